"""The fidelity pipeline: the engine's per-step cost hook, the replayed-cost schedule comparison and
the cross-validation folds."""

import numpy as np
import pandas as pd
import pytest

from portbench import fidelity, sim
from portbench.engine import StepCost, VllmV1Model
from portbench.engine.stepcost import PS
from portbench.policies import make_policy
from portbench.workload import make_window


def _window(n=40, seed=1):
    rng = np.random.default_rng(seed)
    return make_window("toy_w0", "toy", np.sort(rng.uniform(0, 0.5, n)), rng.integers(16, 900, n),
                       rng.integers(1, 60, n), prediction_seed=seed)


COST = StepCost(fixed_s=2e-3, per_prefill_token_s=1e-5, per_decode_seq_s=5e-5, per_context_token_s=1e-7,
                gap_s=1e-4)


def _linear_as_shaped(cost):
    coef = (cost.fixed_s, cost.per_prefill_token_s, cost.per_decode_seq_s, cost.per_context_token_s)
    return fidelity.ShapedStepCost({s: coef for s in fidelity.SHAPES}, cost, cost.gap_s)


@pytest.mark.parametrize("policy", ["fifo", "slai_faithful"])
def test_per_step_cost_hook_matches_the_closed_form(policy):
    """A per-step cost with the linear cost's coefficients walks every step and gets every time the
    closed-form engine gets (fails if the hook mis-times a step or a stretch skips the hook)."""
    w = _window()
    model = VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000, cost=COST)
    ref = sim.simulate(w, make_policy(policy), model)
    hooked = sim.simulate(w, make_policy(policy), VllmV1Model(
        max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000, cost=_linear_as_shaped(COST)))
    for f in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(ref, f), getattr(hooked, f))
    assert ref.n_steps == hooked.n_steps


def _as_real_steps(replay):
    """A replay's own step log, written as a real run's step log."""
    log = replay.log()
    out = pd.DataFrame({"window_id": "toy_w0", "policy": "fifo", "repetition": 0, "step": log["step"],
                        "start_s": log["start_ps"] / PS, "duration_s": (log["end_ps"] - log["start_ps"]) / PS,
                        "prefill_tokens": log["prefill_tokens"], "decode_seqs": log["decode_seqs"],
                        "context_tokens": log["context_tokens"], "scheduled_seqs": log["scheduled_seqs"],
                        "running": 1, "waiting": 0})
    out.loc[out.index[-1], "running"] = 0
    return out


def test_replaying_a_runs_own_step_times_reproduces_it():
    """Replay a simulated run's own steps as if they were a real run's: every step and request agrees;
    a run whose one step differs is caught."""
    w = _window()
    model = VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000, cost=COST)
    rec = fidelity.ReplayedStepTimes(pd.DataFrame({"step": [], "busy": [], "next_start_s": [], "end_s": []}), COST)
    r0 = sim.simulate(w, make_policy("fifo"), VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16,
                                                          max_kv_tokens=20_000, cost=rec))
    assert rec.beyond == r0.n_steps       # no real step to replay: every step timed by the fallback
    real = fidelity.run_steps(_as_real_steps(rec))
    replay = fidelity.ReplayedStepTimes(real, COST)
    r1 = sim.simulate(w, make_policy("fifo"), VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16,
                                                          max_kv_tokens=20_000, cost=replay))
    log = replay.log()
    rq0 = fidelity.request_steps(r0.admit_s, r0.first_token_s, r0.finish_s, real["start_s"], real["end_s"])
    rq1 = fidelity.request_steps(r1.admit_s, r1.first_token_s, r1.finish_s, log["start_ps"] / PS, log["end_ps"] / PS)
    assert (rq0.to_numpy() >= 0).all()
    served = np.ones(len(w), dtype=bool)
    st, rq = fidelity.compare_schedules(real, log, rq0, rq1, policy="fifo", arrival_s=w.arrival_s, served=served)
    assert st["agree"].all() and rq["agree"].all() and replay.beyond == 0
    bad = log.copy()
    bad.loc[5, "prefill_tokens"] += 1
    st, _ = fidelity.compare_schedules(real, bad, rq0, rq1, policy="fifo", arrival_s=w.arrival_s, served=served)
    assert not st.loc[5, "agree"] and st.loc[5, "cls"] in fidelity.DISAGREEMENT_CLASSES


