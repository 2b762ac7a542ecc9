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
    its front and arrivals at its end: the sorted lists are updated for those (checked against the
    queue, else rebuilt).

    After :meth:`get`: ``ids`` (request ids), ``keys`` (their keys, ascending) and ``ekeys`` (their
    eviction keys, or None), plain lists of ints — a few insertions into or deletions from a sorted
    list cost far less than rebuilding an array of thousands.
    """

    #: Changes larger than this (or than a sixteenth of the queue, in a long one) rebuild the lists
    #: in numpy instead of editing them in place: an edit moves the list's tail, a rebuild sorts it all.
    _EDIT_LIMIT = 32

    def __init__(self, on_change=None):
        self.clear()
        self._last_running = ((), None)  # view.running at the last get, and its set if one was built
        self._now_of, self._now = None, set()           # see running_now
        self.yielded: list = []          # admissions proposed at the last call (as consumed)
        self.evicted: list = []          # evictions decided at the last call
        # on_change(gone, new): requests ``gone`` left the queue and ``new`` joined it (gone None:
        # the queue is now exactly ``new``), for a policy that keeps its own tally of the queue (a
        # rekey leaves the queue's members as they were: it is not reported)
        self.on_change = on_change

    def running_now(self, view) -> set:
        """``view.running`` as a set, built once per call (the policy may share it; never change it)."""
        if view.running is not self._now_of:
            self._now_of, self._now = view.running, set(view.running)
        return self._now

    def clear(self):
        self.waiting = None
        self._key_of = np.zeros(0, dtype=np.int64)      # each waiting request's key, by id

    def get(self, view, key, evict_key=None):
        t = view.waiting
        if t is not self.waiting and t != self.waiting:
            if self.waiting is None or not self._update(t, view, key, evict_key):
                ids = np.fromiter(t, dtype=np.int64, count=len(t))
                self._rebuild(ids, key(ids, len(ids)), None if evict_key is None else evict_key(ids))
                if self.on_change is not None:
                    self.on_change(None, self.ids)
            self.waiting = t
        self._last_running = (view.running, self._now if self._now_of is view.running else None)
        self.yielded, self.evicted = [], []
        return self

    def rekey(self, ids, key, evict_key=None):
        """The keys of waiting requests ``ids`` have changed: move them to their new places."""
        if self.waiting is not None and len(ids):
            self._replace(ids, ids, key, evict_key, notify=False)

    def _rebuild(self, ids, keys, ekeys):
        """The lists from unsorted arrays of ids, their keys and eviction keys (or None)."""
        order = np.argsort(keys)
        ids, keys = ids[order], keys[order]
        self.ids, self.keys = ids.tolist(), keys.tolist()
        self._note_keys(ids, keys)
        self.ekeys = None
        if ekeys is not None:
            ekeys = ekeys[order]
            self.ekeys = ekeys.tolist()
            own = ekeys == keys
            self._own = keys[own].tolist()
            e, k = ekeys[~own], keys[~own]
            o = np.lexsort((k, e))
            self._other = list(zip(e[o].tolist(), k[o].tolist()))

    def _update(self, t, view, key, evict_key) -> bool:
        old = self.waiting
        now_running = self.running_now(view)
        refused = {i for i, _ in view.refused}      # proposed, refused: still waiting
        gone = [i for i in self.yielded if i in now_running or (i not in refused and i not in t)]
        prev, prev_set = self._last_running
        before = prev_set if prev_set is not None else set(prev)
        evicted = set(self.evicted)
        evicted.update(before - now_running)
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

    def _replace(self, gone, new, key, evict_key, notify: bool = True):
        """Drop requests ``gone`` and insert requests ``new`` (with their keys now); ``notify``:
        tell ``on_change``."""
        ids, keys, ekeys = self.ids, self.keys, self.ekeys
        gone = [int(i) for i in gone]
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
            key_of = self._key_of
            for i in gone[:g]:
                at = bisect.bisect_left(keys, int(key_of[i]))
                if ekeys is not None:
                    self._unindex(keys[at], ekeys[at])
                    del ekeys[at]
                del ids[at], keys[at]
            if len(new):
                nid = np.array(new, dtype=np.int64)
                nids, nk = nid.tolist(), key(nid, len(nid)).tolist()
                nek = None if ekeys is None else evict_key(nid).tolist()
                for j, (i, k) in enumerate(zip(nids, nk)):
                    at = bisect.bisect_left(keys, k)
                    ids.insert(at, i)
                    keys.insert(at, k)
                    if ekeys is not None:
                        ekeys.insert(at, nek[j])
                        self._index(k, nek[j])
                self._note_keys(nids, nk)
        if notify and self.on_change is not None:
            self.on_change(gone, new)

    def _rebuild_with(self, gone: list, new, key, evict_key):
        """:meth:`_replace` for many requests at once, in numpy."""
        ids = np.array(self.ids, dtype=np.int64)
        keys = np.array(self.keys, dtype=np.int64)
        ekeys = None if self.ekeys is None else np.array(self.ekeys, dtype=np.int64)
        if gone:
            keep = np.ones(len(ids), dtype=bool)
            keep[np.searchsorted(keys, self._key_of[gone])] = False
            ids, keys = ids[keep], keys[keep]
            ekeys = None if ekeys is None else ekeys[keep]
        if len(new):
            nid = np.array(new, dtype=np.int64)
            ids, keys = np.concatenate((ids, nid)), np.concatenate((keys, key(nid, len(nid))))
            if ekeys is not None:
                ekeys = np.concatenate((ekeys, evict_key(nid)))
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

    def _note_keys(self, ids, keys):
        """Remember the keys of requests ``ids`` (arrays, or lists of ints), to find them again when
        they leave."""
        if len(ids):
            top = max(ids) + 1 if isinstance(ids, list) else int(ids.max()) + 1
            if len(self._key_of) < top:
                grown = np.zeros(max(top, 2 * len(self._key_of)), dtype=np.int64)
                grown[:len(self._key_of)] = self._key_of
                self._key_of = grown
            if isinstance(ids, list):
                key_of = self._key_of
                for i, k in zip(ids, keys):
                    key_of[i] = k
            else:
                self._key_of[ids] = keys


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
    slots = m.max_sequences
    inp = view.input_tokens
    room = m.max_kv_tokens
    ids = w.ids
    if nr + 1 <= slots and view.kv_used + inp[ids[0]] <= room:
        # the first request fits the engine as it is: the walk below would only admit
        return _fitting(ids, 0, inp, slots - nr, room - view.kv_used, w.yielded), w.evicted
    head = 0                                  # waiting requests up to the last that may evict
    if nr:
        rids = np.fromiter(view.running, dtype=np.int64, count=nr)
        kr = key(rids, 0)
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
    admit, preempt = w.yielded, w.evicted
    start = 0
    if head:
        # eviction candidates, the lowest ranked (largest key) first
        vo = np.argsort(kr)
        vkeys = kr[vo].tolist()               # ascending
        vids = rids[vo[::-1]].tolist()        # the lowest ranked first
        vfree = vcum = None                   # their freed KV and its running total, when needed
        used = 0                              # evictions made (a prefix of vids)
        ekeys = w.keys if w.ekeys is None else w.ekeys
        best_after = None                     # the best eviction rank from each point on, when needed
        for i, ek in itertools.islice(zip(ids, ekeys), head):
            need = int(inp[i])
            if active + 1 <= slots and kv + need <= room:
                break                         # it fits: from here on, admissions only
            if active >= slots:
                # no slot: stop once nobody left can evict anyone
                if used >= nr:
                    return admit, preempt
                if best_after is None:
                    best_after = (ekeys[:head] if w.ekeys is None else
                                  list(itertools.accumulate(reversed(ekeys[:head]), min))[::-1])
                if best_after[start] >= vkeys[nr - used - 1]:
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
    return itertools.chain(list(admit), _fitting(ids, start, inp, slots - active, room - kv,
                                                 admit)), preempt


def _fitting(ids: list, start: int, inp, slots_left: int, room_left: int, record: list):
    """``ids[start:]``, lazily: each request that still fits (noted in ``record`` as it goes)."""
    for i in itertools.islice(ids, start, None):
        need = int(inp[i])
        if need <= room_left:
            record.append(i)
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
        admit, preempt = admit_by_key(view, lambda ids, _: rank[ids], cache=self._waiting)
        return Decision(admit=admit, preempt=preempt)
