"""What an engine model is, and what a policy is: the interface between them.

The policy interface, in one place (see also the book's "Add your own scheduler"):

- a policy sees a read-only :class:`EngineView` and returns a :class:`Decision` — which waiting
  requests to propose for admission, in order; which running ones to preempt or hold for this step;
  and when it wants to be asked again on its own (``wake_at_s``, a time on the clock, or
  ``wake_after_steps``). Most policies are an order: :class:`portbench.engine.queue.KeyPolicy`;
- the engine owns the queue and every rule: it admits a proposed request only if the engine model's
  limits allow, and the engine model decides what happens to one that does not fit (this model:
  skipped, the walk goes on, as in the study; ``vllm_v1``: head-of-line). It reports what it refused
  in ``view.refused`` at the next call, and schedules the policy's timers as events;
- by default a policy is asked at every step. One that declares ``event_driven`` is asked only at
  events (an arrival, a completion, the step after one that admitted, preempted or held) and at its
  timers — unless the decision is ``steady`` (see :class:`Decision`: the steps up to its timer
  repeat it) or, after a refused admission that left nothing running, ``repeat_if_refused``; the
  clock and the decoded counts move on in skipped steps, so a decision that depends on them needs a
  timer;
- a policy that declares ``admission_only`` must never preempt or hold (the engine raises
  :class:`PolicyContractError` if it does) and must decide from the view alone; it is asked only
  where an admission is possible.

An engine model (:class:`EngineModel`) is a frozen dataclass with a ``name``, the limits a
policy may read, and ``make_engine(window, policy, priority)``, which returns an engine with
``run(event_skipping=...)`` and ``result(window)`` (a :class:`RunResult`). The models live beside
this module, one per file, and are registered by name in :mod:`portbench.engine`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Protocol

import numpy as np

NEVER = math.inf


class PolicyContractError(RuntimeError):
    """A policy broke the interface's contract (or the fast engine and the step-by-step loop disagree)."""


@dataclasses.dataclass
class Decision:
    """What a policy asks for in one step. Ids are request indices within the window.

    ``admit`` is taken in order, once; it may be a lazy iterator, which an engine with head-of-line
    admission stops consuming at its first refusal (wrap it in ``list`` to inspect it). The engine
    admits a proposed request only where its limits allow; the others are reported in
    ``view.refused`` at the next call.

    ``preempt`` (running requests to put back at the queue front, their generated tokens lost) and
    ``hold`` (running requests that get no token this step) end any skipped stretch, and so do
    admissions: the policy is asked again at the next step, unless the decision says otherwise with
    ``steady`` or ``repeat_if_refused`` below.

    ``steady=True`` says that the steps after this one, up to the policy's timer, would each get the
    same answer: the same ``hold``, nothing admitted or preempted. The engine may then skip them after
    this decision's holds and admissions too (never after a preemption, which a steady decision may
    not make, nor after a refused admission), holding the same requests at every skipped step. The
    claim holds *whatever arrives* meanwhile: arrivals join the queue without ending the stretch (the
    policy sees them at its next call); a completion still ends it, and so does a preemption by the
    engine (``vllm_v1``, which walks each of those steps, repeats the decision at them without asking
    the policy). Walking every step, the policy is asked at each as usual, so a false claim shows up
    in :func:`portbench.testing.check_policy`.

    ``repeat_if_refused=True`` says that, should the engine refuse this decision's admissions, the
    policy would answer the same at the next steps as long as nothing arrives, completes or is
    preempted, up to its clock timer ``wake_at_s`` (``wake_after_steps`` then counts for the case
    where the admission goes through), whatever the running requests decode meanwhile (their
    tokens, the KV in use, the prefix cache, unless the decision read :meth:`EngineView.cached_prefix`:
    then only while no waiting request's cached prefix changes, and ``vllm_v1`` ends the repetition
    before an eviction could change one). Two kinds of step then repeat (``vllm_v1`` skips
    them; ``lssp`` asks at each): one in which the engine admits nothing (its first proposal
    refused), preempts nothing and nothing runs, as after a decision that holds every running
    request (only the clock changes), up to the next arrival, ``wake_at_s`` or the drain bound; and
    a pure-decode step whose first proposal was refused for KV blocks (see ``vllm_v1``), up to the
    next event or timer. ``fifo`` and every key policy whose key reads only fixed request data, the
    waiting queue and the cached prefixes say it (as do ``least_laxity_first`` and
    ``admission_control`` while no two laxities are near a tie). Walking every step, the policy is
    asked at each, so a false claim shows up in :func:`portbench.testing.check_policy`. The claim
    may be any object with a truth value: an engine works it out only where it would use it, so a
    claim that costs something to check (the laxity keys sort the queue) is paid for only there.

    The policy's timer: the engine asks again, with nothing else happening, at the first step that
    starts at or after ``wake_at_s`` (seconds on the clock) or ``wake_after_steps`` steps after this
    one (``1``: the next step), whichever comes first. A clock timer may fire up to one step early
    (never late): a policy is then simply asked once more, as the step-by-step loop would ask it.
    """

    admit: list = dataclasses.field(default_factory=list)
    preempt: list = dataclasses.field(default_factory=list)
    hold: frozenset = frozenset()
    wake_at_s: float = NEVER
    wake_after_steps: float = NEVER
    steady: bool = False
    repeat_if_refused: bool = False


