"""Pieces shared by the policies: the study's service estimate and the feasibility walk."""

from __future__ import annotations

import numpy as np

#: The study's service-time proxy, est = ALPHA * prompt + BETA * predicted output ("steps").
ALPHA = 0.5
BETA = 1.0


def estimate(view, i) -> float:
    """est = 0.5 * prompt + 1.0 * predicted output, unitless (1 ms steps)."""
    return ALPHA * int(view.input_tokens[i]) + BETA * int(view.predicted_output_tokens[i])


def fits(view, active: int, kv: int, prompt: int) -> bool:
    """The engine's hard admission limits: one more sequence, and its whole prompt in the KV cache."""
    m = view.model
    return (active + 1 <= m.max_active_sequences and kv + prompt <= m.max_kv_tokens
            and active + 1 <= m.max_batch_tokens)


def admissions_in_order(view, ranked, accept=None, kv_charge=None, limit=None):
    """Walk ``ranked`` once, yielding every request that fits (no head-of-line blocking).

    ``accept(i, active, kv)`` is a policy's extra filter applied after the hard limits;
    ``kv_charge(i)`` the KV a policy books for an admission (default: the prompt);
    ``limit`` the most admissions in this step.

    The walk is lazy: an engine that stops taking admissions at its first refusal stops the walk
    there too (a long queue is then not walked to its end at every step).
    """
    active, kv = view.n_active, view.kv_used
    slots = view.model.max_active_sequences
    n = 0
    for i in ranked:
        if active >= slots:          # no sequence slot left: nothing further can fit
            return
        charge = int(view.input_tokens[i]) if kv_charge is None else kv_charge(i)
        if not fits(view, active, kv, charge):
            continue
        if accept is not None and not accept(i, active, kv):
            continue
        yield i
        active += 1
        kv += charge
        n += 1
        if limit is not None and n >= limit:
            return


def admit_in_order(view, ranked, accept=None, kv_charge=None, limit=None) -> list:
    """The whole walk of :func:`admissions_in_order`, as a list."""
    if kv_charge is None and len(ranked) > 32:
        # A long queue: drop at once every request whose prompt cannot fit in the KV room left now
        # (the room only shrinks along the walk), and walk the rest.
        r = np.fromiter(ranked, dtype=np.int64, count=len(ranked))
        ranked = r[view.input_tokens[r] <= view.model.max_kv_tokens - view.kv_used].tolist()
    return list(admissions_in_order(view, ranked, accept, kv_charge, limit))
