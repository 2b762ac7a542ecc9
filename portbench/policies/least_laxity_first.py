"""``least_laxity_first``: smallest (deadline - now) - est first, as the study implemented it."""

from ..sim import Decision, Policy
from . import register
from ._common import ALPHA, BETA, admissions_in_order, estimate


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

    def schedule(self, view):
        now = view.now
        d, p, o, prio = view.deadline_s, view.input_tokens, view.predicted_output_tokens, view.priority

        def key(i):
            di = float(d[i])
            est = estimate(int(p[i]), int(o[i]), self.alpha, self.beta)
            return ((di - now) - est, di, -float(prio[i]), i)

        return Decision(admit=admissions_in_order(view, sorted(view.waiting, key=key)))
