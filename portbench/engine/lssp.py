"""The study's engine model, ``lssp``: fixed 1 ms steps, free prefill, one token a step.

One run replays one window on one engine from an empty state. Each step ``s`` (start time
``s * step_s``) does, in order:

1. **visibility** — every request with ``arrival <= s * step_s`` joins the waiting queue (arrival order);
2. **scheduling** — the policy looks at a read-only :class:`EngineView` and returns a :class:`Decision`
   (admissions, preemptions, holds); the engine re-checks its hard limits while applying it;
3. **decode** — every running, un-held request gains one token, stamped at the step's end
   ``(s + 1) * step_s``; a request that reaches its true output length completes and leaves at once.

Steps in which nothing can change are not walked one by one: after a step the engine jumps to the
next step at which anything can (an arrival becomes visible, a request completes, the policy's own
timer fires — see :class:`Decision` — or the policy admitted, preempted or held something, unless it
called the decision steady), decoding the skipped steps in bulk. ``event_skipping=False`` walks every
step and asks the policy at each; the tests (and :func:`portbench.testing.check_policy`, for any
policy) prove both give identical results, request by request. A policy that declares neither
``event_driven`` nor ``admission_only`` is always walked step by step.

The policy interface is in :mod:`portbench.engine.api`.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from typing import ClassVar

import numpy as np

from ..workload import Window
from .api import (NEVER, NOTHING, Decision, EngineView, Policy, PolicyContractError, RunResult, check_decision,
                  check_in_window, read_only, skips_steps)


@dataclasses.dataclass(frozen=True)
class LsspModel:
    """The original study's engine model: fixed 1 ms steps, free prefill, one token per step.

    Hard limits are checked at admission only (KV use keeps growing with decoded tokens and may pass
    the cap, as in the study). ``drain_s`` bounds the run after the last arrival is enqueued: the
    study's 50,000 steps of 1 ms.
    """

    name: ClassVar[str] = "lssp"
    #: Step k starts at exactly ``k * step_s``.
    fixed_steps: ClassVar[bool] = True
    step_s: float = 0.001
    max_active_sequences: int = 64
    max_batch_tokens: int = 4096
    max_kv_tokens: int = 131072
    drain_s: float = 50.0

    @property
    def drain_steps(self) -> int:
        """Steps run after the last arrival is enqueued (``drain_s`` in whole steps)."""
        return max(1, round(self.drain_s / self.step_s))

    @property
    def longest_quiet_step_s(self) -> float:
        """The longest a step can last in which only decoding happens."""
        return self.step_s

    @functools.cached_property
    def max_sequences(self) -> int:
        """The most requests that can run at once: a sequence slot each, and a batch token each."""
        return min(self.max_active_sequences, self.max_batch_tokens)

    def make_engine(self, window, policy, priority=None):
        return _Engine(window, policy, self, priority)


def visible_steps(arrival_s: np.ndarray, step_s: float) -> np.ndarray:
    """The first step ``s`` whose start ``s * step_s`` (a float product) is at or after each arrival."""
    s = np.ceil(arrival_s / step_s).astype(np.int64)
    # Fix float round-off so that the rule is exactly "arrival <= s * step_s" for the smallest s.
    too_late = (s - 1) * step_s >= arrival_s
    while too_late.any():
        s[too_late] -= 1
        too_late = (s - 1) * step_s >= arrival_s
    too_early = s * step_s < arrival_s
    while too_early.any():
        s[too_early] += 1
        too_early = s * step_s < arrival_s
    return s




class _Engine:
    def __init__(self, window: Window, policy: Policy, model: LsspModel, priority=None):
        self.model = model
        self.policy = policy
        self.n = n = len(window)
        self.arrival_s = window.arrival_s
        self.deadline_s = window.deadline_s
        self.input_tokens = window.input_tokens
        self.output_tokens = window.output_tokens
        self.predicted = window.predicted_output_tokens
        self.priority = np.ones(n) if priority is None else np.asarray(priority, dtype=np.float64)
        self.block_hashes = window.block_hashes
        self.block_tokens = int(window.meta["block_tokens"]) if window.block_hashes is not None else None
        self.visible = visible_steps(window.arrival_s, model.step_s).tolist()
        self.inp = window.input_tokens.tolist()
        self._inp_array = np.asarray(window.input_tokens, dtype=np.int64)
        self.out = window.output_tokens.tolist()
        # Tokens produced, per request: exact for a request that is not running. A running one's count
        # is ``_tick - _base[i]``: ``_tick`` counts decode steps, and a held step moves the request's
        # base instead, so a step costs the engine nothing per request but for holds, first tokens
        # and completions (a heap of the tick at which each running request emits its last token; a
        # hold only raises a request's tick, so its row is brought up to date when it comes first).
        self.decoded = [0] * n
        self._tick = 0
        self._base: dict[int, int] = {}     # running request -> _tick - decoded (insertion = admission)
        self._done_heap: list[tuple[int, int]] = []    # (tick of the last token, request); stale rows kept
        self._unstarted: list[int] = []     # running requests that have produced no token yet
        self.admit_step = [-1] * n          # step of the first admission
        self.first_step = [-1] * n          # step whose decode produced the first token ever
        self.finish_step = [-1] * n         # step whose decode produced the last token
        self.waiting: list[int] = []
        self._waiting_set: set[int] = set()     # the same requests
        self.queue_log: list[int] = []      # the queue's changes: i joined, ~i left (see EngineView)
        self.running: list[int] = []
        self._kv_running = 0                # Σ (prompt + decoded) over running requests
        self.prev_kv_used = 0               # KV in use at the start of the step before this one
        self.step = 0
        self.n_preemptions = 0
        self.refused: tuple = ()            # (request, reason) of the last decision's refused admissions

    def kv_used(self) -> int:
        return self._kv_running

    def clock(self) -> tuple[float, float]:
        """(the step's start, the previous step's start), in seconds: steps of fixed length."""
        step_s = self.model.step_s
        return self.step * step_s, (self.step - 1) * step_s

    def decoded_of(self, ids) -> list:
        tick, base, decoded = self._tick, self._base, self.decoded
        return [tick - base[i] if i in base else decoded[i] for i in ids]

    def cached_prefix_of(self, ids) -> np.ndarray:
        return np.zeros(len(ids), dtype=np.int64)       # no prefix cache

    def decoded_array(self) -> np.ndarray:
        tick, decoded = self._tick, self.decoded
        for i, b in self._base.items():
            decoded[i] = tick - b
        return read_only(np.asarray(decoded, dtype=np.int64))

    def _first_done(self) -> int | None:
        """The tick at which the first running request emits its last token (None: nothing runs)."""
        heap, base, out = self._done_heap, self._base, self.out
        while heap:
            k, i = heap[0]
            b = base.get(i)
            if b is None:
                heapq.heappop(heap)             # a row of a request that has left
            elif out[i] + b == k:
                return k
            else:                               # held since it was pushed: a row with its tick now
                heapq.heapreplace(heap, (out[i] + b, i))
        return None

    def run(self, event_skipping: bool = True) -> None:
        m = self.model
        n = self.n
        order = np.argsort(np.asarray(self.visible, dtype=np.int64), kind="stable").tolist()   # by (visible, id)
        next_arrival = 0                    # index into `order`
        view = EngineView(self)
        self.policy.reset(view.refresh())
        if n == 0:
            return
        self.step = self.visible[order[0]]
        event_skipping = skips_steps(self.policy, event_skipping)
        lazy = event_skipping and self.policy.admission_only
        seq_cap = m.max_sequences
        visible = [self.visible[i] for i in order]      # in arrival order
        last_step = visible[-1] + m.drain_steps - 1     # the drain bound: the last arrival's step on
        schedule, refresh, policy = self.policy.schedule, view.refresh, self.policy
        waiting_set = self._waiting_set
        while True:
            s = self.step
            # 1. visibility
            while next_arrival < n and visible[next_arrival] <= s:
                i = order[next_arrival]
                self.waiting.append(i)
                waiting_set.add(i)
                self.queue_log.append(i)
                next_arrival += 1
            # 2. scheduling. An admission-only policy has nothing to decide while the queue is empty
            # or no sequence slot is free (whatever it proposed would be refused).
            running = self.running
            if (self.waiting and not (lazy and len(running) >= seq_cap)) or (running and not lazy):
                decision = check_decision(policy, schedule(refresh()))
            else:
                decision = NOTHING
            kv_at_start = self._kv_running
            if decision is NOTHING:
                self.refused = ()
                admitted = False
            else:
                admitted = self._apply(decision)
            hold = decision.hold
            # 3. decode, possibly over several steps at once. A decision that changed the engine's
            # state (an admission, a preemption, a hold) is an event: the policy is asked again next
            # step — unless it is admission-only and will not be asked then (nothing waits, or no slot),
            # or the decision is steady and every admission was granted.
            steady = decision.steady and not self.refused       # arrivals do not end its stretch
            if event_skipping and (not (admitted or hold or decision.preempt) or (
                    lazy and (not self.waiting or len(self.running) >= seq_cap)) or steady):
                horizon = self._next_event_step(
                    decision, visible[next_arrival] if next_arrival < n and not steady else NEVER)
                if horizon > last_step + 1:
                    horizon = last_step + 1
                span = horizon - s if horizon - s > 1 else 1
            else:
                span = 1
            n_decoding = len(self.running) - len(hold)
            kv_after = self._kv_running
            self._decode(s, span, hold)
            # a stretch changes nothing but decoding: one token per running request per step (the
            # KV at the start of its last step counts this step's admissions; of this step, not)
            self.prev_kv_used = kv_at_start if span == 1 else kv_after + (span - 1) * n_decoding
            self.step = s + span
            if self.step > last_step:
                break
            if not self.waiting and not self.running:
                if next_arrival == n:
                    break
                if visible[next_arrival] > self.step:
                    self.prev_kv_used = 0           # idle steps: nothing in use
                    self.step = visible[next_arrival]

    def _next_event_step(self, decision, next_visible) -> int:
        """The first step after this one at which something can change (``next_visible``: the step
        at which the next arrival becomes visible, NEVER when none is left)."""
        s = self.step
        t = next_visible
        # a request completes during step (s + remaining - 1) and frees its slot for the step after
        first_done = self._first_done()
        if first_done is not None and decision.hold and decision.steady:
            # held requests gain no token in a steady stretch: the first completion is another's
            base, out, hold = self._base, self.out, decision.hold
            first_done = min((out[i] + b for i, b in base.items() if i not in hold), default=None)
        if first_done is not None and s + first_done - self._tick < t:
            t = s + first_done - self._tick
        wake = s + decision.wake_after_steps
        if decision.wake_at_s < NEVER:
            # the first step starting at or after wake_at_s, one step early to absorb float round-off
            wake = min(wake, math.ceil(decision.wake_at_s / self.model.step_s) - 1)
        if wake < t:
            t = max(wake, s + 1)
        return t      # NEVER only when no arrival is left: the drain limit then bounds the jump

    def _apply(self, d: Decision) -> bool:
        """Apply a decision under the engine's limits; True when something was admitted."""
        waiting_set = self._waiting_set
        for i in d.preempt:
            if i not in self.running:
                raise PolicyContractError(f"policy {self.policy.name!r} preempted request {i} at step "
                                          f"{self.step}, which is not running")
            self.running.remove(i)
            self._kv_running -= self.inp[i] + self._tick - self._base.pop(i)
            self.decoded[i] = 0           # recompute preemption: generated tokens are lost
            if i in self._unstarted:
                self._unstarted.remove(i)
            waiting_set.add(i)            # (back at the queue's front once admissions are taken)
            self.n_preemptions += 1
        self.refused = ()
        admitted = self._admit(d) if d.admit is not None else False
        for i in d.preempt:
            self.waiting.insert(0, i)
            self.queue_log.append(i)
        return admitted

    def _admit(self, d: Decision) -> bool:
        """The admissions of decision ``d``, taken lazily, under the study's rule: a proposed request
        that does not fit (a sequence slot, its whole prompt in the KV room left) is skipped and the
        walk goes on, until no sequence slot is left. True when something was admitted. The queue
        itself changes only once all are taken."""
        m = self.model
        waiting_set = self._waiting_set
        preempt = d.preempt
        running, base, heap = self.running, self._base, self._done_heap
        inp, out, decoded = self.inp, self.out, self.decoded
        seq_cap, n = m.max_sequences, self.n
        admitted, refused = [], []
        proposal = d.admit
        if hasattr(proposal, "__array__") and len(proposal) > 32:
            proposal = np.asarray(proposal)
            # a long proposal: a prompt that does not fit the KV room left now never will in this
            # walk (the room only shrinks), so such requests are refused at once, not walked
            if not (0 <= proposal.min() and proposal.max() < n):
                self._out_of_window(proposal)
            fit = self._inp_array[proposal] <= m.max_kv_tokens - self._kv_running
            if not fit.all():
                refused.append((-1, "kv"))       # (not listed one by one: see EngineView.refused)
                proposal = proposal[fit]
            proposal = proposal.tolist()
        for i in proposal:
            if preempt and i in preempt:
                continue                  # a request evicted now is not re-admitted now
            if i not in waiting_set:
                self._out_of_window([i])
                raise PolicyContractError(f"policy {self.policy.name!r} admitted request {i} at step "
                                          f"{self.step}, which is not waiting")
            # The engine's hard limits, checked in order (earlier admissions count at once).
            if len(running) + 1 > seq_cap:
                refused.append((i, "seqs"))
                break                     # no slot left: nothing further can be admitted
            elif self._kv_running + inp[i] > m.max_kv_tokens:
                refused.append((i, "kv"))
            else:
                running.append(i)
                self._kv_running += inp[i] + decoded[i]
                b = base[i] = self._tick - decoded[i]
                heapq.heappush(heap, (out[i] + b, i))
                if self.first_step[i] < 0:
                    self._unstarted.append(i)
                if self.admit_step[i] < 0:      # the first admission (metrics.py's definition)
                    self.admit_step[i] = self.step
                admitted.append(i)
                waiting_set.discard(i)
        if refused:
            self.refused = tuple(refused)
        if admitted:
            k = len(admitted)
            if self.waiting[:k] == admitted:     # the queue's head, in its order (the common case)
                del self.waiting[:k]
            else:
                self.waiting = [i for i in self.waiting if i in waiting_set]
            self.queue_log.extend(~i for i in admitted)
        return bool(admitted)

    def _out_of_window(self, ids) -> None:
        """Raise PolicyContractError for the first id in ``ids`` that is not a request of the window."""
        for i in ids:
            check_in_window(self.policy, self.step, i, self.n)

    def _decode(self, s: int, span: int, hold) -> None:
        """Steps ``s`` .. ``s + span - 1``: every running request not in ``hold`` gains a token a step;
        one that reaches its output length leaves, its last token stamped at its own step."""
        base, out, heap = self._base, self.out, self._done_heap
        tick = self._tick
        n_decoding = len(base)
        if hold:
            held = base.keys() & hold           # held: its count stays, so its base moves on
            n_decoding -= len(held)
            for i in held:
                base[i] += span
        if self._unstarted:
            first, still = self.first_step, []
            for i in self._unstarted:
                if hold and i in hold:
                    still.append(i)
                else:
                    first[i] = s                # the first token ever produced
            self._unstarted = still
        self._tick = end = tick + span
        kv = self._kv_running + span * n_decoding
        if heap and heap[0][0] <= end:
            finish, decoded, inp = self.finish_step, self.decoded, self.inp
            gone, kept = [], []
            while heap and heap[0][0] <= end:
                row = heapq.heappop(heap)
                k, i = row
                b = base.get(i)
                if b is None:
                    continue                    # a row of a request that has left
                if out[i] + b != k:             # held since: its row with its tick now
                    heapq.heappush(heap, (out[i] + b, i))
                    continue
                if hold and i in hold:          # (only a zero-length output can get here held)
                    kept.append(row)
                    continue
                left = k - tick                 # tokens it still had to produce
                decoded[i] = out[i]
                finish[i] = s + left - 1
                kv -= inp[i] + out[i] - left + span
                del base[i]
                gone.append(i)
            for row in kept:
                heapq.heappush(heap, row)
            if len(gone) == 1:
                self.running.remove(gone[0])
            elif gone:
                gone = set(gone)
                self.running = [i for i in self.running if i not in gone]
        self._kv_running = kv

    def result(self, window: Window) -> RunResult:
        dt = self.model.step_s

        def stamp(steps, offset):
            arr = np.array(steps, dtype=np.float64)
            out = (arr + offset) * dt
            out[arr < 0] = np.nan
            return out

        return RunResult(window.window_id, self.policy.name, self.model.name, window.arrival_s,
                         window.deadline_s, window.input_tokens, window.output_tokens, self.priority,
                         admit_s=stamp(self.admit_step, 0), first_token_s=stamp(self.first_step, 1),
                         finish_s=stamp(self.finish_step, 1),
                         duration_s=(self.step - 1) * dt if self.n else 0.0, n_steps=self.step,
                         n_preemptions=self.n_preemptions)
