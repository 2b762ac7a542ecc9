"""``least_laxity_first``: smallest (deadline - now) - est first, as the study implemented it."""

import numpy as np

from ..sim import Decision, Policy
from . import register
from ._common import ALPHA, BETA, admissions_in_order, estimate, ranked_lazily


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
        self._est = estimate(view.input_tokens.astype(np.float64),
                             view.predicted_output_tokens.astype(np.float64), self.alpha, self.beta)

    def schedule(self, view):
        # key (lax, deadline, -priority, id), lax = (d - now) - est, evaluated in numpy
        now, d, prio, est = view.now, view.deadline_s, view.priority, self._est
        ranked = ranked_lazily(view, lambda w: -prio[w], lambda w: d[w], lambda w: (d[w] - now) - est[w])
        return Decision(admit=admissions_in_order(view, ranked))
