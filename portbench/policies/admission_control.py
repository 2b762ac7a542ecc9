"""``admission_control``: drop requests below a laxity threshold (none by default), least laxity first."""

import math

from ..sim import Decision, Policy
from . import register
from ._common import ALPHA, BETA, ESTIMATE_UNIT_S, admissions_in_order, estimate_s


@register
class AdmissionControl(Policy):
    """Laxity-filtered, laxity-ordered admission.

    ``est_s = (alpha*P + beta*O) * estimate_unit_s`` seconds and ``lax = (d - now) - est_s``. A request is a
    candidate if ``lax >= -laxity_threshold``; with the default ``inf`` nothing is filtered. Key
    ``(lax, -priority, est_s, deadline, id)`` ascending. Hard limits only. No state; ``now`` cancels
    within a step, and the filter can only remove candidates over time, so there is no timer.

    laxity_threshold: seconds of negative laxity tolerated (inf).
    estimate_unit_s: seconds per unit of the estimate (the study's 1 ms step).
    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "admission_control"
    admission_only = True

    def __init__(self, laxity_threshold: float = math.inf, estimate_unit_s: float = ESTIMATE_UNIT_S,
                 alpha: float = ALPHA, beta: float = BETA):
        self.laxity_threshold = laxity_threshold
        self.estimate_unit_s = estimate_unit_s
        self.alpha = alpha
        self.beta = beta

    def schedule(self, view):
        now = view.now
        d, p, o, prio = view.deadline_s, view.input_tokens, view.predicted_output_tokens, view.priority
        floor = -self.laxity_threshold
        keyed = []
        for i in view.waiting:
            di = float(d[i])
            est_s = estimate_s(int(p[i]), int(o[i]), self.alpha, self.beta, self.estimate_unit_s)
            lax = (di - now) - est_s
            if lax >= floor:
                keyed.append(((lax, -float(prio[i]), est_s, di, i), i))
        keyed.sort(key=lambda t: t[0])
        return Decision(admit=admissions_in_order(view, [i for _, i in keyed]))
