"""The cache-aware key policies (lpm, dfs_weight, cache_aware_sjf) on hand-made engine views."""

import numpy as np
import pytest

from portbench.engine.queue import KeyPolicy
from portbench.policies import make_policy

NEW = ("lpm", "dfs_weight", "cache_aware_sjf")


class StubView:
    """What the three keys read: request arrays by id, the queue, ``cached_prefix`` and the prompts'
    block hashes (``block_tokens`` tokens a hash id; ``model.block_size`` tokens a KV block)."""

    class model:
        block_size = 16

    def __init__(self, cached, input_tokens=None, predicted=None, waiting=None, block_hashes=None,
                 block_tokens=None):
        n = len(cached)
        self._cached = np.asarray(cached, dtype=np.int64)
        self.input_tokens = np.asarray(input_tokens if input_tokens is not None else [4096] * n, dtype=np.int64)
        self.predicted_output_tokens = np.asarray(predicted if predicted is not None else [100] * n,
                                                  dtype=np.int64)
        self.waiting = tuple(range(n)) if waiting is None else tuple(waiting)
        self.n_requests = n
        self.block_hashes = None if block_hashes is None else tuple(np.asarray(h, dtype=np.int64)
                                                                    for h in block_hashes)
        self.block_tokens = block_tokens

    def cached_prefix(self, ids):
        return self._cached[ids]

    def _waiting_array(self):
        return np.asarray(self.waiting, dtype=np.int64)


def order(name, view) -> list:
    return np.asarray(make_policy(name).ranked(view)).tolist()


@pytest.mark.parametrize("name", NEW)
def test_registered_as_admission_only_key_policies(name):
    p = make_policy(name)
    assert isinstance(p, KeyPolicy) and p.name == name
    assert p.admission_only and not p.evict


# --- lpm -------------------------------------------------------------------------------------------

def test_lpm_longest_cached_prefix_first_ties_in_queue_order():
    v = StubView([0, 512, 32, 512, 1024], waiting=[4, 3, 2, 1, 0])
    assert order("lpm", v) == [4, 3, 1, 2, 0]


@pytest.mark.parametrize("n, fcfs", [(128, False), (129, True)])
def test_lpm_turns_fcfs_above_128_waiting(n, fcfs):
    cached = (np.arange(n) % 7) * 16                      # queue order 0..n-1, varied hits
    got = order("lpm", StubView(cached))
    if fcfs:
        assert got == list(range(n))
    else:
        assert got == np.lexsort((np.arange(n), -cached)).tolist() != list(range(n))


# --- cache_aware_sjf -------------------------------------------------------------------------------

def test_cache_aware_sjf_ranks_uncached_work():
    # uncached + predicted: 900+10, 100+10, 600+10 (1000 - 400), 100+10 (tie: queue order)
    v = StubView(cached=[100, 0, 400, 0], input_tokens=[1000, 100, 1000, 100], predicted=[10, 10, 10, 10],
                 waiting=[3, 2, 1, 0])
    assert order("cache_aware_sjf", v) == [3, 1, 2, 0]        # 3 is ahead of 1 in the queue
    # uncached prompt decides against plain SJF: 2 has the longest prompt but the least uncached work
    v = StubView(cached=[0, 0, 3968], input_tokens=[500, 300, 4000], predicted=[50, 50, 50])
    assert order("cache_aware_sjf", v) == [2, 1, 0]


# --- dfs_weight ------------------------------------------------------------------------------------

# Hash blocks of 512 tokens: A..E are hash ids. Request (queue position): hashes, cached tokens.
#   0: [A, B]     0       no match: at the root, last
#   1: [A, B]     1024    ends at node A/B
#   2: [A, C]     1024    ends at node A/C
#   3: [A, C, D]  1536    ends at node A/C/D
#   4: [A]        512     ends at node A
#   5: [E]        512     ends at node E
#   6: [A, C]     768     ends half-way down A/C
# Tree: root {A: 5 requests below, E: 1}; A {C-branch: 3 (2, 3, 6), B-branch: 1 (1)}, own 4.
# SGLang's walk: heavier child first, a node's own requests after its children's:
#   A -> C-branch -> node at 768 -> node A/C -> A/C/D: 3; then A/C's own 2; then 768's own 6;
#   A -> B: 1; A's own 4; E: 5; root's own 0.
A, B, C, D, E = 11, 12, 13, 14, 15
EXAMPLE = dict(cached=[0, 1024, 1024, 1536, 512, 512, 768],
               block_hashes=[[A, B], [A, B], [A, C], [A, C, D], [A], [E], [A, C]],
               input_tokens=[1100, 1100, 1100, 1600, 600, 600, 1100], block_tokens=512)


