"""RQ7's six engine schedulers against hand-worked cases, and against the engine's contract.

Times under ``LsspModel``: a request admitted at step s is stamped ``admit_s = s ms`` (its *first*
admission); with true output T, run without interruption, it finishes at ``(s + T) ms`` and its slot
is free from step ``s + T``. A preemption (recompute) drops its generated tokens; it is put back at
the queue front. ``both_modes`` checks event skipping against the step-by-step walk on each case.
"""

import numpy as np
import pytest

from portbench import sim
from portbench.policies import (EXTENDED_PANEL, RQ7_POLICIES, STUDY_POLICIES, _REGISTRY, available,
                                make_policy)
from portbench.testing import check_policy
from portbench.workload import Window, make_window

MS = 0.001
ONE_SLOT = sim.LsspModel(max_active_sequences=1)


def explicit(arrivals, inputs, outputs, predicted=None, deadlines=None):
    """A window with hand-set columns (deadlines far away unless given)."""
    f = lambda x: np.asarray(x, dtype=np.float64)
    i = lambda x: np.asarray(x, dtype=np.int64)
    predicted = outputs if predicted is None else predicted
    deadlines = [100.0] * len(arrivals) if deadlines is None else deadlines
    return Window("t", "test", f(arrivals), i(inputs), i(outputs), i(predicted), f(deadlines))


def both_modes(name, w, model=None, **params):
    """Run with and without event skipping, check they agree request by request, return one."""
    fast = sim.simulate(w, make_policy(name, **params), model, event_skipping=True)
    slow = sim.simulate(w, make_policy(name, **params), model, event_skipping=False)
    for field in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(fast, field), getattr(slow, field), err_msg=field)
    assert fast.n_steps == slow.n_steps and fast.n_preemptions == slow.n_preemptions
    return fast


def ms(*steps):
    return np.array(steps, dtype=np.float64) * MS


def expect(name, w, model=ONE_SLOT, admit=None, finish=None, preemptions=None, **params):
    """Run both ways and check first admissions, finishes (in ms) and the preemption count."""
    r = both_modes(name, w, model, **params)
    if admit is not None:
        np.testing.assert_allclose(r.admit_s, ms(*admit))
    if finish is not None:
        np.testing.assert_allclose(r.finish_s, ms(*finish))
    if preemptions is not None:
        assert r.n_preemptions == preemptions
    return r


# --- registry ---------------------------------------------------------------------------------


def test_rq7_panel_is_registered_after_the_study_panel():
    assert RQ7_POLICIES == ("vllm_v0_priority", "sjf_aging", "short_request_first", "fastserve_mlfq",
                            "las", "srpt_oracle", "hrrn", "lof", "shortest_prefill_first", "random",
                            "guaranteed_no_evict")
    assert EXTENDED_PANEL == STUDY_POLICIES + RQ7_POLICIES
    names = available()
    assert names[:len(STUDY_POLICIES)] == list(STUDY_POLICIES)
    assert set(RQ7_POLICIES) <= set(names)


def test_vllm_priority_is_named_per_vllm_version():
    """vLLM v0's waiting-eviction rule has a registered name that says v0; vLLM v1's priority
    scheduling (priority = deadline, no waiting eviction) resolves to edf; the old name that covered
    both resolves, for stored tables, to the v0 rule."""
    from portbench.policies import ALIASES, canonical, make_policy

    v0 = make_policy("vllm_v0_priority")
    assert "v0" in v0.name and v0.evict
    v1 = make_policy("vllm_v1_priority")
    assert v1.name == "edf" and not getattr(v1, "evict", False)
    assert canonical("vllm_priority") == "vllm_v0_priority" and canonical("fifo") == "fifo"
    assert not set(ALIASES) & set(available()), "an alias must not shadow a registered name"
    with pytest.raises(KeyError, match="unknown policy 'vllm_v2_priority'"):
        make_policy("vllm_v2_priority")


