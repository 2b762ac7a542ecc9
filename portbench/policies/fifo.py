"""``fifo``: arrival order; a request that does not fit is skipped and the walk goes on."""

from ..sim import Decision, Policy
from . import register
from ._common import admissions_in_order


@register
class Fifo(Policy):
    name = "fifo"
    admission_only = True

    def schedule(self, view):
        return Decision(admit=admissions_in_order(view, view.waiting))
