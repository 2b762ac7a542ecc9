"""``weighted_fair_share``: the study's class-deficit score, which with one class is est-then-arrival."""

import numpy as np

from ..engine.queue import KeyPolicy
from . import register
from ._common import ALPHA, BETA, estimate


@register
class WeightedFairShare(KeyPolicy):
    """Weighted fair share over request classes, as the study computes it.

    ``score = deficit * priority / max(est, 1e-9)`` with ``deficit = demand / max(1, served + 1)``,
    ``demand`` = waiting requests of the class, ``served`` = running requests of the class (the
    study's same-step admission counter is only incremented after the sort, so it never enters the
    ranking). Key ``(-score, arrival, id)`` ascending.

    Our windows carry no class label, so **every request is in one class** (the study's workloads
    have a single class too). The deficit is then the same for every request and, at equal priority,
    the ranking reduces to (est ascending, arrival, id).

    alpha, beta: weights of prompt and predicted output in the estimate (0.5, 1.0).
    """

    name = "weighted_fair_share"

    def __init__(self, alpha: float = ALPHA, beta: float = BETA):
        self.alpha = alpha
        self.beta = beta

    def key(self, view, ids):
        deficit = len(view.waiting) / max(1, view.n_active + 1)
        est = estimate(view.input_tokens[ids].astype(float),
                       view.predicted_output_tokens[ids].astype(float), self.alpha, self.beta)
        score = deficit * view.priority[ids] / np.maximum(est, 1e-9)
        return -score, view.arrival_s[ids], ids
