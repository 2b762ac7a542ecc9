"""``vllm_priority``: vLLM's ``priority`` scheduling policy, with the SLO deadline as the priority.

Design followed (vllm-project/vllm): the v1 scheduler (``vllm/v1/core/sched/scheduler.py``) keeps
the waiting queue as a heap ordered by ``(priority, arrival_time)`` (lower value first) and, when it
must preempt, evicts ``max(running, key=(priority, arrival_time))`` — the lowest-priority, latest
request. Here ``priority = deadline_s``: an earlier SLO deadline is a higher priority (as the vLLM
real-engine backend already maps ``edf``).

How it maps onto portbench, where the engine owns KV:

- admission walks the waiting queue in ``(deadline, arrival, id)`` order; a request that does not
  fit is skipped under the ``lssp`` engine (as for every study policy) and stops admission under
  ``vllm_v1`` (the engine's head-of-line rule, as vLLM's ``break``);
- **priority preemption**: when the highest-priority waiting requests do not fit the engine as it
  is (no sequence slot, or a prompt not in the KV room), each in turn evicts running requests of
  strictly lower priority, lowest first, if that makes it fit (and evicts nothing when even all of
  them would not); once a request fits into free room the step only admits (see
  :func:`admit_by_key`). vLLM v1 itself only preempts when a *running* request cannot grow its KV;
  the waiting-triggered rule is vLLM v0's ``Scheduler._schedule_priority_preemption``
  (``vllm/core/scheduler.py``: the queue head evicts lower priorities until it can be scheduled),
  which v1 dropped. The engine's own growth preemption stays the engine's: ``vllm_v1`` evicts the
  newest admission, not the lowest priority; ``lssp`` never evicts.

Priorities are static, so no timer: over a skipped stretch KV only grows, which can only turn a
fitting request or a feasible eviction into an unfeasible one.

This module also holds the walk the preemptive RQ7 policies share (``las``, ``srpt_oracle``,
``fastserve_mlfq``): :func:`admit_by_key` over integer keys, and :class:`WaitingOrder`.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from ..sim import Decision, Policy
from . import register


def arrival_rank(view) -> np.ndarray:
    """Each request's position in (arrival, id) order: a unique integer tie-break."""
    order = np.lexsort((np.arange(view.n_requests), view.arrival_s))
    rank = np.empty(view.n_requests, dtype=np.int64)
    rank[order] = np.arange(view.n_requests)
    return rank


def ranked_key(primary, ids, n_waiting: int, tie, running_first: bool = True) -> np.ndarray:
    """Unique int64 keys (lower = served first) for ``ids`` (the waiting ones first, then the running
    ones, as :func:`admit_by_key` passes them): ``primary`` (non-negative ints), then — when
    ``running_first`` — running before waiting, so that equals never evict one another, then
    ``tie`` (a unique rank per request, e.g. :func:`arrival_rank`)."""
    n = len(tie)
    key = np.asarray(primary, dtype=np.int64) * (2 * n) + tie[ids]
    if running_first:
        key[:n_waiting] += n
    return key


