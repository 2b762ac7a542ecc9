"""Any key policy as vLLM's ``scheduler_cls``: one definition of an order for the simulator, for
vLLM's scheduler stepped in virtual time (the ``vllm_native`` engine model) and for the real engine.

A :class:`~portbench.engine.queue.KeyPolicy` is an order of the waiting queue: ``key(view, ids)``,
lower served first, ties in the queue's order. :class:`KeyPolicyScheduler` is vLLM 0.32's v1
:class:`~vllm.v1.core.sched.scheduler.Scheduler` (its scheduler API is not public: pinned) with one
change: before each :meth:`schedule` it puts its FCFS waiting queue (a deque that vLLM's waiting
pass walks from the front) in the policy's order. Everything else is vLLM's: admission, KV blocks,
chunking, the token budget and preemption.

What the key reads is :class:`KeyView`: what the simulator's
:class:`~portbench.engine.api.EngineView` gives it, with the same names and units.

Ties go to the engine's queue order, which the scheduler keeps apart from the policy's (re-sorting
the deque would otherwise make the last step's order the tie-break): arrival order, with a
preempted request put in front of everything, the last preempted first, as vLLM's FCFS queue and the
``vllm_v1`` model do.

A key policy with ``evict = True`` (a waiting request evicts running ones ranked after it) does not
use this class: vLLM v1 has no such preemption, and the nearest vLLM form is its ``priority``
scheduling with each request's static rank as its priority
(:func:`~portbench.realengine.vllm_settings.key_priorities`), which also
picks the lowest-ranked running request as the victim when KV blocks run out.

What vLLM cannot express (:data:`GAPS`).
"""

from __future__ import annotations

import itertools
import time
import types
from collections.abc import Callable

import numpy as np
from vllm.v1.core.sched.scheduler import Scheduler

from ..engine.queue import KeyPolicy
from .vllm_settings import FIELDS

QUALNAME = "portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler"

#: What a key policy loses on vLLM (listed in each replay's ``info["scheduler_gaps"]``).
GAPS = (
    "admission is vLLM's: the walk stops at the first request in key order that finds no KV blocks "
    "or no sequence slot (the lssp engine skips such a request and goes on, as lssp's skip-the-misfit walk)",
    "vLLM preempts (recompute) the newest running request when one cannot grow; a key policy never "
    "preempts (evict = True policies run as vLLM's priority scheduling instead, without a waiting "
    "request's eviction of running ones, which vLLM v1 does not have)",
    "on the real engine the clock is the wall clock: a slower engine's longer waits weigh more in a "
    "key that reads view.now (aging, laxity) than in the simulator at the same operating region",
    "the order is set at the start of each schedule() call: requests that arrive during a step wait "
    "for the next call, as for every vLLM policy",
)



