"""vLLM's KV block pool with automatic prefix caching, for the ``vllm_v1`` engine model.

The rules are vLLM 0.32's (``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``,
``single_type_kv_cache_manager.py``, the waiting loop of ``sched/scheduler.py``), for one
full-attention group whose hash block is its KV block:

- **Free queue.** Every block with no user is in one queue, in this order at the start; a new
  block is taken from its head, and a cached block taken there is evicted (its key forgotten), so
  cached blocks go least recently freed first.
- **Caching.** A block is cached (its key recorded) when a request is scheduled with tokens that
  fill it — at scheduling, before the step computes them; prompt blocks and output blocks alike.
  Two blocks may hold the same key (vLLM does not de-duplicate: a request that missed computes its
  own copy); a lookup takes the earliest cached one still there.
- **Hits.** Only a request with nothing computed (a new one, or one preempted) looks its blocks up:
  the longest run of cached keys from its first block, at most ``(tokens - 1) // block_size``
  blocks (one token is always computed). Its hit blocks are shared: each user holds a reference,
  and a hit block with none is taken out of the free queue (so it counts against the free blocks,
  as vLLM's admission check counts it). The hit tokens are computed: they cost no budget.
- **Freeing.** A request that finishes or is preempted releases its blocks last first; a block
  whose last user left goes back to the queue: an uncached block to its head (reused first), a
  cached one to its tail (evicted last), so a preempted request's blocks stay cached until the pool
  needs them.

Block keys (which blocks hold the same tokens) come from :func:`portbench.engine.prefix.block_keys`.
The pool is a handful of int64 arrays worked on by numba functions (a doubly linked free queue, a
first-in list of blocks per key, each request's block table), laid end to end in one array (one
argument to pass into compiled code: :func:`_views` cuts it up there); :class:`BlockPool` holds it,
and the engine's compiled loops take its :attr:`BlockPool.array`.
"""

from __future__ import annotations

import numba
import numpy as np

from . import _jit  # noqa: F401  (numba's cache, keyed by the engine's sources)
from . import prefix
from .prefix import block_keys
from .reqtable import BLOCKS, DECODED, INP, OUT, TARGET

# the pool's arrays (views of BlockPool.array), by position in _views' tuple
NXT, PRV, REF, BKEY, KHEAD, KTAIL, DNEXT, DPREV, TABLE, TOFF, RKEY, NCACHED, TNEXT, TPREV, HDR = range(15)
# BlockPool.array starts with: blocks, keys, block-table entries, requests, the offload tier's
# capacity (blocks; 0: no tier) and the blocks in it
_HEADER = 6
TIER_CAP, TIER_COUNT = 4, 5


class BlockPool:
    """``n_blocks`` KV blocks with vLLM's prefix cache, for the requests of ``window``, and an
    offload tier of ``tier_blocks`` blocks (0: none). ``warm``: the cache starts as serving the
    window's history left it (:func:`warm_array`); else every block is free and uncached."""

    def __init__(self, window, n_blocks: int, block_size: int, *, tier_blocks: int = 0,
                 warm: bool = False):
        if warm:
            self.array = warm_array(window, n_blocks, block_size, tier_blocks).copy()
        else:
            keys, offsets, n_keys = _keys_of(window, block_size)
            self.array = _empty_array(keys, offsets, n_keys, n_blocks, tier_blocks)
        self.block_size = block_size
        self.tier = tier_blocks > 0

    def tier_hits(self, st, i: int) -> int:
        """Blocks of request ``i`` past its hit on the GPU that the offload tier holds now."""
        return _tier_hits_of(self.array, st, i, self.block_size)

    def admission(self, st, i: int, budget: int, thr: int, whole: bool, may_hit: bool):
        """Waiting request ``i`` admitted now (see :func:`_admission`): (blocks it hits on the GPU,
        blocks it loads from the offload tier, tokens it computes, free blocks it takes, free blocks
        vLLM's check asks for)."""
        return _admission_of(self.array, st, i, self.block_size, budget, thr, whole, may_hit)

    def fewest_blocks(self, st, ids, budget: int, thr: int, whole: bool) -> int:
        """The fewest free blocks any of waiting requests ``ids`` needs to be admitted now (see
        :func:`_fewest_blocks`)."""
        return _fewest_blocks(self.array, st, np.asarray(ids, dtype=np.int64), self.block_size,
                              budget, thr, whole)

    def cached_prefix(self, st, ids) -> np.ndarray:
        """The tokens a hit would skip now, for each of ``ids``."""
        return _cached_prefix(self.array, st, np.asarray(ids, dtype=np.int64), self.block_size)

    def takes_sparing(self, st, ids, limit: int) -> int:
        """How many blocks (at most ``limit``) can be taken from the free queue's head before one
        that a hit of ``ids`` uses now (see :func:`_takes_sparing`)."""
        return _takes_sparing(self.array, st, np.asarray(ids, dtype=np.int64), self.block_size, limit)


