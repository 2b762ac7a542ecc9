"""``weighted_fair_share``: the study's class-deficit score, which with one class is est-then-arrival."""

from ..sim import Decision, Policy
from . import register
from ._common import ALPHA, BETA, admissions_in_order, estimate


@register
class WeightedFairShare(Policy):
    """Weighted fair share over request classes, as the study computes it.

    ``score = deficit * priority / max(est, 1e-9)`` with ``deficit = demand / max(1, served + 1)``,
    ``demand`` = waiting requests of the class, ``served`` = running requests of the class (the
    study's same-step admission counter is only incremented after the sort, so it never enters the
    ranking). Key ``(-score, arrival, id)`` ascending. Hard limits only; no state, no ``now``, no
    timer.

    Our windows carry no class label, so **every request is in one class** (the study's workloads
    have a single class too). The deficit is then the same for every request and, at equal priority,
    the ranking reduces to (est ascending, arrival, id).

    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "weighted_fair_share"
    admission_only = True

    def __init__(self, alpha: float = ALPHA, beta: float = BETA):
        self.alpha = alpha
        self.beta = beta

    def schedule(self, view):
        a, p, o, prio = view.arrival_s, view.input_tokens, view.predicted_output_tokens, view.priority
        demand = len(view.waiting)               # waiting requests of the (single) class
        served = view.n_active                   # running requests of that class
        deficit = demand / max(1, served + 1)

        def key(i):
            est = estimate(int(p[i]), int(o[i]), self.alpha, self.beta)
            score = deficit * float(prio[i]) / max(est, 1e-9)
            return (-score, float(a[i]), i)

        return Decision(admit=admissions_in_order(view, sorted(view.waiting, key=key)))
