"""The warm prefix cache and the KV offload tier of the ``vllm_v1`` engine model.

A warm pool is what serving a trace's earlier requests one by one leaves; that walk is checked
against a plain key-level LRU written here, the history's cut against the whole history, and the
engine's step skipping against its step-by-step walk with both features on."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest

from portbench import store
from portbench.engine import blockpool, prefix
from portbench.engine.vllm_v1 import OFFLOAD_S_PER_TOKEN, VllmV1Model
from portbench.policies import make_policy
from portbench.sim import simulate
from portbench.workload import History, scale

BS = 16


def random_history(n: int, seed: int) -> History:
    """Requests whose prompts share prefixes along a random tree of 512-token blocks; no prompt is a
    whole number of KV blocks (so serving one by one never makes two copies of a block)."""
    rng = np.random.default_rng(seed)
    chains, hashes, inp = [[]], [], []
    next_id = 0
    for _ in range(n):
        base = list(chains[rng.integers(len(chains))])[: int(rng.integers(0, 4))]
        for _ in range(int(rng.integers(1, 4))):
            base.append(next_id)
            next_id += 1
        chains.append(base)
        tokens = len(base) * 512 - int(rng.integers(1, 15))
        hashes.append(np.array(base, dtype=np.int64))
        inp.append(tokens)
    out = rng.integers(1, 40, size=n)
    return History(np.array(inp, dtype=np.int64), out.astype(np.int64), tuple(hashes), 512)


def lru_reference(history: History, n_blocks: int, tier_blocks: int):
    """Key-level LRU of the same walk: hits on the GPU, then in the tier; evictions to the tier."""
    keys, offsets, _ = prefix.keys_of_columns(history.input_tokens, history.output_tokens,
                                              history.block_hashes, 512, BS)
    gpu, tier = OrderedDict(), OrderedDict()
    queried = hit = loaded = 0
    for i in range(len(history)):
        k = keys[offsets[i]:offsets[i + 1]].tolist()
        inp, total = int(history.input_tokens[i]), int(history.input_tokens[i] + history.output_tokens[i])
        most, m = (inp - 1) // BS, len(k)
        h = 0
        while h < most and k[h] in gpu:
            h += 1
        t = 0
        while tier_blocks and h + t < most and k[h + t] in tier:
            t += 1
        for j in range(h):
            del gpu[k[j]]
        for j in range(h, h + t):
            tier.move_to_end(k[j])
        while len(gpu) > n_blocks - m:
            old, _ = gpu.popitem(last=False)
            if tier_blocks:
                tier[old] = None
                tier.move_to_end(old)
                if len(tier) > tier_blocks:
                    tier.popitem(last=False)
        for j in range(total // BS - 1, -1, -1):      # full blocks, freed last first
            gpu[k[j]] = None
        queried, hit, loaded = queried + inp, hit + h * BS, loaded + t * BS
    return queried, hit, loaded


@pytest.mark.parametrize("n_blocks,tier_blocks", [(300, 0), (900, 0), (300, 2000), (200, 600)])
def test_serving_one_by_one_is_a_key_level_lru(n_blocks, tier_blocks):
    history = random_history(400, seed=n_blocks + tier_blocks)
    q, g, t = blockpool.serve_trace(history, n_blocks, BS, tier_blocks)
    rq, rh, rt = lru_reference(history, n_blocks, tier_blocks)
    assert (q, g + t, t) == (rq, rh + rt, rt)
    assert g + t > 0 and (t > 0) == (tier_blocks > 0)


@pytest.fixture(scope="module")
def warm_window():
    return store.load_window("mooncake_conversation_w12", history=True)


def cached_in_queue_order(array):
    """The keys of the free queue's cached blocks, head (evicted first) to tail."""
    P = blockpool.views(array)
    nxt, bkey = P[blockpool.NXT], P[blockpool.BKEY]
    s = P[blockpool.REF].shape[0]
    out, b = [], nxt[s]
    while b != s:
        if bkey[b] >= 0:
            out.append(int(bkey[b]))
        b = nxt[b]
    return out


