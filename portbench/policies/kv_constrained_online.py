"""``kv_constrained_online``: keep KV use under 0.82 of the cache unless a request is urgent."""

from ..sim import NEVER, Decision, Policy
from . import register
from ._common import ALPHA, BETA, ESTIMATE_UNIT_S, admit_in_order, estimate_s


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

    #: Weight of the predicted output in the ranking's KV cost (fixed in the study).
    KV_COST_OUTPUT_WEIGHT = 0.25

    def __init__(self, estimate_unit_s: float = ESTIMATE_UNIT_S, alpha: float = ALPHA, beta: float = BETA,
                 target_kv_utilization: float = 0.82, urgent_laxity_seconds: float = 0.25):
        self.estimate_unit_s = estimate_unit_s
        self.alpha = alpha
        self.beta = beta
        self.target_kv_utilization = target_kv_utilization
        self.urgent_laxity_seconds = urgent_laxity_seconds

    def _est_s(self, view, i):
        return estimate_s(int(view.input_tokens[i]), int(view.predicted_output_tokens[i]),
                          self.alpha, self.beta, self.estimate_unit_s)

    def schedule(self, view):
        now = view.now
        d, p, o, prio = view.deadline_s, view.input_tokens, view.predicted_output_tokens, view.priority
        urgent_lax = self.urgent_laxity_seconds
        urgent = {}
        keyed = []
        for i in view.waiting:
            lax = (float(d[i]) - now) - self._est_s(view, i)
            urgent[i] = lax <= urgent_lax
            kv_cost = int(p[i]) + self.KV_COST_OUTPUT_WEIGHT * int(o[i])
            keyed.append(((lax > urgent_lax, kv_cost / max(float(prio[i]), 1e-9), lax, i), i))
        keyed.sort(key=lambda t: t[0])

        max_kv = max(view.model.max_kv_tokens, 1)
        capped = []                               # passed the hard limits, stopped by the cap

        def accept(i, active, kv):
            if (kv + int(p[i])) / max_kv <= self.target_kv_utilization or urgent[i]:
                return True
            capped.append(i)
            return False

        admitted = admit_in_order(view, [i for _, i in keyed], accept=accept)
        wake = NEVER
        for i in capped:       # each becomes urgent once (d - now) - est <= urgent_lax
            wake = min(wake, float(d[i]) - self._est_s(view, i) - urgent_lax)
        return Decision(admit=admitted, wake_at_s=wake)
