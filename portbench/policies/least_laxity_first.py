"""``least_laxity_first``: smallest (deadline - now) - est first, as the study implemented it."""

import bisect

import numpy as np

from ..sim import Decision, Policy
from . import register
from ._common import ALPHA, BETA, admissions_in_order, estimate
from .vllm_priority import WaitingOrder

#: Relative width of a near-tie of ``deadline - est`` (see :meth:`LeastLaxityFirst._exact_chunks`):
#: far above float64 rounding (~1e-16), far below any real difference between two requests.
NEAR_TIE = 1e-7


@register
class LeastLaxityFirst(Policy):
    """Least laxity first, with the study's unit quirk.

    Key ``(lax, deadline, -priority, id)`` ascending, ``lax = (d - now) - (alpha*P + beta*O)``: the
    estimate is in *tokens/steps* and is subtracted from seconds without conversion (as the study
    does), so under the study's deadlines bigger jobs tend to go first. Hard limits only.
    ``now`` is common to all candidates of a step, so there is no timer; the key is still evaluated
    at each executed step's ``now`` to keep the study's floating-point ties.

    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "least_laxity_first"
    admission_only = True

    def __init__(self, alpha: float = ALPHA, beta: float = BETA):
        self.alpha = alpha
        self.beta = beta

    def reset(self, view):
        d = np.asarray(view.deadline_s, dtype=np.float64)
        self._est = estimate(view.input_tokens.astype(np.float64),
                             view.predicted_output_tokens.astype(np.float64), self.alpha, self.beta)
        # Apart from rounding, lax orders the requests as deadline - est does, whatever ``now``: the
        # waiting queue is kept sorted in that fixed order (the same ties after it), and each call
        # evaluates the exact key only on the head its admission walk reaches.
        base = d - self._est
        n = view.n_requests
        order = np.lexsort((np.arange(n), -np.asarray(view.priority, dtype=np.float64), d, base))
        self._rank = np.empty(n, dtype=np.int64)
        self._rank[order] = np.arange(n)
        self._base_by_rank = base[order]
        scale = max(1.0, float(np.abs(d).max(initial=0.0)), float(np.abs(self._est).max(initial=0.0)))
        self._near = NEAR_TIE * scale
        self._waiting = WaitingOrder()

    def schedule(self, view):
        rank = self._rank
        w = self._waiting.get(view, rank)
        return Decision(admit=admissions_in_order(view, self._exact_chunks(view, w.ids, w.keys)))

    def _exact_chunks(self, view, ids, ranks, head: int = 16):
        """The waiting requests ``ids`` (sorted by their fixed ``ranks``) in the exact key order, as
        numpy chunks, lazily. A chunk ends only where the next request's ``deadline - est`` exceeds
        the chunk's last one by more than a near-tie: every request after it then has a larger lax
        than every request in it, whatever the rounding of ``(d - now) - est``; within a chunk the
        exact key sorts (when the fixed order is not already strictly increasing in it)."""
        now, d, prio, est = view.now, view.deadline_s, view.priority, self._est
        base_by_rank = self._base_by_rank
        pos, n = 0, len(ids)
        while pos < n:
            end = min(n, pos + head)
            if end < n:
                beyond = np.searchsorted(base_by_rank, base_by_rank[ranks[end - 1]] + self._near, side="right")
                end = bisect.bisect_left(ranks, int(beyond))
            c = np.array(ids[pos:end], dtype=np.int64)
            dc = d[c]
            lax = (dc - now) - est[c]
            if len(c) > 1 and not (lax[1:] > lax[:-1]).all():      # a tie or an inversion: sort
                c = c[np.lexsort((c, -prio[c], dc, lax))]
            yield c
            pos = end
            head *= 4
