"""``kv_constrained_online``: keep KV use under 0.82 of the cache unless a request is urgent."""

import numpy as np

from ..sim import NEVER, Decision, Policy
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
        self._kv_cost = p + self.KV_COST_OUTPUT_WEIGHT * o

    def schedule(self, view):
        now, d, prio = view.now, view.deadline_s, view.priority
        urgent_lax = self.urgent_laxity_seconds
        w = np.fromiter(view.waiting, dtype=np.int64, count=len(view.waiting))
        lax = (d[w] - now) - self._est[w]
        # key (not urgent, kv_cost / priority, lax, id)
        order = np.lexsort((w, lax, self._kv_cost[w] / np.maximum(prio[w], 1e-9), lax > urgent_lax))
        ranked, urgent = w[order], (lax <= urgent_lax)[order]
        admitted, capped = self._walk(view, ranked, urgent)
        # each capped request becomes urgent once (d - now) - est <= urgent_lax
        wake = float(((d[capped] - self._est[capped]) - urgent_lax).min()) if len(capped) else NEVER
        return Decision(admit=admitted, wake_at_s=wake)

    def _walk(self, view, ranked, urgent):
        """The admission walk in rank order, skipping what does not fit the hard limits: a request
        is admitted if it keeps ``(kv + P) / max_kv`` under the cap or is urgent; the others that
        fit are *capped*. Done a segment at a time in numpy (between two admissions the KV in use
        is fixed). Returns (admitted ids, capped ids)."""
        m = view.model
        p = view.input_tokens
        max_kv = max(m.max_kv_tokens, 1)
        active, kv = view.n_active, view.kv_used
        seq_cap = m.max_sequences
        admitted, capped = [], []
        pos = 0
        while pos < len(ranked) and active + 1 <= seq_cap:
            rest, rest_urgent = ranked[pos:], urgent[pos:]
            need = kv + p[rest]
            fit = need <= m.max_kv_tokens
            ok = fit & ((need / max_kv <= self.target_kv_utilization) | rest_urgent)
            hits = np.flatnonzero(ok)
            j = hits[0] if len(hits) else len(rest)
            capped.append(rest[:j][fit[:j]])        # fit, but stopped by the cap (none of them urgent)
            if j == len(rest):
                break
            i = int(rest[j])
            admitted.append(i)
            active += 1
            kv += int(p[i])
            pos += j + 1
        return admitted, (np.concatenate(capped) if capped else ranked[:0])
