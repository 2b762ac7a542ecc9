"""The fast path (jumping over steps where nothing can change) equals walking every step.

For every registered policy, on random small workloads with tight capacity, the event-skipping
engine and the plain step-by-step loop give the same outcome, request by request.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from portbench import sim
from portbench.policies import available, make_policy
from portbench.workload import make_window, scale


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 24))
    gaps = draw(st.lists(st.floats(0, 0.02, allow_nan=False), min_size=n, max_size=n))
    inputs = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    predicted = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    factor = draw(st.sampled_from([0.5, 5.0, 50.0, 400.0]))
    model = sim.LsspModel(max_active_sequences=draw(st.integers(1, 8)),
                          max_kv_tokens=draw(st.sampled_from([400, 600, 1000, 3000])),
                          drain_steps=draw(st.sampled_from([200, 50_000])))
    w = make_window("random", "test", np.cumsum(gaps), inputs, outputs, predicted)
    return scale(w, factor), model


def assert_same(a: sim.RunResult, b: sim.RunResult):
    for field in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert a.n_preemptions == b.n_preemptions
    assert a.n_steps == b.n_steps
    assert a.duration_s == b.duration_s


@pytest.mark.parametrize("policy", available())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads())
def test_event_skipping_equals_step_by_step(policy, case):
    window, model = case
    fast = sim.simulate(window, make_policy(policy), model, event_skipping=True)
    slow = sim.simulate(window, make_policy(policy), model, event_skipping=False)
    assert_same(fast, slow)


@st.composite
def v1_workloads(draw):
    from portbench.engine_v1 import StepCost, VllmV1Model
    window, lssp = draw(workloads())
    cost = StepCost(fixed_s=draw(st.sampled_from([1e-3, 5.75e-3])),
                    per_prefill_token_s=draw(st.sampled_from([0.0, 17.3e-6])),
                    per_decode_seq_s=draw(st.sampled_from([0.0, 6e-6])),
                    per_context_token_s=draw(st.sampled_from([0.0, 1e-8, 3e-7])))
    model = VllmV1Model(max_num_batched_tokens=draw(st.sampled_from([16, 64, 512])),
                        max_active_sequences=lssp.max_active_sequences,
                        max_kv_tokens=lssp.max_kv_tokens, block_size=draw(st.sampled_from([4, 16])),
                        cost=cost, drain_steps=lssp.drain_steps)
    return window, model


@pytest.mark.parametrize("policy", available())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=v1_workloads())
def test_vllm_v1_event_skipping_equals_step_by_step(policy, case):
    window, model = case
    fast = sim.simulate(window, make_policy(policy), model, event_skipping=True)
    slow = sim.simulate(window, make_policy(policy), model, event_skipping=False)
    assert_same(fast, slow)


@pytest.fixture(scope="module")
def frozen_windows():
    from portbench import store
    return [store.load_windows(source=s)[0] for s in store.SOURCES_OF_THE_STUDY]


@pytest.mark.parametrize("policy", ["fifo", "edf", "least_laxity_first", "estimated_service_time_first",
                                    "weighted_fair_share", "admission_control", "vllm_faithful",
                                    "slai_faithful", "kv_constrained_online", "scorpio_style_slo_guard"])
def test_vllm_v1_fast_path_on_frozen_windows(policy, frozen_windows):
    """Real windows at and far past the vllm_v1 knee (long queues, KV-bound admission, preemption):
    the fast path, with its stretches over arrivals that cannot be admitted, equals the walk."""
    from portbench.engine_v1 import VllmV1Model
    model = VllmV1Model(max_kv_tokens=32768)
    for window in frozen_windows:
        for factor in (1.5, 6.0):
            w = scale(window, factor)
            fast = sim.simulate(w, make_policy(policy), model, event_skipping=True)
            slow = sim.simulate(w, make_policy(policy), model, event_skipping=False)
            assert_same(fast, slow)
