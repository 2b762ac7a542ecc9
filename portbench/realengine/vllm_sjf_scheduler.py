"""``sjf_aging`` as a vLLM v1 scheduler subclass, plugged in with ``scheduler_cls``.

The simulator's policy (:mod:`portbench.policies.sjf_aging`) serves the waiting queue highest score
first, the score being a length part (the study's *predicted* output length, short is better) plus
a wait-time aging part (``now - arrival``); ties go to the earlier arrival. The formula and its
defaults (TensorRT-LLM's ``SJFWaitingQueue``, vLLM PR #29366) are not repeated here: the scores come
from :class:`~portbench.policies.sjf_aging.SjfAging` itself (``reset`` + ``scores`` over a small view
of the waiting requests), so one definition serves both engines.

How it maps onto vLLM's :class:`vllm.v1.core.sched.scheduler.Scheduler` (read from vLLM 0.32.0's
source; the scheduler API is not public and changes between releases):

- **The order**: the engine runs with ``scheduling_policy="fcfs"``, whose waiting queue is a deque
  that vLLM's waiting pass walks from the front. Before each :meth:`schedule` the deque is rebuilt
  in score order, highest first, ties by arrival then submission order (the simulator's arrival, then
  request id). Aging changes the order with the clock alone, so it is re-sorted at every call, at the
  clock time of that call (``time.time()``, the clock of vLLM's ``Request.arrival_time``, which the
  replay sets to the request's scaled trace arrival). A request preempted during the step goes to the
  deque's front (vLLM's rule) and takes its score place at the next call.
- **The predicted length**: the replay hands each request's ``predicted_output_tokens`` to
  :meth:`begin_replay` before it submits anything (``PolicySpec.request_fields``), by the id the
  replay submits; :meth:`add_request` looks it up once (vLLM's internal id is that id plus ``-`` and
  8 random characters). A request the replay did not describe (the engine's warm-up) counts as
  length 0 and is counted in ``stats["undescribed"]``.
- **Why FCFS and not vLLM's ``priority`` heap**: under ``fcfs`` a KV-exhausted step preempts the
  newest admission (``running[-1]``), which is the simulator's ``vllm_v1`` engine rule for every
  admission-only policy; under ``priority`` the victim would be chosen by a ``Request.priority``
  frozen at some past score. And no field of vLLM's ``Request`` is overwritten.

What could not be expressed (the gaps, also listed in :data:`GAPS`):

1. Admission is vLLM's: head-of-line (the first request in score order that finds no KV blocks or
   no sequence slot stops admission, as the simulator's ``vllm_v1`` engine; the ``lssp`` engine
   skips such a request and goes on), and KV blocks are allocated chunk by chunk, not the whole
   prompt up front.
2. vLLM preempts (recompute) when a running request finds no free KV block; the simulator's policy
   never preempts (its ``lssp`` engine neither). Size the KV cache so it does not happen and check
   ``n_preemptions``.
3. The aging constants are absolute seconds (``time_median`` = 5 s) on the real clock: a real engine
   slower than the simulator is calibrated to a lower λ_ref, its windows last longer and its
   requests wait longer, so aging weighs more against length than in the simulator at the same
   operating region.
4. The order is set once per :meth:`schedule` call, at its start: every waiting request is scored
   at the same instant, as in the simulator's step (nothing is lost), but requests that arrive
   while the engine runs a step wait for the next call, as for every vLLM policy.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
from vllm.v1.core.sched.scheduler import Scheduler

from ..policies.sjf_aging import SjfAging

QUALNAME = "portbench.realengine.vllm_sjf_scheduler.SjfAgingScheduler"

GAPS = (
    "admission is vLLM's head-of-line walk with chunked KV allocation (the lssp engine skips misfits)",
    "vLLM may still preempt (recompute) on KV exhaustion; sjf_aging never preempts",
    "aging constants are absolute real seconds: a slower engine's longer waits age more",
    "the order is fixed at the start of each schedule() call (arrivals during a step wait for the next)",
)


@dataclasses.dataclass
class _View:
    """The part of the simulator's engine view that :class:`SjfAging` reads."""

    now: float
    arrival_s: np.ndarray
    predicted_output_tokens: np.ndarray
    input_tokens: np.ndarray