NOTHING = Decision()


class ViewedEngine(Protocol):
    """What :class:`EngineView` reads of an engine (``lssp``'s, ``vllm_v1``'s and ``vllm_native``'s
    runs each provide it): the window's fixed data, the step and clock, the queue and the running
    requests, the refused proposals, and the decoded tokens, KV in use and cached prefixes."""

    model: object
    n: int
    arrival_s: np.ndarray
    deadline_s: np.ndarray
    input_tokens: np.ndarray
    predicted: np.ndarray
    priority: np.ndarray
    step: int
    prev_kv_used: int
    queue_log: list
    waiting: list
    running: list
    refused: tuple

    def clock(self) -> tuple[float, float]: ...

    def kv_used(self) -> int: ...

    def decoded_array(self) -> np.ndarray: ...

    def decoded_of(self, ids) -> list: ...

    def cached_prefix_of(self, ids) -> np.ndarray: ...


class EngineView:
    """The read-only state a policy sees. Arrays are indexed by request id; do not modify them.

    The previous step (``prev_step_start_s``, ``prev_kv_used``: its start and the KV in use then) is
    the one just before this call, whether the policy was asked at it or the engine skipped it: a
    policy that let the engine skip steps reads what happened there instead of replaying them.

    ``refused``: ``(request, reason)`` for each proposal the engine refused at the last call, in
    the order it walked them. A walk that stops (no sequence slot left; ``vllm_v1``'s head-of-line
    rule) lists only the request it stopped at; under ``lssp`` the requests of a long proposal whose
    prompt exceeds the KV room left are refused together, without a walk, listed as ``(-1, "kv")``.

    Prefix caching: :meth:`cached_prefix` says what a hit would skip now. A prefix-hashed window's
    prompt contents are fixed data: ``block_hashes`` (one int64 array of chained hash ids per request,
    each for ``block_tokens`` prompt tokens; both None for other sources; see
    :mod:`portbench.engine.prefix`).
    """

    __slots__ = ("model", "step", "now", "prev_step_start_s", "prev_kv_used", "running",
                 "arrival_s", "deadline_s", "input_tokens", "predicted_output_tokens", "priority",
                 "kv_used", "n_requests", "refused", "block_hashes", "block_tokens", "_queue_version",
                 "_engine", "_waiting", "_cache_read",
                 "_waiting_of", "_warr", "_warr_of")

    def __init__(self, engine: ViewedEngine):
        self._engine = engine
        self.model = engine.model
        self.arrival_s = read_only(engine.arrival_s)
        self.deadline_s = read_only(engine.deadline_s)
        self.input_tokens = read_only(engine.input_tokens)
        self.predicted_output_tokens = read_only(engine.predicted)
        self.priority = read_only(engine.priority)
        self.n_requests = engine.n
        # a prefix-hashed window's prompt-block hash ids (fixed data; None for other sources)
        self.block_hashes = getattr(engine, "block_hashes", None)
        self.block_tokens = getattr(engine, "block_tokens", None)
        self._queue_version = 0         # the length of the engine's log of queue changes
        self._waiting, self._waiting_of = (), 0     # the queue as a tuple, and the version it shows
        self._warr, self._warr_of = np.zeros(0, dtype=np.int64), 0      # ... as an array
        self._cache_read = False        # cached_prefix read since the last refresh

    def refresh(self):
        e = self._engine
        self.step = e.step
        self.now, self.prev_step_start_s = e.clock()      # and the step before (run or skipped)
        self.prev_kv_used = e.prev_kv_used                # KV in use when it started
        self._queue_version = len(e.queue_log)
        self.running = tuple(e.running)
        self.kv_used = e.kv_used()
        self.refused = e.refused
        self._cache_read = False
        return self

    @property
    def waiting(self) -> tuple:
        """The waiting requests, in the engine's queue order (built when first read at a call: the
        engines change their queue only after the decision's admissions are taken)."""
        if self._waiting_of != self._queue_version:
            e = self._engine
            if len(e.queue_log) != self._queue_version:
                raise RuntimeError("engine bug: the queue changed before the policy's call was over")
            self._waiting, self._waiting_of = tuple(e.waiting), self._queue_version
        return self._waiting

    def _waiting_array(self) -> np.ndarray:
        """:attr:`waiting` as a read-only int64 array (for the package's queue code), brought up to
        date from the one of the previous call when the queue only lost requests and gained some at
        its back (the usual case: converting a long queue afresh at every call costs more)."""
        v = self._queue_version
        if self._warr_of != v:
            e = self._engine
            arr = _follow_queue(self._warr, e.queue_log[self._warr_of:v], e.waiting)
            self._warr, self._warr_of = read_only(arr), v
        return self._warr

    @property
    def decoded(self) -> np.ndarray:
        """Tokens produced so far, per request (a read-only int64 array, indexed by request id)."""
        return self._engine.decoded_array()

    def decoded_of(self, ids) -> list:
        """Tokens produced so far by each of ``ids`` (a list of ints; cheaper than ``decoded`` for a few)."""
        return self._engine.decoded_of(ids)

    def cached_prefix(self, ids) -> np.ndarray:
        """For each of ``ids`` (request ids), the tokens a prefix-cache hit would skip if it were
        admitted now: the leading whole KV blocks of its sequence so far (its prompt, or prompt and
        output after a preemption) that the engine holds cached, at most all tokens but the last
        (an int64 array). 0 on an engine model without a prefix cache (``lssp``, ``vllm_v1`` with
        ``enable_prefix_caching`` off)."""
        self._cache_read = True
        return self._engine.cached_prefix_of(ids)

    @property
    def n_active(self) -> int:
        return len(self.running)


