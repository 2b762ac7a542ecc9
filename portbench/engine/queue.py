"""The waiting queue as policies rank it: key policies, the sorted queue and the eviction walk.

The engine owns the queue and the admission rule: a policy proposes requests in its order and the
engine model decides what happens to one that does not fit (``lssp``: skipped, the walk goes on;
``vllm_v1``: head-of-line, admission stops there). Most policies are an order, so most policies are
a :class:`KeyPolicy`: a name and a ``key``::

    @register
    class Edf(KeyPolicy):
        name = "edf"

        def key(self, view, ids):
            return view.deadline_s[ids]

Lower keys are served first; equal keys keep the engine's queue order (arrival order, preempted
requests in front). ``key`` may return several columns (a tuple, the most significant first). A
key may read the clock (``view.now``) or the tokens produced (``view.decoded``): the waiting queue
is ranked afresh at every call, so any key is exact. A key that reads only the requests' fixed data,
the waiting queue and the cached prefixes (:class:`CacheData`; found once per run by trying it
there) orders the queue the same until its members or their cached prefixes change, so its decision
says ``repeat_if_refused``: an engine may skip the steps that would only propose a refused request
again (ending them before an eviction changes a cached prefix the key read).

With ``evict = True`` a waiting request that does not fit the engine as it is preempts running
requests ranked after it (see :func:`admit_by_key`). Such a policy's key must be a function of the
requests' fixed data (their arrival, deadline, prompt, predicted output, priority): the requests
are ranked once, and the engine walks the queue in that rank order, kept sorted as requests come and
go (:class:`WaitingOrder`). Ties then go to the earlier arrival.

Policies whose rule is more than an order (an engine's emulation, a state machine) write their own
``schedule`` and may use :class:`WaitingOrder` and :func:`admit_by_key` for the sorted queue and the
eviction walk.
"""

from __future__ import annotations

import bisect
import itertools
from typing import ClassVar

import numpy as np

from .api import Decision, Policy, PolicyContractError


class KeyPolicy(Policy):
    """A policy that is an order of the waiting queue: subclasses set ``name`` and write ``key``.

    ``evict = True``: a waiting request that does not fit evicts running requests ranked after it
    (a key of fixed request data only). A key policy only admits (and evicts), from the view alone,
    so the engine may skip the steps at which nothing could be admitted.
    """

    #: Preempt running requests ranked after a waiting one that does not fit.
    evict: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.admission_only = not cls.evict
        cls.event_driven = True

    def key(self, view, ids):
        """The keys of requests ``ids`` (an int64 array): an array, or a tuple of arrays (the most
        significant first). Lower is served first."""
        raise NotImplementedError

    def reset(self, view):
        self._fixed_order = None
        if self.evict:
            # ranked once, from the requests' fixed data: a key that reads the run's state is refused
            self._rank = rank_by(view, self.fixed_key(view))
            self._waiting = WaitingOrder()

    def fixed_key(self, view, probe: type = None) -> tuple:
        """The key columns of every request of ``view`` on its fixed data alone (``probe``, default
        :class:`FixedData`: reading anything else raises :class:`PolicyContractError`)."""
        return self.key_columns((probe or FixedData)(view, self.name), np.arange(view.n_requests))

    def key_columns(self, view, ids) -> tuple:
        """``key(view, ids)`` as a tuple of columns, each checked to hold one value per request of
        ``ids`` (:class:`PolicyContractError` naming the policy and the length expected)."""
        cols = self.key(view, ids)
        cols = cols if isinstance(cols, tuple) else (cols,)
        for k, c in enumerate(cols):
            if np.shape(c) != (len(ids),):
                raise PolicyContractError(
                    f"policy {self.name!r}: key column {k} has shape {np.shape(c)}; expected ({len(ids)},), "
                    f"one value per request of ids")
        return cols

    def ranked(self, view) -> "Ranked":
        """The waiting requests in key order (ties: the queue's order)."""
        w = view._waiting_array()
        if len(w) < 2:
            return Ranked(w, ())
        return Ranked(w, self.key_columns(view, w))

    def fixed_order(self, view) -> bool:
        """Whether the key reads only what stays the same while the queue's members do (tried once,
        on :class:`CacheData`): the fixed request data, the waiting queue, and the cached prefixes
        (which the engine watches: reading them is seen at each call)."""
        fixed = getattr(self, "_fixed_order", None)
        if fixed is None:
            try:
                self.fixed_key(view, CacheData)
                fixed = True
            except Exception:                   # it read more (or failed there): asked every time
                fixed = False
            self._fixed_order = fixed
        return fixed

    def schedule(self, view):
        if not self.evict:
            return Decision(admit=self.ranked(view), repeat_if_refused=self.fixed_order(view))
        rank = self._rank
        admit, preempt = admit_by_key(view, self._waiting.get(view, rank), rank.__getitem__)
        return Decision(admit=admit, preempt=preempt)


class FixedData:
    """What an ``evict = True`` key sees: the view's fixed request data (:attr:`FIELDS`) and nothing
    of the run's state. Such a key ranks the requests once, at the start; reading the clock, the
    tokens produced or the queues there would rank by a moment that has passed, so it is refused."""

    FIELDS = ("arrival_s", "deadline_s", "input_tokens", "predicted_output_tokens", "priority", "n_requests",
              "model")
    __slots__ = ("_view", "_policy")

    def __init__(self, view, policy: str):
        self._view, self._policy = view, policy

    def __getattr__(self, name):
        if name in self.FIELDS:
            return getattr(self._view, name)
        raise PolicyContractError(
            f"policy {self._policy!r}: an evict = True key is ranked once, at the start, from the requests' "
            f"fixed data ({', '.join(FixedData.FIELDS)}); it read view.{name}. Drop evict, or key on fixed data")


