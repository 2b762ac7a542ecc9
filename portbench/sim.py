"""A deterministic trace-driven engine loop with pluggable engine models and policies.

One run replays one window on one engine from an empty state. Each step ``s`` (start time
``s * step_s``) does, in order:

1. **visibility** — every request with ``arrival <= s * step_s`` joins the waiting queue (arrival order);
2. **scheduling** — the policy looks at a read-only :class:`EngineView` and returns a :class:`Decision`
   (admissions, preemptions, holds); the engine re-checks its hard limits while applying it;
3. **decode** — every running, un-held request gains one token, stamped at the step's end
   ``(s + 1) * step_s``; a request that reaches its true output length completes and leaves at once.

Steps in which nothing can change are not walked one by one: after a step the engine jumps to the
next step at which anything can (an arrival becomes visible, a request completes, or the policy's own
timer fires, see :meth:`Policy.wake_step`), decoding the skipped steps in bulk. ``event_skipping=False``
walks every step; the tests prove both give identical results, request by request.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from .workload import Window

NEVER = math.inf


@dataclasses.dataclass(frozen=True)
class LsspModel:
    """The original study's engine model: fixed 1 ms steps, free prefill, one token per step.

    Hard limits are checked at admission only (KV use keeps growing with decoded tokens and may pass
    the cap, as in the study). ``drain_steps`` bounds the run after the last arrival is enqueued.
    """

    name: ClassVar[str] = "lssp"
    #: Step k starts at exactly ``k * step_s``.
    fixed_steps: ClassVar[bool] = True
    step_s: float = 0.001
    max_active_sequences: int = 64
    max_batch_tokens: int = 4096
    max_kv_tokens: int = 131072
    drain_steps: int = 50_000

    @property
    def longest_quiet_step_s(self) -> float:
        """The longest a step can last in which only decoding happens."""
        return self.step_s

    def make_engine(self, window, policy, priority=None):
        return _Engine(window, policy, self, priority)


@dataclasses.dataclass
class Decision:
    """What a policy asks for in one step. Ids are request indices within the window.

    ``admit`` is taken in order, once; it may be a lazy iterator, which an engine with head-of-line
    admission stops consuming at its first refusal (wrap it in ``list`` to inspect it).
    """

    admit: list = dataclasses.field(default_factory=list)
    preempt: list = dataclasses.field(default_factory=list)
    hold: frozenset = frozenset()


NOTHING = Decision()


class EngineView:
    """The read-only state a policy sees. Arrays are indexed by request id; do not modify them."""

    __slots__ = ("model", "step", "now", "prev_step_start_s", "waiting", "running", "arrival_s",
                 "deadline_s", "input_tokens", "predicted_output_tokens", "priority", "decoded",
                 "kv_used", "n_requests", "_engine")

    def __init__(self, engine: "_Engine"):
        self._engine = engine
        self.model = engine.model
        self.arrival_s = engine.arrival_s
        self.deadline_s = engine.deadline_s
        self.input_tokens = engine.input_tokens
        self.predicted_output_tokens = engine.predicted
        self.priority = engine.priority
        self.n_requests = engine.n

    def refresh(self):
        e = self._engine
        self.step = e.step
        self.now = e.step * e.model.step_s
        self.prev_step_start_s = (e.step - 1) * e.model.step_s   # the step before (run or skipped)
        self.waiting = tuple(e.waiting)
        self.running = tuple(e.running)
        self.decoded = e.decoded
        self.kv_used = e.kv_used()
        return self

    @property
    def n_active(self) -> int:
        return len(self.running)


class Policy:
    """A scheduling policy. Subclasses set ``name`` and implement :meth:`schedule`.

    A policy may keep its own state across steps (reset in :meth:`reset`); it never changes the
    engine. If its decision can change at a step with no arrival and no completion (a deadline-based
    urgency threshold, a timer), it must say when in :meth:`wake_step`, or the engine will skip that
    step.
    """

    name: ClassVar[str] = ""
    #: True when :meth:`schedule` only admits (never preempts or holds) and is a pure function of the
    #: view (no state kept across steps): an engine may then skip calling it at steps where no waiting
    #: request could be admitted whatever it answered. The event-skipping tests check the claim.
    admission_only: ClassVar[bool] = False

    def reset(self, view: EngineView) -> None:
        """Called once before a run."""

    def schedule(self, view: EngineView) -> Decision:
        raise NotImplementedError

    def wake_step(self, view: EngineView) -> float:
        """The earliest step after ``view.step`` at which the decision may change on its own (a
        timer on the clock is turned into a step with :func:`first_step_when`)."""
        return NEVER


def first_step_when(view: EngineView, cond, t_guess: float) -> float:
    """The first step after ``view.step`` at whose start ``cond(now)`` may hold, for a condition on
    the clock that stays true once true; ``t_guess`` is about where it turns true.

    With fixed steps (``lssp``) step k starts at ``k * step_s`` and the answer is exact. Where steps
    vary in length (``vllm_v1``) an engine skips only steps in which nothing but decoding happens, none
    longer than the model's ``longest_quiet_step_s``: step k then starts no later than
    ``now + (k - step) * longest``, and the answer is the first step that could start with ``cond``
    true — never later than the exact one, so a policy using it is asked again in time.
    """
    s, m = view.step, view.model
    if m.fixed_steps:
        dt = m.step_s

        def start(k):
            return k * dt
    else:
        dt, now = m.longest_quiet_step_s, view.now

        def start(k):
            return now + (k - s) * dt
    guess = s + (t_guess - start(s)) / dt
    if not math.isfinite(guess):
        return NEVER if guess > 0 else s + 1
    k = max(s + 1, math.ceil(guess))
    while k > s + 1 and cond(start(k - 1)):
        k -= 1
    while not cond(start(k)):
        k += 1
    return k


@dataclasses.dataclass(frozen=True, eq=False)
class RunResult:
    """Per-request outcome of one run (times in the scaled window's seconds; NaN = never)."""

    window_id: str
    policy: str
    engine_model: str
    arrival_s: np.ndarray
    deadline_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray
    admit_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    duration_s: float               # start of the last executed step, from t = 0 (the study's span)
    n_steps: int                    # steps up to and including the last executed one
    n_preemptions: int

    @property
    def completed(self) -> np.ndarray:
        return ~np.isnan(self.finish_s)


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
        self.visible = visible_steps(window.arrival_s, model.step_s).tolist()
        self.inp = window.input_tokens.tolist()
        self.out = window.output_tokens.tolist()
        self.decoded = [0] * n
        self.admit_step = [-1] * n
        self.first_step = [-1] * n          # step whose decode produced the first token
        self.finish_step = [-1] * n         # step whose decode produced the last token
        self.waiting: list[int] = []
        self.running: list[int] = []
        self._kv_running = 0                # Σ (prompt + decoded) over running requests
        self.step = 0
        self.n_preemptions = 0

    def kv_used(self) -> int:
        return self._kv_running

    def run(self, event_skipping: bool = True) -> None:
        m = self.model
        n = self.n
        order = sorted(range(n), key=lambda i: (self.visible[i], i))
        next_arrival = 0                    # index into `order`
        view = EngineView(self)
        self.policy.reset(view.refresh())
        if n == 0:
            return
        self.step = self.visible[order[0]]
        last_step = None                    # set when the last arrival is enqueued
        while True:
            s = self.step
            # 1. visibility
            while next_arrival < n and self.visible[order[next_arrival]] <= s:
                self.waiting.append(order[next_arrival])
                next_arrival += 1
            if last_step is None and next_arrival == n:
                last_step = s + m.drain_steps - 1
            # 2. scheduling
            decision = self.policy.schedule(view.refresh()) if (self.waiting or self.running) else NOTHING
            self._apply(decision)
            # 3. decode, possibly over several steps at once
            if event_skipping and not decision.hold:
                horizon = self._next_event_step(view, next_arrival, order)
                if last_step is not None:
                    horizon = min(horizon, last_step + 1)
                span = max(1, horizon - s)
            else:
                span = 1
            self._decode(s, span, decision.hold)
            self.step = s + span
            if last_step is not None and self.step > last_step:
                break
            if not self.waiting and not self.running:
                if next_arrival == n:
                    break
                self.step = max(self.step, self.visible[order[next_arrival]])

    def _next_event_step(self, view, next_arrival, order) -> int:
        s = self.step
        t = self.visible[order[next_arrival]] if next_arrival < self.n else NEVER
        for i in self.running:
            # a request completes during step (s + remaining - 1) and frees its slot for the step after
            done = s + self.out[i] - self.decoded[i]
            if done < t:
                t = done
        wake = self.policy.wake_step(view)
        if wake < t:
            t = max(wake, s + 1)
        return t      # NEVER only when no arrival is left: the drain limit then bounds the jump

    def _apply(self, d: Decision) -> None:
        m = self.model
        for i in d.preempt:
            if i not in self.running:
                raise RuntimeError(f"policy {self.policy.name!r} preempted request {i}, which is not running")
            self.running.remove(i)
            self._kv_running -= self.inp[i] + self.decoded[i]
            self.decoded[i] = 0           # recompute preemption: generated tokens are lost
            self.waiting.insert(0, i)
            self.n_preemptions += 1
        if not d.admit:
            return
        waiting = set(self.waiting) - set(d.preempt)   # a request evicted now is not re-admitted now
        admitted = []
        for i in d.admit:
            if i in d.preempt:
                continue
            if i not in waiting:
                raise RuntimeError(f"policy {self.policy.name!r} admitted request {i}, which is not waiting")
            # The engine's hard limits, re-checked in order (earlier admissions count at once).
            if (len(self.running) + 1 <= m.max_active_sequences
                    and self._kv_running + self.inp[i] <= m.max_kv_tokens
                    and len(self.running) + 1 <= m.max_batch_tokens):
                self.running.append(i)
                self._kv_running += self.inp[i] + self.decoded[i]
                self.admit_step[i] = self.step
                admitted.append(i)
                waiting.discard(i)
        if admitted:
            gone = set(admitted)
            self.waiting = [i for i in self.waiting if i not in gone]

    def _decode(self, s: int, span: int, hold) -> None:
        still = []
        for i in self.running:
            if i in hold:
                still.append(i)
                continue
            if self.decoded[i] == 0:
                self.first_step[i] = s
            left = self.out[i] - self.decoded[i]
            if left <= span:
                self.decoded[i] = self.out[i]
                self.finish_step[i] = s + left - 1
                self._kv_running -= self.inp[i] + self.out[i] - left
            else:
                self.decoded[i] += span
                self._kv_running += span
                still.append(i)
        self.running = still

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


def simulate(window: Window, policy: Policy, model=None, *, event_skipping: bool = True,
             priority=None) -> RunResult:
    """Replay ``window`` (already scaled) under ``policy`` on ``model`` (default: the study's)."""
    engine = (model or LsspModel()).make_engine(window, policy, priority)
    engine.run(event_skipping=event_skipping)
    return engine.result(window)
