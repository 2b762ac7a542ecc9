"""Pieces shared by the policies and the real engines' schedulers: the study's service estimate
(defined here once) and the feasibility walk."""

from __future__ import annotations

import numpy as np

#: The study's service-time proxy, est = ALPHA * prompt + BETA * predicted output, counted in the
#: study simulator's 1 ms steps; ESTIMATE_UNIT_S turns it into seconds wherever it meets the clock.
ALPHA = 0.5
BETA = 1.0
ESTIMATE_UNIT_S = 0.001


def estimate(prompt, predicted, alpha: float = ALPHA, beta: float = BETA):
    """est = alpha * prompt + beta * predicted output (ints, or numpy arrays of them)."""
    return alpha * prompt + beta * predicted


def estimate_s(prompt, predicted, alpha: float = ALPHA, beta: float = BETA,
               unit_s: float = ESTIMATE_UNIT_S):
    """The estimate in seconds."""
    return estimate(prompt, predicted, alpha, beta) * unit_s


def ranked_waiting(view, *keys_last_first) -> list:
    """The waiting queue (an array of ids) sorted by several keys at once, in numpy: ``keys_last_first`` are functions
    of the waiting ids' array giving one key column each, the *least* significant first (as
    :func:`numpy.lexsort` takes them); the request id breaks the remaining ties. The same order as
    Python's ``sorted`` on the key tuple, for keys without NaN."""
    w = np.fromiter(view.waiting, dtype=np.int64, count=len(view.waiting))
    if len(w) < 2:
        return w
    return w[np.lexsort((w, *(k(w) for k in keys_last_first)))]


def fits(view, active: int, kv: int, prompt: int) -> bool:
    """The engine's hard admission limits: one more sequence, and its whole prompt in the KV cache."""
    m = view.model
    return active + 1 <= m.max_sequences and kv + prompt <= m.max_kv_tokens


def admissions_in_order(view, ranked, accept=None, kv_charge=None, limit=None):
    """Walk ``ranked`` once, yielding every request that fits (no head-of-line blocking).

    ``accept(i, active, kv)`` is a policy's extra filter applied after the hard limits;
    ``kv_charge(i)`` the KV a policy books for an admission (default: the prompt);
    ``limit`` the most admissions in this step. ``ranked`` is a sequence of ids, or an iterator of
    numpy chunks of ids in rank order (produced lazily, so that a walk that stops early never ranks
    the rest of a long queue).

    The walk is lazy: an engine that stops taking admissions at its first refusal stops the walk
    there too (a long queue is then not walked to its end at every step).
    """
    active, kv = view.n_active, view.kv_used
    m = view.model
    slots = m.max_sequences
    if active >= slots:
        return
    if accept is None and kv_charge is None and not hasattr(ranked, "__len__"):
        # numpy chunks: the walk in numpy, a chunk at a time — the next request whose
        # prompt fits the KV room left, while a sequence slot is left
        prompts = view.input_tokens
        n = 0
        for chunk in ranked:
            p = prompts[chunk]
            pos = 0
            while pos < len(chunk):
                if active + 1 > slots:
                    return
                hit = np.flatnonzero(p[pos:] <= m.max_kv_tokens - kv)
                if not len(hit):
                    break
                j = pos + int(hit[0])
                yield int(chunk[j])
                active += 1
                kv += int(p[j])
                n += 1
                if limit is not None and n >= limit:
                    return
                pos = j + 1
        return
    if kv_charge is None and len(ranked) > 32:
        # A long queue: drop at once every request whose prompt cannot fit in the KV room left now
        # (the room only shrinks along the walk), and walk the rest.
        r = ranked if isinstance(ranked, np.ndarray) else np.fromiter(ranked, dtype=np.int64, count=len(ranked))
        ranked = r[view.input_tokens[r] <= view.model.max_kv_tokens - kv].tolist()
    elif isinstance(ranked, np.ndarray):
        ranked = ranked.tolist()
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
    return list(admissions_in_order(view, ranked, accept, kv_charge, limit))
