"""``estimated_service_time_first``: smallest est = 0.5 * prompt + predicted output first."""

from ..sim import Decision, Policy
from . import register
from ._common import ALPHA, BETA, admissions_in_order, estimate


@register
class EstimatedServiceTimeFirst(Policy):
    """Shortest estimated service first.

    Key ``(est, deadline, -priority, id)`` ascending with ``est = alpha*P + beta*O``: equal estimates
    break on the deadline first (not on arrival, unlike ``weighted_fair_share``). Hard limits only;
    no state and no use of ``now``, hence no timer.

    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "estimated_service_time_first"
    admission_only = True

    def __init__(self, alpha: float = ALPHA, beta: float = BETA):
        self.alpha = alpha
        self.beta = beta

    def schedule(self, view):
        d, p, o, prio = view.deadline_s, view.input_tokens, view.predicted_output_tokens, view.priority

        def key(i):
            est = estimate(int(p[i]), int(o[i]), self.alpha, self.beta)
            return (est, float(d[i]), -float(prio[i]), i)

        return Decision(admit=admissions_in_order(view, sorted(view.waiting, key=key)))