def test_dfs_weight_hand_built_tree_in_sglang_order():
    assert order("dfs_weight", StubView(**EXAMPLE)) == [3, 2, 6, 1, 4, 5, 0]
    # the key is each request's position in that walk
    v = StubView(**EXAMPLE)
    ids = np.arange(7)
    assert make_policy("dfs_weight").key(v, ids).tolist() == [6, 3, 1, 0, 4, 5, 2]


def test_dfs_weight_heavier_subtree_first_and_ties_by_first_in_queue():
    # two branches of equal weight: the one whose first request is earlier in the queue goes first
    v = StubView(cached=[512, 512, 512, 512], block_hashes=[[E], [A], [E], [A]],
                 input_tokens=[600] * 4, block_tokens=512)
    assert order("dfs_weight", v) == [0, 2, 1, 3]
    # one more under A: A is heavier and goes first
    v = StubView(cached=[512, 512, 512, 512, 1024], block_hashes=[[E], [A], [E], [A], [A, B]],
                 input_tokens=[600] * 4 + [1100], block_tokens=512)
    assert order("dfs_weight", v) == [4, 1, 3, 0, 2]


def test_dfs_weight_no_fcfs_switch_for_long_queues():
    n = 200                                                # queue order: shallow first, deep last
    v = StubView(cached=[512] * (n - 1) + [1024], block_hashes=[[A, B]] * n, input_tokens=[1100] * n,
                 block_tokens=512)
    assert order("dfs_weight", v)[0] == n - 1


def test_dfs_weight_own_blocks_of_a_preempted_request_are_its_own_branch():
    # 1 and 2 share their hashed prompt (one hash block); 2 was preempted and its own blocks past the
    # prompt (1000 tokens: 992 in whole shared blocks) are cached: it hangs alone below depth 992.
    # 0 shares the 512 tokens of A: node A has children {the A/B path: 1, 2} and own 0.
    v = StubView(cached=[512, 992, 1040], block_hashes=[[A], [A, B], [A, B]],
                 input_tokens=[600, 1000, 1000], block_tokens=512)
    assert order("dfs_weight", v) == [2, 1, 0]
    # without prompt hashes (a source without them) a hit is only ever a request's own blocks
    v = StubView(cached=[0, 48, 0, 32], input_tokens=[100] * 4)
    assert order("dfs_weight", v) == [1, 3, 0, 2]


