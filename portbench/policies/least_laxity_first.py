"""``least_laxity_first``: smallest (deadline - now) - est first, as the study implemented it."""

from . import register
from ._common import ALPHA, BETA, LaxityKey, estimate


@register
class LeastLaxityFirst(LaxityKey):
    """Least laxity first, with the study's unit quirk.

    Key ``(lax, deadline, -priority, id)`` ascending, ``lax = (d - now) - (alpha*P + beta*O)``: the
    estimate is in *tokens/steps* and is subtracted from seconds without conversion (as the study
    does), so under the study's deadlines bigger jobs tend to go first. ``now`` is common to all
    candidates of a step, so there is no timer; the key is still evaluated at each call's ``now``
    to keep the study's floating-point ties (a :class:`~portbench.policies._common.LaxityKey`: it
    says ``repeat_if_refused`` while no two laxities are near a tie).

    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "least_laxity_first"

    def __init__(self, alpha: float = ALPHA, beta: float = BETA):
        self.alpha, self.beta = alpha, beta

    def reset(self, view):
        super().reset(view)
        self._est = estimate(view.input_tokens, view.predicted_output_tokens, self.alpha, self.beta)

    def key(self, view, ids):
        d = view.deadline_s[ids]
        return (d - view.now) - self._est[ids], d, -view.priority[ids], ids