def test_an_arrival_between_two_real_steps_is_classed_as_a_race():
    real = pd.DataFrame({"start_s": [0.0, 0.010], "end_s": [0.009, 0.019], "decode_seqs": [0, 0]})
    sim_ = pd.DataFrame({"decode_seqs": [0, 0]})
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0, 0.0095], [True, True]) == fidelity.RACE
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0, 0.02], [True, True]) == fidelity.OTHER
    # the racing request refused on both sides does not count
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0, 0.0095], [True, False]) == fidelity.OTHER


def test_window_folds_hold_every_source_and_reject_one_fold():
    ids = [f"{s}_w{i}" for s in "abc" for i in range(8)]
    folds = fidelity.window_folds(ids, [i[0] for i in ids], 4)
    for f in range(4):
        assert {w[0] for w, g in folds.items() if g == f} == set("abc")
    with pytest.raises(ValueError, match="at least 2 folds"):
        fidelity.window_folds(ids, [i[0] for i in ids], 1)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="lacks columns"):
        fidelity.run_steps(pd.DataFrame({"window_id": ["w"], "policy": ["p"], "repetition": [0], "step": [0]}))
    with pytest.raises(ValueError, match="missing"):
        fidelity.ShapedStepCost({"mixed": (0, 0, 0, 0)}, COST, 0.0)
    with pytest.raises(ValueError, match="kind"):
        fidelity.cross_validated_costs(pd.DataFrame(), pd.DataFrame(), kind="cubic")


