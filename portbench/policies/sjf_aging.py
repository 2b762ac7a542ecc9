"""``sjf_aging``: shortest job first on the predicted output length, with wait-time aging.

Design followed: the SJF waiting queue proposed for vLLM (PR #29366, ``TimeAndLengthScorer`` in
``vllm/v1/core/sched/policy/``) and shipped in TensorRT-LLM (``SJFWaitingQueue``,
``tensorrt_llm/_torch/pyexecutor/scheduler/waiting_queue.py``, ``SjfConfig``): the queue is served
highest score first, ::

    score = length_weight * 1 / (1 + exp((len - length_median) / length_median))
          + time_weight   * 1 / (1 + exp(-(wait - time_median) / time_median))

with their defaults ``length_median = 32768`` tokens, ``time_median = 5`` s, weights 0.5 and 0.5
(clamped to [0, 1] as vLLM does). ``normalization="rational"`` gives the form of TensorRT-LLM PR
#12428's description instead, ``length_weight / (1 + len / length_median) + time_weight * wait /
time_median``. Both engines score the *prompt* length (they have no output predictor); here ``len``
is the study's predicted output length by default (``length="prompt"`` for theirs). ``wait`` is
``now - arrival``; ties go to the earlier arrival. The engine model decides what happens to a
request that does not fit (skipped under ``lssp``, head-of-line under ``vllm_v1``). No preemption.

Aging makes the order change with the clock alone, yet no timer is needed: a key policy only admits,
from the view alone, and a step the engine skips is one in which no waiting request can be admitted
whatever the order (KV only grows and no slot frees until an event), so the order matters only at
steps where the policy is asked anyway.
(The rational form's order does not even change: every score ages at the same rate.)
"""

from __future__ import annotations

import numpy as np

from ..engine.queue import KeyPolicy
from . import register

NORMALIZATIONS = ("sigmoid", "rational")
LENGTHS = ("predicted_output", "prompt")


def _logistic(x):
    """1 / (1 + exp(-x)), without overflow warnings."""
    return 1.0 / (1.0 + np.exp(-np.clip(x, -700.0, 700.0)))


@register
class SjfAging(KeyPolicy):
    """SJF with wait-time aging (vLLM PR #29366 / TensorRT-LLM ``SJFWaitingQueue`` defaults)."""

    name = "sjf_aging"

    def __init__(self, length_median: float = 32768.0, time_median: float = 5.0,
                 length_weight: float = 0.5, time_weight: float = 0.5,
                 normalization: str = "sigmoid", length: str = "predicted_output"):
        for what, value, allowed in (("normalization", normalization, NORMALIZATIONS),
                                     ("length", length, LENGTHS)):
            if value not in allowed:
                raise ValueError(f"sjf_aging: {what} must be one of {allowed}, got {value!r}")
        if not (length_median > 0 and time_median > 0):
            raise ValueError(f"sjf_aging: medians must be positive, got length_median="
                             f"{length_median!r}, time_median={time_median!r}")
        self.length_median, self.time_median = float(length_median), float(time_median)
        self.length_weight, self.time_weight = float(length_weight), float(time_weight)
        self.normalization, self.length = normalization, length

    def reset(self, view):
        raw = view.predicted_output_tokens if self.length == "predicted_output" else view.input_tokens
        ln = raw.astype(np.float64)
        if self.normalization == "sigmoid":
            self._len_score = self.length_weight * _logistic(-(ln - self.length_median) / self.length_median)
        else:
            self._len_score = self.length_weight / (1.0 + ln / self.length_median)

    def scores(self, view, ids) -> np.ndarray:
        """The score of requests ``ids`` at ``view.now`` (higher is served first)."""
        wait = np.maximum(view.now - view.arrival_s[ids], 0.0)
        if self.normalization == "sigmoid":
            t = self.time_weight * _logistic((wait - self.time_median) / self.time_median)
            return np.clip(self._len_score[ids] + t, 0.0, 1.0)
        return self._len_score[ids] + self.time_weight * wait / self.time_median

    def key(self, view, ids):
        return -self.scores(view, ids), view.arrival_s[ids], ids
