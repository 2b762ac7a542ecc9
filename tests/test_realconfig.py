"""The simulator in a real run's configuration (portbench.realconfig)."""

import numpy as np
import pandas as pd
import pytest

from portbench import realconfig
from portbench.sim import RunResult
from portbench.workload import make_window


def test_capped_submissions_wait_for_a_free_worker():
    arrival = np.zeros(4)
    finish = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(realconfig.capped_submissions(arrival, finish, 2), [0, 0, 1, 2])
    np.testing.assert_allclose(realconfig.capped_submissions(arrival, finish, 4), [0, 0, 0, 0])
    # a request never served frees its worker at once
    np.testing.assert_allclose(realconfig.capped_submissions(arrival, [np.nan, 2, 3, 4], 1), [0, 0, 2, 3])
    with pytest.raises(ValueError, match="max_in_flight"):
        realconfig.capped_submissions(arrival, finish, 0)


def _fifo_server(service_s: float, servers: int):
    """A stand-in engine: ``servers`` requests served at a time, each for ``service_s``, FIFO."""
    def simulate(w):
        free = [0.0] * servers
        finish = np.empty(len(w.arrival_s))
        for i, a in enumerate(w.arrival_s):
            k = int(np.argmin(free))
            start = max(a, free[k])
            finish[i] = free[k] = start + service_s
        return RunResult(w.window_id, "p", "toy", w.arrival_s, w.deadline_s, w.input_tokens, w.output_tokens,
                         np.ones(len(w)), admit_s=finish - service_s, first_token_s=finish, finish_s=finish,
                         duration_s=float(finish.max()), n_steps=0, n_preemptions=0)
    return simulate


def test_run_capped_is_a_trajectory_of_the_capped_client():
    n = 10
    w = make_window("cap", "synthetic", np.zeros(n), np.full(n, 8), np.full(n, 4), np.full(n, 4))
    result, submit, iterations = realconfig.run_capped(w, _fifo_server(1.0, servers=100), 3)
    # three at a time: they finish in waves of one second, and the arrivals stay the trace's
    np.testing.assert_allclose(result.finish_s, np.repeat([1.0, 2.0, 3.0, 4.0], [3, 3, 3, 1]))
    np.testing.assert_allclose(submit, result.finish_s - 1.0)
    np.testing.assert_array_equal(result.arrival_s, w.arrival_s)
    assert iterations > 1
    in_flight = max(int(((submit <= t) & (result.finish_s > t)).sum()) for t in submit)
    assert in_flight == 3
    # a cap that never binds changes nothing
    free, submit_free, k = realconfig.run_capped(w, _fifo_server(1.0, servers=100), 100)
    assert k == 1 and np.allclose(free.finish_s, 1.0)


def test_the_cost_fit_takes_as_many_runs_of_every_window_as_the_fewest():
    runs = pd.DataFrame({"window_id": ["a"] * 6 + ["b"] * 2, "policy": ["x", "y"] * 4,
                         "repetition": [5, 5, 0, 0, 9, 9, 3, 3]})
    kept = realconfig.balanced_runs(runs)
    assert sorted(map(tuple, kept[["window_id", "repetition"]].to_numpy().tolist())) == \
        [("a", 0), ("a", 0), ("b", 3), ("b", 3)]


def test_paired_repetitions_keep_the_hosts_swings_out_of_the_difference():
    """Each repetition's host speed moves both policies' ANWG together; x is 0.01 above y in every
    pair. Paired, the interval is the 0.01 itself; unpaired, the swings widen it past 0; a repetition
    with one policy's run only is left out of the pairs."""
    level = np.array([0.9, 0.6, 0.8, 0.5, 0.7])
    rows = [{"source": "s", "window_id": w, "policy": p, "repetition": r, "anwg": level[r] + (0.01 if p == "x" else 0)}
            for w in ("a", "b") for r in range(5) for p in ("x", "y")]
    rows.append({"source": "s", "window_id": "a", "policy": "x", "repetition": 5, "anwg": 0.1})
    runs = pd.DataFrame(rows)
    p = realconfig.repetition_resampled_delta(runs, policies=("x", "y"), n_resamples=300).iloc[0]
    assert p["delta"] == pytest.approx(0.01) and p["half_width"] == pytest.approx(0.0, abs=1e-12)
    assert p["repetitions"] == 5 and p["pair_corr"] == pytest.approx(1.0)
    u = realconfig.repetition_resampled_delta(runs, policies=("x", "y"), n_resamples=300, paired=False).iloc[0]
    assert u["ci_low"] < 0 < u["ci_high"] and u["repetitions"] == 5 and u["repetitions_max"] == 6
    assert np.isnan(u["pair_corr"])


def test_repetition_resampled_delta_and_budget_exposure():
    runs = pd.DataFrame({"source": "s", "window_id": np.repeat(["a", "b"], 4),
                         "policy": ["x", "x", "y", "y"] * 2, "repetition": [0, 1, 0, 1] * 2,
                         "anwg": [0.9, 0.9, 0.8, 0.8, 0.5, 0.5, 0.6, 0.6]})
    t = realconfig.repetition_resampled_delta(runs, policies=("x", "y"), n_resamples=200).iloc[0]
    assert t["delta"] == pytest.approx(0.0) and t["repetitions"] == 2 and t["n_windows"] == 2
    assert t["ci_low"] <= 0 <= t["ci_high"]
    w = make_window("e", "synthetic", np.zeros(4), np.array([10, 10, 30, 30]), np.full(4, 2), np.full(4, 2))
    assert realconfig.budget_exposure([w], budget=50, max_in_flight=2) == 1
    assert realconfig.budget_exposure([w], budget=60, max_in_flight=2) == 0