def _synthetic_steps(coef, n_windows=8, per_window=120, seed=3):
    """A step log whose durations follow RichStepCost's terms with ``coef`` exactly."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in range(n_windows):
        for k in range(per_window):
            shape = k % 3
            prefill = int(rng.integers(16, 600)) if shape != 1 else 0
            decode = int(rng.integers(1, 100)) if shape != 0 else 0
            pseqs = int(rng.integers(1, 4)) if prefill else 0
            rows.append({"window_id": f"toy_w{w}", "policy": "fifo", "repetition": 0, "step": k,
                         "start_s": k * 0.05, "prefill_tokens": prefill, "decode_seqs": decode,
                         "context_tokens": int(rng.integers(0, 50_000)), "scheduled_seqs": decode + pseqs,
                         "running": 1, "waiting": 0})
    steps = pd.DataFrame(rows)
    x = fidelity.rich_design(steps["prefill_tokens"], steps["decode_seqs"], steps["context_tokens"],
                              steps["scheduled_seqs"])
    shape = fidelity.batch_shape(steps["prefill_tokens"], steps["decode_seqs"])
    steps["duration_s"] = [x[i] @ np.asarray(coef[s]) for i, s in enumerate(shape)]
    runs = pd.DataFrame({"window_id": [f"toy_w{w}" for w in range(n_windows)], "source": "toy"})
    return steps, runs


RICH_COEF = {"prefill only": (3e-3, 4e-6, 0.0, 2e-8, 1.5e-8), "decode only": (1.2e-3, 0.0, 8e-5, 1.2e-7, 0.0),
             "mixed": (3e-3, 7e-6, 2.5e-5, 2e-7, 5e-9)}


def test_rich_cost_recovers_known_coefficients():
    """Steps timed exactly by known per-shape coefficients: the fit gives them back, and the engine
    hook times a step as ``predict`` does (plus the gap)."""
    steps, _ = _synthetic_steps(RICH_COEF)
    cost = fidelity.RichStepCost.fit(steps)
    for shape, want in RICH_COEF.items():
        np.testing.assert_allclose(cost.coef[shape], want, rtol=1e-3, atol=1e-12)
    pred = cost.predict(steps["prefill_tokens"], steps["decode_seqs"], steps["context_tokens"], steps["scheduled_seqs"])
    np.testing.assert_allclose(pred, steps["duration_s"], rtol=1e-6)
    row = steps.iloc[5]
    hook = cost.step_ps(0, 0, int(row["prefill_tokens"]), int(row["decode_seqs"]), int(row["context_tokens"]),
                        int(row["scheduled_seqs"]))
    assert abs(hook / PS - cost.gap_s - row["duration_s"]) < 1e-9


def test_cross_validation_never_uses_the_test_windows():
    """Each fold's cost is the same whatever the durations of its own windows' steps: spoiling them
    (×50) changes no coefficient of that fold's fit, and changes the other folds' fits."""
    steps, runs = _synthetic_steps(RICH_COEF)
    clean = fidelity.cross_validated_costs(steps, runs, k=4, kind="rich")
    for f in range(4):
        spoiled = steps.copy()
        mine = spoiled["window_id"].map(clean["folds"]) == f
        spoiled.loc[mine, "duration_s"] *= 50
        costs = fidelity.cross_validated_costs(spoiled, runs, k=4, kind="rich")
        assert costs[(f, "fifo")].coef == clean[(f, "fifo")].coef
        assert any(costs[(g, "fifo")].coef != clean[(g, "fifo")].coef for g in range(4) if g != f)
    err = fidelity.cross_validated_step_error(steps, runs, k=4, kind="rich")
    assert err["rel_error"].median() < 1e-6


def test_rich_cost_matches_the_total_of_skewed_steps():
    """Steps slowed by right-skewed noise (most near the typical time, a few much slower): the
    robust fit alone predicts the typical step and a short total; the default fit keeps its
    relative terms and adds up, shape by shape, to the measured total (a latency is a sum)."""
    steps, _ = _synthetic_steps(RICH_COEF, per_window=300)
    rng = np.random.default_rng(5)
    steps["duration_s"] *= np.where(rng.random(len(steps)) < 0.1, 3.0, 1.0) * rng.uniform(0.98, 1.02, len(steps))
    steps = steps.assign(gap_s=np.where(np.arange(len(steps)) % 2 == 0, 1e-4, np.nan))
    robust = fidelity.RichStepCost.fit(steps, match_total=False)
    total = fidelity.RichStepCost.fit(steps)
    shape = fidelity.batch_shape(steps["prefill_tokens"], steps["decode_seqs"])
    args = (steps["prefill_tokens"], steps["decode_seqs"], steps["context_tokens"], steps["scheduled_seqs"])
    for name in fidelity.SHAPES:
        m = shape == name
        measured = steps.loc[m, "duration_s"].sum()
        assert robust.predict(*args)[m].sum() < 0.9 * measured
        assert total.predict(*args)[m].sum() == pytest.approx(measured, rel=1e-9)
        used = np.asarray(robust.coef[name]) > 0
        ratio = np.asarray(total.coef[name])[used] / np.asarray(robust.coef[name])[used]
        assert np.allclose(ratio, ratio[0])                                     # one level, same terms
        assert (np.asarray(total.coef[name])[~used] == 0).all()
    assert total.gap_s == pytest.approx(1e-4)


def test_each_policy_gets_its_own_cross_validated_cost():
    """A scheduler that does more per step makes the same batch slower: two policies' steps, one
    1.3× the other's, give two fits, each of its own policy's steps."""
    a, runs = _synthetic_steps(RICH_COEF)
    b = a.assign(policy="slai_faithful", duration_s=a["duration_s"] * 1.3)
    costs = fidelity.cross_validated_costs(pd.concat([a, b], ignore_index=True), runs, k=4, kind="rich")
    for f in range(4):
        for shape in fidelity.SHAPES:
            np.testing.assert_allclose(np.asarray(costs[(f, "slai_faithful")].coef[shape]),
                                       1.3 * np.asarray(costs[(f, "fifo")].coef[shape]), rtol=1e-6, atol=1e-12)
    err = fidelity.cross_validated_step_error(pd.concat([a, b], ignore_index=True), runs, k=4, kind="rich")
    assert err["rel_error"].max() < 1e-6


def test_measured_slai_clock_is_the_real_schedulers_moving_average():
    """The rebuilt step length follows the real scheduler's rule: starts at 1 ms, moves by 0.2 of
    each busy interval's difference, ignores calls that found nothing running and gaps of 1 s+;
    and the weight is the scheduler's own (read from its source: it needs vLLM to import)."""
    import ast
    import pathlib

    frame = pd.DataFrame({"step": range(5), "start_s": [0.0, 0.011, 0.021, 1.5, 1.51],
                          "running_before": [0, 1, 0, 1, 1]})
    got = fidelity.slai_measured_step_s(frame)
    s1 = 0.001 + 0.2 * (0.011 - 0.001)
    s4 = s1 + 0.2 * (0.01 - s1)
    np.testing.assert_allclose(got, [0.001, s1, s1, s1, s4])
    src = pathlib.Path(fidelity.__file__).parent.parent / "realengine" / "vllm_slai_scheduler.py"
    tree = ast.parse(src.read_text())
    ema = [n.value.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
           and getattr(n.target, "id", "") == "step_ema"]
    assert ema == [fidelity.SLAI_STEP_EMA]