class KeyView:
    """What a key policy reads, filled by :class:`KeyPolicyScheduler` at each :meth:`schedule` call
    (the names and units of :class:`~portbench.engine.api.EngineView`):

    - the window's request arrays (``arrival_s``, ``deadline_s``, ``input_tokens``,
      ``predicted_output_tokens``, ``priority``, ``n_requests``), indexed by the request's index in the
      window; the replay hands them over with :meth:`KeyPolicyScheduler.begin_key_replay`, with the map
      from vLLM's request id to that index;
    - ``now``: the replay's clock in the window's seconds, read once per :meth:`schedule` call (the
      virtual clock of ``vllm_native``; ``time.time()`` less the replay's start on the real engine,
      whose requests carry ``arrival_time`` = start + arrival);
    - the run's state: ``running`` and ``waiting`` (request indices, in vLLM's order), ``n_active``,
      ``decoded`` (tokens produced so far), ``step``, ``kv_used`` (blocks in use × block size) and
      ``model`` (the engine's limits: ``max_num_batched_tokens``, ``max_active_sequences``,
      ``max_kv_tokens``, ``block_size``). ``refused`` is always empty: vLLM does not report it;
    - ``cached_prefix(ids)``: the tokens a prefix-cache hit would skip for each request if it were
      admitted now, from vLLM's own cache lookup (read only; 0 with prefix caching off, and for a
      request vLLM does not hold: not arrived yet, or finished).
    """

    __slots__ = ("arrival_s", "deadline_s", "input_tokens", "predicted_output_tokens", "priority",
                 "n_requests", "model", "now", "step", "running", "waiting", "decoded", "kv_used",
                 "refused", "prev_step_start_s", "prev_kv_used", "block_hashes", "block_tokens",
                 "_hit_of")

    def __init__(self, window, model, priority=None):
        for name in FIELDS:
            setattr(self, name, _read_only(np.asarray(getattr(window, name))))
        n = len(self.arrival_s)
        self.priority = _read_only(np.ones(n) if priority is None else np.asarray(priority, dtype=np.float64))
        self.n_requests, self.model = n, model
        self.now = self.prev_step_start_s = 0.0
        self.step = self.kv_used = self.prev_kv_used = 0
        self.running, self.waiting, self.refused = (), (), ()
        self.decoded = np.zeros(n, dtype=np.int64)
        hashes = getattr(window, "block_hashes", None)      # fixed data, as EngineView's
        self.block_hashes = hashes
        self.block_tokens = int(window.meta["block_tokens"]) if hashes is not None else None
        self._hit_of: Callable[[int], int] = lambda i: 0

    @property
    def n_active(self) -> int:
        return len(self.running)

    def cached_prefix(self, ids) -> np.ndarray:
        """For each of ``ids`` (request indices), the tokens a prefix-cache hit would skip if it were
        admitted now (an int64 array): the leading whole KV blocks of its sequence so far (prompt, or
        prompt + output after a preemption) that vLLM's cache holds, at most ``(tokens - 1) //
        block_size`` blocks, times the block size -- vLLM's own lookup, read without touching the
        cache. 0 with prefix caching off, and for a request the engine does not hold (not arrived
        yet, or gone)."""
        hit = self._hit_of
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return np.fromiter((hit(int(i)) for i in ids), np.int64, len(ids))

    def decoded_of(self, ids) -> list:
        return [int(self.decoded[i]) for i in ids]


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.view()
    a.flags.writeable = False
    return a


def order_by_key(policy: KeyPolicy, view: KeyView, ids: np.ndarray, queue_seq: np.ndarray) -> np.ndarray:
    """Positions of ``ids`` (request indices) in ``policy``'s order at ``view``: its key columns, the
    most significant first, then ``queue_seq`` (the engine's queue order)."""
    cols = policy.key_columns(view, ids)
    return np.lexsort((queue_seq, *cols[::-1]))