def _empty_array(keys, offsets, n_keys, n_blocks, tier_blocks):
    """A pool's array with every block free and uncached, in block order, and an empty tier."""
    s = n_blocks                                       # the queue's sentinel
    nxt = np.arange(1, n_blocks + 2, dtype=np.int64)
    prv = np.arange(-1, n_blocks, dtype=np.int64)
    nxt[s], prv[0] = 0, s
    prv[s] = n_blocks - 1 if n_blocks else s
    if not n_blocks:
        nxt[s] = s
    tnext = np.full(n_keys + 1, -1, np.int64)          # the tier's queue over keys (-1: not in it),
    tprev = np.full(n_keys + 1, -1, np.int64)          # least recent first; its sentinel is n_keys
    tnext[n_keys] = tprev[n_keys] = n_keys
    parts = (np.array([n_blocks, n_keys, len(keys), len(offsets) - 1, tier_blocks, 0], np.int64),
             nxt, prv, np.zeros(n_blocks, np.int64), np.full(n_blocks, -1, np.int64),
             np.full(n_keys, -1, np.int64), np.full(n_keys, -1, np.int64),
             np.full(n_blocks, -1, np.int64), np.full(n_blocks, -1, np.int64),
             np.full(len(keys), -1, np.int64), offsets, keys, np.zeros(len(offsets) - 1, np.int64),
             tnext, tprev)
    return np.concatenate(parts)


_WARM: dict = {}        # (window id, blocks, block size, tier blocks) -> (history, warm array), the last few


def warm_array(window, n_blocks: int, block_size: int, tier_blocks: int = 0) -> np.ndarray:
    """The pool's array after serving ``window.history`` one request after another (its last
    requests that fill the cache and tier: :func:`~portbench.engine.prefix.warm_history_start`):
    each looks its blocks up, is given them and caches its full ones, then frees them, as vLLM's
    KV-cache manager does for a request that runs alone. The window's requests come first in it
    (rows ``0 .. len(window) - 1``); the history's follow and hold no blocks. Kept for the last
    windows seen (read-only: :class:`BlockPool` copies it)."""
    k = (window.window_id, n_blocks, block_size, tier_blocks)
    got = _WARM.get(k)
    if got is not None and got[0] is window.history:
        return got[1]
    first = prefix.warm_history_start(window, n_blocks + tier_blocks, block_size)
    keys, offsets, n_keys = prefix.block_keys(window, block_size, history_from=first)
    A = _empty_array(keys, offsets, n_keys, n_blocks, tier_blocks)
    n, hist = len(window), window.history
    st = np.zeros((len(offsets) - 1, 8), dtype=np.int64)
    st[n:, INP] = hist.input_tokens[first:]
    st[n:, OUT] = hist.output_tokens[first:]
    serve_one_by_one(A, st, n, len(offsets) - 1, block_size)
    A.setflags(write=False)
    if len(_WARM) >= 4:
        _WARM.pop(next(iter(_WARM)))
    _WARM[k] = (window.history, A)
    return A


