"""The real engine's repeatability beside the simulator's error (portbench.repeatability)."""

import numpy as np
import pandas as pd
import pytest

from portbench import repeatability as R


def counterpart(real0, real1, sim0, sim1, admit0=None, admit1=None, admit_sim=None):
    """Two repetitions of one (window, policy) run, one request per entry: finish times from 0."""
    n = len(real0)
    rows = []
    for rep, (real, sim) in enumerate(((real0, sim0), (real1, sim1))):
        admit = (admit0, admit1)[rep]
        rows.append(pd.DataFrame({
            "source": "s", "window_id": "w", "policy": "p", "repetition": rep, "request_index": np.arange(n),
            "arrival_s": 0.0, "output_tokens": 3, "deadline_s": 100.0,
            "admit_s": np.arange(n, dtype=float) if admit is None else admit,
            "first_token_s": np.asarray(real) / 2, "finish_s": np.asarray(real, dtype=float),
            "admit_s_sim": np.arange(n, dtype=float) if admit_sim is None else admit_sim,
            "first_token_s_sim": np.asarray(sim) / 2, "finish_s_sim": np.asarray(sim, dtype=float)}))
    return pd.concat(rows, ignore_index=True)


def test_paired_errors_pair_each_request_with_the_other_repetition():
    c = counterpart([1.0, 2.0], [1.5, 2.0], [1.1, 1.0], [1.5, 4.0])
    p = R.paired_errors(c)
    e2e = p[p["measure"] == "end-to-end"].set_index(["repetition", "request_index"])
    assert e2e.loc[(0, 0), "noise_error"] == pytest.approx(0.5)       # 1.5 against 1.0
    assert e2e.loc[(1, 0), "noise_error"] == pytest.approx(1 / 3)     # 1.0 against 1.5
    assert e2e.loc[(0, 0), "sim_error"] == pytest.approx(0.1)
    assert e2e.loc[(1, 1), "sim_error"] == pytest.approx(1.0)         # 4 against 2
    assert set(p["measure"]) == set(R.MEASURES)


def test_one_repetition_has_no_noise_floor():
    c = counterpart([1.0], [1.0], [1.0], [1.0])
    assert R.paired_errors(c[c["repetition"] == 0]).empty


def test_noise_table_ratio_and_a_run_offset_removed():
    rng = np.random.default_rng(0)
    frames = []
    for w in range(6):
        real0 = rng.uniform(1, 2, 50)
        real1 = real0 * rng.uniform(0.9, 1.1, 50)
        c = counterpart(real0, real1, real0 * 1.3, real1 * 1.3)      # the model: a pure 30% offset per run
        frames.append(c.assign(window_id=f"w{w}"))
    c = pd.concat(frames, ignore_index=True)
    p = R.paired_errors(c)
    t = R.noise_table(p, by=(), n_resamples=50).set_index(["measure", "stat"])
    row = t.loc[("end-to-end", "median")]
    assert row["sim"] == pytest.approx(0.3) and 0 < row["noise"] < 0.1
    assert row["ratio"] == pytest.approx(row["sim"] / row["noise"])
    assert row["ratio_lo"] <= row["ratio"] <= row["ratio_hi"] and row["windows"] == 6
    offsets, q = R.run_offsets(p)
    assert np.allclose(offsets["sim_offset"], 0.3)
    assert q["sim_error_offset_removed"].max() < 1e-12               # an offset, and nothing else


def test_admission_order_agreement_counts_same_positions():
    c = counterpart([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1],
                    admit0=[0.0, 1.0, 2.0, 3.0], admit1=[0.0, 2.0, 1.0, 3.0], admit_sim=[0.0, 1.0, 2.0, 3.0])
    a = R.admission_order_agreement(c).set_index("repetition")
    assert a.loc[0, "sim"] == 1.0 and a.loc[0, "noise"] == 0.5       # two requests swapped in repetition 1
    assert a.loc[1, "sim"] == 0.5


