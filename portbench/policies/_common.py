"""Pieces shared by the policies: the study's service estimate and the feasibility walk."""

from __future__ import annotations

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


def admit_in_order(view, ranked, accept=None, kv_charge=None, limit=None) -> list:
    """Walk ``ranked`` once, admitting every request that fits (no head-of-line blocking).

    ``accept(i, active, kv)`` is a policy's extra filter applied after the hard limits;
    ``kv_charge(i)`` the KV a policy books for an admission (default: the prompt);
    ``limit`` the most admissions in this step.
    """
    active, kv = view.n_active, view.kv_used
    admitted = []
    slots = view.model.max_active_sequences
    for i in ranked:
        if active >= slots:          # no sequence slot left: nothing further can fit
            break
        charge = int(view.input_tokens[i]) if kv_charge is None else kv_charge(i)
        if not fits(view, active, kv, charge):
            continue
        if accept is not None and not accept(i, active, kv):
            continue
        admitted.append(i)
        active += 1
        kv += charge
        if limit is not None and len(admitted) >= limit:
            break
    return admitted