class KeyPolicyScheduler(Scheduler):
    """vLLM v1 scheduler whose FCFS waiting queue is put in a key policy's order before every step.

    Without a policy (before :meth:`begin_key_replay`, e.g. during the engine's warm-up) it is vLLM's
    FCFS scheduler. ``stats``: ``calls``, ``reordered_steps`` and ``undescribed`` (requests the
    replay did not describe: they keep their queue place ahead of the described ones).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._policy: KeyPolicy | None = None
        self._view: KeyView | None = None
        self._index_of: Callable[[str], int | None] = lambda rid: None
        self._clock: Callable[[], float] = time.time
        self._index: dict[str, int] = {}        # vLLM's request id -> the window's request index
        self._seq: dict[str, int] = {}          # ... -> its place in the engine's queue order
        self._request_of: dict[int, object] = {}    # the window's index -> vLLM's request
        self._counter = itertools.count()
        self.stats = {"calls": 0, "reordered_steps": 0, "undescribed": 0}

    def begin_key_replay(self, policy: KeyPolicy, window, *, index_of: Callable[[str], int | None],
                         clock: Callable[[], float], priority=None) -> None:
        """The replay about to start: its ``policy`` (reset here on the window's view), its
        ``window`` (the request arrays the key reads), ``index_of`` (vLLM's request id → the request's
        index in the window, None for a request not of the window) and ``clock`` (now, in the
        window's seconds). Forgets the previous replay and resets the counters."""
        if not isinstance(policy, KeyPolicy):
            raise TypeError(f"policy {getattr(policy, 'name', policy)!r} is not a KeyPolicy: only an order "
                            "of the waiting queue runs as vLLM's scheduler_cls this way")
        if policy.evict:
            raise ValueError(f"policy {policy.name!r} has evict = True: run it as vLLM's priority "
                             "scheduling with vllm_settings.key_priorities(), not through this scheduler")
        sc = self.scheduler_config
        model = types.SimpleNamespace(max_num_batched_tokens=sc.max_num_batched_tokens,
                                      max_active_sequences=sc.max_num_seqs, block_size=self.block_size,
                                      max_kv_tokens=(self.kv_cache_config.num_blocks - 1) * self.block_size)   # less vLLM's null block
        self._view = KeyView(window, model, priority)
        self._policy, self._index_of, self._clock = policy, index_of, clock
        self._index, self._seq = {}, {}
        self._request_of = {}
        if self.kv_cache_manager.enable_caching:
            self._view._hit_of = self._hit_of
        self.stats = {"calls": 0, "reordered_steps": 0, "undescribed": 0}
        self._view.now = float(clock())
        policy.reset(self._view)

    def add_request(self, request) -> None:
        rid = request.request_id
        if rid not in self.requests:
            self._seq[rid] = next(self._counter)
            k = self._index_of(rid)
            if k is None:
                if self._policy is not None:
                    self.stats["undescribed"] += 1
            else:
                self._index[rid] = k
                self._request_of[k] = request
        super().add_request(request)

    def cached_prefix_of(self, request) -> int:
        """The tokens a prefix-cache hit would skip if ``request`` (vLLM's) were admitted now: vLLM's
        own lookup (``find_longest_cache_hit`` over its block hashes, at most all tokens but the
        last, as ``get_computed_blocks`` asks), without its side effects: no block is touched or
        taken out of the free queue, and no statistics are recorded. 0 with caching off."""
        kvm = self.kv_cache_manager
        if not kvm.prefix_cache_lookup_enabled(request):
            return 0
        _, tokens, _ = kvm.coordinator.find_longest_cache_hit(request.block_hashes,
                                                              request.num_tokens - 1)
        return int(tokens)

    def _hit_of(self, index: int) -> int:
        request = self._request_of.get(index)
        if request is None or self.requests.get(request.request_id) is not request:
            return 0                                        # not arrived yet, or gone
        return self.cached_prefix_of(request)

    def _preempt_request(self, request, timestamp, *args, **kwargs) -> None:
        super()._preempt_request(request, timestamp, *args, **kwargs)
        self._seq[request.request_id] = -next(self._counter)      # to the front, the last first

    def key_reorder(self, now: float | None = None) -> bool:
        """Put the waiting queue in the policy's order at ``now`` (default: the replay's clock);
        True when it changed."""
        waiting = self.waiting
        if self._policy is None or len(waiting) < 2:
            return False
        view = self._view
        view.now = float(self._clock()) if now is None else float(now)
        reqs = list(waiting)
        index = self._index
        described = [r for r in reqs if r.request_id in index]
        if len(described) < 2:
            return False
        ids = np.fromiter((index[r.request_id] for r in described), np.int64, len(described))
        seq = np.fromiter((self._seq[r.request_id] for r in described), np.int64, len(described))
        running = [index[r.request_id] for r in self.running if r.request_id in index]
        decoded = view.decoded
        decoded[:] = 0
        for r in itertools.chain(described, self.running):
            k = index.get(r.request_id)
            if k is not None:
                decoded[k] = r.num_output_tokens
        view.running = tuple(running)
        view.waiting = tuple(ids[np.argsort(seq, kind="stable")].tolist())
        view.kv_used = (view.model.max_kv_tokens
                        - self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size)
        ordered = [r for r in reqs if r.request_id not in index] + \
                  [described[k] for k in order_by_key(self._policy, view, ids, seq)]
        if all(a is b for a, b in zip(ordered, reqs)):
            return False
        waiting.clear()
        waiting.extend(ordered)
        return True

    def schedule(self, *args, **kwargs):
        self.stats["calls"] += 1
        if self._view is not None:
            self._view.step = self.stats["calls"] - 1
        if self.key_reorder():
            self.stats["reordered_steps"] += 1
        for rid in [r for r in self._seq if r not in self.requests]:
            self._seq.pop(rid)
            k = self._index.pop(rid, None)                  # finished or aborted
            if k is not None and getattr(self._request_of.get(k), "request_id", None) == rid:
                del self._request_of[k]
        return super().schedule(*args, **kwargs)