def test_measured_clock_slai_runs_and_scaled_cost_scales():
    w = _window()
    model = VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000,
                        cost=_linear_as_shaped(COST))
    plain = sim.simulate(w, make_policy("slai_faithful"), model)
    measured = sim.simulate(w, fidelity.measured_clock_slai([0.001] * 5), model)
    assert np.isfinite(measured.finish_s).all() and measured.policy == plain.policy
    slow = sim.simulate(w, make_policy("fifo"), VllmV1Model(
        max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000,
        cost=fidelity.ScaledStepCost(_linear_as_shaped(COST), 2.0)))
    fast = sim.simulate(w, make_policy("fifo"), model)
    assert slow.duration_s > fast.duration_s
    with pytest.raises(ValueError, match="slai_clock"):
        fidelity.replayed_cost_comparison(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), {}, COST, slai_clock="x")


# --- the exact batches and the submission log (the equal-limits case's logs) ----------------------
def _fake_real_case(policy="fifo"):
    """A simulated run written as a real case with the new logs: each step's batch (``scheduled``,
    as the real backend formats it) and each request's ``submit_step`` (the model's own first step
    that could schedule it)."""
    from portbench.realengine.vllm_backend import format_scheduled
    from portbench.workload import scale

    w = _window(n=30, seed=4)
    rec = fidelity.ReplayedStepTimes(pd.DataFrame({"step": [], "busy": [], "next_start_s": [], "end_s": []}), COST)
    result, _ = fidelity.simulate_counterpart(scale(w, 1.0), policy, rec, on_engine=rec.attach)
    log = rec.log()
    steps = _as_real_steps(rec).assign(policy=policy, kept=True,
                                       scheduled=[format_scheduled(b) for b in log["batch"]], preempted="")
    starts = log["start_ps"].to_numpy()
    submit = np.searchsorted(starts, np.ceil(scale(w, 1.0).arrival_s * PS).astype(np.int64))
    requests = pd.DataFrame({"window_id": "toy_w0", "policy": policy, "repetition": 0,
                             "request_index": np.arange(len(w)), "admit_s": result.admit_s,
                             "first_token_s": result.first_token_s, "finish_s": result.finish_s,
                             "refused": False, "submit_step": submit})
    runs = pd.DataFrame({"window_id": ["toy_w0"], "policy": [policy], "repetition": [0], "source": ["toy"],
                         "load_factor": [1.0], "max_model_len": [np.nan]})
    return w, log, steps, requests, runs