def test_vllm_v1_priority_decides_as_edf_and_not_as_the_v0_rule():
    # One slot: R0 (deadline 10) runs from 0; R1 (deadline 1) arrives at 3 ms. The v0 rule evicts R0
    # for it; vLLM v1's priority scheduling (edf) lets R1 wait for the slot.
    w = explicit([0, 0.003], [5, 5], [10, 2], deadlines=[10.0, 1.0])
    v1, edf = both_modes("vllm_v1_priority", w, ONE_SLOT), both_modes("edf", w, ONE_SLOT)
    np.testing.assert_array_equal(v1.finish_s, edf.finish_s)
    np.testing.assert_allclose(v1.finish_s, ms(10, 12))
    assert v1.n_preemptions == 0 and both_modes("vllm_v0_priority", w, ONE_SLOT).n_preemptions == 1


def test_only_the_oracle_reads_true_lengths():
    available()
    assert [n for n, cls in _REGISTRY.items() if getattr(cls, "needs_true_lengths", False)] == ["srpt_oracle"]


# (check_policy with its defaults for every RQ7 policy: test_policy_contract's
# test_every_registered_policy_keeps_the_contract, which covers every registered policy)


@pytest.mark.parametrize("name, params", [
    ("fastserve_mlfq", {"num_levels": 3, "starvation_s": 0.01}),   # capped levels, clock timers
    ("short_request_first", {"threshold": 100, "long_max_wait_s": 0.01}),
    ("sjf_aging", {"length_median": 50, "time_median": 0.01, "normalization": "rational"}),
])
def test_fast_engine_equals_the_step_by_step_loop_with_other_parameters(name, params):
    check_policy(type(make_policy(name)), params, max_examples=25, real_windows=0)


# --- vllm_v0_priority ----------------------------------------------------------------------------


def test_vllm_v0_priority_serves_earliest_deadline_first():
    # One slot, all at t=0, T=2: deadlines 0.5, 0.3, 0.1 -> R2 (0), R1 (2 ms), R0 (4 ms).
    w = explicit([0, 0, 0], [5, 5, 5], [2, 2, 2], deadlines=[0.5, 0.3, 0.1])
    expect("vllm_v0_priority", w, admit=(4, 2, 0))


def test_vllm_v0_priority_evicts_a_lower_priority_request_for_a_slot():
    # One slot. R0 (deadline 10, T=10) runs from 0. R1 (deadline 1, T=2) arrives at 3 ms: no slot,
    # R0 has the lower priority -> evicted (3 tokens lost), R1 admitted at 3, done at 5 ms.
    # R0 re-enters at 5 and needs all 10 steps again: done at 15 ms. (FIFO: R1 at 10, done 12.)
    w = explicit([0, 0.003], [5, 5], [10, 2], deadlines=[10.0, 1.0])
    expect("vllm_v0_priority", w, admit=(0, 3), finish=(15, 5), preemptions=1)
    np.testing.assert_allclose(both_modes("fifo", w, ONE_SLOT).finish_s, ms(10, 12))


def test_vllm_v0_priority_evicts_for_kv_room_but_never_for_a_lower_priority():
    # max_kv 100. R0 (P=60, deadline 10, T=20) from 0. R1 (P=50, deadline 1, T=5) at 2 ms:
    # kv 62 + 50 > 100 -> R0 evicted (frees 62), R1 admitted at 2, done at 7 ms. At step 3
    # R0 (60) does not fit beside R1 (51) and cannot evict it (higher priority): R0 re-enters at
    # 7 and is done at 27 ms.
    kv100 = sim.LsspModel(max_kv_tokens=100)
    w = explicit([0, 0.002], [60, 50], [20, 5], deadlines=[10.0, 1.0])
    expect("vllm_v0_priority", w, kv100, finish=(27, 7), preemptions=1)
    # The other way round (R1 has the later deadline) nothing is evicted: R1 waits for R0.
    w = explicit([0, 0.002], [60, 50], [20, 5], deadlines=[1.0, 10.0])
    expect("vllm_v0_priority", w, kv100, finish=(20, 25), preemptions=0)


