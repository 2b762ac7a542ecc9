"""SLAI's step plan on an engine whose requests arrive one by one: the simulator's own policy.

SLAI's vLLM port (:class:`~portbench.realengine.vllm_slai_scheduler.SlaiScheduler`) plans each of
vLLM's steps by asking ``slai_faithful`` itself (:class:`portbench.policies.slai_faithful.SlaiFaithful`,
imported, not copied): its LSTs, its prompt-only block count, its shadow prefill and its
shortest-prompt-first admission walk are the policy's code, run on a view of the engine's state
(:class:`~portbench.engine.api.EngineView`, the view the simulator's engines give it). So the port
and the simulator's policy under ``vllm_v1`` plan the same step from the same state; the port then
has vLLM carry the plan out as ``vllm_v1`` carries a decision out.

Two pieces, neither of which imports vLLM:

- :class:`ArrivingSlai`: ``SlaiFaithful`` unchanged but for what it knows in advance. The simulator
  hands a policy the whole window at :meth:`~SlaiFaithful.reset`; an engine meets its requests as
  they arrive, so they are described then (:meth:`ArrivingSlai.describe`): the prompt and arrival
  lists grow, and the waiting queue is keyed on (prompt, id) as one integer, the order of the
  policy's rank over the window (shortest prompt first, then id), instead of that rank.
- :class:`EngineState`: the engine side of an ``EngineView`` over a live engine: the port gives it,
  at each step, the clock, the running requests and the KV tokens in use, and tells it the waiting
  queue's changes (a request joined or left) as they happen.

:class:`SlaiPlan` puts the two together: request ids are given in order of arrival (the window's
order in a replay), and :meth:`SlaiPlan.decide` returns the policy's
:class:`~portbench.engine.api.Decision` for the step about to run.

The plan asks the policy at every step, as ``vllm_v1``'s step-by-step walk does (the engine's
event skipping gives the same runs: ``tests/test_event_skipping.py``); the decision's timers
(``steady``, ``wake_*``) are therefore not needed and not read.
"""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np

from ..engine.api import Decision, EngineView
from ..engine.queue import WaitingOrder
from ..policies.slai_faithful import SlaiFaithful, SlaiRule

#: (prompt, id) as one int64: prompt << _ID_BITS | id (ids below 2**32, prompts below 2**31).
_ID_BITS = 32


class _GrowingWaitingOrder(WaitingOrder):
    """:class:`~portbench.engine.queue.WaitingOrder` over a request set that grows between calls
    (its per-request key table is sized at its first call)."""

    def get(self, view, key, evict_key=None):
        if self.ids is not None and len(self._key_of) < view.n_requests:
            grown = np.zeros(max(view.n_requests, 2 * len(self._key_of)), dtype=np.int64)
            grown[:len(self._key_of)] = self._key_of
            self._key_of = grown
        return super().get(view, key, evict_key)


class ArrivingSlai(SlaiFaithful):
    """``slai_faithful`` for requests described as they arrive (:meth:`describe`), not at reset.

    Reset it on a view with no requests; every decision is then the simulator's policy's, whose
    state (block manager, shadow prefill, LSTs, waiting order) it keeps as it does."""

    def reset(self, view):
        if view.n_requests:
            raise ValueError("ArrivingSlai is reset with no requests: describe() each as it arrives")
        super().reset(view)
        self._prompts = np.zeros(64, dtype=np.int64)
        self._prompt_rank_array = self._prompt_key     # the rank's order, computed per request
        self._waiting = _GrowingWaitingOrder()

    def describe(self, i: int, prompt: int, arrival_s: float) -> None:
        """Request ``i`` (the next id: ids are given in arrival order) has arrived."""
        if i != len(self._inp):
            raise ValueError(f"request ids are given in order: expected {len(self._inp)}, got {i}")
        if i >= len(self._prompts):
            self._prompts = np.concatenate((self._prompts, np.zeros_like(self._prompts)))
        self._prompts[i] = prompt
        self._inp.append(int(prompt))
        self._key.append((float(arrival_s), i))

    def _prompt_key(self, ids: np.ndarray) -> np.ndarray:
        """Shortest prompt first, then id: the order of ``SlaiFaithful``'s rank over a window."""
        return (self._prompts[ids] << _ID_BITS) | ids