def test_the_models_batches_add_up_and_replay_exactly():
    """The replay's logged batches hold each request's every token (prompt + output − 1 tokens run,
    no preemption here) and as many requests as the step's count; replaying the run against its own
    batch and submission logs agrees on every step's exact batch and every request, with either
    arrival rule."""
    w, log, steps, requests, runs = _fake_real_case()
    assert (log["batch"].map(len) == log["scheduled_seqs"]).all()
    ran = pd.Series(0, index=range(len(w)))
    for b in log["batch"]:
        for i, n in b.items():
            ran[i] += n
    np.testing.assert_array_equal(ran.to_numpy(), w.input_tokens + w.output_tokens - 1)
    for arrivals in fidelity.ARRIVALS:
        st, rq, per_run = fidelity.replayed_cost_comparison(runs, requests, steps, {"toy_w0": w}, COST,
                                                            arrivals=arrivals)
        assert st["agree"].all() and st["agree_batch"].eq(1).all() and rq["agree"].all()
        assert per_run.loc[0, "steps_agree"] == per_run.loc[0, "n_steps_real"]
    table = fidelity.agreement_table(st)
    assert table.loc[0, "agree, counts only"] == 1.0


def test_same_counts_other_requests_is_caught_by_the_exact_batch():
    """Two steps with the same counts but another request in the batch: the counts agree, the
    batch does not, and the episode is classed as the same shapes with other requests."""
    real = pd.DataFrame({"start_s": [0.0, 0.01, 0.02], "end_s": [0.009, 0.019, 0.029],
                         "scheduled_seqs": [1, 2, 2], "prefill_tokens": [100, 100, 0], "decode_seqs": [0, 1, 2],
                         "batch": [{0: 100}, {0: 1, 1: 100}, {0: 1, 1: 1}]})
    sim_ = real.assign(batch=[{0: 100}, {0: 1, 2: 100}, {0: 1, 1: 1}])[["scheduled_seqs", "prefill_tokens",
                                                                        "decode_seqs", "batch"]]
    req = pd.DataFrame({"admit_step": [0, 1, 1], "first_step": [0, 1, 1], "finish_step": [2, 2, 2]})
    st, rq = fidelity.compare_schedules(real, sim_, req, req, policy="fifo", arrival_s=[0.0, 0.001, 0.001],
                                        served=[True, True, True])
    assert st["agree_counts"].all()
    assert st["agree"].tolist() == [True, False, True]
    assert st.loc[1, "cls"] == fidelity.SAME_SHAPE


def test_the_race_is_read_from_the_submission_log():
    """A request the real loop submitted a step later than the model could see it races the steps
    in between (and only those); one seen at the same step on both sides, or refused, does not."""
    real_visible = np.array([0, 3, 2, -1])
    sim_visible = np.array([0, 1, 2, 1])
    served = np.array([True, True, True, False])
    assert fidelity.raced(1, real_visible, sim_visible, served).tolist() == [1]
    assert fidelity.raced(2, real_visible, sim_visible, served).tolist() == [1]
    assert fidelity.raced(3, real_visible, sim_visible, served).tolist() == []
    real = pd.DataFrame({"start_s": [0.0, 0.01, 0.02, 0.03], "end_s": [0.009, 0.019, 0.029, 0.039],
                         "scheduled_seqs": [1, 1, 2, 3], "prefill_tokens": [5, 0, 5, 5], "decode_seqs": [0, 1, 1, 2]})
    sim_ = real.assign(prefill_tokens=[5, 5, 5, 5], scheduled_seqs=[1, 2, 2, 3])
    # the log says the race, even where the arrival times alone would not (arrivals all at 0)
    kw = dict(real_visible=real_visible, sim_visible=sim_visible)
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0] * 4, served, **kw) == fidelity.RACE
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0] * 4, served) == fidelity.OTHER
    assert fidelity.classify_episode(3, "fifo", real, sim_, [0.0] * 4, served, **kw) == fidelity.SAME_SHAPE