def test_the_cut_history_warms_the_cache_as_the_whole_history_does(warm_window):
    n_blocks = 40000
    cut = blockpool.warm_array(warm_window, n_blocks, BS)
    start = prefix.warm_history_start(warm_window, n_blocks, BS)
    assert 0 < start < len(warm_window.history) - 50
    keys_cut, _, _ = prefix.block_keys(warm_window, BS, history_from=start)
    keys_all, offsets_all, n_keys = prefix.block_keys(warm_window, BS, history_from=0)
    whole = blockpool._empty_array(keys_all, offsets_all, n_keys, n_blocks, 0)
    n = len(warm_window)
    st = np.zeros((len(offsets_all) - 1, 8), dtype=np.int64)
    st[n:, 0] = warm_window.history.input_tokens
    st[n:, 1] = warm_window.history.output_tokens
    blockpool.serve_one_by_one(whole, st, n, len(offsets_all) - 1, BS)

    def window_keys(keys, array):
        # the window's own keys (rows 0 .. n-1) are numbered alike in both; others are named by
        # the position of their first block in the key array, which differs: compare the window's
        # keys and the number of cached blocks
        mine = set(keys[: int(blockpool.views(array)[blockpool.TOFF][n])].tolist())
        order = cached_in_queue_order(array)
        return [k if k in mine else -1 for k in order]
    a, b = window_keys(keys_cut, cut), window_keys(keys_all, whole)
    assert len(a) == len(b) >= n_blocks - 1        # full but the last request's partial block
    assert sum(k >= 0 for k in a) > 100            # the window's prefixes among them
    assert a == b


@pytest.mark.parametrize("policy", ["fifo", "las", "edf", "cache_aware_sjf", "lpm", "slai_faithful",
                                    "sjf_aging", "vllm_v0_priority"])
def test_warm_and_tiered_runs_skip_steps_exactly(warm_window, policy):
    model = VllmV1Model(enable_prefix_caching=True, warm_start=True, offload_kv_tokens=1 << 20)
    for factor in (0.4, 2.0):
        w = scale(warm_window, factor)
        a = simulate(w, make_policy(policy), model)
        b = simulate(w, make_policy(policy), model, event_skipping=False)
        for name in ("admit_s", "first_token_s", "finish_s"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert (a.prefix_hit_tokens, a.prefix_tier_hit_tokens) == (b.prefix_hit_tokens, b.prefix_tier_hit_tokens)


def test_a_warm_cache_and_a_tier_serve_more_and_loading_takes_time(warm_window):
    w = scale(warm_window, 0.4)
    runs = {}
    for name, opts in {"cold": {}, "warm": {"warm_start": True},
                       "tier": {"warm_start": True, "offload_kv_tokens": 1 << 22},
                       "free": {"warm_start": True, "offload_kv_tokens": 1 << 22, "offload_s_per_token": 0.0}
                       }.items():
        runs[name] = simulate(w, make_policy("fifo"), VllmV1Model(enable_prefix_caching=True, **opts))
    assert runs["cold"].prefix_tier_hit_tokens == runs["warm"].prefix_tier_hit_tokens == 0
    assert runs["warm"].prefix_hit_tokens >= runs["cold"].prefix_hit_tokens
    assert runs["tier"].prefix_tier_hit_tokens > 0.05 * runs["tier"].prefix_queried_tokens
    assert runs["tier"].prefix_hit_tokens > runs["warm"].prefix_hit_tokens
    # the same decisions' first steps, but each load adds its time: a tiered request is not faster
    # with a cost than without
    assert np.nansum(runs["tier"].finish_s) > np.nansum(runs["free"].finish_s)
    assert 4e-6 < OFFLOAD_S_PER_TOKEN < 4.3e-6


def test_warm_start_and_the_tier_need_the_cache_and_a_history(warm_window):
    bare = store.load_window("mooncake_conversation_w12")
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        simulate(bare, make_policy("fifo"), VllmV1Model(warm_start=True))
    with pytest.raises(ValueError, match="history=True"):
        simulate(bare, make_policy("fifo"), VllmV1Model(enable_prefix_caching=True, warm_start=True))
    with pytest.raises(ValueError, match="history"):
        prefix.warm_history_start(dataclasses.replace(warm_window, history=None), 100, BS)