class Policy:
    """A scheduling policy. Subclasses set ``name`` and implement :meth:`schedule` (most policies
    are an order of the waiting queue: see :class:`portbench.engine.queue.KeyPolicy`).

    A policy may keep its own state across steps (reset in :meth:`reset`); it never changes the
    engine. By default the engine asks it at every step, which is exact whatever it does. The fast
    path is opt-in: a policy that sets ``event_driven = True`` promises that its decision changes
    only at an event (an arrival, a completion, a step after it admitted, preempted or held) or at
    the timer its decision names (``wake_at_s``, ``wake_after_steps``), and the engine then skips
    the steps in between. ``portbench.testing.check_policy`` checks the promise on random and real
    windows under every engine model.
    """

    name: ClassVar[str] = ""
    #: True when :meth:`schedule` only admits (never preempts or holds) and is a pure function of the
    #: view (no state kept across steps): an engine may then skip calling it at steps where no waiting
    #: request could be admitted whatever it answered. The event-skipping tests check the claim.
    admission_only: ClassVar[bool] = False
    #: True when the decision changes only at events and at the decision's own timers (see above);
    #: False (the default): the engine asks at every step (an ``admission_only`` policy excepted).
    event_driven: ClassVar[bool] = False

    def reset(self, view: EngineView) -> None:
        """Called once before a run."""

    def schedule(self, view: EngineView) -> Decision:
        raise NotImplementedError