class WaitingOrder:
    """The waiting queue sorted by key, kept up to date across a policy's calls.

    For a policy whose waiting requests' keys do not change while they wait (a fixed priority,
    attained service, remaining output): pass one instance to :func:`admit_by_key` at every call
    — or, for a policy that walks the queue itself, call :meth:`get` at every call and set
    ``yielded`` to the requests it admitted (as ``least_laxity_first`` and ``slai_faithful`` do);
    when some waiting requests' keys do change, say so with :meth:`rekey` (or :meth:`clear`).
    Between two calls the engine's queue only loses the admitted requests, gains evicted ones at
    its front and arrivals at its end: the sorted arrays are updated for those (checked against the
    queue, else rebuilt).
    """

    def __init__(self):
        self.clear()
        self._running: tuple = ()
        self.yielded: list = []          # admissions proposed at the last call (as consumed)
        self.evicted: list = []          # evictions decided at the last call
        self._mark = None                # scratch flags, one per request

    def clear(self):
        self.waiting = None

    def get(self, view, key, evict_key=None):
        t = view.waiting
        if t != self.waiting:
            # (a short queue is cheaper to sort again than to update)
            if self.waiting is None or len(t) < 256 or not self._update(t, view, key, evict_key):
                ids = np.fromiter(t, dtype=np.int64, count=len(t))
                k = key(ids, len(t))
                order = np.argsort(k)
                self.ids, self.keys = ids[order], k[order]
                self.ekeys = None if evict_key is None else evict_key(self.ids)
            self.waiting = t
        self._running = view.running
        self.yielded, self.evicted = [], []
        return self

    def rekey(self, ids, key, evict_key=None):
        """The keys of waiting requests ``ids`` have changed: move them to their new places."""
        if self.waiting is not None and len(ids):
            self._replace(ids, ids, key, evict_key)

    def _update(self, t, view, key, evict_key) -> bool:
        old = self.waiting
        now_running = set(view.running)
        gone = [i for i in self.yielded if i in now_running or i not in t]     # admitted
        evicted = set(self.evicted)
        evicted.update(set(self._running).difference(now_running))
        n_front = 0
        while n_front < len(t) and t[n_front] in evicted:
            n_front += 1
        n_mid = len(old) - len(gone)
        n_new = len(t) - n_front - n_mid
        if n_new < 0:
            return False
        if n_mid:
            out = set(gone)
            first = next(i for i in old if i not in out)
            last = next(i for i in reversed(old) if i not in out)
            if t[n_front] != first or t[n_front + n_mid - 1] != last:
                return False
        self._replace(gone, t[:n_front] + t[len(t) - n_new:], key, evict_key)
        return True

    def _replace(self, gone, new, key, evict_key):
        """Drop requests ``gone`` and insert requests ``new`` (with their keys now)."""
        ids, keys, ekeys = self.ids, self.keys, self.ekeys
        if len(gone):
            top = max(int(max(gone)), int(ids.max()) if len(ids) else 0) + 1
            if self._mark is None or len(self._mark) < top:
                self._mark = np.zeros(max(top, 2 * (0 if self._mark is None else len(self._mark))),
                                      dtype=bool)
            self._mark[gone] = True
            keep = ~self._mark[ids]
            self._mark[gone] = False
            ids, keys = ids[keep], keys[keep]
            ekeys = None if ekeys is None else ekeys[keep]
        if len(new):
            nid = np.array(new, dtype=np.int64)
            nk = key(nid, len(nid))
            o = np.argsort(nk)
            nid, nk = nid[o], nk[o]
            at = np.searchsorted(keys, nk) + np.arange(len(nk))      # their places in the result
            old_at = np.ones(len(keys) + len(nk), dtype=bool)
            old_at[at] = False
            ids, keys = _merge(ids, nid, at, old_at), _merge(keys, nk, at, old_at)
            if ekeys is not None:
                ekeys = _merge(ekeys, evict_key(nid), at, old_at)
        self.ids, self.keys, self.ekeys = ids, keys, ekeys


def _merge(old, new, at, old_at):
    out = np.empty(len(old) + len(new), dtype=old.dtype)
    out[at] = new
    out[old_at] = old
    return out


