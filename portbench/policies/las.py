"""``las``: least attained service first (foreground-background), preemptive when no room.

Design followed: least-attained-service / foreground-background scheduling (Kleinrock; Rai,
Urvoy-Keller & Biersack, "Analysis of LAS scheduling for job size distributions with high
variance", SIGMETRICS 2003), the information-agnostic baseline FastServe's MLFQ approximates: serve
the requests that have received the least service, with no prediction of their length.

Attained service = tokens generated so far, counted across runs (tokens generated and then lost to
a recompute preemption still count: they were service received). The waiting queue is walked in
``(attained, arrival, id)`` order and admitted while it fits (misfits skipped under ``lssp``,
head-of-line under ``vllm_v1``). **Preemption**: a request that has attained no service yet (a new
arrival) and does not fit evicts running requests of strictly more attained service, the most first,
when that makes it fit (the walk of :func:`~portbench.engine.queue.admit_by_key`: evictions
only for the top-ranked requests that do not fit the engine as it is). FB's other preemption — a running request overtaking a waiting one's
attained service, which time-shares equals token by token — is left out: with recompute preemption
(``lssp`` drops the generated tokens) two long requests would evict each other forever. Each
eviction is therefore caused by an arrival, and the run always ends.

No timer: between events the waiting requests' attained service is fixed and KV only grows, so
nothing that did not fit starts fitting. A running request grows its attained service in skipped
steps, but it has some from its first token on, and the steps before that (the admission step;
``vllm_v1``'s prefill steps) are never skipped.
"""

from __future__ import annotations

import numpy as np

from ..engine.api import Decision, Policy
from . import register
from ..engine.queue import WaitingOrder, admit_by_key, arrival_rank, ranked_key


class AttainedService:
    """Tokens each request has generated in all its runs, kept up to date from ``view.decoded``.

    Call :meth:`update` at every policy call: a running request's ``decoded`` only grows while it
    runs (the gain since the last call is service), and a request seen leaving the running set
    (evicted) is re-based, so a recompute preemption (``decoded`` back to 0) loses no attained
    service. Every eviction is followed by a call (it ends any skipped stretch), so the re-basing
    happens before the request can run again.
    """

    def __init__(self, n: int):
        self.served = np.zeros(n, dtype=np.int64)
        self._seen = np.zeros(n, dtype=np.int64)        # decoded when last accounted for
        self._running: tuple = ()

    def update(self, view, dec) -> np.ndarray:
        running = view.running
        if self._running:
            for i in set(self._running).difference(running):       # evicted since the last call
                self._seen[i] = dec[i]
        if running:
            r = np.fromiter(running, dtype=np.int64, count=len(running))
            d = dec[r]
            self.served[r] += d - self._seen[r]
            self._seen[r] = d
        self._running = running
        return self.served


def _fresh_only(served, ids, tie) -> np.ndarray:
    """Eviction keys: a request with no service yet evicts from its own rank; others never do."""
    key = ranked_key(served, ids, len(ids), tie)
    key[served > 0] = np.iinfo(np.int64).max
    return key


@register
class LeastAttainedService(Policy):
    """Fewest generated tokens first; an arrival evicts the most-served running request if needed."""

    name = "las"
    event_driven = True

    def reset(self, view):
        self._service = AttainedService(view.n_requests)
        self._tie = arrival_rank(view)
        self._waiting = WaitingOrder()      # a waiting request's attained service is fixed

    def schedule(self, view):
        dec = view.decoded
        served = self._service.update(view, dec)
        tie = self._tie
        # (attained, running before waiting, arrival): equals never evict one another
        waiting = self._waiting.get(view, lambda w: ranked_key(served[w], w, len(w), tie),
                                    lambda w: _fresh_only(served[w], w, tie))
        admit, preempt = admit_by_key(view, waiting, lambda r: ranked_key(served[r], r, 0, tie),
                                      decoded=dec)
        return Decision(admit=admit, preempt=preempt)