class EngineState:
    """What an :class:`~portbench.engine.api.EngineView` reads from its engine, kept by the port.

    ``model``: the engine's limits the policy reads (``max_kv_tokens``, ``max_active_sequences``,
    ``max_num_batched_tokens``, ``max_sequences``, ``enable_chunked_prefill``, ``block_size``,
    ``longest_quiet_step_s``). The request arrays grow with :meth:`add`; ``waiting_ids()`` lists
    the waiting requests' ids in the engine's order (read when the policy first needs the whole
    queue; afterwards it follows ``queue_log``); ``decoded(ids)``: the tokens each of ``ids`` has
    produced (read only where the policy asks)."""

    def __init__(self, model, waiting_ids, decoded):
        self.model = model
        self._waiting_ids, self._decoded_of = waiting_ids, decoded
        self._arrival = np.zeros(64)
        self._prompt = np.zeros(64, dtype=np.int64)
        self._unknown = np.full(64, np.nan)
        self.n = 0
        self.block_hashes = self.block_tokens = None
        self.step = -1
        self.now = self.prev_start = 0.0
        self.kv = self.prev_kv_used = 0
        self.running: list[int] = []
        self.queue_log: list[int] = []      # i joined the queue, ~i left it
        self.refused = ()

    def add(self, prompt: int, arrival_s: float) -> int:
        """A new request: its id."""
        i = self.n
        if i >= len(self._arrival):
            self._arrival = np.concatenate((self._arrival, np.zeros_like(self._arrival)))
            self._prompt = np.concatenate((self._prompt, np.zeros_like(self._prompt)))
            self._unknown = np.full(2 * len(self._unknown), np.nan)
        self._arrival[i], self._prompt[i] = arrival_s, prompt
        self.n = i + 1
        return i

    def begin_step(self, now: float, running: list, kv_used: int) -> None:
        """A step starts at ``now`` with ``running`` (ids, in the engine's order) and ``kv_used``
        tokens computed by them."""
        self.prev_start, self.prev_kv_used = self.now, self.kv
        self.step += 1
        self.now, self.running, self.kv = now, running, kv_used

    # the engine interface EngineView reads
    @property
    def arrival_s(self):
        return self._arrival[:self.n]

    @property
    def input_tokens(self):
        return self._prompt[:self.n]

    @property
    def deadline_s(self):            # not known to a live engine (slai_faithful reads none of these)
        return self._unknown[:self.n]

    predicted = priority = deadline_s

    @property
    def waiting(self) -> list:
        return self._waiting_ids()

    def clock(self):
        return self.now, self.prev_start

    def kv_used(self) -> int:
        return self.kv

    def decoded_array(self):
        return np.array(self._decoded_of(range(self.n)), dtype=np.int64)

    def decoded_of(self, ids) -> list:
        return self._decoded_of(ids)

    def cached_prefix_of(self, ids):
        return np.zeros(len(ids), dtype=np.int64)


def plan_model(*, max_kv_tokens: int, max_active_sequences: int, max_num_batched_tokens: int,
               enable_chunked_prefill: bool, block_size: int):
    """The engine limits a policy reads, as ``vllm_v1``'s model states them. The longest quiet step
    is unbounded: the plan is asked at every step, so the policy never plans skipped ones."""
    return types.SimpleNamespace(
        max_kv_tokens=max_kv_tokens, max_active_sequences=max_active_sequences,
        max_num_batched_tokens=max_num_batched_tokens,
        max_sequences=min(max_active_sequences, max_num_batched_tokens),
        enable_chunked_prefill=enable_chunked_prefill, block_size=block_size,
        longest_quiet_step_s=math.inf)


class SlaiPlan:
    """``slai_faithful``'s decision at each step of a live engine.

    ``model``: :func:`plan_model`; ``rule``: the :class:`SlaiRule`; ``max_num_seqs``, ``block_size``,
    ``watermark``: the policy's own (its block manager's). ``waiting_ids()``: the engine's waiting
    requests' ids, in its order. Tell it each arrival (:meth:`arrive`) and each change of the waiting
    queue (:meth:`left_queue`, :meth:`joined_queue`, or :meth:`resync` with the whole queue); ask
    :meth:`decide` at each step. ``decoded(ids)``: the tokens each of ``ids`` has produced."""

    def __init__(self, model, rule: SlaiRule, waiting_ids, decoded, *, max_num_seqs: int,
                 block_size: int = 16, watermark: float = 0.01):
        self.state = EngineState(model, waiting_ids, decoded)
        self.in_queue: set[int] = set()         # the ids the plan has been told are waiting
        self.policy = ArrivingSlai(max_num_seqs, block_size, watermark, **dataclasses.asdict(rule))
        self.policy.reset(EngineView(self.state).refresh())

    @property
    def rule(self) -> SlaiRule:
        return self.policy.rule

    def use_step(self, step_s: float) -> None:
        """Θ counts steps of ``step_s`` seconds from now on (a real engine's measured step)."""
        if step_s != self.policy.rule.step_s:
            self.policy.rule = dataclasses.replace(self.policy.rule, step_s=step_s)

    def arrive(self, prompt: int, arrival_s: float, waiting: bool = True) -> int:
        """A request arrived: its id (the next, in arrival order); ``waiting``: it joins the queue."""
        i = self.state.add(prompt, arrival_s)
        self.policy.describe(i, prompt, arrival_s)
        if waiting:
            self.joined_queue(i)
        return i

    def left_queue(self, i: int) -> None:
        self.in_queue.discard(i)
        self.state.queue_log.append(~i)

    def joined_queue(self, i: int) -> None:
        self.in_queue.add(i)
        self.state.queue_log.append(i)

    def resync(self, waiting: set) -> None:
        """The waiting queue is now ``waiting`` (ids): log what left and joined since it was told."""
        for i in sorted(self.in_queue - waiting):
            self.left_queue(i)
        for i in sorted(waiting - self.in_queue):
            self.joined_queue(i)

    def decide(self, now: float, running: list, kv_used: int) -> Decision:
        """The policy's decision for the step starting at ``now`` (see :meth:`EngineState.begin_step`)."""
        self.state.begin_step(now, running, kv_used)
        return self.policy.schedule(EngineView(self.state).refresh())