def admit_by_key(view, key, evict_key=None, decoded=None, cache: WaitingOrder | None = None):
    """Admissions and evictions from one walk down the waiting requests in key order.

    ``key(ids, n_waiting)`` gives unique int64 keys, lower first: to ``ids`` = some waiting ids
    (the first ``n_waiting``) then some running ones. While the walk has admitted nothing into room
    that was free, a waiting request that does not fit the engine's hard limits (one more sequence,
    its prompt in the KV room) evicts running requests ranked below it, lowest first, when evicting
    all of those would make it fit: it evicts just enough and is admitted; otherwise it is skipped.
    ``evict_key(waiting_ids)`` (default: their ``key``) is the rank a request evicts from: running
    requests with a larger key are below it (a key past every running one's: it never evicts).
    From the first request that fits, the walk only admits what fits, lazily. Evictions are thus
    decided on the engine's state at the call, never to make room for this call's own admissions
    into free room (``vllm_v1`` admits nothing in a step that evicts). An evicted request frees a
    slot and an estimated ``prompt + decoded`` KV tokens (exact under ``lssp``).

    ``cache``: a :class:`WaitingOrder` kept by the policy. Returns ``(admit, preempt)``:
    ``preempt`` a list, ``admit`` an iterable.
    """
    w = (cache or WaitingOrder()).get(view, key, evict_key)
    nw, nr = len(view.waiting), len(view.running)
    if not nw:
        return [], []
    m = view.model
    slots = min(m.max_active_sequences, m.max_batch_tokens)
    head = 0                                  # waiting requests up to the last that may evict
    if nr:
        rids = np.fromiter(view.running, dtype=np.int64, count=nr)
        kr = key(rids, 0)
        lowest = kr.max()
        ahead = int(np.searchsorted(w.keys, lowest))   # waiting ranked above the lowest running
        if w.ekeys is None:
            head = ahead
        elif ahead:
            allowed = np.flatnonzero(w.ekeys[:ahead] < lowest)
            head = int(allowed[-1]) + 1 if len(allowed) else 0
    if not head and nr >= slots:
        return [], []
    inp = view.input_tokens
    room = m.max_kv_tokens
    active, kv = nr, view.kv_used
    admit, preempt = w.yielded, w.evicted
    start = 0
    if head:
        # eviction candidates, the lowest ranked (largest key) first
        vo = np.argsort(kr)
        vkeys = kr[vo].tolist()               # ascending
        vids = rids[vo[::-1]].tolist()        # the lowest ranked first
        vfree = vcum = None                   # their freed KV and its running total, when needed
        used = 0                              # evictions made (a prefix of vids)
        ekeys = w.keys[:head] if w.ekeys is None else w.ekeys[:head]
        # the best eviction rank from each point of the walk on (to stop once none can evict)
        best_after = ekeys if w.ekeys is None else np.minimum.accumulate(ekeys[::-1])[::-1]
        for i, ek in _chunked(w.ids, ekeys, head):
            need = int(inp[i])
            if active + 1 <= slots and kv + need <= room:
                break                         # it fits: from here on, admissions only
            if active >= slots and (used >= nr or best_after[start] >= vkeys[nr - used - 1]):
                return admit, preempt         # no slot, and nobody left can evict anyone
            start += 1
            below = nr - bisect.bisect_right(vkeys, ek)   # running ranked below it: vids[:below]
            if below <= used:
                continue
            if vfree is None:
                dec = view.decoded if decoded is None else decoded
                vfree = (inp[vids] + dec[vids]).tolist()
                vcum = list(itertools.accumulate(vfree, initial=0))
            if active - (below - used) + 1 > slots or kv - (vcum[below] - vcum[used]) + need > room:
                continue
            while not (active + 1 <= slots and kv + need <= room):
                preempt.append(vids[used])
                active -= 1
                kv -= vfree[used]
                used += 1
            admit.append(i)
            active += 1
            kv += need
    if active >= slots or start >= nw:
        return admit, preempt
    return itertools.chain(list(admit), _fitting(w.ids, start, inp, slots - active, room - kv,
                                                 admit)), preempt


def _chunked(ids, keys, stop: int, chunk: int = 32):
    """``zip(ids[:stop], keys[:stop])`` as Python ints, converted a chunk at a time."""
    for a in range(0, stop, chunk):
        b = min(stop, a + chunk)
        yield from zip(ids[a:b].tolist(), keys[a:b].tolist())


def _fitting(ids, start: int, inp, slots_left: int, room_left: int, record: list):
    """``ids[start:]``, lazily: each request that still fits (noted in ``record`` as it goes)."""
    chunk = 16
    while start < len(ids):
        for i in ids[start:start + chunk].tolist():
            need = int(inp[i])
            if need <= room_left:
                record.append(i)
                yield i
                slots_left -= 1
                room_left -= need
                if slots_left <= 0:
                    return
        start += chunk
        chunk *= 4


@register
class VllmPriority(Policy):
    """vLLM ``priority`` policy with ``priority = deadline``; evicts strictly lower priorities."""

    name = "vllm_priority"

    def reset(self, view):
        # (deadline, arrival, id) is fixed: rank every request once
        order = np.lexsort((np.arange(view.n_requests), view.arrival_s, view.deadline_s))
        self._rank = np.empty(view.n_requests, dtype=np.int64)
        self._rank[order] = np.arange(view.n_requests)
        self._waiting = WaitingOrder()

    def schedule(self, view):
        rank = self._rank
        admit, preempt = admit_by_key(view, lambda ids, _: rank[ids], cache=self._waiting)
        return Decision(admit=admit, preempt=preempt)
