"""Pieces shared by the policies and the real engines' schedulers: the study's service estimate
(defined here once), and the admission walk of the policies that book admissions themselves."""

from __future__ import annotations

import numpy as np

from ..engine.api import Decision
from ..engine.queue import KeyPolicy

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


def fits(view, active: int, kv: int, prompt: int) -> bool:
    """The ``lssp`` engine's hard admission limits: one more sequence, and its whole prompt in the
    KV cache (for policies that book admissions themselves before proposing them)."""
    m = view.model
    return active + 1 <= m.max_sequences and kv + prompt <= m.max_kv_tokens


def admit_in_order(view, ranked, accept=None, kv_charge=None, limit=None) -> list:
    """A policy's own admission walk over ``ranked`` (ids), for a policy whose rule books more than
    the engine does: every request that fits :func:`fits` with ``kv_charge(i)`` KV tokens (default:
    its prompt) and passes ``accept(i, active, kv)``, skipping the others, at most ``limit``."""
    active, kv = view.n_active, view.kv_used
    admitted = []
    for i in (ranked.tolist() if isinstance(ranked, np.ndarray) else ranked):
        if active >= view.model.max_sequences or (limit is not None and len(admitted) >= limit):
            break
        charge = int(view.input_tokens[i]) if kv_charge is None else kv_charge(i)
        if fits(view, active, kv, charge) and (accept is None or accept(i, active, kv)):
            admitted.append(i)
            active += 1
            kv += charge
    return admitted


class LaxityKey(KeyPolicy):
    """A key policy whose key leads with each request's laxity, ``(deadline_s - now) - estimate``
    (``least_laxity_first``, ``admission_control``). The clock is common to all, so the order turns
    over as it moves only where floating-point round-off meets a near-tie: the decision says
    ``repeat_if_refused`` while no two laxities are near a tie (:class:`NoNearTie`)."""

    def schedule(self, view):
        ranked = self.ranked(view)
        return Decision(admit=ranked, repeat_if_refused=NoNearTie(ranked, view))


class NoNearTie:
    """Whether no two laxities of ``ranked`` (its first key column) lie within a hundred-millionth
    of the magnitudes involved (1 + the clock + the largest |deadline| and |laxity|): the round-off
    of the two subtractions stays far below that at any clock under a million times those values,
    so the order is the same at every later clock. Worked out (it sorts the queue) only when an
    engine asks for its truth, after a refusal; at most one waiting request: true."""

    __slots__ = ("_ranked", "_view", "_now", "_holds")

    def __init__(self, ranked, view):
        self._ranked, self._view, self._now, self._holds = ranked, view, view.now, None

    def __bool__(self) -> bool:
        if self._holds is None:
            r = self._ranked
            if not r.cols:
                self._holds = True
            else:
                lax = r.cols[0]
                scale = 1 + abs(self._now) + np.abs(self._view.deadline_s[r.ids]).max() + np.abs(lax).max()
                self._holds = bool(np.diff(np.sort(lax)).min() > 1e-8 * scale)
        return self._holds
