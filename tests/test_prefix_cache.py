"""vLLM's prefix cache in the ``vllm_v1`` engine model (``enable_prefix_caching``): hits, their cap,
sharing, eviction, a preempted request's own blocks, the view's ``cached_prefix``, and the block keys
of a prefix-hashed window. (vLLM's own scheduler is the reference: tests/test_vllm_native.py.)"""

import dataclasses

import numpy as np
import pytest

from portbench import store
from portbench.engine import StepCost, VllmV1Model, simulate
from portbench.engine.api import Decision, Policy
from portbench.engine.prefix import block_keys, prompt_token_ids
from portbench.policies import make_policy
from portbench.workload import make_window, scale

# one 1 ms step plus 1 ms per prefill token: a step's length says how many tokens it prefilled
COST = StepCost(fixed_s=1e-3, per_prefill_token_s=1e-3, per_decode_seq_s=0.0, per_context_token_s=0.0)


def window(arrivals, inputs, outputs, hashes, block_tokens=16):
    w = make_window("t", "test", np.asarray(arrivals, float), inputs, outputs, outputs)
    return dataclasses.replace(w, block_hashes=tuple(np.asarray(h, dtype=np.int64) for h in hashes),
                               meta={"block_tokens": block_tokens})


def model(**kw):
    return VllmV1Model(cost=COST, block_size=16, **{"enable_prefix_caching": True, **kw})


def ttft(r):
    return r.first_token_s - r.arrival_s


def test_a_repeated_prompt_computes_only_what_is_not_cached():
    # the second request repeats the first's 100-token prompt after it left: 6 full blocks cached
    w = window([0.0, 10.0], [100, 100], [2, 2], [list(range(7))] * 2)
    on, off = simulate(w, make_policy("fifo"), model()), \
        simulate(w, make_policy("fifo"), model(enable_prefix_caching=False))
    assert ttft(off)[1] == pytest.approx(0.101)               # 100 tokens in one step
    assert ttft(on)[1] == pytest.approx(0.001 + 0.004)        # 96 hit, 4 computed
    assert ttft(on)[0] == ttft(off)[0]


def test_the_hit_leaves_the_last_token_to_compute():
    # a 96-token prompt is 6 full blocks; the hit stops at 5 so that one token is computed
    w = window([0.0, 10.0], [96, 96], [2, 2], [list(range(6))] * 2)
    assert ttft(simulate(w, make_policy("fifo"), model()))[1] == pytest.approx(0.001 + 0.016)


def test_only_the_common_prefix_hits():
    # same first 32 tokens (hash blocks 0, 1), then different: 2 blocks hit
    w = window([0.0, 10.0], [64, 64], [2, 2], [[1, 2, 3, 4], [1, 2, 9, 9]])
    assert ttft(simulate(w, make_policy("fifo"), model()))[1] == pytest.approx(0.001 + 0.032)
    # a different first block: nothing hits, the chain breaks at once
    w = window([0.0, 10.0], [64, 64], [2, 2], [[1, 2, 3, 4], [5, 2, 3, 4]])
    assert ttft(simulate(w, make_policy("fifo"), model()))[1] == pytest.approx(0.001 + 0.064)


def test_running_requests_share_blocks():
    # both in flight at once: the second hits the first's 6 blocks while it still runs; 300 tokens
    # each are 19 blocks, 32 together when shared: 32 blocks hold both without a preemption
    w = window([0.0, 0.102], [100, 100], [200, 200], [list(range(7))] * 2)
    on = simulate(w, make_policy("fifo"), model(max_kv_tokens=16 * 32))
    assert ttft(on)[1] == pytest.approx(0.005) and on.first_token_s[1] < on.finish_s[0]
    assert on.n_preemptions == 0


def test_evicted_blocks_no_longer_hit():
    # 9 blocks. The first request's 7 go back last first: its partial block to the queue's head,
    # its cached blocks to the tail in the order 5, 4, ..., 0. The second request's 8 blocks then
    # take the head: the partial block, the 2 never used, and cached blocks 5 .. 1. Block 0 alone
    # survives: the third request (the first's prompt again) hits 16 tokens and computes 84.
    w = window([0.0, 10.0, 20.0], [100, 120, 100], [2, 2, 2],
               [list(range(7)), list(range(50, 58)), list(range(7))])
    assert ttft(simulate(w, make_policy("fifo"), model()))[2] == pytest.approx(0.005)
    assert ttft(simulate(w, make_policy("fifo"), model(max_kv_tokens=16 * 9)))[2] == \
        pytest.approx(0.001 + 0.084)