class CacheData(FixedData):
    """What a key may read and still order the queue the same from one call to the next while
    nothing arrives, completes or is preempted: :class:`FixedData`, the prompts' block hashes, the
    waiting queue (its members change only at those events) and the cached prefixes (an engine that
    repeats the answer ends the repetition before an eviction changes one the key read)."""

    FIELDS = FixedData.FIELDS + ("block_hashes", "block_tokens", "waiting", "cached_prefix")
    __slots__ = ()


class Ranked:
    """Requests ``ids`` (in queue order) ranked by key columns ``cols`` (the most significant
    first), then queue order. Iterated, it yields the head first and sorts the rest only when the
    walk goes past it (an engine with head-of-line admission rarely does); as an array
    (``np.asarray``), it is the whole order (an engine that skips misfits walks it all)."""

    #: The head sorted first: the requests whose first key is among the HEAD smallest (all ties
    #: included: every other request ranks after all of them).
    HEAD = 32

    __slots__ = ("ids", "cols")

    def __init__(self, ids: np.ndarray, cols: tuple):
        self.ids, self.cols = ids, cols

    def __len__(self) -> int:
        return len(self.ids)

    def _order(self, among: np.ndarray) -> np.ndarray:
        return self.ids[among[np.lexsort((among, *(c[among] for c in self.cols[::-1])))]]

    def __array__(self, dtype=None, copy=None):
        ids = self._order(np.arange(len(self.ids))) if self.cols else self.ids
        return ids if dtype is None else ids.astype(dtype)

    def __iter__(self):
        n = len(self.ids)
        if not self.cols or n <= 2 * self.HEAD:
            yield from np.asarray(self).tolist()
            return
        first = self.cols[0]
        kth = np.partition(first, self.HEAD - 1)[self.HEAD - 1]
        head = first <= kth                   # (NaN keys rank last, with the rest)
        yield from self._order(np.flatnonzero(head)).tolist()
        yield from self._order(np.flatnonzero(~head)).tolist()


def rank_by(view, cols) -> np.ndarray:
    """Each request's position in the order of the key columns ``cols`` (an array or a tuple of
    arrays over every request, the most significant first), then arrival, then id: a unique int."""
    cols = cols if isinstance(cols, tuple) else (cols,)
    n = view.n_requests
    order = np.lexsort((np.arange(n), view.arrival_s, *cols[::-1]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank


def arrival_rank(view) -> np.ndarray:
    """Each request's position in (arrival, id) order: a unique integer tie-break."""
    return rank_by(view, ())


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


def _queue_log(view):
    """The engine's log of its waiting queue's changes (``i`` joined, ``~i`` left), and its length
    when the policy was called: how :class:`WaitingOrder` follows the queue without diffing it."""
    return view._engine.queue_log, view._queue_version


class WaitingOrder:
    """The waiting queue sorted by key, kept up to date across a policy's calls.

    For keys that do not change while a request waits (a fixed priority, attained service, remaining
    output): call :meth:`get` at every call; it follows the engine's queue (requests that left are
    dropped, those that joined inserted with their keys as of this call). When some waiting
    requests' keys do change, say so with :meth:`rekey` (or :meth:`clear`).

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
        self._seen = 0                                  # the length of the engine's log at the last get

    def get(self, view, key, evict_key=None):
        log, v = _queue_log(view)
        if self.ids is None:
            ids = np.fromiter(view.waiting, dtype=np.int64, count=len(view.waiting))
            self._key_of = np.zeros(view.n_requests, dtype=np.int64)   # each waiting one's key
            self._rebuild(ids, _keys(key, ids), None if evict_key is None else _keys(evict_key, ids))
            if self.on_change is not None:
                self.on_change(None, self.ids)
        elif v != self._seen:
            changes = log[self._seen:v]
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
    """Evictions, then the proposal, from one walk down the waiting requests in key order.

    ``waiting``: the queue, brought up to date at this call (:meth:`WaitingOrder.get`), with its
    keys and eviction keys; ``running_key(ids)``: the running requests' keys, on the same scale
    (unique int64, lower first). While the walk has found no request that fits the engine as it is
    (a sequence slot, and its prompt in the KV room left), a waiting request that does not fit
    evicts running requests ranked below it, lowest first, when evicting all of those would make it
    fit: it evicts just enough and is proposed; otherwise it is passed over. Its eviction key
    (default: its key) is the rank it evicts from: running requests with a larger key are below it
    (a key past every running one's: it never evicts). From the first request that fits, the rest
    of the queue is proposed in order, and the engine model decides what each proposal gets.
    Evictions are thus decided on the engine's state at the call, never to make room for this
    call's own admissions into free room (``vllm_v1`` admits nothing in a step that evicts). An
    evicted request frees a slot and an estimated ``prompt + decoded`` KV tokens (exact under
    ``lssp``).

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
        return ids, []                        # the first request fits the engine as it is
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
    if not head:
        return ([], []) if nr >= slots else (ids, [])
    active, kv = nr, view.kv_used
    admit, preempt = [], []
    start = 0
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
            break                         # it fits: from here on, the queue is proposed
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
    return itertools.chain(admit, itertools.islice(ids, start, None)), preempt
