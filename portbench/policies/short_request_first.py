"""``short_request_first``: vllm-ascend's ShortRequestFirst waiting queue (short/long lanes).

Design followed: ``ShortRequestFirstRequestQueue`` in vllm-ascend
(``vllm_ascend/core/short_request_first_scheduler.py``; user guide "ShortRequestFirst Prefill
Scheduling"). The waiting queue has three FCFS lanes — *immediate* (recovery requests: preempted,
or with tokens already generated), *short* (``prompt <= threshold``) and *long* — served
``immediate > aged-long > short > long``, where a long request is *aged* once it has waited
``long_max_wait_s`` (and short requests are waiting: with none, long requests go next anyway).

Defaults: ``threshold = 256`` prompt tokens (vllm-ascend's default) and ``long_max_wait_s = 2.0``,
the documented enabling example (``long_max_wait_ms: 2000``). vllm-ascend's own default is 0 ms,
which disables promotion (strict short-first): pass ``long_max_wait_s=0``. The feature itself is off
by default there.

In portbench: a request is a recovery request when it has generated a token (``view.decoded > 0``;
the ``vllm_v1`` engine keeps emitted tokens across its preemptions; one preempted before its first
token cannot be told from a fresh one and keeps its lane); within a lane, the engine's queue order
(arrival, preempted requests in front). The engine model decides what happens to a request that
does not fit (skipped under ``lssp``, head-of-line under ``vllm_v1``). No preemption.

Aging changes the order with the clock alone, yet no timer is needed: a key policy only admits, from
the view alone, and a step the engine skips is one in which no waiting request can be admitted
whatever the order.
"""

from __future__ import annotations

import numpy as np

from ..engine.queue import KeyPolicy
from . import register

IMMEDIATE, AGED_LONG, SHORT, LONG = range(4)


@register
class ShortRequestFirst(KeyPolicy):
    """Short/long prompt lanes, recovery lane first, long requests promoted after a maximum wait."""

    name = "short_request_first"

    def __init__(self, threshold: int = 256, long_max_wait_s: float = 2.0):
        if not threshold >= 0:
            raise ValueError(f"short_request_first: threshold must be >= 0, got {threshold!r}")
        if not long_max_wait_s >= 0:
            raise ValueError(f"short_request_first: long_max_wait_s must be >= 0 (0 = never "
                             f"promote), got {long_max_wait_s!r}")
        self.threshold = threshold
        self.long_max_wait_s = float(long_max_wait_s)

    def key(self, view, w) -> np.ndarray:
        """The lane of waiting requests ``w`` now (0 immediate, 1 aged long, 2 short, 3 long)."""
        short = view.input_tokens[w] <= self.threshold
        lane = np.where(short, SHORT, LONG)
        if self.long_max_wait_s > 0 and short.any():
            aged = ~short & (view.now - view.arrival_s[w] >= self.long_max_wait_s)
            lane[aged] = AGED_LONG
        lane[np.asarray(view.decoded)[w] > 0] = IMMEDIATE
        return lane
