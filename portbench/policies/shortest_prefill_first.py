"""``shortest_prefill_first``: SGLang's ``--schedule-policy shortest-prefill-first``.

Design followed: SGLang's prefill ordering (``python/sglang/srt/managers/prefill_order.py``, used by
``SchedulePolicy.calc_priority`` in ``schedule_policy.py``): the waiting queue is served by the
prefill work each request still needs, smallest first (its prompt less what the prefix cache holds,
at least one token), ties to the request that waited longer; with aging on (``aging_tokens > 0``),
requests that have waited that long go first, longest-waiting first (SGLang measures the wait in
prefill tokens processed since the request joined; ``aging_tokens <= 0`` turns aging off).

Here the work is the whole prompt (``view.input_tokens``: our windows carry no prefix information,
so nothing is cached), the wait is on the clock (``aging_s`` seconds since arrival; 0, the default,
turns aging off), and ties keep the queue's order (arrival, preempted requests in front). The policy
reads no prediction. The engine model decides what happens to a request that does not fit (skipped
under ``lssp``, head-of-line under ``vllm_v1``). No preemption.

With aging on, the order changes with the clock alone, yet no timer is needed: a key policy only
admits, from the view alone, and a step the engine skips is one in which no waiting request can be
admitted whatever the order.
"""

from __future__ import annotations

import math

import numpy as np

from ..engine.queue import KeyPolicy
from . import register


@register
class ShortestPrefillFirst(KeyPolicy):
    """Shortest prompt first; with ``aging_s > 0``, requests waiting that long first (oldest first)."""

    name = "shortest_prefill_first"

    def __init__(self, aging_s: float = 0.0):
        if not (isinstance(aging_s, (int, float)) and math.isfinite(aging_s) and aging_s >= 0):
            raise ValueError(f"shortest_prefill_first: aging_s must be a finite number of seconds "
                             f">= 0 (0 = no aging), got {aging_s!r}")
        self.aging_s = float(aging_s)

    def key(self, view, ids):
        work = view.input_tokens[ids]
        if self.aging_s == 0:
            return work
        wait = view.now - view.arrival_s[ids]
        aged = wait >= self.aging_s
        # aged first (the longest wait first), then the shortest prompt
        return ~aged, np.where(aged, -wait, work.astype(np.float64))
