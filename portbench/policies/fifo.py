"""``fifo``: the engine's queue as it stands (arrival order, preempted requests in front)."""

from ..engine.api import Decision, Policy
from . import register


@register
class Fifo(Policy):
    """First come, first served: proposes the waiting queue in its order; the engine model decides
    what happens to a request that does not fit (skipped under ``lssp``, head-of-line under
    ``vllm_v1``)."""

    name = "fifo"
    admission_only = True

    def schedule(self, view):
        # the queue changes only at events: a refused head is proposed again until one
        return Decision(admit=view.waiting, repeat_if_refused=True)