def test_submitted_arrivals_put_each_request_at_its_submission_step():
    """Each request's replay arrival falls after the start of the step before its submission step
    and by its submission step's start; arrival order is kept and the trace's arrival is kept
    where it is already later (after an idle engine) or the request was never submitted."""
    starts = np.array([0.0, 0.010, 0.020, 0.050])
    arrival = np.array([0.0, 0.005, 0.0095, 0.0099, 0.040, 0.041, 0.060])
    submit = np.array([0, 1, 2, 2, 3, 3, -1])      # 0.0095 and 0.0099 missed step 1
    got = fidelity.submitted_arrivals(arrival, submit, starts)
    assert (np.diff(got) >= 0).all()
    for i, s in enumerate(submit):
        if s >= 1:
            assert starts[s - 1] < got[i] <= starts[s]
    assert got[4] == got[5] == 0.040 and got[6] == 0.060 and got[1] == 0.005
    with pytest.raises(ValueError, match="arrivals"):
        fidelity.replayed_cost_comparison(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), {}, COST, arrivals="x")


def test_case_tags_name_the_same_files():
    assert fidelity.case_tag("vllm_cpu_equal_case") == fidelity.case_tag("vllm_cpu_equal") == fidelity.EQUAL_TAG
    assert fidelity.case_tag(fidelity.GUARDED_TAG) == "vllm_cpu_guarded"


def test_the_rules_the_batches_show_are_named():
    """An episode whose batches differ by a prompt's last one-token chunk (SLAI only) or only by
    requests of equal prompt and arrival is named by the rule; without the prompts it is not."""
    real = pd.DataFrame({"start_s": [0.0, 0.01, 0.02], "end_s": [0.009, 0.019, 0.029],
                         "scheduled_seqs": [1, 1, 1], "prefill_tokens": [512, 512, 512], "decode_seqs": [0, 0, 0],
                         "batch": [{0: 512}, {0: 512}, {1: 512}]})
    sim_ = real.assign(scheduled_seqs=[1, 1, 2], batch=[{0: 512}, {0: 512}, {0: 1, 1: 511}])
    kw = dict(input_tokens=[1025, 600], arrival_s=[0.0, 0.015], served=[True, True])
    assert fidelity.classify_episode(2, "slai_faithful", real, sim_, **kw) == fidelity.LAST_PROMPT_TOKEN
    assert fidelity.classify_episode(2, "fifo", real, sim_, **kw) == fidelity.OTHER
    tie_real = pd.DataFrame({"start_s": [0.0], "end_s": [0.009], "scheduled_seqs": [2], "prefill_tokens": [299],
                             "decode_seqs": [0], "batch": [{10: 218, 9: 81}]})
    tie_sim = tie_real.assign(batch=[{9: 218, 10: 81}])
    prompts = np.zeros(11, dtype=int)
    prompts[[9, 10]] = 218
    kw = dict(arrival_s=np.zeros(11), served=np.ones(11, dtype=bool), real_visible=np.zeros(11, dtype=int),
              sim_visible=np.zeros(11, dtype=int))
    assert fidelity.classify_episode(0, "slai_faithful", tie_real, tie_sim, input_tokens=prompts, **kw) == fidelity.ID_TIE
    assert fidelity.classify_episode(0, "slai_faithful", tie_real, tie_sim, **kw) == fidelity.SAME_SHAPE


def test_the_last_prompt_token_is_inferred_without_the_real_batches():
    """Without the real batches (an older step log), the model's own batch shows the rule: one more
    request, a one-token chunk completing its prompt, the same prefill tokens and decodes."""
    real = pd.DataFrame({"start_s": [0.0, 0.01, 0.02], "end_s": [0.009, 0.019, 0.029],
                         "scheduled_seqs": [1, 1, 1], "prefill_tokens": [512, 512, 512], "decode_seqs": [0, 0, 0]})
    sim_ = real.assign(scheduled_seqs=[1, 1, 2], batch=[{0: 512}, {0: 512}, {0: 1, 1: 511}])
    kw = dict(input_tokens=[1025, 600], arrival_s=[0.0, 0.015], served=[True, True],
              real_visible=[0, 2], sim_visible=[0, 2])
    assert fidelity.classify_episode(2, "slai_faithful", real, sim_, **kw) == fidelity.LAST_PROMPT_TOKEN
    kw["input_tokens"] = [1500, 600]
    assert fidelity.classify_episode(2, "slai_faithful", real, sim_, **kw) == fidelity.OTHER