def test_vllm_v0_priority_evicts_nothing_when_eviction_would_not_make_room():
    # max_kv 100. R1 (P=120) can never fit: R0 is not evicted for it.
    w = explicit([0, 0.002], [60, 120], [20, 5], deadlines=[10.0, 1.0])
    r = both_modes("vllm_v0_priority", w, sim.LsspModel(max_kv_tokens=100, drain_s=0.1))
    assert r.n_preemptions == 0 and r.finish_s[0] == pytest.approx(0.020) and np.isnan(r.admit_s[1])


# --- sjf_aging --------------------------------------------------------------------------------


def test_sjf_aging_serves_shortest_predicted_output_first():
    # One slot, all at 0, T=1: predicted 300, 10, 100 -> R1 (0), R2 (1 ms), R0 (2 ms). The true
    # outputs are equal: only predictions are read.
    w = explicit([0, 0, 0], [5, 5, 5], [1, 1, 1], predicted=[300, 10, 100])
    np.testing.assert_allclose(both_modes("sjf_aging", w, ONE_SLOT).admit_s, ms(2, 0, 1))


def test_sjf_aging_lets_an_old_long_request_overtake_a_new_short_one():
    # One slot; B (T=50) runs from 0. L (predicted 300) arrives at 1 ms, S (predicted 10) at 48 ms.
    # At step 50 (now = 0.05 s), medians 100 tokens and 0.01 s, weights 0.5:
    #   L: 0.5/(1+e^2)   = 0.0596 + 0.5/(1+e^-3.9) (wait 0.049) = 0.4901 -> 0.5497
    #   S: 0.5/(1+e^-.9) = 0.3555 + 0.5/(1+e^0.8)  (wait 0.002) = 0.1550 -> 0.5105
    # so L goes first (50 ms) and S after it (L's T=5: 55 ms). Without aging (time_weight 0) S
    # goes first. The rational form (0.5/(1+len/100) + 0.5*wait/0.01): L 0.125 + 2.45 = 2.575,
    # S 0.4545 + 0.1 = 0.5545: L first too.
    w = explicit([0, 0.001, 0.048], [5, 5, 5], [50, 5, 5], predicted=[1, 300, 10])
    tuned = dict(length_median=100, time_median=0.01)
    np.testing.assert_allclose(both_modes("sjf_aging", w, ONE_SLOT, **tuned).admit_s, ms(0, 50, 55))
    np.testing.assert_allclose(both_modes("sjf_aging", w, ONE_SLOT, **tuned, time_weight=0.0).admit_s,
                               ms(0, 55, 50))
    np.testing.assert_allclose(both_modes("sjf_aging", w, ONE_SLOT, **tuned,
                                          normalization="rational").admit_s, ms(0, 50, 55))


def test_sjf_aging_can_rank_by_prompt_as_vllm_and_tensorrt_llm_do():
    # Prompts 300, 10 (predicted outputs the other way round): length="prompt" -> R1 first.
    w = explicit([0, 0], [300, 10], [1, 1], predicted=[10, 300])
    np.testing.assert_allclose(both_modes("sjf_aging", w, ONE_SLOT).admit_s, ms(0, 1))
    np.testing.assert_allclose(both_modes("sjf_aging", w, ONE_SLOT, length="prompt").admit_s, ms(1, 0))
    with pytest.raises(ValueError, match="normalization"):
        make_policy("sjf_aging", normalization="tanh")


# --- short_request_first ----------------------------------------------------------------------


