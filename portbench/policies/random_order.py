"""``random``: a random order of the waiting queue, seeded — the panel's floor.

Design followed: SGLang's cache-agnostic ``RANDOM`` policy (``python/sglang/srt/managers/
schedule_policy.py``), which shuffles the waiting queue before each scheduling pass.

Here each request draws one random rank when the run starts (a permutation of the window's requests
from ``numpy.random.default_rng(seed)``), and the queue is served in that rank. Re-shuffling at every
call, as SGLang does, would make a run depend on how often the engine asks the policy (it skips steps
in which nothing can be admitted), so the step-by-step walk and the fast path would differ; a fixed
rank per request gives the same kind of order — any waiting request is equally likely to be first,
whatever its arrival or size — and the same run for the same seed and window, every time. The engine
model decides what happens to a request that does not fit (skipped under ``lssp``, head-of-line under
``vllm_v1``). No preemption, no use of the clock or of predictions.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..engine.queue import KeyPolicy
from . import register


@register
class RandomOrder(KeyPolicy):
    """A uniformly random order, fixed per request for a given ``seed`` (default 0)."""

    name = "random"

    def __init__(self, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"random: seed must be an integer >= 0, got {seed!r}")
        self.seed = int(seed)

    def reset(self, view):
        self._rank = np.random.default_rng(self.seed).permutation(view.n_requests)

    def key(self, view, ids):
        return self._rank[ids]
