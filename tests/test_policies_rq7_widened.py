"""RQ7's widened panel — SGLang's ``hrrn``, ``lof``, ``shortest_prefill_first`` and ``random``, and
TensorRT-LLM's ``guaranteed_no_evict`` — against hand-worked cases.

Under ``ONE_SLOT`` (``LsspModel`` with one sequence slot) a request admitted at step s is stamped
``admit_s = s ms`` and, with output T, finishes at ``(s + T) ms``. A blocker (request 0, arriving at
0 with 50 output tokens) holds the slot until 50 ms, so the policy's order decides who goes next.
The contract check (``check_policy``) runs in ``tests/test_policy_contract.py`` for every registered
policy, and in ``tests/test_policies_rq7.py`` for RQ7's panel.
"""

import dataclasses

import numpy as np
import pytest

from portbench import sim
from portbench.engine import VllmV1Model
from portbench.policies import make_policy
from portbench.testing import real_cases

from test_policies_rq7 import ONE_SLOT, explicit, expect, ms


def behind_blocker(arrivals, inputs, outputs):
    """Request 0 holds the one slot from 0 to 50 ms; the others wait (predictions = true outputs)."""
    return explicit([0.0, *arrivals], [1, *inputs], [50, *outputs])


def order_after_blocker(name, w, **params):
    """The waiting requests (ids >= 1) in the order they were admitted."""
    r = expect(name, w, **params)
    return (np.argsort(r.admit_s[1:], kind="stable") + 1).tolist()


# --- hrrn -----------------------------------------------------------------------------------------

def test_hrrn_a_short_late_job_overtakes_a_long_early_one():
    # est = (0.5 * prompt + predicted) ms. At 50 ms: request 1 (from 1 ms, est 101 ms) has ratio
    # 1 + 49/101 = 1.49; request 2 (from 2 ms, est 6 ms) has 1 + 48/6 = 9 -> 2 first (FIFO: 1 first).
    w = behind_blocker([0.001, 0.002], [2, 2], [100, 5])
    assert order_after_blocker("hrrn", w) == [2, 1]
    assert order_after_blocker("fifo", w) == [1, 2]


def test_hrrn_a_long_job_that_waited_long_enough_goes_first():
    # At 50 ms: request 1 (from 1 ms, est 21 ms) 1 + 49/21 = 3.33; request 2 (from 45 ms, est 3 ms)
    # 1 + 5/3 = 2.67 -> 1 first, though 2 is shorter (shortest-first would take 2).
    w = behind_blocker([0.001, 0.045], [2, 2], [20, 2])
    assert order_after_blocker("hrrn", w) == [1, 2]
    r = expect("hrrn", w, admit=[0, 50, 70], finish=[50, 70, 72])
    assert r.n_preemptions == 0


def test_hrrn_refuses_a_zero_service_estimate():
    with pytest.raises(ValueError, match="hrrn: the service estimate must be positive"):
        make_policy("hrrn", alpha=0.0, beta=0.0)
    with pytest.raises(ValueError, match="hrrn: estimate_unit_s must be a finite number"):
        make_policy("hrrn", estimate_unit_s=float("nan"))


# --- lof ------------------------------------------------------------------------------------------

def test_lof_serves_the_longest_predicted_output_first():
    # predicted 5, 50, 20 -> order 2 (50..100 ms), 3 (100..120), 1 (120..125)
    w = behind_blocker([0.001, 0.002, 0.003], [10, 10, 10], [5, 50, 20])
    expect("lof", w, admit=[0, 120, 50, 100], finish=[50, 125, 100, 120])


def test_lof_reads_the_prediction_not_the_true_output():
    w = explicit([0.0, 0.001, 0.002], [1, 10, 10], [50, 5, 50], predicted=[50, 60, 1])
    assert order_after_blocker("lof", w) == [1, 2]


# --- shortest_prefill_first -----------------------------------------------------------------------

def test_shortest_prefill_first_orders_by_prompt():
    # prompts 300, 10, 100 (outputs 5 each) -> 2 (50..55), 3 (55..60), 1 (60..65)
    w = behind_blocker([0.001, 0.002, 0.003], [300, 10, 100], [5, 5, 5])
    expect("shortest_prefill_first", w, admit=[0, 60, 50, 55], finish=[50, 65, 55, 60])


def test_shortest_prefill_first_aging_puts_the_oldest_first():
    # aging_s = 30 ms: at 50 ms request 1 (from 1 ms) has waited 49 ms -> first, although its prompt
    # is the longest; request 3 (from 30 ms, 20 ms) is not aged -> then the shortest prompt (2).
    w = behind_blocker([0.001, 0.002, 0.030], [300, 10, 100], [5, 5, 5])
    assert order_after_blocker("shortest_prefill_first", w, aging_s=0.03) == [1, 2, 3]
    assert order_after_blocker("shortest_prefill_first", w) == [2, 3, 1]
    with pytest.raises(ValueError, match="shortest_prefill_first: aging_s must be"):
        make_policy("shortest_prefill_first", aging_s=-1)


# --- random ---------------------------------------------------------------------------------------

def test_random_follows_its_seeded_rank_and_repeats_itself():
    w = behind_blocker([0.001 * k for k in range(1, 8)], [10] * 7, [3] * 7)
    for seed in (0, 1, 2):
        rank = np.random.default_rng(seed).permutation(8)          # one rank per request
        want = sorted(range(1, 8), key=lambda i: rank[i])
        assert order_after_blocker("random", w, seed=seed) == want
        assert order_after_blocker("random", w, seed=seed) == want  # a second run: the same
    orders = {tuple(order_after_blocker("random", w, seed=s)) for s in range(6)}
    assert len(orders) > 1                                          # seeds give different orders
    with pytest.raises(ValueError, match="random: seed must be an integer >= 0"):
        make_policy("random", seed=1.5)


# --- guaranteed_no_evict --------------------------------------------------------------------------

def test_guaranteed_no_evict_reserves_the_predicted_output_head_of_line():
    # Cache 100 tokens, 4 slots. Request 0 (prompt 10, output 40) reserves 50. Request 1 needs
    # 10 + 45 = 55 > 50 left: refused, and request 2 (10, fits) waits behind it (head-of-line);
    # FIFO admits all three at 0. At 40 ms request 0 leaves: 1 (55) and 2 (10) both fit.
    model = sim.LsspModel(max_active_sequences=4, max_kv_tokens=100)
    w = explicit([0.0, 0.0, 0.0], [10, 10, 5], [40, 45, 5])
    expect("guaranteed_no_evict", w, model, admit=[0, 40, 40], finish=[40, 85, 45])
    expect("fifo", w, model, admit=[0, 0, 0])


def test_guaranteed_no_evict_never_preempts_with_exact_predictions():
    # A real window at high load under vllm_v1, predictions replaced by the true outputs: FIFO
    # preempts, the reservation never needs to.
    window, model = real_cases("vllm_v1", 1)[0]
    exact = dataclasses.replace(window, predicted_output_tokens=window.output_tokens.copy())
    assert isinstance(model, VllmV1Model)
    assert sim.simulate(exact, make_policy("fifo"), model).n_preemptions > 0
    r = sim.simulate(exact, make_policy("guaranteed_no_evict"), model)
    assert r.n_preemptions == 0
    assert r.completed.any()
