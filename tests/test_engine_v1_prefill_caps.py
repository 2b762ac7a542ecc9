"""vLLM's long-prefill caps on the ``vllm_v1`` engine model: validation, hand-worked schedules, the
defaults leaving runs as they were, and the fast path against the step-by-step walk with caps on."""

import dataclasses

import numpy as np
import pytest

from portbench import sim
from portbench.engine import StepCost, VllmV1Model
from portbench.policies import make_policy
from portbench.testing import check_policy, real_cases, verified_run
from portbench.workload import make_window

#: 1 ms a step whatever runs: a step's end is its index + 1, in ms.
FLAT = StepCost(fixed_s=1e-3, per_prefill_token_s=0.0, per_decode_seq_s=0.0)
MS = 1e-3


def four_requests():
    """Two long prompts (300) then two short ones (50), all at t = 0, five output tokens each."""
    return make_window("t", "test", [0, 0, 0, 0], [300, 300, 50, 50], [5] * 4, [5] * 4)


def run(window, **caps):
    model = VllmV1Model(cost=FLAT, max_active_sequences=4, **caps)
    return verified_run(window, make_policy("fifo"), model)


@pytest.mark.parametrize("params, message", [
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold must be an integer >= 0"),
    (dict(long_prefill_token_threshold=1.5), "long_prefill_token_threshold must be an integer"),
    (dict(max_num_partial_prefills=0), "max_num_partial_prefills must be an integer >= 1"),
    (dict(max_long_partial_prefills=True), "max_long_partial_prefills must be an integer >= 1"),
    (dict(long_prefill_token_threshold=8, max_num_partial_prefills=2, max_long_partial_prefills=3),
     r"max_long_partial_prefills \(3\) must not exceed max_num_partial_prefills \(2\)"),
    (dict(max_num_partial_prefills=2), "needs long_prefill_token_threshold > 0"),
])
def test_bad_caps_are_refused_with_their_name(params, message):
    with pytest.raises(ValueError, match=message):
        VllmV1Model(**params)


def test_defaults_are_off():
    m = VllmV1Model()
    assert (m.long_prefill_token_threshold, m.max_num_partial_prefills,
            m.max_long_partial_prefills) == (0, 1, 1)
    assert not m.partial_prefill_caps


def test_threshold_chunks_long_prompts_hand_worked():
    # No cap: 700 prompt tokens fit the 2048 budget, every prompt is done in step 0 (first token at
    # 1 ms), five tokens each, finished at 5 ms.
    r = run(four_requests())
    np.testing.assert_allclose(r.first_token_s, np.array([1, 1, 1, 1]) * MS)
    np.testing.assert_allclose(r.finish_s, np.array([5, 5, 5, 5]) * MS)
    # Threshold 100: the long prompts take 100 tokens a step, steps 0-2 -> first token at 3 ms, then
    # four more decodes -> 7 ms; the short ones are untouched.
    r = run(four_requests(), long_prefill_token_threshold=100)
    np.testing.assert_allclose(r.admit_s, np.zeros(4))
    np.testing.assert_allclose(r.first_token_s, np.array([3, 3, 1, 1]) * MS)
    np.testing.assert_allclose(r.finish_s, np.array([7, 7, 5, 5]) * MS)


def test_partial_prefill_caps_let_short_prompts_overtake_hand_worked():
    # Threshold 100, at most two prefills a step, one of them long (vLLM v0's semantics):
    # step 0: A (long) admitted; B (long) passed over (one long prefill already); C (short) admitted
    #         (two prefills now); D stopped (the cap of two) -> C's first token at 1 ms.
    # step 1: A still prefilling (200 left: long); B passed over again; D admitted -> first at 2 ms.
    # step 2: A has 100 left, no longer long; B admitted (the one long prefill), 100 tokens a step
    #         over steps 2-4 -> first token at 5 ms; A's at 3 ms.
    r = run(four_requests(), long_prefill_token_threshold=100, max_num_partial_prefills=2,
            max_long_partial_prefills=1)
    np.testing.assert_allclose(r.admit_s, np.array([0, 2, 0, 1]) * MS)
    np.testing.assert_allclose(r.first_token_s, np.array([3, 5, 1, 2]) * MS)
    np.testing.assert_allclose(r.finish_s, np.array([7, 9, 5, 6]) * MS)


@pytest.mark.parametrize("policy", ["fifo", "edf", "vllm_v0_priority", "slai_faithful",
                                    "sarathi_faithful", "fastserve_mlfq"])
def test_caps_that_never_bind_leave_runs_identical(policy):
    # A real window at high load under the campaign's engine: a threshold above every prompt and
    # the budget, and concurrent-prefill caps above the sequence limit, change nothing.
    window, model = real_cases("vllm_v1", 1)[0]
    loose = dataclasses.replace(model, long_prefill_token_threshold=10 ** 9,
                                max_num_partial_prefills=model.max_active_sequences + 1,
                                max_long_partial_prefills=1)
    base = sim.simulate(window, make_policy(policy), model)
    same = sim.simulate(window, make_policy(policy), loose)
    for field in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(base, field), getattr(same, field), err_msg=field)
    assert base.n_preemptions == same.n_preemptions and base.n_steps == same.n_steps


def test_binding_caps_change_a_real_schedule():
    window, model = real_cases("vllm_v1", 1)[0]
    capped = dataclasses.replace(model, long_prefill_token_threshold=64, max_num_partial_prefills=2,
                                 max_long_partial_prefills=1)
    base = sim.simulate(window, make_policy("fifo"), model)
    other = verified_run(window, make_policy("fifo"), capped)
    assert not np.array_equal(base.first_token_s, other.first_token_s, equal_nan=True)


@pytest.mark.parametrize("name", ["fifo", "vllm_v0_priority", "hrrn", "guaranteed_no_evict"])
def test_fast_path_equals_the_walk_with_caps_on(name):
    check_policy(type(make_policy(name)), engine_models=("vllm_v1_caps",), max_examples=25,
                 real_windows=1)


def test_chunked_prefill_off_admits_whole_prompts_only_hand_worked():
    # Budget 400, chunked prefill off: step 0 admits A (300 tokens, 100 left); B (300) does not fit
    # what is left and stops admission (C and D wait behind it, as in vLLM). Step 1: A decodes (1
    # token), 399 left: B enters (99 left), C (50) too (49 left), D (50) does not fit. Step 2: D.
    # With chunking, step 0 would take A whole and 100 tokens of B.
    r = run(four_requests(), max_num_batched_tokens=400, enable_chunked_prefill=False)
    np.testing.assert_allclose(r.admit_s, np.array([0, 1, 1, 2]) * MS)
    np.testing.assert_allclose(r.first_token_s, np.array([1, 2, 2, 3]) * MS)
    np.testing.assert_allclose(r.finish_s, np.array([5, 6, 6, 7]) * MS)
    chunked = run(four_requests(), max_num_batched_tokens=400)
    assert chunked.admit_s[1] == 0.0


def test_chunked_prefill_off_refuses_a_prompt_above_the_budget():
    with pytest.raises(ValueError, match=r"request 0's prompt \(300 tokens\) exceeds max_num_batched_tokens \(256\)"):
        run(four_requests(), max_num_batched_tokens=256, enable_chunked_prefill=False)


@pytest.mark.parametrize("name", ["fifo", "edf", "vllm_v0_priority", "slai_faithful", "fastserve_mlfq"])
def test_fast_path_equals_the_walk_with_chunked_prefill_off(name):
    check_policy(type(make_policy(name)), engine_models=("vllm_v1_whole",), max_examples=25,
                 real_windows=1)
