"""``edf``: earliest SLO deadline first."""

from ..engine.queue import KeyPolicy
from . import register


@register
class Edf(KeyPolicy):
    """Earliest deadline first; equal deadlines keep the queue's (arrival) order. No state and no
    use of ``now``."""

    name = "edf"

    def key(self, view, ids):
        return view.deadline_s[ids]
