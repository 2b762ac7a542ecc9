"""``dfs_weight``: the waiting queue in depth-first order of the prefix tree, heavier subtrees first —
SGLang's ``--schedule-policy dfs-weight``.

Design followed: SGLang's cache-aware ``DFS_WEIGHT`` policy (``python/sglang/srt/managers/
schedule_policy.py``: ``SchedulePolicy._sort_by_dfs_weight``; the walk is ``_calc_weight`` and
``_get_dfs_priority`` there in older releases, ``_dfs_weight_order`` in ``mem_cache/
base_prefix_cache.py`` in newer ones, with the same order). Each waiting request sits at the radix
tree node where its cache match ends (the root when nothing matched); a node weighs the waiting
requests in its subtree; the queue is a depth-first walk from the root that visits a node's
children heaviest first (a stable sort: equal weights in the tree's order of children) and lists a
node's own requests, in queue order, *after* all of its children's. So deeper matches of a branch go
before shallower ones, the heaviest branch is served first, and requests with no match go last.
(SGLang splits a tree node where a match ends inside it, so a request sits exactly at the end of
its match.) SGLang's FCFS switch for long queues (more than 128 waiting: ``lpm``, ``hrrn``) and its
in-batch deprioritisation (``lpm``, ``hrrn``, ``shortest-prefill-first``) do not apply to
``dfs-weight``: neither is here.

Here the tree is built from the waiting requests' cached prefixes (``view.cached_prefix``, whole
16-token KV blocks): two requests share a node at depth ``d`` exactly when both have at least ``d``
cached tokens and their first ``d`` tokens are the same. That is read from the prompts' block hashes
(``view.block_hashes``: one int64 array of hash ids per request, each id naming the chain of
``view.block_tokens`` (512) prompt tokens up to the end of its block; None for a source without
them; fixed request data of the window, read only when something is cached, with the KV block
size ``view.model.block_size``), as the engine's cache keys its blocks (:mod:`portbench.engine.prefix`): a KV block wholly
inside the prompt and the hash list is shared by the prompts with the same hash ids up to it; any
other block (past the hash list, or holding an output token, cached for a preempted request) is the
request's own. Nodes the cache holds with no waiting request below weigh nothing and do not change
the order. Differences from SGLang: equal-weight siblings go in the order of their first waiting
request in the queue, where SGLang's go in the order the cache first stored their branches (not
known here); within a node, requests keep the engine's queue order (arrival, preempted requests in
front) where SGLang's keep its previous sort's (it sorts its queue in place); matches are in whole
16-token blocks (SGLang's page size 1 matches single tokens).

With no prefix cache (``cached_prefix`` all zero, the ``lssp`` engine) every request is at the root
and the policy is ``fifo``. The engine model decides what happens to a request that does not fit
(skipped under ``lssp``, head-of-line under ``vllm_v1``). No preemption.
"""

from __future__ import annotations

import numpy as np

from ..engine.queue import KeyPolicy
from . import register


@register
class DfsWeight(KeyPolicy):
    """Each request's place in the heaviest-subtree-first depth-first walk of its cached prefix."""

    name = "dfs_weight"

    _last = None        # (block hashes, ids, cached prefixes, rank) of the last walk

    def key(self, view, ids):
        cached = view.cached_prefix(ids)
        if not cached.any():
            return np.zeros(len(ids), dtype=np.int64)
        # the walk depends on nothing else: reuse the last one while the queue and its cached
        # prefixes stay the same (as they do over a run of steps that admit nothing)
        last = self._last
        if (last is not None and last[0] is view.block_hashes and np.array_equal(last[1], ids)
                and np.array_equal(last[2], cached)):
            return last[3].copy()
        rank = np.zeros(len(ids), dtype=np.int64)
        rank[dfs_order(view, ids, cached.tolist())] = np.arange(len(ids))
        self._last = (view.block_hashes, np.array(ids), cached, rank)
        return rank.copy()


def dfs_order(view, ids, cached: list) -> list:
    """Positions into ``ids`` (in queue order) in SGLang's dfs-weight order of the prefix tree of
    their ``cached`` tokens."""
    hashes, span = view.block_hashes, view.block_tokens
    # own_from[p]: the depth from which request p's blocks are its own (shared up to there at most)
    own_from = [0] * len(ids) if hashes is None else [
        min(n - n % view.model.block_size, len(hashes[i]) * span)
        for n, i in zip(view.input_tokens[ids].tolist(), ids.tolist())]
    order = []
    stack = [(list(range(len(ids))), 0)]      # (the requests whose paths share depth d, d)
    while stack:
        members, d = stack.pop()
        if d is None:                         # a node's own requests, listed after its subtree's
            order.extend(members)
            continue
        own, children = [], {}                # children: the next block's identity -> its requests
        for p in members:
            if cached[p] == d:
                own.append(p)
            else:
                block = ("own", p) if d >= own_from[p] else ("hash", int(hashes[ids[p]][d // span]))
                children.setdefault(block, []).append(p)
        stack.append((own, None))
        # heaviest first, equal weights by their first request in the queue (a stable sort); pushed
        # in reverse, so that the first is walked first
        for group in sorted(children.values(), key=len, reverse=True)[::-1]:
            stack.append((group, _next_node(group, d, cached, own_from, hashes, ids, span)))
    return order


def _next_node(group, d, cached, own_from, hashes, ids, span) -> int:
    """The depth of the next node that matters below depth ``d`` on the path of ``group`` (requests
    whose next block is the same): where one of them ends, turns to its own blocks, or they part."""
    if len(group) == 1:
        return cached[group[0]]               # one request's subtree: it alone, at its match's end
    end = min(min(cached[p], own_from[p]) for p in group)
    j = d // span                             # they share hash block j: how many more from there?
    ref = hashes[ids[group[0]]][j:-(-end // span)]
    k = len(ref)
    for p in group[1:]:
        differ = np.flatnonzero(hashes[ids[p]][j:j + k] != ref[:k])
        if len(differ):
            k = int(differ[0])
    return min(end, (j + k) * span)
