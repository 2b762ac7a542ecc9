"""A pure-decode step whose first proposal is refused for KV blocks starts a skipped stretch under a
``repeat_if_refused`` decision (``fifo``, a key on fixed data): the same results as walking every
step, in far fewer executed steps; a key that reads the clock or the cache does not claim it."""

import numpy as np
import pytest

from portbench.engine import StepCost, VllmV1Model
from portbench.engine.queue import KeyPolicy
from portbench.policies import make_policy
from portbench.testing import verified_run
from portbench.workload import make_window

FLAT = StepCost(fixed_s=1e-3, per_prefill_token_s=0.0, per_decode_seq_s=0.0)


def kv_bound_window():
    """Four long-running requests fill most of a 40-block cache; a fifth, arriving at once, needs
    more blocks than are free until one of them leaves; two short ones wait behind it."""
    return make_window("kv", "test", [0, 0, 0, 0, 0, 0, 0], [120, 120, 120, 120, 300, 16, 16],
                       [200, 200, 200, 200, 5, 5, 5], [200, 200, 200, 200, 5, 5, 5])


def engine_view(engine):
    from portbench.engine.api import EngineView
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


@pytest.mark.parametrize("policy", ["fifo", "edf", "estimated_service_time_first", "shortest_prefill_first"])
@pytest.mark.parametrize("cache", [False, True])
def test_a_refused_head_repeats_over_a_skipped_stretch(policy, cache):
    model = VllmV1Model(cost=FLAT, max_kv_tokens=640, max_active_sequences=8, enable_prefix_caching=cache)
    w = kv_bound_window()
    r = verified_run(w, make_policy(policy), model)       # fast path == the step-by-step walk
    assert r.completed.all()
    executed, steps = executed_steps(w, policy, model)
    assert steps > 200 and executed < steps / 4


@pytest.mark.parametrize("policy, fixed", [("edf", True), ("estimated_service_time_first", True),
                                           ("lof", True), ("least_laxity_first", False), ("hrrn", False),
                                           ("lpm", False), ("dfs_weight", False)])
def test_a_key_on_fixed_data_says_its_refusals_repeat(policy, fixed):
    engine = VllmV1Model().make_engine(kv_bound_window(), make_policy(policy))
    engine.run()
    assert engine.policy.fixed_order(None) is fixed       # found once, at the first call
    assert engine.policy.schedule(engine_view(engine)).repeat_if_refused is fixed


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