def check_in_window(policy, step: int, i, n: int) -> None:
    """Raise PolicyContractError unless ``i``, admitted by ``policy`` at ``step``, is a request id
    of the window (an int in 0 .. n - 1)."""
    if not (isinstance(i, (int, np.integer)) and 0 <= i < n):
        raise PolicyContractError(f"policy {policy.name!r} admitted {i!r} at step {step}, which is "
                                  f"not a request of the window (ids are 0 .. {n - 1})")


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (the engine keeps writing through ``a`` itself)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _follow_queue(before: np.ndarray, changes: list, waiting: list) -> np.ndarray:
    """The waiting queue ``waiting`` (a list) as an int64 array, from ``before`` (the array as it
    was) and the log of ``changes`` since (``i`` joined, ``~i`` left). Without converting the list
    when the changes are departures from the queue's front and joins that all sit at its back:
    the requests that did not change keep their relative order, so the queue is then ``before``
    without its first ones, followed by those that joined."""
    gone = {~c for c in changes if c < 0}
    joined = [c for c in changes if c >= 0]
    g, k, n = len(gone), len(joined), len(waiting)
    if (n != len(before) - g + k or (k and waiting[n - k:] != joined) or not gone.isdisjoint(joined)
            or (g and set(before[:g].tolist()) != gone)):
        return np.array(waiting, dtype=np.int64)
    return np.concatenate((before[g:], np.array(joined, dtype=np.int64))) if k else before[g:]


def skips_steps(policy: Policy, event_skipping: bool) -> bool:
    """Whether an engine may skip steps for ``policy``: it asked for it (``event_skipping``) and
    the policy declared when its decisions change (``event_driven``) or that it only admits."""
    return event_skipping and (policy.event_driven or policy.admission_only)


def check_decision(policy: Policy, d: Decision) -> Decision:
    """The contract checks an engine makes on every decision (cheap; always on)."""
    if policy.admission_only and (d.preempt or d.hold):
        raise PolicyContractError(
            f"policy {policy.name!r} declares admission_only but returned "
            f"{'preempt=' + str(list(d.preempt)) if d.preempt else 'hold=' + str(sorted(d.hold))}; "
            "drop the admission_only flag or only admit")
    if d.preempt and (d.steady or d.repeat_if_refused):
        raise PolicyContractError(f"policy {policy.name!r} returned a "
                                  f"{'steady' if d.steady else 'repeat_if_refused'} decision that "
                                  f"preempts {list(d.preempt)}; a preemption always ends a skipped "
                                  "stretch")
    if not (d.wake_after_steps >= 1):
        raise PolicyContractError(f"policy {policy.name!r} returned wake_after_steps="
                                  f"{d.wake_after_steps!r}; it must be >= 1 (1 = the next step)")
    return d


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
    # prefix caching (engine models with a prefix cache): over every admission, the tokens looked up
    # (the sequence so far) and those the cache served
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_tier_hit_tokens: int = 0     # of the hit, those loaded from an offload tier

    @property
    def completed(self) -> np.ndarray:
        return ~np.isnan(self.finish_s)


class EngineModel(Protocol):
    """What the engine loop needs of an engine model (``lssp``, ``vllm_v1``, ...)."""

    #: The name the campaign, the book and the results know it by.
    name: ClassVar[str]

    @property
    def max_sequences(self) -> int:
        """The most requests that can run at once."""

    @property
    def longest_quiet_step_s(self) -> float:
        """The longest a step can last in which only decoding happens."""

    def make_engine(self, window, policy: Policy, priority=None):
        """An engine that replays ``window`` under ``policy`` once: ``run(event_skipping=...)``,
        then ``result(window)``."""