@numba.njit(cache=True)
def serve_one_by_one(A, st, first, last, bs):
    """Serve requests ``first .. last - 1`` (rows of ``st``: their prompt and output tokens) one
    after another: each hits its cached prefix (GPU, then tier), takes the rest of its blocks, caches
    its full ones and frees them all. Returns (prompt tokens looked up, hit on the GPU, loaded from
    the tier); a request longer than the pool is left out, as vLLM refuses it."""
    P = views(A)
    nb = P[REF].shape[0]
    queried = gpu = tier = 0
    for i in range(first, last):
        total = st[i, INP] + st[i, OUT]
        m = -(-total // bs)
        if m > nb:
            continue
        most = (st[i, INP] - 1) // bs
        h, _ = _hit(P, i, most)
        t = _tier_hit(P, i, h, most)
        queried += st[i, INP]
        gpu += h * bs
        tier += t * bs
        touch(P, st, i, h)
        _tier_touch(P, i, h, t)
        allocate(P, st, i, m - h)
        cache_full(P, st, i, total, bs)
        release(P, st, i)
    return queried, gpu, tier


def serve_trace(history, n_blocks: int, block_size: int, tier_blocks: int = 0) -> tuple[int, int, int]:
    """Serve every request of ``history`` (a :class:`~portbench.workload.History`: a whole trace, in
    order) one after another on an empty pool (:func:`serve_one_by_one`): the steady hit rate of
    the trace at this capacity. Returns (prompt tokens looked up, hit on the GPU, loaded from the
    tier)."""
    inp = np.asarray(history.input_tokens, dtype=np.int64)
    out = np.asarray(history.output_tokens, dtype=np.int64)
    keys, offsets, n_keys = prefix.keys_of_columns(inp, out, history.block_hashes, history.block_tokens,
                                                   block_size, "trace")
    A = _empty_array(keys, offsets, n_keys, n_blocks, tier_blocks)
    st = np.zeros((len(inp), 8), dtype=np.int64)
    st[:, INP] = inp
    st[:, OUT] = out
    return tuple(int(x) for x in serve_one_by_one(A, st, 0, len(inp), block_size))


_KEYS: dict = {}        # (window id, block size) -> (its block hashes, block_keys' answer), the last few


def _keys_of(window, block_size: int):
    """:func:`~portbench.engine.prefix.block_keys`, kept for the last windows seen (a window runs
    under many policies and loads; its scaled copies share its hash lists)."""
    hashes = getattr(window, "block_hashes", None)
    if hashes is None:
        return block_keys(window, block_size)
    k = (window.window_id, block_size)
    got = _KEYS.get(k)
    if got is None or got[0] is not hashes:
        if len(_KEYS) >= 64:
            _KEYS.pop(next(iter(_KEYS)))
        got = _KEYS[k] = (hashes, block_keys(window, block_size))
    return got[1]


@numba.njit(cache=True)
def views(A):
    """The pool's arrays, cut out of ``A`` (:attr:`BlockPool.array`), in the order of NXT .. NCACHED:
    the ``P`` that the functions below work on (cut once per compiled call, not per block), and
    the header last."""
    nb, nk, total, n = A[0], A[1], A[2], A[3]
    a = _HEADER
    b = a + nb + 1
    c = b + nb + 1
    d = c + nb
    e = d + nb
    f = e + nk
    g = f + nk
    h = g + nb
    i = h + nb
    j = i + total
    k = j + n + 1
    m = k + total
    o = m + n
    q = o + nk + 1
    return (A[a:b], A[b:c], A[c:d], A[d:e], A[e:f], A[f:g], A[g:h], A[h:i], A[i:j], A[j:k], A[k:m],
            A[m:o], A[o:q], A[q:q + nk + 1], A[:_HEADER])


@numba.njit(cache=True, inline="always")
def _max_hit(st, i, bs):
    """The most blocks a lookup may hit: whole blocks of the sequence so far, less its last token."""
    return (st[i, INP] + st[i, DECODED] - 1) // bs


@numba.njit(cache=True)
def _hit(P, i, max_blocks):
    """(blocks request ``i`` hits, at most ``max_blocks``; how many of them are in the free queue)."""
    khead, ref, off, rkey = P[KHEAD], P[REF], P[TOFF][i], P[RKEY]
    h = e = 0
    while h < max_blocks:
        b = khead[rkey[off + h]]
        if b < 0:
            break
        e += ref[b] == 0
        h += 1
    return h, e


@numba.njit(cache=True)
def _tier_hit(P, i, h, max_blocks):
    """The blocks of request ``i`` from its ``h``-th on (up to ``max_blocks``) that the offload
    tier holds, in a run."""
    tnext, off, rkey = P[TNEXT], P[TOFF][i], P[RKEY]
    t = 0
    if P[HDR][TIER_CAP] == 0:
        return t
    while h + t < max_blocks and tnext[rkey[off + h + t]] >= 0:
        t += 1
    return t


@numba.njit(cache=True)
def _tier_hits_of(A, st, i, bs):
    P = views(A)
    most = _max_hit(st, i, bs)
    h, _ = _hit(P, i, most)
    return _tier_hit(P, i, h, most)


@numba.njit(cache=True)
def _tier_put(hdr, tnext, tprev, k):
    """Key ``k`` becomes the offload tier's most recent (in it already: moved there), and the least
    recent leaves past its capacity."""
    s = tnext.shape[0] - 1
    if tnext[k] >= 0:
        p, q = tprev[k], tnext[k]
        tnext[p] = q
        tprev[q] = p
    else:
        hdr[TIER_COUNT] += 1
    p = tprev[s]
    tnext[p] = k
    tprev[k] = p
    tnext[k] = s
    tprev[s] = k
    if hdr[TIER_COUNT] > hdr[TIER_CAP]:
        old = tnext[s]
        q = tnext[old]
        tnext[s] = q
        tprev[q] = s
        tnext[old] = tprev[old] = -1
        hdr[TIER_COUNT] -= 1


@numba.njit(cache=True)
def _tier_touch(P, i, h, t):
    """Request ``i`` loads its blocks ``h .. h + t - 1`` from the tier: they become its most recent."""
    hdr, tnext, tprev, off, rkey = P[HDR], P[TNEXT], P[TPREV], P[TOFF][i], P[RKEY]
    for j in range(h, h + t):
        _tier_put(hdr, tnext, tprev, rkey[off + j])


@numba.njit(cache=True)
def _cached_prefix(A, st, ids, bs):
    """The tokens a hit would skip now (on the GPU and from the tier), for each of ``ids``."""
    P = views(A)
    out = np.zeros(ids.shape[0], dtype=np.int64)
    for j in range(ids.shape[0]):
        i = ids[j]
        most = _max_hit(st, i, bs)
        h, _ = _hit(P, i, most)
        out[j] = (h + _tier_hit(P, i, h, most)) * bs
    return out


@numba.njit(cache=True)
def _takes_sparing(A, st, ids, bs, limit):
    """How many blocks, at most ``limit``, new allocations can take from the free queue's head (in
    order: decoding only takes, and frees nothing before its last step) before they evict a block
    that the hit of one of ``ids`` uses now. Up to there every cached prefix of ``ids`` stays the
    same: another copy of an evicted key is not among their hits, and no hit block is touched. With
    an offload tier, before the first cached block (its eviction moves its key to the tier, which
    may push out a key that a hit there uses)."""
    P = views(A)
    nxt, khead, rkey, toff = P[NXT], P[KHEAD], P[RKEY], P[TOFF]
    s = P[REF].shape[0]
    if P[HDR][TIER_CAP] > 0:
        bkey = P[BKEY]
        n, b = 0, nxt[s]
        while n < limit and b != s and bkey[b] < 0:
            n += 1
            b = nxt[b]
        return n
    used = np.zeros(s, dtype=np.bool_)
    for j in range(ids.shape[0]):
        i = ids[j]
        h, e = _hit(P, i, _max_hit(st, i, bs))
        if e:                                   # some of its hit blocks are free (evictable)
            for q in range(h):
                used[khead[rkey[toff[i] + q]]] = True
    n, b = 0, nxt[s]
    while n < limit and b != s and not used[b]:
        n += 1
        b = nxt[b]
    return n


@numba.njit(cache=True)
def _admission(P, st, i, bs, budget, thr, whole, may_hit):
    """Request ``i`` (waiting, nothing computed) admitted with ``budget`` tokens left under the cap
    ``thr`` (0: none), by vLLM's ``allocate_slots``: (``h`` blocks it hits on the GPU and ``t`` it
    loads from the offload tier after them (none unless ``may_hit``), the tokens it computes, the
    free blocks it takes: new ones for its tier hit and chunk and its hit blocks in the free queue,
    and the free blocks the admission check asks for: those, or under ``whole``
    (``reserve_full_isl``) its whole sequence's less the GPU hit blocks, plus the hit blocks in the
    free queue)."""
    target = st[i, TARGET]
    h = e = t = 0
    if may_hit:
        most = _max_hit(st, i, bs)
        h, e = _hit(P, i, most)
        t = _tier_hit(P, i, h, most)
    chunk = min(target - (h + t) * bs, budget)
    if thr > 0:
        chunk = min(chunk, thr)
    take = -(-((h + t) * bs + chunk) // bs) - h + e
    check = -(-target // bs) - h + e if whole else take
    return h, t, chunk, take, check


@numba.njit(cache=True)
def _admission_of(A, st, i, bs, budget, thr, whole, may_hit):
    return _admission(views(A), st, i, bs, budget, thr, whole, may_hit)


@numba.njit(cache=True)
def _fewest_blocks(A, st, ids, bs, budget, thr, whole):
    """The fewest free blocks one of ``ids`` (waiting, nothing computed) needs for admission with
    ``budget`` tokens left under the cap ``thr`` (0: none): :func:`_admission`'s check."""
    P = views(A)
    least = 1 << 62
    for j in range(ids.shape[0]):
        least = min(least, _admission(P, st, ids[j], bs, budget, thr, whole, True)[4])
    return least


# The per-block helpers take the pool's arrays themselves, not ``P``: each array taken out of the
# tuple is a reference counted in and out, which costs more than the block's own work.

@numba.njit(cache=True)
def _unlink(nxt, prv, b):
    """Take block ``b`` out of the free queue."""
    p, q = prv[b], nxt[b]
    nxt[p] = q
    prv[q] = p


@numba.njit(cache=True)
def _forget(bkey, dnext, dprev, khead, ktail, b):
    """Evict block ``b``'s key, if it has one; returns the key (-1: none)."""
    k = bkey[b]
    if k < 0:
        return k
    p, q = dprev[b], dnext[b]
    if p >= 0:
        dnext[p] = q
    else:
        khead[k] = q
    if q >= 0:
        dprev[q] = p
    else:
        ktail[k] = p
    bkey[b] = -1
    return k


@numba.njit(cache=True)
def touch(P, st, i, h):
    """Give request ``i`` (no blocks yet) its first ``h`` blocks from the cache, shared."""
    khead, ref, table, off, rkey = P[KHEAD], P[REF], P[TABLE], P[TOFF][i], P[RKEY]
    nxt, prv = P[NXT], P[PRV]
    for j in range(h):
        b = khead[rkey[off + j]]
        if ref[b] == 0:
            _unlink(nxt, prv, b)
        ref[b] += 1
        table[off + j] = b
    st[i, BLOCKS] = h
    P[NCACHED][i] = h


@numba.njit(cache=True)
def allocate(P, st, i, n):
    """Give request ``i`` ``n`` new blocks from the free queue's head (evicting their keys: to the
    offload tier, if there is one, when no other copy is cached)."""
    nxt, prv, ref, table, off = P[NXT], P[PRV], P[REF], P[TABLE], P[TOFF][i]
    bkey, dnext, dprev, khead, ktail = P[BKEY], P[DNEXT], P[DPREV], P[KHEAD], P[KTAIL]
    hdr = P[HDR]
    tiered = hdr[TIER_CAP] > 0
    s = ref.shape[0]
    held = st[i, BLOCKS]
    for _ in range(n):
        b = nxt[s]
        _unlink(nxt, prv, b)
        k = _forget(bkey, dnext, dprev, khead, ktail, b)
        if tiered and k >= 0 and khead[k] < 0:
            _tier_put(hdr, P[TNEXT], P[TPREV], k)
        ref[b] = 1
        table[off + held] = b
        held += 1
    st[i, BLOCKS] = held


@numba.njit(cache=True)
def cache_full(P, st, i, tokens, bs):
    """Cache request ``i``'s blocks that ``tokens`` fill (and are not cached yet)."""
    ncached, table, off, rkey = P[NCACHED], P[TABLE], P[TOFF][i], P[RKEY]
    bkey, dnext, dprev, khead, ktail = P[BKEY], P[DNEXT], P[DPREV], P[KHEAD], P[KTAIL]
    full = tokens // bs
    for j in range(ncached[i], full):
        b, k = table[off + j], rkey[off + j]
        bkey[b] = k
        dprev[b] = ktail[k]
        dnext[b] = -1
        if ktail[k] >= 0:
            dnext[ktail[k]] = b
        else:
            khead[k] = b
        ktail[k] = b
    if full > ncached[i]:
        ncached[i] = full


@numba.njit(cache=True)
def admit(A, st, i, h, t, n, tokens, bs):
    """An admission's blocks: request ``i``'s ``h`` hit blocks shared (:func:`touch`), its next
    ``t`` loaded from the tier (the tier's most recent now), ``n`` new ones (:func:`allocate`: the
    loaded ones among them), and those its first ``tokens`` fill cached (:func:`cache_full`)."""
    P = views(A)
    touch(P, st, i, h)
    _tier_touch(P, i, h, t)
    allocate(P, st, i, n)
    cache_full(P, st, i, tokens, bs)


@numba.njit(cache=True)
def release_blocks(A, st, i):
    """:func:`release` on :attr:`BlockPool.array` (from Python)."""
    return release(views(A), st, i)


@numba.njit(cache=True)
def release(P, st, i):
    """Request ``i`` lets go of its blocks, last first. Returns the blocks that became free."""
    nxt, prv, ref, bkey, table, off = P[NXT], P[PRV], P[REF], P[BKEY], P[TABLE], P[TOFF][i]
    s = ref.shape[0]
    n = st[i, BLOCKS]
    head = s                        # the uncached ones go to the queue's head, in release order
    freed = 0
    for j in range(n - 1, -1, -1):
        b = table[off + j]
        ref[b] -= 1
        if ref[b] > 0:
            continue
        freed += 1
        if bkey[b] < 0:             # after the last uncached one inserted (head: the sentinel)
            q = nxt[head]
            nxt[head] = b
            prv[b] = head
            nxt[b] = q
            prv[q] = b
            head = b
        else:                       # at the tail
            p = prv[s]
            nxt[p] = b
            prv[b] = p
            nxt[b] = s
            prv[s] = b
    st[i, BLOCKS] = 0
    P[NCACHED][i] = 0
    return freed
