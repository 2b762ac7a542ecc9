"""``fastserve_mlfq``: FastServe's skip-join multi-level feedback queue, preemptive.

Design followed: FastServe (Wu et al., "Fast Distributed Inference Serving for Large Language
Models", arXiv 2305.05920; ``MLFQ`` in LLMServe/FastServe ``fastserve/scheduler.py``) and the vLLM v1
MLFQ proposal (PR #25567, ``vllm/v1/core/sched/mlfq_request_queue.py``):

- **levels and quanta**: level ``k`` (0 = highest priority) has a quantum of
  ``base_quantum * quantum_ratio**k`` tokens; FastServe's ratio is 2 and its level count is
  unbounded (queues are added on demand; ``num_levels`` caps it, vLLM's PR uses 6). FastServe's base
  quantum is 10 ms of execution, about one decode iteration on its GPUs; the vLLM PR counts one
  iteration: ``base_quantum = 1`` token;
- **skip-join**: a request joins the highest level whose quantum covers its first iteration:
  FastServe's rule (the smallest ``k`` with ``quantum(k) >= prefill cost``) with the prefill cost
  counted as ``prompt / skip_join_base`` base quanta (the vLLM PR's ``skip_join_base = 128``
  tokens): prompts up to 128 tokens join level 0, up to 256 level 1, and so on;
- **demotion**: a running request that has generated a level's quantum of tokens there moves one
  level down (FastServe; the vLLM PR skips two);
- **starvation**: a waiting request not served for ``starvation_s`` (FastServe: 3 s since its last
  iteration) is promoted to level 0 (FastServe checks every 1000 iterations; here at once). It goes
  to the front of the queue but evicts only what its level before the promotion could (until it
  runs again): with the engines' recompute preemption, evicting from level 0 makes starving long
  requests evict one another forever under ``lssp`` (each eviction drops the tokens generated),
  where FastServe's swapping keeps them;
- **preemptive**: the order is (level, running before waiting, arrival); a waiting request that does
  not fit evicts running requests of strictly lower level, the lowest first, when that makes it fit
  (the walk of :func:`~portbench.engine.queue.admit_by_key`).
  FastServe rebuilds the batch each iteration and swaps evicted KV to host memory; here eviction is
  the engines' recompute preemption (``lssp`` drops the generated tokens), a much dearer move.

A preempted request keeps its level and starts a fresh quantum when it runs again. Misfits are
skipped under ``lssp`` and stop admission under ``vllm_v1``, as for every study policy.

Timers: demotions count tokens, so levels are caught up exactly from ``view.decoded`` at each call;
a demotion changes a decision only when it takes a running request below the level a waiting
request evicts from (it becomes evictable): the decision's ``wake_after_steps`` is the fewest tokens
any running request needs for that (one token per step at most, so never late). A starvation
promotion needs no timer: it changes only the order of the queue, which matters only at steps where
something can be admitted, and those follow an event; the promotion is applied at the next call
(``now`` past the threshold), with the same result.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..engine.api import NEVER, Decision, Policy
from . import register
from ..engine.queue import WaitingOrder, admit_by_key, arrival_rank, ranked_key


#: Levels tracked when ``num_levels`` is None (quanta past 2**60 tokens are never used up).
_TOP_LEVEL = 64
_NO_END = float(2 ** 62)


@register
class FastServeMlfq(Policy):
    """Skip-join MLFQ (FastServe): token quanta doubling per level, starvation promotion, eviction."""

    name = "fastserve_mlfq"
    event_driven = True         # its timers: see the module docstring

    def __init__(self, base_quantum: int = 1, quantum_ratio: float = 2.0, skip_join_base: int = 128,
                 num_levels: int | None = None, starvation_s: float = 3.0):
        if not (int(base_quantum) == base_quantum and base_quantum >= 1):
            raise ValueError(f"fastserve_mlfq: base_quantum must be a whole number of tokens >= 1, "
                             f"got {base_quantum!r}")
        if not quantum_ratio > 1:
            raise ValueError(f"fastserve_mlfq: quantum_ratio must be > 1 (quanta grow with the "
                             f"level), got {quantum_ratio!r}")
        if not (int(skip_join_base) == skip_join_base and skip_join_base >= 1):
            raise ValueError(f"fastserve_mlfq: skip_join_base must be a token count >= 1, "
                             f"got {skip_join_base!r}")
        if num_levels is not None and not (int(num_levels) == num_levels and num_levels >= 1):
            raise ValueError(f"fastserve_mlfq: num_levels must be None (unbounded) or >= 1, "
                             f"got {num_levels!r}")
        if not starvation_s > 0:
            raise ValueError(f"fastserve_mlfq: starvation_s must be positive (math.inf: never "
                             f"promote), got {starvation_s!r}")
        self.base_quantum = int(base_quantum)
        self.quantum_ratio = float(quantum_ratio)
        self.skip_join_base = int(skip_join_base)
        self.num_levels = None if num_levels is None else int(num_levels)
        self.starvation_s = float(starvation_s)

    def quantum(self, level: int) -> int:
        """Tokens a request generates at ``level`` before it is demoted."""
        return max(1, int(self.base_quantum * self.quantum_ratio ** level))

    def join_level(self, prompt: int) -> int:
        """Skip-join: the smallest level whose quantum covers ``prompt / skip_join_base`` quanta."""
        need = -(-int(prompt) // self.skip_join_base)           # prefill cost in base quanta
        level = 0
        while self.quantum(level) < need * self.base_quantum:
            level += 1
        return level if self.num_levels is None else min(level, self.num_levels - 1)

    def join_levels(self, prompts, top: int) -> np.ndarray:
        """:meth:`join_level` of every prompt in ``prompts``, at most ``top - 1``, as an array."""
        quanta = np.array([float(self.quantum(x)) for x in range(top)])   # non-decreasing
        need = -(-np.asarray(prompts, dtype=np.int64) // self.skip_join_base) * self.base_quantum
        level = np.searchsorted(quanta, need.astype(np.float64), side="left")
        cap = top if self.num_levels is None else min(top, self.num_levels)
        return np.minimum(level, cap - 1).astype(np.int64)

    def reset(self, view):
        n = view.n_requests
        # Quanta add up: a request that joined level k has reached level L after
        # tokens_to_level[L] - tokens_to_level[k] tokens (the last level, if capped, never ends).
        top = self.num_levels if self.num_levels is not None else _TOP_LEVEL
        q = [self.quantum(x) for x in range(top - 1)] + [_NO_END]
        self._to_level = np.concatenate(([0], np.cumsum(q, dtype=np.float64)))
        self.level = self.join_levels(view.input_tokens, top)
        self.evict_level = self.level.copy()     # = level, but kept through a starvation promotion
        # each request's keys while it waits (ranked_key's, kept as the levels change): level,
        # running before waiting, arrival; a waiting request evicts from its evict_level. A running
        # request's key is its waiting key less n.
        self._tie = arrival_rank(view)
        everyone = np.arange(n)
        self._wkey = ranked_key(self.level, everyone, n, self._tie)
        self._ekey = ranked_key(self.evict_level, everyone, n, self._tie)
        self.anchor = np.zeros(n, dtype=np.int64)            # decoded when the current level began
        self.last_served_s = np.array(view.arrival_s, dtype=np.float64)
        self._prev_running: set = set()        # the running requests at the last call
        # waiting levels change only by promotion; the queue's tally is kept as it changes
        self._waiting = WaitingOrder(on_change=self._queue_changed)
        self._demote_and_cross = _compiled()
        self._queued: set = set()                             # the waiting requests
        self._per_level = np.zeros(top, dtype=np.int64)      # waiting requests per evict_level
        self._counted = np.zeros(n, dtype=np.int64)          # the evict_level each was counted at
        # (last served, request) of every time a request started waiting: the oldest first
        self._since = sorted(zip(view.arrival_s.tolist(), range(n)))

    def _queue_changed(self, gone, new):
        queued, per_level, counted, evict_level = self._queued, self._per_level, self._counted, self.evict_level
        if gone is None:
            queued.clear()
            per_level[:] = 0
            gone = ()
        for i in gone:
            queued.discard(i)
            per_level[counted[i]] -= 1
        for i in new:
            queued.add(i)
            counted[i] = lv = evict_level[i]
            per_level[lv] += 1

    def schedule(self, view):
        dec = view.decoded
        now = view.now
        level, anchor, to_level = self.level, self.anchor, self._to_level
        evict_level = self.evict_level
        running = view.running
        # Requests that ran at the last call and no longer do were evicted (or finished): a fresh
        # quantum at their level, and their wait for service starts now.
        starvation = self.starvation_s
        since_heap, last_served = self._since, self.last_served_s
        now_running = set(running)
        for i in self._prev_running - now_running:
            anchor[i] = dec[i]
            last_served[i] = now
            heapq.heappush(since_heap, (now, i))
        self._prev_running = now_running
        # (level, running before waiting, arrival); a request evicts only from lower levels, and one
        # promoted for starvation only from the level it had before
        wkey, ekey, n = self._wkey, self._ekey, view.n_requests
        self._waiting.get(view, wkey, ekey)
        # starvation: waiting requests below level 0 not served for starvation_s, found from the
        # oldest "last served" on (entries of requests since served again or gone are stale)
        starving = []
        queued, tie = self._queued, self._tie
        while since_heap and now - since_heap[0][0] >= starvation:
            since, i = heapq.heappop(since_heap)
            if i in queued and level[i] > 0 and last_served[i] == since:
                level[i] = 0
                anchor[i] = dec[i]
                wkey[i] = tie[i] + n                # ranked_key's, at level 0 and waiting
                starving.append(i)
        if starving:
            self._waiting.rekey(starving, wkey, ekey)
        # Demotions of the running requests (the waiting ones' levels and the queue's tally above do
        # not depend on them), and the timer: one compiled pass.
        r = np.fromiter(running, dtype=np.int64, count=len(running))
        wake = self._demote_and_cross(r, dec, level, evict_level, anchor, to_level, self._per_level,
                                      len(self._waiting.ids) > 0, wkey, ekey, n)
        admit, preempt = admit_by_key(view, self._waiting, lambda r: wkey[r] - n, decoded=dec)
        return Decision(admit=admit, preempt=preempt, wake_after_steps=wake)


_COMPILED = None


def _compiled():
    """:func:`_demote_and_cross` compiled with numba, on first use: numba (and llvmlite) are imported
    only by runs of this policy, not by importing the policy registry — a vLLM process (the real-
    engine backend imports the registry) must not load llvmlite, whose objects vLLM's CPU platform
    trips over when it scans every loaded module at start-up."""
    global _COMPILED
    if _COMPILED is None:
        import numba
        _COMPILED = numba.njit(cache=True)(_demote_and_cross)
    return _COMPILED


def _demote_and_cross(r, dec, level, evict_level, anchor, to_level, per_level, want_wake, wkey, ekey,
                      n):
    """Catch the running requests ``r`` up on their demotions (in place, and their keys ``wkey``,
    ``ekey`` with them: see ``FastServeMlfq.reset``; ``n`` requests), then, when ``want_wake``,
    the fewest tokens a running request must generate to drop below the level a waiting request
    evicts from, where it is not yet (then it becomes evictable by that request); NEVER if none.

    Demotion: a request whose level ``lv`` began when it had decoded ``anchor`` tokens is at the last
    level ``L`` with ``to_level[L] <= to_level[lv] + (decoded - anchor)``, and its anchor moves on by
    ``to_level[L] - to_level[lv]`` tokens.
    """
    n_lv = to_level.shape[0]
    for j in range(r.shape[0]):
        i = r[j]
        base = to_level[level[i]]
        x = base + (dec[i] - anchor[i])
        lo, hi = 0, n_lv                    # the first level whose start lies past x
        while lo < hi:
            mid = (lo + hi) // 2
            if to_level[mid] <= x:
                lo = mid + 1
            else:
                hi = mid
        new = lo - 1
        anchor[i] += np.int64(to_level[new] - base)
        wkey[i] += (new - level[i]) * (2 * n)
        ekey[i] = wkey[i]
        level[i] = new
        evict_level[i] = new
    if not want_wake or r.shape[0] == 0:
        return NEVER
    # the first level at or below each level (by index: at or after it) holding a waiting request
    n_pl = per_level.shape[0]
    first_waiting = np.full(n_pl + 1, -1, dtype=np.int64)
    for lv in range(n_pl - 1, -1, -1):
        first_waiting[lv] = lv if per_level[lv] > 0 else first_waiting[lv + 1]
    best = NEVER
    for j in range(r.shape[0]):
        i = r[j]
        lv = level[i]
        if lv < 0 or lv >= n_pl or first_waiting[lv] < 0:
            continue
        target = first_waiting[lv] + 1           # the level to reach
        if target >= n_lv - 1:
            continue
        tokens = to_level[target] - to_level[lv] - (dec[i] - anchor[i])
        if tokens < best:
            best = tokens
    if best < _NO_END:
        return max(1.0, best)
    return NEVER
