"""A pure-decode step whose first proposal is refused for KV blocks starts a skipped stretch under a
``repeat_if_refused`` decision (``fifo``, a key on fixed data or the cached prefixes, a laxity key
without a near-tie): the same results as walking every step, in far fewer executed steps; a key that
reads the clock otherwise does not claim it, and a stretch after a decision that read the cached
prefixes ends before an eviction changes one."""

import dataclasses

import numpy as np
import pytest

from portbench.engine import StepCost, VllmV1Model
from portbench.engine import blockpool
from portbench.engine.api import EngineView, PolicyContractError
from portbench.engine.queue import KeyPolicy
from portbench.policies import make_policy
from portbench.testing import verified_run
from portbench.workload import make_window

FLAT = StepCost(fixed_s=1e-3, per_prefill_token_s=0.0, per_decode_seq_s=0.0)


def kv_bound_window(last: int = 24):
    """Four long-running requests fill most of a 40-block cache; a fifth, arriving at once, needs
    more blocks than are free until one of them leaves; two short ones wait behind it (prompts of
    16 and ``last`` tokens)."""
    return make_window("kv", "test", [0, 0, 0, 0, 0, 0, 0], [120, 121, 122, 123, 300, 16, last],
                       [200, 200, 200, 200, 5, 5, 5], [200, 200, 200, 200, 5, 5, 5])


def engine_view(engine):
    return EngineView(engine).refresh()


def executed_steps(window, policy, model):
    engine = model.make_engine(window, make_policy(policy))
    calls = []
    step = engine._execute_step

    def counted(d, view):
        calls.append(engine.step)
        return step(d, view)

    engine._execute_step = counted
    engine.run()
    return len(calls), engine.step


@pytest.mark.parametrize("policy", ["fifo", "edf", "estimated_service_time_first", "shortest_prefill_first",
                                    "least_laxity_first", "admission_control", "lpm", "cache_aware_sjf"])
@pytest.mark.parametrize("cache", [False, True])
def test_a_refused_head_repeats_over_a_skipped_stretch(policy, cache):
    model = VllmV1Model(cost=FLAT, max_kv_tokens=640, max_active_sequences=8, enable_prefix_caching=cache)
    w = kv_bound_window()
    r = verified_run(w, make_policy(policy), model)       # fast path == the step-by-step walk
    assert r.completed.all()
    executed, steps = executed_steps(w, policy, model)
    assert steps > 200 and executed < steps / 4


@pytest.mark.parametrize("policy, fixed", [("edf", True), ("estimated_service_time_first", True),
                                           ("lof", True), ("lpm", True), ("dfs_weight", True),
                                           ("cache_aware_sjf", True), ("hrrn", False), ("sjf_aging", False)])
def test_a_key_on_fixed_data_says_its_refusals_repeat(policy, fixed):
    engine = VllmV1Model().make_engine(kv_bound_window(), make_policy(policy))
    engine.run()
    assert engine.policy.fixed_order(None) is fixed       # found once, at the first call
    assert engine.policy.schedule(engine_view(engine)).repeat_if_refused is fixed


@pytest.mark.parametrize("policy", ["least_laxity_first", "admission_control"])
def test_a_laxity_key_says_its_refusals_repeat_unless_two_laxities_nearly_tie(policy):
    # the clock is common to all: the order turns over only where round-off meets a near-tie
    def claim(deadlines):
        w = dataclasses.replace(kv_bound_window(last=16), deadline_s=np.asarray(deadlines, dtype=float))
        engine = VllmV1Model().make_engine(w, make_policy(policy))
        view = engine_view(engine)
        engine.policy.reset(view)
        for i in range(len(w)):
            engine._enqueue(i)
        return engine.policy.schedule(engine_view(engine)).repeat_if_refused

    spread = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    assert claim(spread)
    # requests 5 and 6 have the same prompt and prediction: equal deadlines tie exactly, deadlines
    # a picosecond apart nearly tie
    assert not claim(spread[:6] + [60.0])
    assert not claim(spread[:6] + [60.0 + 1e-12])


def cache_window():
    """A and D (short) finish at once, their prompts cached and last in the free queue (A's first);
    B and C decode long, taking one block in 16 steps. Z then Y arrive together: Y shares A's whole
    prompt, so a cache-aware key ranks it first, but it needs more blocks than are free until B and
    C leave; Z needs one. Once B and C have taken the never-used blocks, they evict A's: Y's cached
    prefix is gone, Z goes first and is admitted while B and C still run."""
    arrivals = [0, 0, 0.01, 0.01, 0.02, 0.02]
    inputs, outputs = [64, 64, 16, 16, 16, 384], [1, 1, 300, 300, 2, 2]
    hashes = [[1, 2, 3, 4], [11, 12, 13, 14], [21], [31], [41], [1, 2, 3, 4, *range(100, 120)]]
    w = make_window("evict", "test", np.asarray(arrivals, float), inputs, outputs, outputs)
    return dataclasses.replace(w, block_hashes=tuple(np.asarray(h, dtype=np.int64) for h in hashes),
                               meta={"block_tokens": 16})


@pytest.mark.parametrize("policy", ["lpm", "dfs_weight"])
def test_a_stretch_after_a_decision_on_cached_prefixes_ends_before_an_eviction_changes_one(policy, monkeypatch):
    model = VllmV1Model(cost=FLAT, max_kv_tokens=25 * 16, max_active_sequences=8, enable_prefix_caching=True)
    r = verified_run(cache_window(), make_policy(policy), model)
    assert 0.03 < r.admit_s[4] < r.admit_s[5]           # Z once Y's cached prefix is evicted, then Y
    executed, steps = executed_steps(cache_window(), policy, model)
    assert executed < steps / 4
    # without the bound the stretch runs past the eviction, and Z's admission comes late
    monkeypatch.setattr(blockpool.BlockPool, "takes_sparing", lambda self, st, ids, limit: limit)
    with pytest.raises(PolicyContractError, match="request 4"):
        verified_run(cache_window(), make_policy(policy), model)


def test_a_users_key_on_fixed_data_is_found_so():
    class Longest(KeyPolicy):
        name = "test_longest_prompt"

        def key(self, view, ids):
            return -view.input_tokens[ids]

    class Oldest(KeyPolicy):
        name = "test_oldest_by_clock"

        def key(self, view, ids):
            return view.arrival_s[ids] - view.now

    for cls, fixed in ((Longest, True), (Oldest, False)):
        engine = VllmV1Model().make_engine(kv_bound_window(), cls())
        engine.run()
        assert engine.policy.fixed_order(None) is fixed