def test_short_request_first_lanes_and_long_promotion():
    # One slot; B (P=10, T=50) runs from 0. L (P=1000 > 256) arrives at 1 ms, S (P=100) at 2 ms.
    # Step 50: S (short lane) before L (long lane): S at 50, L at 50 + 5 = 55 ms (FIFO: L first).
    # With long_max_wait_s = 0.01, L has waited 49 ms >= 10 ms -> aged, ahead of S: L at 50, S at 53.
    # With 0 promotion is off: S first again.
    w = explicit([0, 0.001, 0.002], [10, 1000, 100], [50, 3, 5])
    np.testing.assert_allclose(both_modes("short_request_first", w, ONE_SLOT).admit_s, ms(0, 55, 50))
    np.testing.assert_allclose(both_modes("fifo", w, ONE_SLOT).admit_s, ms(0, 50, 53))
    np.testing.assert_allclose(
        both_modes("short_request_first", w, ONE_SLOT, long_max_wait_s=0.01).admit_s, ms(0, 50, 53))
    np.testing.assert_allclose(
        both_modes("short_request_first", w, ONE_SLOT, long_max_wait_s=0).admit_s, ms(0, 55, 50))


def test_short_request_first_threshold_is_inclusive():
    # P = 256 is short (vllm-ascend: prompt <= threshold): it goes before an earlier P = 257.
    w = explicit([0, 0.001, 0.002], [10, 257, 256], [50, 3, 5])
    np.testing.assert_allclose(both_modes("short_request_first", w, ONE_SLOT).admit_s, ms(0, 55, 50))


# --- fastserve_mlfq ---------------------------------------------------------------------------
# Quanta 1, 2, 4, 8, 16, ... tokens at levels 0, 1, 2, ...; a request that has generated d tokens
# since joining at level 0 is at level 0 for d < 1, 1 for d < 3, 2 for d < 7, 3 for d < 15, 4 for
# d < 31. Skip-join: prompt P joins the smallest k with 2**k >= ceil(P / 128).


def test_mlfq_skip_join_levels():
    p = make_policy("fastserve_mlfq")
    assert [p.join_level(x) for x in (1, 128, 129, 256, 257, 1000, 2000)] == [0, 0, 1, 1, 2, 3, 4]
    assert make_policy("fastserve_mlfq", num_levels=3).join_level(2000) == 2


def test_mlfq_new_request_evicts_a_demoted_one():
    # One slot. R0 (P=100, level 0, T=20) from 0; at step 5 it has 5 tokens -> level 2.
    # R1 (P=100, level 0, T=3) arrives at 5 ms: 0 < 2 -> R0 evicted, R1 at 5, done at 8 ms.
    # R0 (level 2, tokens lost) re-enters at 8 and is done at 28 ms.
    w = explicit([0, 0.005], [100, 100], [20, 3])
    expect("fastserve_mlfq", w, admit=(0, 5), finish=(28, 8), preemptions=1)


def test_mlfq_demotion_below_a_waiting_level_is_a_timer():
    # One slot. R0 (P=1000: level 3, T=100) from 0: level 3 for 8 tokens, level 4 for 16 more,
    # level 5 from token 24. R1 (P=2000: level 4, T=3) arrives at 1.5 ms (visible at step 2): it
    # cannot evict R0 until R0 drops below level 4, at step 24 — no arrival, no completion then.
    # R1 at 24, done at 27; R0 again from 27, done at 127 ms.
    w = explicit([0, 0.0015], [1000, 2000], [100, 3])
    expect("fastserve_mlfq", w, admit=(0, 24), finish=(127, 27))