def reference_dfs_order(view) -> list:
    """SGLang's walk on an uncompressed tree of 16-token blocks, children in the order first inserted
    (requests inserted in queue order): an independent statement of the order, for cross-checks."""
    bs, span = view.model.block_size, view.block_tokens
    root = {"children": {}, "own": [], "weight": 0}
    for p, i in enumerate(view.waiting):
        c = int(view.cached_prefix(np.array([i]))[0])
        n = int(view.input_tokens[i])
        h = () if view.block_hashes is None else tuple(view.block_hashes[i].tolist())
        node, path = root, [root]
        for b in range(c // bs):
            end = (b + 1) * bs
            label = ("h", h[:-(-end // span)], b) if end <= n and end <= len(h) * span else ("own", i, b)
            node = node["children"].setdefault(label, {"children": {}, "own": [], "weight": 0})
            path.append(node)
        node["own"].append(p)
        for x in path:
            x["weight"] += 1
    out = []

    def walk(node):
        for child in sorted(node["children"].values(), key=lambda x: -x["weight"]):
            walk(child)
        out.extend(node["own"])

    walk(root)
    return [view.waiting[p] for p in out]


def test_dfs_weight_matches_the_uncompressed_reference():
    assert reference_dfs_order(StubView(**EXAMPLE)) == [3, 2, 6, 1, 4, 5, 0]
    rng = np.random.default_rng(7)
    span = 64                                              # small hash blocks: deep trees, few tokens
    for _ in range(300):
        n = int(rng.integers(1, 14))
        hashes, inp, cached = [], [], []
        for _ in range(n):
            m = int(rng.integers(0, 5))
            h = np.cumsum(rng.integers(0, 2, size=m)) * 7 + np.arange(m) * 1000   # few distinct chains
            tokens = int(rng.integers(1, span * (m + 1) + 40))
            hashes.append(h)
            inp.append(tokens)
            cached.append(int(rng.integers(0, (tokens + 60) // 16 + 1)) * 16 * int(rng.random() < 0.8))
        v = StubView(cached, input_tokens=inp, block_hashes=hashes, block_tokens=span,
                     waiting=rng.permutation(n).tolist())
        assert order("dfs_weight", v) == reference_dfs_order(v)


# --- with no prefix cache -------------------------------------------------------------------------

def test_no_cache_reduces_to_the_baselines():
    rng = np.random.default_rng(3)
    n = 40
    inp, pred = rng.integers(1, 3000, n), rng.integers(1, 500, n)
    queue = rng.permutation(n).tolist()
    v = StubView(np.zeros(n), input_tokens=inp, predicted=pred, waiting=queue)
    assert order("lpm", v) == queue                        # fifo
    assert order("dfs_weight", v) == queue                 # fifo (all at the root)
    job = inp + pred                                       # sjf on prompt + predicted output, stable
    assert order("cache_aware_sjf", v) == [queue[k] for k in np.argsort(job[queue], kind="stable")]


# --- in the engine, with its prefix cache ---------------------------------------------------------

class WithHashes:
    """The engine's view plus the prompts' block hashes, as ``dfs_weight`` reads them
    (``view.block_hashes``, ``view.block_tokens``), for as long as the engine's view lacks them."""

    def __init__(self, view, window):
        self._view, self.block_hashes, self.block_tokens = view, window.block_hashes, window.meta["block_tokens"]

    def __getattr__(self, name):
        return getattr(self._view, name)


def shared_prefix_window(n=40, seed=5):
    from portbench.workload import make_window
    rng = np.random.default_rng(seed)
    hashes = []
    for _ in range(n):                                      # 3 system prompts, 2 follow-ups each, tails
        m = int(rng.integers(1, 5))
        chain = [int(rng.integers(0, 3)), 10 + int(rng.integers(0, 2))] + [100 + int(rng.integers(0, 10**6))
                                                                            for _ in range(m)]
        hashes.append(np.cumsum(np.asarray(chain[:m + 1], dtype=np.int64) * 7919) % 10**9)
    inp = [512 * len(h) - int(rng.integers(0, 300)) for h in hashes]
    out = rng.integers(50, 300, n).tolist()
    return make_window("shared", "test", np.sort(rng.uniform(0, 0.5, n)), inp, out, out,
                       meta={"block_tokens": 512}, block_hashes=hashes)


@pytest.mark.parametrize("name", NEW)
def test_in_the_engine_with_its_prefix_cache(name):
    from portbench.engine import VllmV1Model
    from portbench.testing import verified_run
    window = shared_prefix_window()
    model = VllmV1Model(enable_prefix_caching=True, max_num_batched_tokens=1024, max_active_sequences=4,
                        max_kv_tokens=4096, drain_s=60.0)            # tight: some requests are preempted
    base = type(make_policy(name))
    checked = []

    class Checked(base):
        def key(self, view, ids):
            view = WithHashes(view, window)
            k = super().key(view, ids)
            if name == "dfs_weight" and len(ids) == len(view.waiting):
                got = [view.waiting[p] for p in np.lexsort((np.arange(len(ids)), k))]
                assert got == reference_dfs_order(view)
                checked.append(int(view.cached_prefix(ids).astype(bool).sum()))
            return k

    r = verified_run(window, Checked(), model)
    assert r.completed.all() and r.n_preemptions > 0
    if name == "dfs_weight":
        assert sum(checked) > 0                            # the walk met cached prefixes
