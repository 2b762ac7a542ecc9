"""``kv_constrained_online``: keep KV use under 0.82 of the cache unless a request is urgent."""

import numpy as np

from ..engine.api import NEVER, Decision, Policy
from . import register
from ._common import ALPHA, BETA, ESTIMATE_UNIT_S, estimate_s


@register
class KvConstrainedOnline(Policy):
    """KV-utilisation cap with an urgency bypass.

    ``lax_s = (d - now) - (alpha*P + beta*O) * estimate_unit_s``; urgent iff ``lax_s <= urgent_laxity_seconds``.
    Key ``(lax_s > urgent, kv_cost / max(priority, 1e-9), lax_s, id)`` ascending with
    ``kv_cost = P + 0.25 * O`` (ranking only): urgent requests first, then the smaller footprint.
    After the hard limits, a request is admitted only if ``(kv + P) / max_kv <= target_kv_utilization``
    (``kv`` = KV in use plus the prompts admitted earlier in the step; nothing is reserved for the
    output) or it is urgent. A request that fails is skipped and the walk goes on.

    Timer: a waiting request that passed the hard limits but was stopped by the cap can be admitted,
    with no other event, once it becomes urgent; the decision's ``wake_at_s`` is the earliest such
    time, ``d - est - urgent_laxity_seconds`` (the engine fires a clock timer early rather than late).

    estimate_unit_s: seconds per unit of the estimate (the study's 1 ms step).
    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    target_kv_utilization: the cap on (kv + P) / max_kv for non-urgent requests (0.82).
    urgent_laxity_seconds: laxity at or below which a request is urgent (0.25).
    """

    name = "kv_constrained_online"
    admission_only = True           # only admits, from the view alone

    #: Weight of the predicted output in the ranking's KV cost (fixed in the study).
    KV_COST_OUTPUT_WEIGHT = 0.25

    def __init__(self, estimate_unit_s: float = ESTIMATE_UNIT_S, alpha: float = ALPHA, beta: float = BETA,
                 target_kv_utilization: float = 0.82, urgent_laxity_seconds: float = 0.25):
        self.estimate_unit_s = estimate_unit_s
        self.alpha = alpha
        self.beta = beta
        self.target_kv_utilization = target_kv_utilization
        self.urgent_laxity_seconds = urgent_laxity_seconds

    def reset(self, view):
        # per-request constants
        p = view.input_tokens.astype(np.float64)
        o = view.predicted_output_tokens.astype(np.float64)
        self._est = estimate_s(p, o, self.alpha, self.beta, self.estimate_unit_s)
        self._cost = (p + self.KV_COST_OUTPUT_WEIGHT * o) / np.maximum(view.priority, 1e-9)
        self._prompt = view.input_tokens.tolist()

    def schedule(self, view):
        now, d = view.now, view.deadline_s
        urgent_lax = self.urgent_laxity_seconds
        w = view._waiting_array()
        lax = (d[w] - now) - self._est[w]
        late = lax > urgent_lax
        # key (not urgent, kv_cost / priority, lax, id)
        order = np.lexsort((w, lax, self._cost[w], late))
        ranked, urgent = w[order], (lax <= urgent_lax)[order]
        admitted, wake = self._walk(view, ranked.tolist(), urgent.tolist())
        return Decision(admit=admitted, wake_at_s=wake)

    def _walk(self, view, ranked: list, urgent: list):
        """The admission walk in rank order, skipping what does not fit the hard limits: a request
        is admitted if it keeps ``(kv + P) / max_kv`` under the cap or is urgent; the others that
        fit are *capped*, and each of them becomes urgent once ``(d - now) - est <= urgent_lax``.
        Returns (admitted ids, the earliest such time or NEVER)."""
        m = view.model
        p = self._prompt
        max_kv, room, target = max(m.max_kv_tokens, 1), m.max_kv_tokens, self.target_kv_utilization
        active, kv, seq_cap = view.n_active, view.kv_used, m.max_sequences
        admitted, capped = [], []
        for i, u in zip(ranked, urgent):
            if active + 1 > seq_cap:
                break
            need = kv + p[i]
            if need > room:
                continue
            if u or need / max_kv <= target:
                admitted.append(i)
                active += 1
                kv = need
            else:
                capped.append(i)
        if not capped:
            return admitted, NEVER
        c = np.array(capped, dtype=np.int64)
        return admitted, float(((view.deadline_s[c] - self._est[c]) - self.urgent_laxity_seconds).min())