def score_order(requests, predicted: dict, rule: SjfAging, now: float, seq: dict | None = None) -> list:
    """``requests`` (vLLM ``Request`` objects, or anything with ``request_id``, ``arrival_time`` and
    ``num_prompt_tokens``) in ``rule``'s order at wall-clock time ``now``: highest score first, ties by
    arrival, then by ``seq`` (submission order; request id when absent). ``predicted`` maps a request
    id to its predicted output length (missing: 0)."""
    reqs = list(requests)
    if len(reqs) < 2:
        return reqs
    view = _View(now=float(now),
                 arrival_s=np.fromiter((r.arrival_time for r in reqs), np.float64, len(reqs)),
                 predicted_output_tokens=np.fromiter((predicted.get(r.request_id, 0) for r in reqs),
                                                     np.float64, len(reqs)),
                 input_tokens=np.fromiter((r.num_prompt_tokens for r in reqs), np.float64, len(reqs)))
    rule.reset(view)
    score = rule.scores(view, np.arange(len(reqs)))
    if seq is None:
        tie = np.argsort(np.argsort(np.array([r.request_id for r in reqs], dtype=object)))
    else:
        tie = np.fromiter((seq.get(r.request_id, -1) for r in reqs), np.int64, len(reqs))
    order = np.lexsort((tie, view.arrival_s, -score))
    return [reqs[k] for k in order]


class SjfAgingScheduler(Scheduler):
    """vLLM v1 scheduler whose FCFS waiting queue is re-sorted by ``sjf_aging``'s score every step.

    Parameters are :class:`SjfAging`'s (set them with :meth:`sjf_configure`; the engine builds the
    scheduler itself, so the constructor keeps vLLM's signature).
    """

    rule: SjfAging = SjfAging()          # the simulator's policy: its parameters and its score

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._predicted: dict[str, float] = {}     # by the replay's request id
        self._length: dict[str, float] = {}        # by vLLM's request id, for the queued requests
        self._seq: dict[str, int] = {}
        self._counter = itertools.count()
        self.sjf_reset()

    # -- configuration, per-replay data, counters --------------------------------------------------
    def sjf_configure(self, **params) -> None:
        """Use ``SjfAging(**params)`` (its defaults for what is not given); resets the counters."""
        self.rule = SjfAging(**params)
        self.sjf_reset()

    def sjf_reset(self) -> None:
        self.stats = {"calls": 0, "reordered_steps": 0, "undescribed": 0}

    def begin_replay(self, request_data: dict) -> None:
        """Per-request data of the replay about to start: ``{request_id: {"predicted_output_tokens":
        n, ...}}``; forgets the previous replay's and resets the counters."""
        self._predicted = {rid: float(d["predicted_output_tokens"]) for rid, d in request_data.items()}
        self._length, self._seq = {}, {}
        self.sjf_reset()

    # -- the queue --------------------------------------------------------------------------------
    def add_request(self, request) -> None:
        rid = request.request_id
        if rid not in self.requests:
            self._seq[rid] = next(self._counter)
            length = self._predicted.get(rid, self._predicted.get(rid.rsplit("-", 1)[0]))
            if length is None:
                self.stats["undescribed"] += 1
            self._length[rid] = length or 0.0
        super().add_request(request)

    def sjf_reorder(self, now: float | None = None) -> bool:
        """Put the waiting queue in score order at ``now`` (default: the wall clock); True when it
        changed."""
        waiting = self.waiting
        if len(waiting) < 2:
            return False
        now = time.time() if now is None else now
        ordered = score_order(waiting, self._length, self.rule, now, self._seq)
        if all(a is b for a, b in zip(ordered, waiting)):
            return False
        waiting.clear()
        waiting.extend(ordered)
        return True

    def schedule(self, *args, **kwargs):
        self.stats["calls"] += 1
        if self.sjf_reorder():
            self.stats["reordered_steps"] += 1
        for rid in [r for r in self._seq if r not in self.requests]:
            del self._seq[rid], self._length[rid]          # finished or aborted
        return super().schedule(*args, **kwargs)
