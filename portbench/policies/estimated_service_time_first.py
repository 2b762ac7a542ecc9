"""``estimated_service_time_first``: smallest est = 0.5 * prompt + predicted output first."""

from ..engine.queue import KeyPolicy
from . import register
from ._common import ALPHA, BETA, estimate


@register
class EstimatedServiceTimeFirst(KeyPolicy):
    """Shortest estimated service first.

    Key ``(est, deadline, -priority, id)`` ascending with ``est = alpha*P + beta*O``: equal estimates
    break on the deadline first (not on arrival, unlike ``weighted_fair_share``).

    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "estimated_service_time_first"

    def __init__(self, alpha: float = ALPHA, beta: float = BETA):
        self.alpha = alpha
        self.beta = beta

    def key(self, view, ids):
        est = estimate(view.input_tokens[ids].astype(float),
                       view.predicted_output_tokens[ids].astype(float), self.alpha, self.beta)
        return est, view.deadline_s[ids], -view.priority[ids], ids
