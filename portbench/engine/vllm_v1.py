"""A vLLM-v1-like engine model with a calibrated step-time cost model.

Same policies, same view, same results interface as the study's ``lssp`` model, but each step
works the way vLLM v1's scheduler does (each rule, with vLLM's source it follows, in
:class:`VllmV1Model`):

- a per-step **token budget** with **chunked prefill**; **running requests first**, in admission
  order, then the policy's admissions while budget, sequence slots and KV blocks last
  (**head-of-line**: the first that cannot get blocks stops admission);
- a **block-granular KV cache** (16-token blocks) with vLLM's **preemption** (recompute) and, as
  options, vLLM's **prefix cache** (:mod:`~portbench.engine.blockpool`), a warm start and an
  offload tier, and the **long-prefill caps**;
- the **step time** ``fixed + per_prefill_token · P + per_decode_seq · D + per_context_token · C``,
  in integer picoseconds.

Holds :class:`VllmV1Model` (the settings), ``_V1Engine`` (one run) and the numba-compiled loops of a
step and of a *stretch*: a run of steps in which nothing can change (no arrival, completion, block
exhaustion, prefill or policy timer), summed in closed form, bit-identical to walking them one by
one. The shortcuts (pure-decode stretches, lazily asked ``admission_only`` policies, a long
prompt's chunk steps, ``steady`` and ``repeat_if_refused`` decisions) are described where they are
taken (``run``, ``_execute_step``, ``_chunk_steps``, ``_refusal_repeats``);
``tests/test_event_skipping.py`` checks all of them against the step-by-step walk, which runs the
same step code but asks the policy at every step and jumps nowhere.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import math
from typing import ClassVar, NamedTuple

import numba
import numpy as np

from .api import (NEVER, Decision, EngineView, Policy, PolicyContractError, RunResult, check_decision,
                  check_in_window, read_only, skips_steps)
from . import _jit  # noqa: F401  (numba's cache, keyed by the engine's sources)
from . import blockpool
from .reqtable import BLOCKS, COMPUTED, DECODED, FINISH, FIRST, INP, OUT, TARGET
from .stepcost import PS, StepCost
from ..realengine.vllm_settings import scheduling_priorities

#: Seconds to load one token's KV from a host-memory offload tier: the KV of a Llama-3.1-8B-class
#: model (32 layers × 8 KV heads × 128 dims × K and V × 2 bytes = 131,072 bytes a token, fp16) over
#: PCIe 4.0 ×16 (31.5 GB/s a direction: 16 GT/s × 16 lanes, 128b/130b coding; PCI-SIG's PCIe 4.0
#: specification; the host link of an A100 40GB PCIe board): 4.16 µs a token, about a quarter of
#: the model's 17.3 µs a prefill token.
OFFLOAD_S_PER_TOKEN = 131072 / 31.5e9

_TIMER_MARGIN_PS = 10 ** 6      # a clock timer fires up to a microsecond early (float round-off)
_MAX_STRETCH = 1 << 40          # no other bound on a stretch's length than its events
_NO_DECISION = Decision()
_NO_HOLD = np.zeros(0, dtype=np.int64)


class _Repeat(NamedTuple):
    """A steady decision the engine repeats: the decision, the step at which its policy asked to be
    asked again, and the time its clock timer fires (picoseconds, less the margin for round-off)."""

    decision: Decision
    until_step: float
    until_ps: float


@dataclasses.dataclass(frozen=True)
class VllmV1Model:
    """vLLM-v1-like engine model. Capacity defaults match the study's GPU (64 sequences, 131,072 KV
    tokens); the step cost defaults to a published vLLM fit (Llama-3.1-8B, H100) until replaced by a
    fit to our own engine profiles.

    vLLM's long-prefill caps (its ``SchedulerConfig``), all off by default (0 / 1 / 1, vLLM's own
    defaults), which leaves every run exactly as without them:

    - ``long_prefill_token_threshold`` (0 = off): a request computes at most this many prefill tokens
      in a step, whether running or just admitted — vLLM v1's scheduler (``vllm/v1/core/sched/
      scheduler.py``) caps ``num_new_tokens`` at it in both its running and its waiting loop, before
      the token budget. A prompt (or a recompute) *longer* than it is a long prefill.
    - ``max_num_partial_prefills`` (1 = off) and ``max_long_partial_prefills`` (1): with the first
      above 1, at most that many requests prefill in one step, and at most the second of them are
      long. vLLM v1 rejects values above 1 ("Concurrent Partial Prefill is not supported") and later
      removed both arguments, so the semantics modelled are those of vLLM v0's scheduler
      (``vllm/core/scheduler.py``, ``PartialPrefillMetadata``), where they came from: the running
      requests still prefilling count first (they are never held back); a waiting request is then
      admitted only while fewer than ``max_num_partial_prefills`` requests prefill in the step (at
      the cap, admission stops); a *long* waiting request only while fewer than
      ``max_long_partial_prefills`` long ones do — if not, it is passed over and the walk goes on, so
      that short prompts overtake long ones (v0's documented purpose). v0 also splits the step's
      token budget evenly among concurrent prefills; that is not modelled (each takes what the
      budget and the threshold leave, as in v1). vLLM derives a threshold of 4% of the model's
      context when the caps are on and it is 0; the model has no context length, so it must be
      given. vLLM v1 lifts the threshold while a single request is in the engine (running or
      waiting): nobody is there to starve; so does this model.

    ``reserve_full_isl`` (vLLM 0.32's ``scheduler_reserve_full_isl``, on by default there and here):
    a waiting request is admitted only when the KV blocks of its whole sequence so far (its prompt,
    or prompt + output after a preemption) are free, not just those of its first chunk; only the
    chunk's blocks are taken. Off: the first chunk's blocks decide (vLLM before that option).

    ``enable_chunked_prefill`` (vLLM's default, on): off, a waiting request is admitted only with
    all the tokens it computes (its prompt less any cache hit, under the long-prefill cap) within
    the step's budget left, and the first that does not fit stops admission (vLLM v1's rule, which
    then needs every prompt within ``max_num_batched_tokens``: a longer one is refused when the
    engine is built). Running requests are untouched by it, as in vLLM.

    Preemption is vLLM v1's: a running request that cannot get its blocks preempts, until they fit
    or it has preempted itself (the running phase then ends), the victim vLLM would choose for the
    policy. A policy that runs on vLLM's FCFS scheduling (``fifo``, the key adapter, a policy with no
    vLLM form) preempts the last running request, and the victim waits again at the queue's head. A
    policy that runs on vLLM's ``priority`` scheduling
    (:func:`~portbench.realengine.vllm_settings.scheduling_priorities`: ``edf``,
    ``estimated_service_time_first``, ``least_laxity_first``, ``slai_faithful``, ``vllm_v0_priority``,
    a key policy with ``evict = True``) preempts the running request of largest (priority, arrival),
    with its vLLM priority, even one already scheduled in the step (its tokens go back to the
    budget); the victim waits again at its arrival's place in the queue (vLLM's waiting heap is on
    (priority, arrival), so a key's ties fall in arrival order there too).

    ``enable_prefix_caching`` (off by default; vLLM turns it on by default, the study's real engine
    ran with it off): vLLM's automatic prefix caching over the same ``max_kv_tokens // block_size``
    blocks (:mod:`portbench.engine.blockpool`): a request admitted with nothing computed skips the
    leading blocks of its sequence that are cached (at least one token is computed; the hit costs no
    budget, but its tokens are context the step attends over), hit blocks are shared, a full block
    is cached when it is scheduled, and free cached blocks are evicted least recently freed first.
    Which blocks hold the same tokens comes from the window's block hashes
    (:mod:`portbench.engine.prefix`); a window without them shares nothing, and the cache then
    serves only a preempted request's own blocks.

    ``warm_start`` (with the cache on; the window loaded with its history): the pool starts as
    serving the trace's requests before the window, one after another, left it
    (:func:`~portbench.engine.blockpool.warm_array`), not empty. ``offload_kv_tokens`` > 0: a second
    tier of that many tokens in host memory, as vLLM's offloading connector, LMCache or Mooncake's
    store provide: a cached block evicted from the GPU (its last copy) moves there, least recently
    used out first; a request looked up finds its GPU hit, then the blocks after it that the tier
    holds, which are loaded into new GPU blocks (they cost no budget) at ``offload_s_per_token``
    each, added to the step's time (no overlap with compute, no bandwidth shared between loads).
    The tier keeps what it loads and is warm at the start under ``warm_start``.
    """

    name: ClassVar[str] = "vllm_v1"
    fixed_steps: ClassVar[bool] = False
    max_num_batched_tokens: int = 2048
    max_active_sequences: int = 64
    max_kv_tokens: int = 131072
    block_size: int = 16
    cost: StepCost = StepCost()
    drain_s: float = 50.0
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    reserve_full_isl: bool = True
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    warm_start: bool = False
    offload_kv_tokens: int = 0
    offload_s_per_token: float = OFFLOAD_S_PER_TOKEN

    def __post_init__(self):
        for what, least in (("long_prefill_token_threshold", 0), ("max_num_partial_prefills", 1),
                            ("max_long_partial_prefills", 1)):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
                raise ValueError(f"VllmV1Model: {what} must be an integer >= {least}, got {v!r}")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(f"VllmV1Model: max_long_partial_prefills ({self.max_long_partial_prefills})"
                             f" must not exceed max_num_partial_prefills "
                             f"({self.max_num_partial_prefills})")
        if self.max_num_partial_prefills > 1 and self.long_prefill_token_threshold == 0:
            raise ValueError(f"VllmV1Model: max_num_partial_prefills="
                             f"{self.max_num_partial_prefills} needs long_prefill_token_threshold > 0 "
                             f"(what counts as a long prefill; vLLM derives 4% of the model's context "
                             f"length, which this model does not know)")

    @property
    def partial_prefill_caps(self) -> bool:
        """The concurrent-prefill caps are on (``max_num_partial_prefills > 1``)."""
        return self.max_num_partial_prefills > 1

    @functools.cached_property
    def max_sequences(self) -> int:
        """The most requests that can run at once: a sequence slot each, and a budget token each."""
        return min(self.max_active_sequences, self.max_num_batched_tokens)

    @property
    def step_s(self) -> float:
        """A nominal step (the fixed cost)."""
        return self.cost.fixed_s

    @property
    def longest_quiet_step_s(self) -> float:
        """The longest a step can last in which only decoding happens: every sequence decoding, the
        whole cache read (the engine's picosecond costs, plus a nanosecond for float round-off)."""
        c0, _, cd, cc, cg = self.cost.picoseconds()
        return (c0 + cg + cd * self.max_active_sequences + cc * self.max_kv_tokens) / PS + 1e-9

    def make_engine(self, window, policy, priority=None):
        if (self.warm_start or self.offload_kv_tokens) and not self.enable_prefix_caching:
            raise ValueError("VllmV1Model: warm_start and offload_kv_tokens need enable_prefix_caching")
        return _V1Engine(window, policy, self, priority)


# --- the per-request loops, compiled -------------------------------------------------------------
# Per-request state lives in one int64 table, a row per request (columns: portbench.engine.reqtable).


@numba.njit(cache=True)
def _no_pool():
    """The block pool the cache-off loops pass on (never read)."""
    return np.zeros(16, dtype=np.int64)      # an empty pool's header and sentinel


@numba.njit(cache=True)
def _schedule_running(run, hold, held, st, sched, budget, free, bs, thr, prio, arr, victims):
    """The running phase without a prefix cache (see :func:`_running_phase`)."""
    return _running_phase(run, hold, held, st, sched, budget, free, bs, thr, prio, arr, victims,
                          blockpool.views(_no_pool()), False)


@numba.njit(cache=True)
def _schedule_running_cached(run, hold, held, st, sched, budget, free, bs, thr, prio, arr, victims, pool):
    """The running phase with the prefix cache's block pool (see :func:`_running_phase`)."""
    return _running_phase(run, hold, held, st, sched, budget, free, bs, thr, prio, arr, victims,
                          blockpool.views(pool), True)


@numba.njit(cache=True)
def _victim(run, n_run, prio, arr):
    """The index in ``run[:n_run]`` of the request vLLM preempts: under FCFS (``prio`` empty) the
    last; under priority scheduling the largest (priority, arrival), the first of equals (Python's
    ``max`` over vLLM's running list)."""
    if prio.shape[0] == 0:
        return n_run - 1
    vi = 0
    for j in range(1, n_run):
        a, b = run[j], run[vi]
        if prio[a] > prio[b] or (prio[a] == prio[b] and arr[a] > arr[b]):
            vi = j
    return vi


@numba.njit(cache=True)
def _running_phase(run, hold, held, st, sched, budget, free, bs, thr, prio, arr, victims, pool, cached):
    """vLLM's running phase: each running request in order gets ``min(left, budget)`` tokens and the
    blocks for them; one that cannot get its blocks preempts (recompute: the victim's blocks are
    freed, its KV dropped, its target reset) until they fit or it has preempted itself, which ends
    the phase. The victim (:func:`_victim`): under FCFS (``prio`` empty) the last running request,
    whoever it is; under priority scheduling (``prio``: each request's vLLM priority, ``arr``: its
    arrival) the running request of largest (priority, arrival), and when it was already scheduled
    this step, its tokens go back to the budget (vLLM v1's two rules).
    With ``cached`` (prefix caching), blocks come from and go back to ``pool`` (see
    :mod:`portbench.engine.blockpool`), and a full block is cached when scheduled.
    A prefill computes at most ``thr`` tokens a step (0: no cap). The requests in ``hold`` are
    passed over (``held``, all False, is the scratch table for that); an id in ``hold`` outside the
    table returns -1 requests walked, and nothing is done. ``run`` is left with the requests still
    running first, in their order.

    Writes (request, new tokens) rows into ``sched`` and the preempted requests, in the order of
    their preemption, into ``victims``. Returns (requests walked, running requests left, rows
    written, budget, free blocks, prefill tokens, decodes, context tokens, KV tokens dropped,
    requests preempted)."""
    for i in hold:
        if i < 0 or i >= held.shape[0]:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0
    for i in hold:
        held[i] = True
    n_run = run.shape[0]
    k = m = prefill = decodes = context = dropped = nv = 0
    while k < n_run and budget > 0:
        i = run[k]
        if held[i]:
            k += 1
            continue
        c = st[i, COMPUTED]
        left = st[i, TARGET] - c
        n_new = min(left, budget)
        if 0 < thr < n_new:
            n_new = thr
        need = -(-(c + n_new) // bs) - st[i, BLOCKS]
        stuck = False
        while need > free:
            vi = _victim(run, n_run, prio, arr)
            v = run[vi]
            for j in range(vi, n_run - 1):
                run[j] = run[j + 1]
            n_run -= 1
            if vi < k:                            # walked already
                k -= 1
                if not held[v]:                   # and scheduled: its tokens go back
                    r = 0
                    while sched[r, 0] != v:
                        r += 1
                    back = sched[r, 1]
                    for j in range(r, m - 1):
                        sched[j, 0] = sched[j + 1, 0]
                        sched[j, 1] = sched[j + 1, 1]
                    m -= 1
                    budget += back
                    if st[v, TARGET] - st[v, COMPUTED] > 1 or st[v, DECODED] == 0:
                        prefill -= back
                    else:
                        decodes -= 1
                    context -= st[v, COMPUTED]
            if cached:
                free += blockpool.release(pool, st, v)
            else:
                free += st[v, BLOCKS]
            st[v, BLOCKS] = 0
            dropped += st[v, COMPUTED]
            st[v, COMPUTED] = 0
            st[v, TARGET] = st[v, INP] + st[v, DECODED]
            victims[nv] = v
            nv += 1
            if v == i:
                stuck = True
                break
        if stuck:
            break
        free -= need
        if cached:
            blockpool.allocate(pool, st, i, need)
            blockpool.cache_full(pool, st, i, c + n_new, bs)
        else:
            st[i, BLOCKS] += need
        sched[m, 0] = i
        sched[m, 1] = n_new
        m += 1
        if left > 1 or st[i, DECODED] == 0:
            prefill += n_new
        else:
            decodes += 1
        context += c
        budget -= n_new
        k += 1
    for i in hold:
        held[i] = False
    return k, n_run, m, budget, free, prefill, decodes, context, dropped, nv


@numba.njit(cache=True)
def _advance(sched, m, st, t_ps, finished):
    """The end of a step without a prefix cache (see :func:`_step_end`)."""
    return _step_end(sched, m, st, t_ps, finished, blockpool.views(_no_pool()), False)


@numba.njit(cache=True)
def _advance_cached(sched, m, st, t_ps, finished, pool):
    """The end of a step with the prefix cache's block pool (see :func:`_step_end`)."""
    return _step_end(sched, m, st, t_ps, finished, blockpool.views(pool), True)


@numba.njit(cache=True)
def _step_end(sched, m, st, t_ps, finished, pool, cached):
    """The end of a step: scheduled requests gain their tokens; a request whose target is reached
    emits a token (stamped ``t_ps``) and leaves when it was its last. Writes the leavers into
    ``finished``. Returns (leavers, blocks freed, KV tokens change, some request is mid-prefill)."""
    f = freed = kv = 0
    mid_prefill = False
    for j in range(m):
        i = sched[j, 0]
        c = st[i, COMPUTED] + sched[j, 1]
        st[i, COMPUTED] = c
        kv += sched[j, 1]
        if c == st[i, TARGET]:
            st[i, DECODED] += 1
            if st[i, FIRST] < 0:
                st[i, FIRST] = t_ps
            if st[i, DECODED] == st[i, OUT]:
                st[i, FINISH] = t_ps
                finished[f] = i
                f += 1
                if cached:
                    freed += blockpool.release(pool, st, i)
                else:
                    freed += st[i, BLOCKS]
                st[i, BLOCKS] = 0
                kv -= c
            else:
                st[i, TARGET] = c + 1
        else:
            mid_prefill = True
    return f, freed, kv, mid_prefill


@numba.njit(cache=True)
def _stretch_bound(run, st, free, bs, k, p, c):
    """The most next steps, at most ``k``, that repeat the shape of :func:`_stretch` (``run``'s
    requests decoding, the one at position ``p``, if any, prefilling ``c`` tokens a step), before the
    first completion (included), before that prefill computes its last token (excluded) and without
    running out of KV blocks."""
    for j in range(run.shape[0]):
        i = run[j]
        if j == p:
            k = min(k, (st[i, TARGET] - st[i, COMPUTED] - 1) // c)
        else:
            k = min(k, st[i, OUT] - st[i, DECODED])
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = 0
        for j in range(run.shape[0]):
            i = run[j]
            need += -(-(st[i, COMPUTED] + (mid * c if j == p else mid)) // bs) - st[i, BLOCKS]
        if need <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


@numba.njit(cache=True)
def _chunk_shape(run, st, budget):
    """Whether the next step is a chunk step that repeats: the running requests, in order, decode up
    to one (``P``) still prefilling, which takes all the budget the decoders before it leave and has
    more left to compute; those after it get nothing (the budget is spent). Returns (P's position,
    its chunk, the context the step attends over: the scheduled requests' computed tokens), or
    (-1, 0, 0) when the next step is not of that shape."""
    context = 0
    for p in range(run.shape[0]):
        i = run[p]
        left = st[i, TARGET] - st[i, COMPUTED]
        if left == 1 and st[i, DECODED] > 0:
            context += st[i, COMPUTED]
            continue
        c = budget - p
        if c <= 0 or left <= c:
            return -1, 0, 0
        return p, c, context + st[i, COMPUTED]
    return -1, 0, 0


@numba.njit(cache=True)
def _decode_stretch(run, st, k, bs, t_ps, finished, p, c):
    """``k`` repeated steps without a prefix cache (see :func:`_stretch`)."""
    return _stretch(run, st, k, bs, t_ps, finished, blockpool.views(_no_pool()), False, p, c)


@numba.njit(cache=True)
def _decode_stretch_cached(run, st, k, bs, t_ps, finished, pool, p, c):
    """``k`` repeated steps with the prefix cache's block pool (see :func:`_stretch`)."""
    return _stretch(run, st, k, bs, t_ps, finished, blockpool.views(pool), True, p, c)


@numba.njit(cache=True)
def _stretch(run, st, k, bs, t_ps, finished, pool, cached, p, c):
    """``k`` steps of one shape at once, the last ending at ``t_ps``: each of ``run``'s requests
    decodes a token a step, except the one at position ``p`` (-1: none), which prefills ``c`` tokens
    a step and does not finish its prefill in them; decoders whose last token comes in the k-th
    leave (with ``cached``, after every request took its blocks, as in the k-th step). Returns
    (leavers, blocks taken net of those freed, KV tokens change)."""
    f = taken = kv = 0
    for j in range(run.shape[0]):
        i = run[j]
        grow = k * c if j == p else k
        new_blocks = -(-(st[i, COMPUTED] + grow) // bs) - st[i, BLOCKS]
        if new_blocks > 0:
            if cached:
                blockpool.allocate(pool, st, i, new_blocks)
            else:
                st[i, BLOCKS] += new_blocks
            taken += new_blocks
        if cached:
            blockpool.cache_full(pool, st, i, st[i, COMPUTED] + grow, bs)
        st[i, COMPUTED] += grow
        kv += grow
        if j == p:
            continue
        st[i, DECODED] += k
        st[i, TARGET] += k
        if st[i, DECODED] == st[i, OUT]:
            st[i, FINISH] = t_ps
            finished[f] = i
            f += 1
            if not cached:
                taken -= st[i, BLOCKS]
                st[i, BLOCKS] = 0
            kv -= st[i, COMPUTED]
    if cached:
        for j in range(f):
            taken -= blockpool.release(pool, st, finished[j])
    return f, taken, kv


class _V1Engine:
    def __init__(self, window, policy: Policy, model: VllmV1Model, priority=None):
        self.model, self.policy = model, policy
        self.n = n = len(window)
        self.arrival_s, self.deadline_s = window.arrival_s, window.deadline_s
        self.input_tokens, self.output_tokens = window.input_tokens, window.output_tokens
        self.predicted = window.predicted_output_tokens
        self.priority = np.ones(n) if priority is None else np.asarray(priority, dtype=np.float64)
        self.block_hashes = window.block_hashes
        self.block_tokens = int(window.meta["block_tokens"]) if window.block_hashes is not None else None
        if not model.enable_chunked_prefill and n and int(window.input_tokens.max()) > model.max_num_batched_tokens:
            i = int(np.argmax(window.input_tokens))
            raise ValueError(f"window {window.window_id}: request {i}'s prompt ({int(window.input_tokens[i])} "
                             f"tokens) exceeds max_num_batched_tokens ({model.max_num_batched_tokens}); "
                             f"without chunked prefill it could never be admitted (vLLM requires "
                             f"max_model_len <= max_num_batched_tokens then)")
        self.arrival_ps = np.ceil(window.arrival_s * PS).astype(np.int64).tolist()   # as math.ceil(a * PS)
        self.inp = window.input_tokens.tolist()
        st = self.st = np.zeros((n, 8), dtype=np.int64)
        st[:, INP] = window.input_tokens
        st[:, OUT] = window.output_tokens
        st[:, TARGET] = window.input_tokens   # tokens to compute before the next token can be emitted
        st[:, FIRST] = st[:, FINISH] = -1
        self.decoded = read_only(st[:, DECODED])     # tokens emitted (the policies' view reads it)
        self.admit_ps = [-1] * n
        self.free_blocks = model.max_kv_tokens // model.block_size
        # vLLM's block pool with its prefix cache (None: blocks are only counted)
        self._pool = (blockpool.BlockPool(window, self.free_blocks, model.block_size,
                                          tier_blocks=model.offload_kv_tokens // model.block_size,
                                          warm=model.warm_start)
                      if model.enable_prefix_caching else None)
        self._load_ps = int(round(model.offload_s_per_token * PS))
        self._loaded = 0                # tokens loaded from the offload tier in this step
        self._tier_blocks = 0           # the last admission's blocks from the tier
        self._P = None if self._pool is None else self._pool.array
        self.prefix_queried = self.prefix_hits = 0     # tokens looked up and hit, over admissions
        self.prefix_tier_hits = 0                      # of the hit, tokens loaded from the tier
        self.waiting: list[int] = []
        self.queue_log: list[int] = []  # the queue's changes: i joined, ~i left (see EngineView)
        self.is_waiting = [False] * n
        self.running: list[int] = []
        self.step = 0
        self.t_ps = 0
        self.last_step_start_ps = 0
        self.n_preemptions = 0
        self._c = model.cost.picoseconds()
        # A cost with a per-step method (step_ps) times each step itself; no closed-form stretch then.
        self._step_ps = getattr(model.cost, "step_ps", None)
        self._kv = 0                    # Σ computed tokens over running requests
        self.prev_kv_used = 0           # _kv at the start of the last executed step
        self._wait_heap: list[tuple[int, int]] = []   # (target, request) of waiting ones, and stale rows
        self._admission_only = getattr(policy, "admission_only", False)
        self._held = np.zeros(n, dtype=np.bool_)
        self._hold_of, self._hold_arr = None, _NO_HOLD    # the last hold set, as an array
        self.refused: tuple = ()            # (request, reason) where the last decision's admissions stopped
        self._decision = _NO_DECISION       # the decision of the last executed step
        self._idle = False                  # the last executed step was idle (see _execute_step)
        self._spent = False                 # it used its whole token budget (see _execute_step)
        self._free_floor = None             # free blocks the next stretch must leave, if bounded
        self._drain_end_ps = None           # no step starts at or after it (set at the last arrival)
        self.step_starts_ps = None          # a list when recording (the step-by-step check's diagnostics)
        # scratch rows for one step: at most max_active_sequences requests run in it
        self._sched = np.zeros((model.max_active_sequences + 1, 2), dtype=np.int64)
        self._finished = np.zeros(model.max_active_sequences + 1, dtype=np.int64)
        self._victims = np.zeros(model.max_active_sequences + 1, dtype=np.int64)
        # preemption victims as vLLM chooses them for this policy: under FCFS the newest admission
        # (an empty table), under priority scheduling the largest (priority, arrival)
        prio = scheduling_priorities(window, policy) if n else None
        self._victim_prio = _NO_HOLD if prio is None else prio
        self._arrival_arr = np.asarray(self.arrival_ps, dtype=np.int64)

    # the view's interface
    def kv_used(self) -> int:
        return self._kv

    def decoded_array(self) -> np.ndarray:
        return self.decoded

    def decoded_of(self, ids) -> list:
        return self.decoded[np.asarray(ids, dtype=np.int64)].tolist()

    def cached_prefix_of(self, ids) -> np.ndarray:
        if self._pool is None:
            return np.zeros(len(ids), dtype=np.int64)
        return self._pool.cached_prefix(self.st, ids)

    def clock(self) -> tuple[float, float]:
        """(now, the last executed step's start), in seconds, as the view shows them."""
        return self.t_ps / PS, self.last_step_start_ps / PS

    def _enqueue(self, i: int, at: int | None = None) -> None:
        """Request ``i`` joins the queue: at its back, or at position ``at``."""
        if at is None:
            self.waiting.append(i)
        else:
            self.waiting.insert(at, i)
        self.queue_log.append(i)
        self.is_waiting[i] = True
        heapq.heappush(self._wait_heap, (int(self.st[i, TARGET]), i))

    def _preempt(self, i: int) -> None:
        """Recompute preemption: drop the KV of running request ``i``, put it first in the queue."""
        st = self.st
        self._kv -= int(st[i, COMPUTED])
        if self._pool is None:
            self.free_blocks += int(st[i, BLOCKS])
        else:
            self.free_blocks += blockpool.release_blocks(self._P, st, i)
        st[i, BLOCKS] = st[i, COMPUTED] = 0
        st[i, TARGET] = st[i, INP] + st[i, DECODED]
        self._requeue(i)

    def _requeue(self, i: int) -> None:
        """The queue side of a preemption (the state side is done): back at the queue's front under
        FCFS; under priority scheduling at its arrival's place (vLLM's waiting heap on (priority,
        arrival): a key policy's ties then fall in arrival order, as there)."""
        self.running.remove(i)
        # (ids are in arrival order, and so is the queue under priority scheduling)
        self._enqueue(i, bisect.bisect(self.waiting, i) if self._victim_prio.shape[0] else 0)
        self.n_preemptions += 1

    def _leave(self, n_finished: int) -> None:
        for i in self._finished[:n_finished].tolist():
            self.running.remove(i)

    def _threshold(self) -> int:
        """The step's long-prefill cap: the model's, lifted (0) while one request is in the engine."""
        thr = self.model.long_prefill_token_threshold
        return thr if thr > 0 and len(self.running) + len(self.waiting) > 1 else 0

    def _first_chunk(self, tokens: int, budget: int, thr: int) -> int:
        """The tokens a waiting request (nothing computed) computes if admitted with ``budget`` left
        under the cap ``thr`` (0: none)."""
        return min(tokens, budget, thr) if thr > 0 else min(tokens, budget)

    def _admission_blocks(self, tokens: int, budget: int, thr: int) -> int:
        """The free KV blocks a waiting request of ``tokens`` (nothing computed) needs to be admitted
        with ``budget`` tokens left: its whole sequence's under ``reserve_full_isl``, else its first
        chunk's (at least as many as the chunk takes)."""
        bs = self.model.block_size
        if self.model.reserve_full_isl:
            return -(-tokens // bs)
        return -(-self._first_chunk(tokens, budget, thr) // bs)

    def _admission_with_hit(self, i: int, target: int, budget: int, thr: int):
        """Waiting request ``i`` (``target`` tokens, nothing computed) under prefix caching: (tokens
        its cache hit skips, tokens it computes in the step, free blocks it takes: new ones and hit
        ones in the free queue, whether it fits vLLM's check: :func:`blockpool._admission`)."""
        h, t, n_new, need, check = self._pool.admission(self.st, i, budget, thr,
                                                        self.model.reserve_full_isl, self._may_hit(i))
        self._tier_blocks = t
        return (h + t) * self.model.block_size, n_new, need, check <= self.free_blocks

    def _take_blocks(self, i: int, hit: int, n_new: int) -> None:
        """Admit request ``i``'s blocks: its GPU hit ones shared, its tier hit loaded into new ones,
        new ones for its chunk, full ones cached (``hit`` counts the tier's: the last admission)."""
        st, bs = self.st, self.model.block_size
        t = self._tier_blocks
        h = hit // bs - t
        blockpool.admit(self._P, st, i, h, t, -(-(hit + n_new) // bs) - h, hit + n_new, bs)
        st[i, COMPUTED] = hit
        self._kv += hit
        self.prefix_queried += int(st[i, TARGET])
        self.prefix_hits += hit
        self.prefix_tier_hits += t * bs
        self._loaded += t * bs

    def _arrival_blocks(self, i: int, budget: int) -> int:
        """The free blocks request ``i``, not arrived yet, would need to be admitted (with prefix
        caching, at the hit it would have now: the hit can only shrink before it arrives)."""
        thr = self.model.long_prefill_token_threshold
        if self._pool is None:
            return self._admission_blocks(self.inp[i], budget, thr)
        return self._pool.fewest_blocks(self.st, [i], budget, thr, self.model.reserve_full_isl)

    def _admission_impossible(self, budget: int, free_blocks: int) -> bool:
        """No waiting request can be admitted: no slot, no budget, or too few blocks for any of them
        (with prefix caching, each one's blocks less its hit: a pure-decode stretch only lowers hits
        and free blocks, so it stays so)."""
        if not self.waiting or budget <= 0 or len(self.running) >= self.model.max_active_sequences:
            return True
        heap, st, is_waiting = self._wait_heap, self.st, self.is_waiting
        while not is_waiting[heap[0][1]] or st[heap[0][1], TARGET] != heap[0][0]:
            heapq.heappop(heap)                   # a row of a request that has left the queue
        if self._admission_blocks(heap[0][0], budget, self._threshold()) <= free_blocks:
            return False                          # one fits without a hit (a hit only lowers it)
        if self._pool is None:
            return True
        hitting = self.waiting if self.block_hashes is not None else [
            i for i in self.waiting if self.admit_ps[i] >= 0]
        return not hitting or self._pool.fewest_blocks(
            self.st, hitting, budget, self._threshold(), self.model.reserve_full_isl) > free_blocks

    def _may_hit(self, i: int) -> bool:
        """Request ``i`` may find blocks of its own in the cache: the window's prompts share prefixes,
        or it ran before (a window without block hashes shares nothing, so a request's blocks can be
        cached only if it once held them)."""
        return self.block_hashes is not None or self.admit_ps[i] >= 0

    def run(self, event_skipping: bool = True) -> None:
        """Run the window. With ``event_skipping`` (and a policy that allows it) the engine jumps:

        - over pure-decode stretches (every step alike but for the context, up to an arrival, a
          completion, block exhaustion or a policy timer: :func:`_stretch`);
        - for an ``admission_only`` policy (a decision that only admits and is a pure function of the
          view): it is asked only when a waiting request could get a slot, budget and the blocks of
          its first chunk; once none can, a stretch runs on past arrivals that could not be admitted
          either (free blocks only shrink in it); its admissions are taken lazily;
        - over a long prompt's chunk steps (``_chunk_steps``), a ``steady`` decision's steps
          (repeated without asking, walked one by one) and, after a refused admission, a
          ``repeat_if_refused`` decision's idle steps or decode stretch (``_refusal_repeats``).
        """
        n, m = self.n, self.model
        order = np.argsort(self._arrival_arr, kind="stable").tolist()
        view = EngineView(self)
        self.policy.reset(view.refresh())
        if n == 0:
            return
        nxt = 0
        self.t_ps = self.arrival_ps[order[0]]
        event_skipping = skips_steps(self.policy, event_skipping)
        # An admission-only policy is asked only when some waiting request could be admitted.
        lazy = event_skipping and self._admission_only
        # A steady decision is repeated without asking the policy while it holds (see _Repeat).
        steady = None
        while True:
            while nxt < n and self.arrival_ps[order[nxt]] <= self.t_ps:
                self._enqueue(order[nxt])
                nxt += 1
            if nxt == n and self._drain_end_ps is None:
                self._drain_end_ps = self.t_ps + int(round(m.drain_s * PS))
            if not self.waiting and not self.running:
                if nxt == n:
                    break
                self.t_ps = self.arrival_ps[order[nxt]]       # idle: jump to the next arrival
                continue
            if self._drain_end_ps is not None and self.t_ps >= self._drain_end_ps:
                break                                         # the drain bound: no step starts now
            if self.step_starts_ps is not None:
                self.step_starts_ps.append(self.t_ps)
            if steady is not None and self.step < steady.until_step and self.t_ps < steady.until_ps:
                # the policy's answer is known: the same holds, nothing admitted (and its timers)
                d = Decision(hold=steady.decision.hold, wake_at_s=steady.decision.wake_at_s,
                             wake_after_steps=steady.until_step - self.step)
            else:
                steady = None
                if not lazy:
                    d = check_decision(self.policy, self.policy.schedule(view.refresh()))
                elif self._pool is None:
                    d = None        # asked in the step, once the running requests left room
                else:
                    # The running phase evicts cached blocks, and the view shows the cache: ask
                    # first, as the step starts, unless nothing could be admitted with the whole
                    # budget (the running phase only takes budget and blocks)
                    d = _NO_DECISION if self._admission_impossible(m.max_num_batched_tokens,
                                                                   self.free_blocks) else \
                        check_decision(self.policy, self.policy.schedule(view.refresh()))
                if event_skipping and d is not None and d.steady:
                    steady = _Repeat(d, self.step + d.wake_after_steps,
                                     math.ceil(d.wake_at_s * PS) - _TIMER_MARGIN_PS
                                     if d.wake_at_s < NEVER else NEVER)
            quiet, blocked = self._execute_step(d, view)
            if event_skipping and quiet:
                k = self._quiet_steps(view, order, nxt, blocked)
                if k > 0:
                    self._bulk_decode(k)
            elif event_skipping and self._idle:
                k = self._idle_steps(order, nxt)
                if k > 0:
                    self._skip_idle(k)
            elif lazy and steady is None and self._spent:
                k, run, p, c, context = self._chunk_steps(order, nxt)
                if k > 0:
                    self._bulk_steps(k, run, p, c, context)
            if steady is not None and (self._running_changed or self.refused):
                steady = None           # a completion, a preemption or a refused admission ends it

    def _execute_step(self, d, view) -> tuple[bool, bool]:
        """One engine step. ``d`` is the policy's decision, or None to ask the (admission-only) policy
        only if an admission is possible. Returns (quiet, blocked): quiet when it was a pure-decode
        step that changed nothing else, blocked when moreover no waiting request can be admitted
        until something other than decoding happens."""
        m = self.model
        bs = m.block_size
        st, running = self.st, self.running
        hold = d.hold if d is not None else ()
        preempted = False
        kv_at_start = self._kv
        if d is not None and d.preempt:           # policy-directed preemption
            for i in d.preempt:
                if i not in running:
                    raise PolicyContractError(f"policy {self.policy.name!r} preempted request {i} at "
                                              f"step {self.step}, which is not running")
                self._preempt(i)
            preempted = True
        # a decision that read the cached prefixes: the free blocks left once those that can be taken
        # before one a waiting request's hit uses are gone (see _refusal_repeats)
        floor = None
        if d is not None and view._cache_read and self._pool is not None and d.repeat_if_refused:
            floor = self.free_blocks - self._pool.takes_sparing(st, self.waiting, self.free_blocks)
        # running requests first
        run = np.array(running, dtype=np.int64)
        thr = self._threshold()
        prio, arr, victims = self._victim_prio, self._arrival_arr, self._victims
        k, n_left, n_sched, budget, free, prefill, decodes, context, dropped, n_victims = \
            _schedule_running(run, self._hold_array(hold), self._held, st, self._sched,
                              m.max_num_batched_tokens, self.free_blocks, bs, thr, prio, arr, victims) \
            if self._P is None else \
            _schedule_running_cached(run, self._hold_array(hold), self._held, st, self._sched,
                                     m.max_num_batched_tokens, self.free_blocks, bs, thr, prio, arr, victims,
                                     self._P)
        if k < 0:
            bad = next(i for i in sorted(hold) if not 0 <= i < self.n)
            raise PolicyContractError(f"policy {self.policy.name!r} held request {bad} at step "
                                      f"{self.step}, which is not in the window")
        self.free_blocks = free
        if n_victims:                             # the engine preempted
            self._kv -= dropped
            for v in victims[:n_victims].tolist():
                self._requeue(v)
            preempted = True
        all_ran = k == n_left
        # An admission refused for blocks or budget may go through later without any event (the
        # policy's own list can change as KV grows), so such a step is never quiet, unless no waiting
        # request at all could be admitted; one refused only for sequence slots stays refused until
        # a completion.
        refused_for_room = admitted = False
        self.refused = ()
        if d is None:
            # nothing has changed that the view shows, so it still shows the step's start
            d = _NO_DECISION if preempted or self._admission_impossible(budget, self.free_blocks) else \
                check_decision(self.policy, self.policy.schedule(view.refresh()))
        self._decision = d
        if not preempted:
            sched = self._sched
            taken = []                  # the queue changes once the admissions are taken
            caps = m.partial_prefill_caps
            if caps:                    # prefills of the step so far (all of them, the long ones)
                n_pre, n_long = self._running_prefills(n_sched)
                passed = []             # long requests passed over (v0's leftover waiting requests)
            for i in d.admit:
                check_in_window(self.policy, self.step, i, self.n)
                i = int(i)
                if not self.is_waiting[i]:
                    if i in running or self.st[i, FINISH] >= 0 or self.arrival_ps[i] > self.t_ps:
                        raise PolicyContractError(f"policy {self.policy.name!r} admitted request {i} "
                                                  f"at step {self.step}, which is not waiting")
                    continue
                if len(running) >= m.max_active_sequences:
                    self.refused = ((i, "seqs"),)
                    break
                if budget <= 0:
                    refused_for_room = True
                    self.refused = ((i, "budget"),)
                    break
                target = int(st[i, TARGET])           # nothing computed, no blocks while waiting
                is_prefill = target > 1 or st[i, DECODED] == 0
                if caps and is_prefill:
                    if n_pre >= m.max_num_partial_prefills:
                        refused_for_room = True
                        self.refused = ((i, "prefills"),)
                        break                      # no more prefills this step
                    if target > m.long_prefill_token_threshold:
                        if n_long >= m.max_long_partial_prefills:
                            refused_for_room = True
                            passed.append((i, "long_prefills"))
                            continue               # passed over: shorter prompts may go ahead
                        n_long += 1
                    n_pre += 1
                if self._pool is None:
                    hit = 0
                    n_new = self._first_chunk(target, budget, thr)
                    need = -(-n_new // bs)
                    fits = max(need, self._admission_blocks(target, budget, thr)) <= self.free_blocks
                else:
                    hit, n_new, need, fits = self._admission_with_hit(i, target, budget, thr)
                if not m.enable_chunked_prefill and self._first_chunk(target - hit, target, thr) > budget:
                    refused_for_room = True        # what it computes (under the cap) exceeds the
                    self.refused = ((i, "budget"),)   # budget left: vLLM without chunked prefill
                    break                          # stops admission here
                if not fits:
                    refused_for_room = True
                    self.refused = ((i, "kv"),)
                    break                          # head-of-line: admission stops here
                self.free_blocks -= need
                if self._pool is None:
                    st[i, BLOCKS] = need
                else:
                    self._take_blocks(i, hit, n_new)
                    context += hit
                taken.append(i)
                self.is_waiting[i] = False
                running.append(i)
                if self.admit_ps[i] < 0:
                    self.admit_ps[i] = self.t_ps
                sched[n_sched] = i, n_new
                n_sched += 1
                if target - hit > 1 or st[i, DECODED] == 0:
                    prefill += n_new
                else:
                    decodes += 1
                budget -= n_new
                admitted = True
            if caps and passed:         # the long requests passed over, then where the walk stopped
                self.refused = (*passed, *self.refused)
            for i in taken:
                self.waiting.remove(i)
                self.queue_log.append(~i)
        self._spent = budget <= 0              # the step's token budget all used (see _chunk_steps)
        # step time from the batch
        c0, cp, cd, cc, cg = self._c
        self.last_step_start_ps = self.t_ps
        self.prev_kv_used = kv_at_start
        if self._step_ps is None:
            self.t_ps += c0 + cg + cp * prefill + cd * decodes + cc * context
        else:
            self.t_ps += self._step_ps(self.step, self.t_ps, prefill, decodes, context, n_sched)
        if self._loaded:                       # blocks loaded from the offload tier, before the step
            self.t_ps += self._load_ps * self._loaded
            self._loaded = 0
        self.step += 1
        n_fin, freed, kv, mid_prefill = _advance(self._sched, n_sched, st, self.t_ps, self._finished) \
            if self._P is None else _advance_cached(self._sched, n_sched, st, self.t_ps, self._finished, self._P)
        self._kv += kv
        self.free_blocks += freed
        if n_fin:
            self._leave(n_fin)
        self._running_changed = preempted or n_fin > 0
        # Idle: nothing ran, nothing was admitted (the first proposal refused) and nothing preempted;
        # the next steps repeat this one, which changed nothing but the clock, as long as the policy
        # would answer the same (its repeat_if_refused claim).
        self._idle = n_sched == 0 and bool(self.refused) and not preempted and bool(d.repeat_if_refused)
        self._free_floor = None
        # Blocked: with an admission-only policy, after any step in which every running request is
        # left decoding and no waiting one can be admitted, the next steps are pure decodes until a
        # completion, block exhaustion or an arrival that could be admitted.
        budget_next = m.max_num_batched_tokens - len(running)
        if (self._admission_only and all_ran and not mid_prefill and budget_next >= 0
                and (running or self.waiting) and self._admission_impossible(budget_next, self.free_blocks)):
            return True, True
        # Quiet: a pure-decode step where every running request ran and nothing else happened, so the
        # next steps repeat it until an arrival, a completion, block exhaustion or a policy timer.
        if prefill or admitted or preempted or n_fin or hold or not all_ran:
            return False, False
        return not refused_for_room or self._refusal_repeats(floor), False

    def _refusal_repeats(self, floor) -> bool:
        """After a pure-decode step whose admission stopped at its first proposal for want of KV
        blocks, the next steps repeat it up to an event: a ``repeat_if_refused`` decision is the
        same until then (the policy's claim), and that request's blocks stay short. Decoding only
        takes free blocks, and the blocks the request asks for do not shrink: without a prefix cache
        its first chunk is the same (so is the budget left); with one, its check is its whole
        sequence's less its hit (``reserve_full_isl``), and an eviction cuts the hit by no more
        blocks than it takes out of the free ones. (A first chunk's blocks with a hit may shrink.)
        A decision that read the cached prefixes holds only while those of the waiting requests do:
        counted from the decision (the step's start), the step and the stretch then leave at least
        ``floor`` free blocks, those that were behind the free queue's first hit block (the stretch
        reads it from ``_free_floor``)."""
        if not (len(self.refused) == 1 and self.refused[0][1] == "kv"
                and (self._pool is None or self.model.reserve_full_isl) and self._decision.repeat_if_refused):
            return False
        if floor is not None:
            if self.free_blocks < floor:
                return False            # this step's running requests may have evicted a hit
            self._free_floor = floor
        return True

    def _running_prefills(self, n_sched: int) -> tuple[int, int]:
        """(prefills, long prefills) among the step's first ``n_sched`` scheduled (running) requests:
        a request still prefilling, long when more than the threshold of its prompt (or recompute)
        was left to compute at the step's start."""
        st, thr = self.st, self.model.long_prefill_token_threshold
        n_pre = n_long = 0
        for i in self._sched[:n_sched, 0].tolist():
            left = int(st[i, TARGET] - st[i, COMPUTED])
            if left > 1 or st[i, DECODED] == 0:
                n_pre += 1
                n_long += left > thr
        return n_pre, n_long

    def _hold_array(self, hold) -> np.ndarray:
        """``hold`` as an array of ids, kept for the next step while the policy (or a repeated steady
        decision) returns the same frozenset (a mutable set may have changed in between)."""
        if not hold:
            return _NO_HOLD
        if hold is not self._hold_of or type(hold) is not frozenset:
            self._hold_of, self._hold_arr = hold, np.fromiter(hold, dtype=np.int64, count=len(hold))
        return self._hold_arr

    def _span_ps(self, k: int, D: int, C0: int, c: int = 0) -> int:
        """Sum of the next ``k`` step times of ``D`` decodes and ``c`` prefill tokens each, over a
        context of ``C0`` tokens that grows by ``D + c`` a step."""
        c0, cp, cd, cc, cg = self._c
        return k * (c0 + cg + cp * c + cd * D + cc * C0) + cc * (D + c) * (k * (k - 1) // 2)

    def _steps_starting_before(self, limit_ps: int, k: int, D: int, C0: int, c: int = 0) -> int:
        """The most of the next ``k`` such steps (see :meth:`_span_ps`) that all start before ``limit_ps``."""
        limit = limit_ps - self.t_ps        # the j-th step of a stretch starts at span(j - 1)
        if k <= 0 or self._span_ps(k - 1, D, C0, c) < limit:
            return max(0, k)
        lo, hi = 0, k - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._span_ps(mid - 1, D, C0, c) < limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _quiet_steps(self, view, order, nxt, blocked) -> int:
        """How many next steps are pure decodes in which nothing else can happen (the last of them
        may complete requests: they leave at its end, as they would walking step by step).

        ``blocked``: no waiting request can be admitted during them (and the policy only admits), so
        neither the policy's timers nor arrivals that could not be admitted either end the stretch.
        """
        if self._step_ps is not None:
            return 0                    # a per-step cost: every step is walked
        m = self.model
        D = len(self.running)
        C0 = self._kv
        # completions (the first one included) and KV blocks
        free = self.free_blocks - (self._free_floor or 0)
        k = _stretch_bound(np.array(self.running, dtype=np.int64), self.st, free, m.block_size, _MAX_STRETCH,
                           -1, 0)
        # the next arrival that matters: every step of the stretch must start before it
        stop = nxt
        if blocked and k > 0:
            budget = m.max_num_batched_tokens - D
            slot = D < m.max_active_sequences
            end_ps = self.t_ps + self._span_ps(k, D, C0)
            n = self.n
            # The last arrival always stops the stretch: it starts the drain clock.
            while stop < n - 1 and self.arrival_ps[order[stop]] < end_ps and not (
                    slot and budget > 0
                    and self._arrival_blocks(order[stop], budget) <= self.free_blocks):
                stop += 1
        if stop < self.n:
            k = self._steps_starting_before(self.arrival_ps[order[stop]], k, D, C0)
        if not blocked:
            # the policy's timers (of the decision of the step just executed)
            d = self._decision
            if d.wake_after_steps < NEVER:
                k = min(k, int(d.wake_after_steps) - 1)
            if d.wake_at_s < NEVER:
                # no skipped step may start at or after the timer (a microsecond early, for round-off)
                k = self._steps_starting_before(math.ceil(d.wake_at_s * PS) - _TIMER_MARGIN_PS, k, D, C0)
        if self._drain_end_ps is not None:
            k = self._steps_starting_before(self._drain_end_ps, k, D, C0)
        return max(0, k)

    def _idle_steps(self, order, nxt) -> int:
        """How many next steps repeat an idle one (see ``_execute_step``): each lasts the fixed cost
        and starts before the next arrival, the last decision's clock timer and the drain bound (its
        claim: the same answer until an arrival or ``wake_at_s``)."""
        if self._step_ps is not None:
            return 0                    # a per-step cost: every step is walked
        d = self._decision
        k = _MAX_STRETCH
        if nxt < self.n:
            k = self._steps_starting_before(self.arrival_ps[order[nxt]], k, 0, 0)
        if d.wake_at_s < NEVER:
            k = self._steps_starting_before(math.ceil(d.wake_at_s * PS) - _TIMER_MARGIN_PS, k, 0, 0)
        if self._drain_end_ps is not None:
            k = self._steps_starting_before(self._drain_end_ps, k, 0, 0)
        return max(0, k)

    def _skip_idle(self, k: int) -> None:
        """Run ``k`` idle steps at once: the same holds, the same refusal, only the clock moves."""
        self.last_step_start_ps = self.t_ps + self._span_ps(k - 1, 0, 0)
        self.prev_kv_used = self._kv
        self.t_ps += self._span_ps(k, 0, 0)
        self.step += k

    def _bulk_decode(self, k: int) -> None:
        """Run ``k`` pure-decode steps at once; requests whose last token comes in the k-th leave."""
        self._bulk_steps(k, np.array(self.running, dtype=np.int64), -1, 0, self._kv)

    def _chunk_steps(self, order, nxt) -> tuple[int, np.ndarray, int, int, int]:
        """How many next steps repeat a chunk step (:func:`_chunk_shape`), with (the scheduled
        requests, the prefilling one's position among them, its chunk, the first step's context).
        The policy only admits and the budget is spent before the waiting queue, so it would not be
        asked, and an arrival changes nothing but the queue; the last arrival ends the stretch (it
        starts the drain clock), and so does the drain bound. (Only without the long-prefill cap,
        which an arrival may switch on, and with the closed-form step cost.)"""
        m = self.model
        if self._step_ps is not None or m.long_prefill_token_threshold > 0 or not self.running:
            return 0, _NO_HOLD, -1, 0, 0
        run = np.array(self.running, dtype=np.int64)
        p, c, context = _chunk_shape(run, self.st, m.max_num_batched_tokens)
        if p < 0:
            return 0, _NO_HOLD, -1, 0, 0
        run = run[:p + 1]
        k = _stretch_bound(run, self.st, self.free_blocks, m.block_size, _MAX_STRETCH, p, c)
        if nxt < self.n:
            k = self._steps_starting_before(self.arrival_ps[order[-1]], k, p, context, c)
        if self._drain_end_ps is not None:
            k = self._steps_starting_before(self._drain_end_ps, k, p, context, c)
        return max(0, k), run, p, c, context

    def _bulk_steps(self, k: int, run: np.ndarray, p: int, c: int, context: int) -> None:
        """Run ``k`` steps of one shape at once (see :func:`_stretch`): ``run``'s requests decode,
        but the one at position ``p`` (-1: none), which prefills ``c`` tokens a step; the first step
        attends over ``context`` tokens. Decoders whose last token comes in the k-th leave."""
        D = len(run) - (p >= 0)
        grow = D + (c if p >= 0 else 0)          # tokens computed a step
        C0 = self._kv
        self.last_step_start_ps = self.t_ps + self._span_ps(k - 1, D, context, c)
        self.prev_kv_used = C0 + grow * (k - 1)
        self.t_ps += self._span_ps(k, D, context, c)
        self.step += k
        bs = self.model.block_size
        n_fin, taken, kv = _decode_stretch(run, self.st, k, bs, self.t_ps, self._finished, p, c) \
            if self._P is None else _decode_stretch_cached(run, self.st, k, bs, self.t_ps, self._finished,
                                                           self._P, p, c)
        self.free_blocks -= taken
        self._kv += kv
        if n_fin:
            self._leave(n_fin)
            self._running_changed = True

    def result(self, window) -> RunResult:
        def stamp(ps):
            arr = np.asarray(ps, dtype=np.float64)
            out = arr / PS
            out[arr < 0] = np.nan
            return out

        return RunResult(window.window_id, self.policy.name, self.model.name, window.arrival_s,
                         window.deadline_s, window.input_tokens, window.output_tokens, self.priority,
                         admit_s=stamp(self.admit_ps), first_token_s=stamp(self.st[:, FIRST]),
                         finish_s=stamp(self.st[:, FINISH]), duration_s=self.last_step_start_ps / PS,
                         n_steps=self.step, n_preemptions=self.n_preemptions,
                         prefix_queried_tokens=self.prefix_queried, prefix_hit_tokens=self.prefix_hits,
                         prefix_tier_hit_tokens=self.prefix_tier_hits)
