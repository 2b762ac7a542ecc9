"""``admission_control``: drop requests below a laxity threshold (none by default), least laxity first."""

import math

import numpy as np

from ..engine.api import Decision
from . import register
from ._common import ALPHA, BETA, ESTIMATE_UNIT_S, LaxityKey, estimate_s


@register
class AdmissionControl(LaxityKey):
    """Laxity-filtered, laxity-ordered admission.

    ``est_s = (alpha*P + beta*O) * estimate_unit_s`` seconds and ``lax = (d - now) - est_s``. A request is a
    candidate if ``lax >= -laxity_threshold``; with the default ``inf`` nothing is filtered. Key
    ``(lax, -priority, est_s, deadline, id)`` ascending. ``now`` cancels within a step, and the
    filter can only remove candidates over time, so there is no timer. Unfiltered, it is a
    :class:`~portbench.policies._common.LaxityKey` (``repeat_if_refused`` while no near-tie).

    laxity_threshold: seconds of negative laxity tolerated (inf).
    estimate_unit_s: seconds per unit of the estimate (the study's 1 ms step).
    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "admission_control"

    def __init__(self, laxity_threshold: float = math.inf, estimate_unit_s: float = ESTIMATE_UNIT_S,
                 alpha: float = ALPHA, beta: float = BETA):
        self.laxity_threshold = laxity_threshold
        self.estimate_unit_s = estimate_unit_s
        self.alpha = alpha
        self.beta = beta

    def laxity(self, view, ids):
        est_s = estimate_s(view.input_tokens[ids].astype(float), view.predicted_output_tokens[ids]
                           .astype(float), self.alpha, self.beta, self.estimate_unit_s)
        return (view.deadline_s[ids] - view.now) - est_s, est_s

    def key(self, view, ids):
        lax, est_s = self.laxity(view, ids)
        return lax, -view.priority[ids], est_s, view.deadline_s[ids], ids

    def schedule(self, view):
        if self.laxity_threshold == math.inf:
            return super().schedule(view)
        ranked = np.asarray(self.ranked(view))
        return Decision(admit=ranked[self.laxity(view, ranked)[0] >= -self.laxity_threshold])