def test_least_recently_freed_blocks_go_first():
    # 14 blocks. A and B (96-token prompts, 7 blocks each) run one after the other and leave their
    # 6 prompt blocks cached, A's freed before B's; C (80 tokens, 6 blocks) then takes 2 never-used
    # or uncached blocks and 4 cached ones from the queue's head: A's, last block first (A5 .. A2).
    # B's prompt then hits whole (1 token computed), A's only its first 2 blocks (65 computed).
    a, b, c = list(range(6)), list(range(10, 16)), list(range(20, 25))
    for again, hashes, ttft_again in ((a, a + [99], 0.001 + 0.065), (b, b + [98], 0.001 + 0.001)):
        w = window([0.0, 5.0, 10.0, 15.0], [96, 96, 80, 97], [2, 2, 2, 2], [a, b, c, hashes])
        assert ttft(simulate(w, make_policy("fifo"), model(max_kv_tokens=16 * 14)))[3] == \
            pytest.approx(ttft_again)


class _CachedPrefixSpy(Policy):
    """FIFO that records what the view says is cached for each waiting request."""

    name = "cached_prefix_spy"

    def reset(self, view):
        self.seen = {}

    def schedule(self, view):
        w = view.waiting
        for i, c in zip(w, view.cached_prefix(list(w)).tolist()):
            self.seen.setdefault(i, c)
        return Decision(admit=w)


def test_the_view_shows_each_waiting_requests_cached_prefix():
    w = window([0.0, 10.0, 10.0], [100, 100, 40], [2, 2, 2],
               [list(range(7)), list(range(7)), list(range(3))])
    spy = _CachedPrefixSpy()
    simulate(w, spy, model(), event_skipping=False)
    assert spy.seen == {0: 0, 1: 96, 2: 32}
    spy = _CachedPrefixSpy()
    simulate(w, spy, model(enable_prefix_caching=False), event_skipping=False)
    assert spy.seen == {0: 0, 1: 0, 2: 0}


def test_a_window_without_hashes_shares_nothing():
    # the study's windows: with the cache on, no run changes where nothing is preempted
    w = store.load_window(store.list_windows()["window_id"].iloc[0])
    for factor in (1.0, 20.0):
        on = simulate(scale(w, factor), make_policy("fifo"), VllmV1Model(enable_prefix_caching=True))
        off = simulate(scale(w, factor), make_policy("fifo"), VllmV1Model())
        if on.n_preemptions == 0:
            np.testing.assert_array_equal(on.finish_s, off.finish_s)


def test_block_keys_of_a_mooncake_window_follow_the_hash_chain():
    w = store.load_window(f"{store.PREFIX_HASHED_SOURCE}_w00")
    keys, offsets, n_keys = block_keys(w, 16)
    assert keys.max() < n_keys and offsets[-1] == len(keys)
    h, inp = w.block_hashes, w.input_tokens
    for i in range(30):
        for j in range(30):
            ki, kj = keys[offsets[i]:offsets[i + 1]], keys[offsets[j]:offsets[j + 1]]
            # shared leading 512-token hash blocks <=> shared leading KV blocks (whole prompt blocks)
            g = 0
            while g < min(len(h[i]), len(h[j])) and h[i][g] == h[j][g]:
                g += 1
            full = min(inp[i] // 16, inp[j] // 16, g * 32)
            assert np.array_equal(ki[:full], kj[:full])
            if i != j and full < min(inp[i], inp[j]) // 16:
                assert ki[full] != kj[full]
    # every block that holds an output token is the request's own
    own = np.concatenate([keys[offsets[i] + inp[i] // 16:offsets[i + 1]] for i in range(len(inp))])
    assert len(np.unique(own)) == len(own) and not np.isin(own, keys[np.isin(keys, own, invert=True)]).any()


def test_prompt_token_ids_repeat_exactly_where_the_hashes_do():
    rng = np.random.default_rng(0)
    a = prompt_token_ids(1000, [5, 6], 512, rng)
    b = prompt_token_ids(700, [5, 7], 512, rng)
    assert len(a) == 1000 and len(b) == 700
    assert a[:512] == b[:512] and a[512:700] != b[512:700]
    assert prompt_token_ids(600, [5, 6], 512, rng)[:600] == a[:600]


def test_the_pool_is_whole_after_a_run():
    # every block back in the free queue exactly once, no reference left, every cached key's list
    # holding blocks that carry that key (a Mooncake window at high load: hits and preemptions)
    from portbench.engine import blockpool

    w = scale(store.load_window(f"{store.PREFIX_HASHED_SOURCE}_w01"), 3.0)
    m = VllmV1Model(enable_prefix_caching=True, drain_s=1e5)       # every request finishes
    engine = m.make_engine(w, make_policy("fifo"))
    engine.run()
    r = engine.result(w)
    assert r.n_preemptions > 0 and r.prefix_hit_tokens > 0 and np.isfinite(r.finish_s).all()
    nxt, prv, ref, bkey, khead, ktail, dnext, dprev = blockpool.views(engine._pool.array)[:8]
    nb = len(ref)
    seen, b = [], nxt[nb]
    while b != nb:
        seen.append(int(b))
        assert nxt[prv[b]] == b
        b = nxt[b]
    assert sorted(seen) == list(range(nb)) and not ref.any()
    for k in np.flatnonzero(khead >= 0)[:2000]:
        b = khead[k]
        while b >= 0:
            assert bkey[b] == k
            b = dnext[b]