def test_choice_steps_and_agreement_on_them():
    steps = pd.DataFrame({"window_id": "w", "policy": "p", "repetition": 0, "kept": True, "step": [0, 1, 2, 3],
                          "running_before": [0, 2, 2, 1], "waiting_before": [2, 1, 0, 0],
                          "scheduled_seqs": [2, 2, 2, 1]})
    s = R.choice_steps(steps)
    assert s["choice"].tolist() == [False, True, False, False]
    replay = pd.DataFrame({"window_id": "w", "policy": "p", "repetition": 0, "step": [0, 1, 2, 3],
                           "agree": [True, False, True, True]})
    t = R.agreement_on_choice_steps(replay, steps).set_index("group")
    assert t.loc["all", "choice_share"] == 0.25 and t.loc["all", "agree_choice"] == 0.0
    assert t.loc["all", "agree_all"] == 0.75
    with pytest.raises(ValueError, match="running_before"):
        R.choice_steps(steps.drop(columns="running_before"))


def hol_case(seats=8):
    """One vllm_faithful run, budget 100: three requests (60, 50, 30 tokens) submitted at step 0.
    Step 0 admits request 0 (60 tokens) and stops at request 1 (50 > the 40 left), although request
    2 (30) would fit behind it; step 1 admits both beside request 0's decode; step 2 only decodes."""
    steps = pd.DataFrame({"window_id": "w", "policy": "vllm_faithful", "repetition": 0, "attempt": 0,
                          "kept": True, "step": [0, 1, 2],
                          "scheduled": ["0:60", "0:1;1:50;2:30", "0:1;1:1;2:1"]})
    requests = pd.DataFrame({"window_id": "w", "policy": "vllm_faithful", "repetition": 0, "attempt": 0,
                             "request_index": [0, 1, 2], "submit_step": [0, 0, 0], "input_tokens": [60, 50, 30],
                             "refused": False})
    runs = pd.DataFrame({"window_id": ["w"], "policy": ["vllm_faithful"], "repetition": [0],
                         "max_num_seqs": [seats]})
    return steps, requests, runs


def test_head_of_line_steps_find_where_the_rule_stopped_admission():
    h = R.head_of_line_steps(*hol_case(), budget=100).set_index("step")
    assert h.loc[0, "fired"] and h.loc[0, "blocked"]          # 50 > 40 left, and 30 behind it fits
    assert h.loc[0, "head"] == 1 and h.loc[0, "budget_left"] == 40
    assert not h.loc[1, "fired"] and h.loc[1, "head"] == -1   # nothing waits any more
    # with one seat the engine was full: the seat, not the budget, held request 1 back
    assert not R.head_of_line_steps(*hol_case(seats=1), budget=100)["fired"].any()
    replay = pd.DataFrame({"window_id": "w", "policy": "vllm_faithful", "repetition": 0, "step": [0, 1, 2],
                           "agree": [True, False, True]})
    a = R.agreement_on_hol_steps(replay, R.head_of_line_steps(*hol_case(), budget=100)).iloc[0]
    assert (a["fired_steps"], a["blocked_steps"], a["agree_blocked"]) == (1, 1, 1.0)


def test_lifetime_speed_stretches_the_model_by_the_host_over_each_request():
    # the host ran steps 0-1 as predicted and steps 2-3 twice as slow
    steps = pd.DataFrame({"window_id": "w", "policy": "p", "repetition": 0, "start_s": [0.0, 1.0, 2.0, 4.0],
                          "duration_s": [1.0, 1.0, 2.0, 2.0], "predicted_s": [1.0, 1.0, 1.0, 1.0]})
    c = pd.DataFrame({"window_id": "w", "policy": "p", "repetition": 0, "request_index": [0, 1],
                      "arrival_s": [0.0, 2.0], "finish_s": [2.0, 6.0],
                      "admit_s_sim": [0.0, 2.0], "first_token_s_sim": [1.0, 3.0], "finish_s_sim": [2.0, 4.0]})
    speed = R.lifetime_speed(c, steps).set_index("request_index")["lifetime_speed"]
    assert speed.tolist() == [1.0, 2.0]
    stretched = R.with_lifetime_speed(c, R.lifetime_speed(c, steps))
    assert stretched["finish_s_sim"].tolist() == [2.0, 6.0] and stretched["first_token_s_sim"].tolist() == [1.0, 4.0]