def test_mlfq_starvation_promotes_to_the_front_but_not_to_evict():
    # One slot. R0 (P=100: level 0, T=50) runs from 0 and ends at level 5 (50 tokens): nobody below
    # level 5 waits, so it is never evicted. W2 (P=8000: ceil(8000/128) = 63 -> level 6, T=5)
    # arrives at 1.5 ms, W1 (P=4000: 32 -> level 5, T=5) at 30 ms. At 50 ms W1 (level 5) goes before
    # W2 (level 6): W1 done at 55, W2 at 60. With starvation_s = 20 ms, W2 is promoted to level 0 at
    # step 22 and goes first: W2 done at 55, W1 at 60. Promoted, W2 still evicts only what level 6
    # could: R0 (level <= 5) is not evicted.
    w = explicit([0, 0.030, 0.0015], [100, 4000, 8000], [50, 5, 5])
    expect("fastserve_mlfq", w, finish=(50, 55, 60))
    expect("fastserve_mlfq", w, starvation_s=0.02, finish=(50, 60, 55), preemptions=0)


# --- las --------------------------------------------------------------------------------------


def test_las_arrival_evicts_the_most_served_and_no_ping_pong_follows():
    # One slot. R0 (T=10) from 0; R1 (T=10) arrives at 2 ms with no service: R0 (2 tokens) is
    # evicted, R1 at 2. From step 5 R1 has more service than R0, but R0 (not new) does not evict:
    # R1 done at 12, R0 from 12, done at 22 ms. One preemption.
    w = explicit([0, 0.002], [5, 5], [10, 10])
    expect("las", w, admit=(0, 2), finish=(22, 12), preemptions=1)


def test_las_serves_the_least_attained_service_first():
    # One slot. R0 (T=30) from 0; R1 (T=30) at 5 ms evicts R0 (5 tokens); R2 (T=5) at 7 ms evicts
    # R1 (2 tokens), R2 done at 12 ms. Then R1 (attained 2) before R0 (attained 5), though R0
    # came first: R1 from 12 (all 30 again) done at 42, R0 from 42, done at 72 ms.
    w = explicit([0, 0.005, 0.007], [5, 5, 5], [30, 30, 5])
    expect("las", w, finish=(72, 42, 12), preemptions=2)


# --- srpt_oracle ------------------------------------------------------------------------------


def test_srpt_oracle_evicts_on_true_remaining_and_ignores_predictions():
    # One slot. R0 (T=10, predicted 1) from 0. R1 (T=2, predicted 1000) at 3 ms: remaining 2 < 7 ->
    # R0 evicted, R1 at 3, done at 5; R0 from 5 (all 10 again), done at 15 ms.
    w = explicit([0, 0.003], [5, 5], [10, 2], predicted=[1, 1000])
    expect("srpt_oracle", w, finish=(15, 5), preemptions=1)
    # R1 with T=8: remaining 8 > 7 -> no eviction, R1 waits: R0 done at 10, R1 at 18 ms.
    w = explicit([0, 0.003], [5, 5], [10, 8], predicted=[1, 1000])
    expect("srpt_oracle", w, finish=(10, 18), preemptions=0)


def test_srpt_oracle_admits_shortest_true_output_first():
    # One slot, all at 0: true outputs 3, 1, 2 -> R1 (0), R2 (1 ms), R0 (3 ms).
    w = explicit([0, 0, 0], [5, 5, 5], [3, 1, 2], predicted=[1, 9, 9])
    np.testing.assert_allclose(both_modes("srpt_oracle", w, ONE_SLOT).admit_s, ms(3, 0, 1))


def test_preemptive_policies_run_under_the_vllm_v1_engine():
    # A burst on a tight vLLM-like engine: every request of a small window completes, and the
    # engine preempts or the policy does, with fast == step by step (both_modes).
    from portbench.engine import VllmV1Model
    rng = np.random.default_rng(0)
    n = 30
    w = make_window("burst", "test", np.sort(rng.uniform(0, 0.05, n)), rng.integers(20, 300, n),
                    rng.integers(1, 60, n), rng.integers(1, 80, n))
    model = VllmV1Model(max_active_sequences=4, max_kv_tokens=800, max_num_batched_tokens=256)
    for name in RQ7_POLICIES:
        r = both_modes(name, w, model)
        assert r.completed.all(), name
