"""``edf``: earliest SLO deadline first; a request that does not fit is skipped and the walk goes on."""

from ..sim import Decision, Policy
from . import register
from ._common import admissions_in_order


@register
class Edf(Policy):
    """Earliest deadline first.

    Ranks the waiting queue by deadline alone with a stable sort, so equal deadlines keep queue
    (arrival) order. Hard limits only; no state and no use of ``now``, hence no timer.
    """

    name = "edf"
    admission_only = True

    def schedule(self, view):
        d = view.deadline_s
        ranked = sorted(view.waiting, key=lambda i: float(d[i]))
        return Decision(admit=admissions_in_order(view, ranked))
