"""``hrrn``: highest response ratio next, as SGLang's ``--schedule-policy hrrn`` ranks its queue.

Design followed: SGLang's schedule policies (``python/sglang/srt/managers/schedule_policy.py``, with
the waited-token counter of ``python/sglang/srt/managers/prefill_order.py``). Its HRRN
(``SchedulePolicy._sort_by_hrrn``) serves the waiting request with the highest response ratio
``1 + waited / work = (waited + work) / work`` first, where *work* is
the prefill the request still needs (its prompt less the tokens its prefix cache already holds, at
least one token) and *waited* is counted in the prefill tokens the scheduler processed since the
request joined the queue (a token clock, so that every tensor-parallel rank ranks alike).

Here both terms are in seconds of the same clock: ``waited = now - arrival`` and the **expected
service** is the study's service estimate ``est = (alpha * prompt + beta * predicted output) *
estimate_unit_s`` (:func:`portbench.policies._common.estimate_s`; 0.5 and 1.0 per token, 1 ms a
unit). Our windows carry no prefix information, so nothing is ever cached and SGLang's work would
be the whole prompt; we use the estimate instead because it is the study's one service proxy and
because it makes the policy read the predicted output, so that the prediction-error sweep applies
to it. The ratio is ``1 + waited / est``: equal waits favour the shorter job, and a long job's
ratio rises until it overtakes. Ties go to the earlier arrival (the queue's order). The engine model
decides what happens to a request that does not fit (skipped under ``lssp``, head-of-line under
``vllm_v1``). No preemption.

Aging makes the order change with the clock alone, yet no timer is needed: a key policy only admits,
from the view alone, and a step the engine skips is one in which no waiting request can be admitted
whatever the order.
"""

from __future__ import annotations

import numpy as np

from ..engine.queue import KeyPolicy
from . import register
from ._common import ALPHA, BETA, ESTIMATE_UNIT_S, estimate_s


@register
class Hrrn(KeyPolicy):
    """Highest ``(wait + est) / est`` first, est the study's service estimate (seconds)."""

    name = "hrrn"

    def __init__(self, estimate_unit_s: float = ESTIMATE_UNIT_S, alpha: float = ALPHA,
                 beta: float = BETA):
        for what, value in (("estimate_unit_s", estimate_unit_s), ("alpha", alpha), ("beta", beta)):
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"hrrn: {what} must be a finite number >= 0, got {value!r}")
        if not (estimate_unit_s > 0 and alpha + beta > 0):
            raise ValueError(f"hrrn: the service estimate must be positive (estimate_unit_s > 0 and "
                             f"alpha + beta > 0), got estimate_unit_s={estimate_unit_s!r}, "
                             f"alpha={alpha!r}, beta={beta!r}")
        self.estimate_unit_s, self.alpha, self.beta = float(estimate_unit_s), float(alpha), float(beta)

    def reset(self, view):
        est = estimate_s(view.input_tokens.astype(np.float64),
                         view.predicted_output_tokens.astype(np.float64),
                         self.alpha, self.beta, self.estimate_unit_s)
        # a request with neither prompt nor predicted output still costs a unit
        self._est = np.maximum(est, self.estimate_unit_s)

    def ratios(self, view, ids) -> np.ndarray:
        """The response ratio of requests ``ids`` at ``view.now`` (higher is served first)."""
        wait = np.maximum(view.now - view.arrival_s[ids], 0.0)
        return 1.0 + wait / self._est[ids]

    def key(self, view, ids):
        return -self.ratios(view, ids)
