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
    attained service, remaining output): call :meth:`get` at every call; it reads the engine's log of
    the queue's changes since the last call (:meth:`~portbench.sim.EngineView.queue_changes`), drops
    the requests that left and inserts those that joined, with their keys as of this call. When some
    waiting requests' keys do change, say so with :meth:`rekey` (or :meth:`clear`).

    ``key`` (and ``evict_key``, the rank a waiting request evicts from, or None): the keys of
    waiting requests, unique int64 (lower first) — an array indexed by request id, or a function of
    an int64 array of ids giving theirs.

    After :meth:`get`: ``ids`` (request ids), ``keys`` (their keys, ascending) and ``ekeys`` (their
    eviction keys, or None), plain lists of ints — a few insertions into or deletions from a sorted
    list cost far less than rebuilding an array of thousands.
    """

    #: Changes larger than this (or than a sixteenth of the queue, in a long one) rebuild the lists
    #: in numpy instead of editing them in place: an edit moves the list's tail, a rebuild sorts it all.
    _EDIT_LIMIT = 32
    #: Up to this many keys are read one by one from a key array (a numpy call costs more).
    _SCALAR_LIMIT = 8

    def __init__(self, on_change=None):
        self.clear()
        # on_change(gone, new): requests ``gone`` left the queue and ``new`` joined it (gone None:
        # the queue is now exactly ``new``), for a policy that keeps its own tally of the queue (a
        # rekey leaves the queue's members as they were: it is not reported)
        self.on_change = on_change

    def clear(self):
        """Forget the queue: the next :meth:`get` sorts it afresh."""
        self.ids = None
        self._seen = 0                                  # the view's queue_version at the last get

    def get(self, view, key, evict_key=None):
        v = view.queue_version
        if self.ids is None:
            ids = np.fromiter(view.waiting, dtype=np.int64, count=len(view.waiting))
            self._key_of = np.zeros(view.n_requests, dtype=np.int64)   # each waiting one's key
            self._rebuild(ids, _keys(key, ids), None if evict_key is None else _keys(evict_key, ids))
            if self.on_change is not None:
                self.on_change(None, self.ids)
        elif v != self._seen:
            changes = view.queue_changes(self._seen)
            if len(changes) == 1:
                gone, new = ([], changes) if changes[0] >= 0 else ([~changes[0]], [])
            else:
                # a request that left and came back is moved (its key may have changed meanwhile);
                # one that came and left is not seen at all
                gone, joined = [], {}
                for c in changes:
                    if c >= 0:
                        joined[c] = None
                    elif ~c in joined:
                        del joined[~c]
                    else:
                        gone.append(~c)
                new = list(joined)
            self._replace(gone, new, key, evict_key)
        self._seen = v
        return self

    def rekey(self, ids, key, evict_key=None):
        """The keys of waiting requests ``ids`` have changed: move them to their new places."""
        if self.ids is None or not len(ids):
            return
        ids = [int(i) for i in ids]
        self._replace(ids, ids, key, evict_key, notify=False)

    def _rebuild(self, ids, keys, ekeys):
        """The lists from unsorted arrays of ids, their keys and eviction keys (or None)."""
        order = np.argsort(keys)
        ids, keys = ids[order], keys[order]
        self.ids, self.keys = ids.tolist(), keys.tolist()
        self._key_of[ids] = keys
        self.ekeys = None
        if ekeys is not None:
            ekeys = ekeys[order]
            self.ekeys = ekeys.tolist()
            own = ekeys == keys
            self._own = keys[own].tolist()
            e, k = ekeys[~own], keys[~own]
            o = np.lexsort((k, e))
            self._other = list(zip(e[o].tolist(), k[o].tolist()))

    def _replace(self, gone: list, new: list, key, evict_key, notify: bool = True):
        """Drop requests ``gone`` and insert requests ``new`` (lists of ints; with their keys now);
        ``notify``: tell ``on_change``."""
        ids, keys, ekeys = self.ids, self.keys, self.ekeys
        g = len(gone)
        if g and (ids[:g] == gone or set(ids[:g]) == set(gone)):
            # the usual case: admissions leave from the front
            if ekeys is not None:
                for k, e in zip(keys[:g], ekeys[:g]):
                    self._unindex(k, e)
                del ekeys[:g]
            del ids[:g], keys[:g]
            g = 0
        limit = max(self._EDIT_LIMIT, len(ids) >> 4)
        if g > limit or len(new) > limit:
            self._rebuild_with(gone if g else [], new, key, evict_key)
        else:
            for i in gone[:g]:
                self._drop(i)
            if new:
                nk = _keys(key, new, self._SCALAR_LIMIT)
                nek = nk if ekeys is None else _keys(evict_key, new, self._SCALAR_LIMIT)
                for i, k, e in zip(new, nk, nek):
                    self._put(i, k, e)
        if notify and self.on_change is not None:
            self.on_change(gone, new)

    def _drop(self, i: int) -> None:
        """Take waiting request ``i`` out of the lists (found by the key it went in with)."""
        keys, ekeys = self.keys, self.ekeys
        at = bisect.bisect_left(keys, int(self._key_of[i]))
        if ekeys is not None:
            self._unindex(keys[at], ekeys[at])
            del ekeys[at]
        del self.ids[at], keys[at]

    def _put(self, i: int, k: int, e: int) -> None:
        """Insert waiting request ``i`` with key ``k`` (and eviction key ``e``, with eviction keys)."""
        keys, ekeys = self.keys, self.ekeys
        at = bisect.bisect_left(keys, k)
        self.ids.insert(at, i)
        keys.insert(at, k)
        self._key_of[i] = k
        if ekeys is not None:
            ekeys.insert(at, e)
            self._index(k, e)

    def _rebuild_with(self, gone: list, new: list, key, evict_key):
        """:meth:`_replace` for many requests at once, in numpy."""
        ids = np.array(self.ids, dtype=np.int64)
        keys = np.array(self.keys, dtype=np.int64)
        ekeys = None if self.ekeys is None else np.array(self.ekeys, dtype=np.int64)
        if gone:
            keep = np.ones(len(ids), dtype=bool)
            keep[np.searchsorted(keys, self._key_of[gone])] = False
            ids, keys = ids[keep], keys[keep]
            ekeys = None if ekeys is None else ekeys[keep]
        if new:
            nid = np.array(new, dtype=np.int64)
            ids, keys = np.concatenate((ids, nid)), np.concatenate((keys, _keys(key, nid)))
            if ekeys is not None:
                ekeys = np.concatenate((ekeys, _keys(evict_key, nid)))
        self._rebuild(ids, keys, ekeys)

    # The eviction keys indexed apart, to find the last waiting request that may evict without a
    # walk: ``_own`` the keys of requests that evict from their own rank (eviction key = key),
    # ``_other`` (eviction key, key) of the others, sorted.

    def _index(self, k: int, e: int) -> None:
        if e == k:
            bisect.insort(self._own, k)
        else:
            bisect.insort(self._other, (e, k))

    def _unindex(self, k: int, e: int) -> None:
        if e == k:
            del self._own[bisect.bisect_left(self._own, k)]
        else:
            del self._other[bisect.bisect_left(self._other, (e, k))]

    def evictors_up_to(self, lowest: int) -> int:
        """With eviction keys: how far down the queue the last request with key and eviction key
        both below ``lowest`` sits (its index + 1; 0 if none)."""
        own = self._own
        j = bisect.bisect_left(own, lowest)
        best = own[j - 1] if j else None
        for e, k in self._other:                 # by eviction key
            if e >= lowest:
                break
            if k < lowest and (best is None or k > best):
                best = k
        return 0 if best is None else bisect.bisect_left(self.keys, best) + 1


def _keys(key, ids, scalar_limit: int = 0):
    """The keys of ``ids`` from ``key`` (an array by id, or a function of an id array): an int64
    array for an array of ids; a list of ints for a list (read one by one when it is short and
    ``key`` an array)."""
    if isinstance(ids, np.ndarray):
        return key[ids] if isinstance(key, np.ndarray) else key(ids)
    if isinstance(key, np.ndarray) and len(ids) <= scalar_limit:
        return [int(key[i]) for i in ids]
    a = np.array(ids, dtype=np.int64)
    return (key[a] if isinstance(key, np.ndarray) else key(a)).tolist()


def admit_by_key(view, waiting: WaitingOrder, running_key, decoded=None):
    """Admissions and evictions from one walk down the waiting requests in key order.

    ``waiting``: the queue, brought up to date at this call (:meth:`WaitingOrder.get`), with its
    keys and eviction keys; ``running_key(ids)``: the running requests' keys, on the same scale
    (unique int64, lower first). While the walk has admitted nothing into room that was free, a
    waiting request that does not fit the engine's hard limits (one more sequence, its prompt in the
    KV room) evicts running requests ranked below it, lowest first, when evicting all of those would
    make it fit: it evicts just enough and is admitted; otherwise it is skipped. Its eviction key
    (default: its key) is the rank it evicts from: running requests with a larger key are below it
    (a key past every running one's: it never evicts). From the first request that fits, the walk
    only admits what fits, lazily. Evictions are thus decided on the engine's state at the call,
    never to make room for this call's own admissions into free room (``vllm_v1`` admits nothing in
    a step that evicts). An evicted request frees a slot and an estimated ``prompt + decoded`` KV
    tokens (exact under ``lssp``).

    Returns ``(admit, preempt)``: ``preempt`` a list, ``admit`` an iterable.
    """
    w = waiting
    ids = w.ids
    nw, nr = len(ids), len(view.running)
    if not nw:
        return [], []
    m = view.model
    slots = m.max_sequences
    inp = view.input_tokens
    room = m.max_kv_tokens
    if nr + 1 <= slots and view.kv_used + inp[ids[0]] <= room:
        # the first request fits the engine as it is: the walk below would only admit
        return _fitting(ids, 0, inp, slots - nr, room - view.kv_used), []
    head = 0                                  # waiting requests up to the last that may evict
    if nr:
        rids = np.fromiter(view.running, dtype=np.int64, count=nr)
        kr = running_key(rids)
        lowest = int(kr.max())
        ahead = bisect.bisect_left(w.keys, lowest)     # waiting ranked above the lowest running
        if w.ekeys is None:
            head = ahead
        elif ahead:
            # the last of them that may evict: a few looked at directly, else from the index
            ek = w.ekeys
            for head in range(ahead, max(0, ahead - 16), -1):
                if ek[head - 1] < lowest:
                    break
            else:
                head = w.evictors_up_to(lowest)
    if not head and nr >= slots:
        return [], []
    active, kv = nr, view.kv_used
    admit, preempt = [], []
    start = 0
    if head:
        # eviction candidates, the lowest ranked (largest key) first
        vo = np.argsort(kr)
        vkeys = kr[vo].tolist()               # ascending
        vids = rids[vo[::-1]].tolist()        # the lowest ranked first
        vfree = vcum = None                   # their freed KV and its running total, when needed
        used = 0                              # evictions made (a prefix of vids)
        ekeys = w.keys if w.ekeys is None else w.ekeys
        evictor = 0                           # from `start` on, the first that may still evict
        for i, ek in itertools.islice(zip(ids, ekeys), head):
            need = int(inp[i])
            if active + 1 <= slots and kv + need <= room:
                break                         # it fits: from here on, admissions only
            if active >= slots:
                # no slot: stop once nobody left can evict anyone (the rank to beat only rises as
                # evictions are made, so a request passed over here never becomes an evictor)
                if used >= nr:
                    return admit, preempt
                beat = vkeys[nr - used - 1]
                evictor = max(evictor, start)
                while evictor < head and ekeys[evictor] >= beat:
                    evictor += 1
                if evictor == head:
                    return admit, preempt
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
    return itertools.chain(admit, _fitting(ids, start, inp, slots - active, room - kv)), preempt


def _fitting(ids: list, start: int, inp, slots_left: int, room_left: int):
    """``ids[start:]``, lazily: each request that still fits."""
    for i in itertools.islice(ids, start, None):
        need = int(inp[i])
        if need <= room_left:
            yield i
            slots_left -= 1
            room_left -= need
            if slots_left <= 0:
                return


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
        admit, preempt = admit_by_key(view, self._waiting.get(view, rank), rank.__getitem__)
        return Decision(admit=admit, preempt=preempt)
