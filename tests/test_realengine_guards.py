"""The real-engine case's guards, without an engine: fake replay and probe functions.

Host probes and re-runs, repetitions, step logs, resume after a stop, λ_ref bracket widening, the
refusal rule shared by both sides of the sim-vs-real comparison, and the step cost's gap term.
"""

import dataclasses
import types

import numpy as np
import pandas as pd
import pytest

from portbench import fidelity, results, sim, testing
from portbench.engine import StepCost, VllmV1Model
from portbench.engine.stepcost import PS
from portbench.metrics import slo_violation_rate
from portbench.policies import make_policy
from portbench.realengine import probe_window, to_run_result
from portbench.realengine import study
from portbench.workload import make_window, scale

POLICIES = study.CASE_POLICIES


def fake_window(k: int, source: str, n: int = 12) -> object:
    rng = np.random.default_rng(k)
    return make_window(f"{source}_w{k}", source, np.sort(rng.uniform(0, 4.0, n)),
                       rng.integers(8, 200, n), rng.integers(2, 40, n), prediction_seed=k,
                       meta={"paper_lambda_ref": 10.0 + k})


def windows(n_per_source: int = 2):
    return [fake_window(k, s) for k in range(n_per_source) for s in ("azure_llm_2024", "burstgpt")]


class FakeEngine:
    """A deterministic engine: every request violates its SLO when the window is compressed by more
    than ``knee`` (a step function of λ), else finishes early; records every call."""

    def __init__(self, knee: float = 3.0, probe_walls=()):
        self.knee = knee
        self.calls: list[tuple] = []            # (window_id, policy, time_scale) of finished replays
        self.case_runs = 0
        self.probe_walls = list(probe_walls)
        self.n_probes = 0

    def replay(self, window, policy, **kwargs):
        if window.window_id == "host_probe":
            raise AssertionError("the probe goes through probe(), not replay()")
        if policy != "fifo":
            self.case_runs += 1
        late = window.time_scale > self.knee
        finish = np.where(late, window.deadline_s + 1.0, window.arrival_s + 1e-3)
        n = len(window)
        rejected = [i for i in range(n) if window.input_tokens[i] > 190]
        finish = np.where(np.isin(np.arange(n), rejected), np.nan, finish)
        result = to_run_result(window, policy, "fake", admit_s=window.arrival_s,
                               first_token_s=finish - 5e-4, finish_s=finish,
                               duration_s=float(np.nanmax(finish)), n_steps=3)
        self.calls.append((window.window_id, policy, window.time_scale))
        steps = {"start_s": [0.0, 0.01, 0.02], "duration_s": [0.005] * 3, "running": [1, 2, 0],
                 "waiting": [1, 0, 0], "schedule_s": [1e-5] * 3, "prefill_tokens": [64, 0, 0],
                 "decode_seqs": [0, 2, 1], "context_tokens": [0, 66, 34]}
        return result, {"wall_s": 0.03, "steps": steps, "rejected": rejected,
                        "engine_config": {"max_model_len": 4096}}

    def probe(self, policy="fifo", **kwargs):
        self.n_probes += 1
        wall = self.probe_walls.pop(0) if self.probe_walls else 1.0
        return {"wall_s": wall, "mean_step_s": wall / 33, "n_steps": 33}

    def backend(self):
        return types.SimpleNamespace(ENGINE="fake", replay=self.replay, probe=self.probe)


def out_dir(tmp_path):
    return study.realengine_dir(tmp_path)


def run_case(backend, *, progress=False, resume=True, time_budget_s=None, **config):
    """:func:`study.run_case` on ``CaseConfig(backend, **config)``, without a progress bar."""
    return study.run_case(study.CaseConfig(backend, **config), progress=progress, resume=resume,
                          time_budget_s=time_budget_s)


# --- 1. host guard, repetitions, step logs -----------------------------------------------------

def test_guard_reruns_a_run_whose_probe_drifted_and_flags_one_that_never_settles(tmp_path):
    walls = [1.0] * 6                                  # reference: 3 probes per policy
    walls += [1.0, 1.5, 1.0, 1.02]                     # run 1: drifted after, re-run within 15%
    walls += [2.0, 2.0, 1.6, 1.6, 1.3, 1.3]            # run 2: every attempt drifted (least: the third)
    engine = FakeEngine(probe_walls=walls)
    ws = windows(1)
    runs = run_case(engine.backend(), windows=ws, tag="g", data_dir=tmp_path, progress=False,
                          speed_ratio=0.1, bisection_steps=2)
    assert len(runs) == len(ws) * len(POLICIES) * 2
    assert set(study.GUARD_COLUMNS) <= set(runs.columns)
    assert (runs.groupby(["window_id", "policy"])["repetition"].apply(sorted)
            .map(lambda r: r == [0, 1])).all()
    first, second = runs.iloc[0], runs.iloc[1]
    assert (first["attempt"], first["n_attempts"], bool(first["host_flagged"])) == (1, 2, False)
    assert first["probe_ref_s"] == 1.0 and first["probe_after_s"] == 1.02
    assert first["drift"] == pytest.approx(0.02)
    assert (second["attempt"], second["n_attempts"], bool(second["host_flagged"])) == (2, 3, True)
    assert second["drift"] == pytest.approx(0.3)
    assert not runs.iloc[2:]["host_flagged"].any() and (runs.iloc[2:]["attempt"] == 0).all()

    out = out_dir(tmp_path)
    attempts = pd.read_parquet(out / "g_attempts.parquet")
    assert len(attempts) == len(runs) + 1 + 2
    assert attempts["kept"].sum() == len(runs)
    assert list(attempts["accepted"][:5]) == [False, True, False, False, False]
    steps = pd.read_parquet(out / "g_steps.parquet")
    assert {"window_id", "policy", "repetition", "attempt", "kept", "start_s", "duration_s", "running",
            "waiting", "prefill_tokens", "decode_seqs", "context_tokens", "schedule_s"} <= set(steps.columns)
    assert len(steps) == 3 * len(attempts)
    requests = pd.read_parquet(out / "g_requests.parquet")
    assert len(requests) == sum(len(w) for w in ws) * len(POLICIES) * 2
    assert {"repetition", "attempt", "refused"} <= set(requests.columns)
    assert (requests["refused"] == (requests["input_tokens"] > 190)).all()
    assert (runs["max_model_len"] == 4096).all()


def test_a_noisy_reference_is_measured_again(tmp_path):
    walls = [1.0, 2.0, 1.0, 1.0, 1.0, 1.05]            # slai: a noisy round, then a consistent one
    walls += [3.0, 1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 3.0]   # vllm_faithful: never consistent
    engine = FakeEngine(probe_walls=walls)
    run_case(engine.backend(), windows=windows(1)[:1], tag="n", data_dir=tmp_path, progress=False,
                   repetitions=1)
    import json
    ref = json.loads((out_dir(tmp_path) / "n.json").read_text())["probe_reference"]
    assert ref["slai_faithful"]["rounds"] == 2 and ref["slai_faithful"]["wall_s"] == 1.0
    assert ref["slai_faithful"]["spread"] == pytest.approx(0.05)
    assert ref["vllm_faithful"]["rounds"] == 3 and ref["vllm_faithful"]["spread"] == pytest.approx(2.0)
    assert ref["vllm_faithful"]["wall_s"] == 1.0


@pytest.mark.parametrize("now", [0.5, 2.0])
def test_a_case_resumed_on_a_host_of_another_speed_keeps_its_reference(tmp_path, now):
    """Resumed on a host twice as fast (another machine: the case's λ_ref would be a lighter load
    there) or twice as slow, the case keeps the reference of its start, so the new runs drift, are
    re-run, and are flagged."""
    kw = dict(windows=windows(1), tag="h", data_dir=tmp_path, progress=False, speed_ratio=0.1,
              bisection_steps=2)
    first = run_case(FakeEngine().backend(), repetitions=1, **kw)
    assert not first["host_flagged"].any()
    runs = run_case(FakeEngine(probe_walls=[now] * 200).backend(), repetitions=2, **kw)
    new = runs[runs["repetition"] == 1]
    assert len(new) == len(first) and new["host_flagged"].all() and (new["n_attempts"] == 3).all()
    assert (new["probe_ref_s"] == 1.0).all()
    import json
    ref = json.loads((out_dir(tmp_path) / "h.json").read_text())["probe_reference"]
    assert all(r["kept_earlier"] and r["wall_s"] == 1.0 for r in ref.values())


def test_scheduler_time_by_queue_length():
    steps = pd.DataFrame({"policy": ["a"] * 4 + ["b"] * 3, "waiting_before": [0, 0, 5, 40, 1, 200, 900],
                          "schedule_s": [1e-4, 3e-4, 2e-4, 1e-3, 5e-5, 2e-3, np.nan]})
    t = study.scheduler_time(steps)
    assert list(zip(t["policy"], t["queue_bin"].astype(str), t["steps"])) == [
        ("a", "0", 2), ("a", "1-7", 1), ("a", "32-127", 1), ("b", "1-7", 1), ("b", "128-511", 1)]
    assert t["median_ms"].iloc[0] == pytest.approx(0.2)


def test_probe_window_is_the_fixed_batch():
    w = probe_window()
    assert len(w) == 8 and (w.arrival_s == 0).all()
    assert (w.input_tokens == 64).all() and (w.output_tokens == 32).all()


# --- 3. resume ---------------------------------------------------------------------------------

IDENTITY = ["source", "window_id", "policy", "repetition", "region", "lambda_ref_real", "load_factor",
            "lambda_pinned", "anwg", "completion_fraction"]


@pytest.mark.parametrize("stop_after", [1, 4, 7])
def test_a_stopped_case_resumes_without_repeating_a_run(tmp_path, stop_after):
    """Stop the case by raising inside the (monkeypatched) replay after ``stop_after`` runs, restart
    it with the same tag: no run or λ_ref search is repeated or lost, and the table equals an
    uninterrupted one."""
    ws = windows(2)
    kw = dict(windows=ws, tag="r", progress=False, speed_ratio=0.1, bisection_steps=2)
    uninterrupted = FakeEngine()
    full = run_case(uninterrupted.backend(), data_dir=tmp_path / "full", **kw)

    engine = FakeEngine()
    backend = engine.backend()
    healthy = backend.replay

    def stopping(window, policy, **kwargs):
        if policy != "fifo" and engine.case_runs >= stop_after:
            raise KeyboardInterrupt("stopped")
        return healthy(window, policy, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend, "replay", stopping)
        with pytest.raises(KeyboardInterrupt):
            run_case(backend, data_dir=tmp_path / "cut", **kw)
    cut = out_dir(tmp_path / "cut")
    assert len(pd.read_parquet(cut / "r_runs.parquet")) == stop_after      # written after every run
    calls_before = list(engine.calls)
    resumed = run_case(backend, data_dir=tmp_path / "cut", **kw)
    calls_after = engine.calls[len(calls_before):]

    case = lambda calls: [c for c in calls if c[1] != "fifo"]  # noqa: E731
    search = lambda calls: [c for c in calls if c[1] == "fifo"]  # noqa: E731
    assert len(case(calls_before)) == stop_after
    assert len(case(calls_before)) + len(case(calls_after)) == len(full) == len(case(uninterrupted.calls))
    assert len(search(calls_before)) + len(search(calls_after)) == len(search(uninterrupted.calls))
    assert not {c[0] for c in search(calls_before)} & {c[0] for c in search(calls_after)}
    pd.testing.assert_frame_equal(resumed[IDENTITY].reset_index(drop=True),
                                  full[IDENTITY].reset_index(drop=True))
    on_disk = pd.read_parquet(cut / "r_runs.parquet")
    assert not on_disk.duplicated(list(study.RUN_KEY)).any() and len(on_disk) == len(full)
    requests = pd.read_parquet(cut / "r_requests.parquet")
    assert not requests.duplicated(["window_id", "policy", "repetition", "request_index"]).any()
    assert len(requests) == len(pd.read_parquet(out_dir(tmp_path / "full") / "r_requests.parquet"))


@pytest.mark.parametrize("lost", ["runs", "requests"])
def test_a_case_stopped_between_two_of_its_files_resumes_whole(tmp_path, lost):
    """A stop while a run's tables are being written: the runs table written last is lost (its
    requests, steps and attempts are on disk), or, as a case written before the runs table came last
    could be left, the run is in the runs table and its requests are not. Resumed, that run is run
    again once, and every table equals an uninterrupted case's."""
    ws = windows(2)
    kw = dict(windows=ws, tag="r", progress=False, speed_ratio=0.1, bisection_steps=2)
    run_case(FakeEngine().backend(), data_dir=tmp_path / "full", **kw)
    full = out_dir(tmp_path / "full")
    engine = FakeEngine()
    real_write = results._write

    def n_runs(value):
        return len(value[list(study.RUN_KEY)].drop_duplicates()) if len(value) else 0

    def stopping(path, value):                     # the writes of the third run, as the stop leaves them
        if path.name == "r_runs.parquet" and len(value) == 3:
            if lost == "requests":
                real_write(path, value)
            raise KeyboardInterrupt("stopped")
        if lost == "requests" and path.name == "r_requests.parquet" and n_runs(value) == 3:
            return
        real_write(path, value)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(results, "_write", stopping)
        with pytest.raises(KeyboardInterrupt):
            run_case(engine.backend(), data_dir=tmp_path / "cut", **kw)
    cut = out_dir(tmp_path / "cut")
    n_runs = len(pd.read_parquet(cut / "r_runs.parquet"))
    n_req = pd.read_parquet(cut / "r_requests.parquet")[list(study.RUN_KEY)].drop_duplicates().shape[0]
    assert (n_runs, n_req) == ((2, 3) if lost == "runs" else (3, 2))
    resumed = run_case(engine.backend(), data_dir=tmp_path / "cut", **kw)
    runs_full = pd.read_parquet(full / "r_runs.parquet")
    pd.testing.assert_frame_equal(resumed[IDENTITY].reset_index(drop=True), runs_full[IDENTITY])
    for part, key in (("runs", list(study.RUN_KEY)), ("requests", [*study.RUN_KEY, "request_index"]),
                      ("attempts", [*study.RUN_KEY, "attempt"])):
        a, b = pd.read_parquet(cut / f"r_{part}.parquet"), pd.read_parquet(full / f"r_{part}.parquet")
        assert not a.duplicated(key).any(), part
        assert a[key].sort_values(key).reset_index(drop=True).equals(b[key].sort_values(key).reset_index(drop=True)), part


def test_a_stopped_case_has_every_window_at_about_the_same_repetitions(tmp_path):
    """The plan goes repetition by repetition, so a case stopped part-way (here by its time budget,
    after the first run) is balanced; a resumed session that adds repetitions to one source keeps
    every source and the most repetitions in the case's settings."""
    ws = windows(2)
    engine = FakeEngine()
    kw = dict(windows=ws, tag="b", progress=False, speed_ratio=0.1, bisection_steps=2, data_dir=tmp_path)
    runs = run_case(engine.backend(), repetitions=3, **kw)
    order = [(r.repetition, r.window_id) for r in runs.itertuples() if r.policy == runs["policy"].iloc[0]]
    assert order == sorted(order, key=lambda x: x[0]) and len({w for _, w in order[:2]}) == 2
    merged = study._merged_settings({"sources": ["a", "b"], "repetitions": 3},
                                    {"sources": ["b"], "repetitions": 5, "region": "x"})
    assert merged == {"sources": ["a", "b"], "repetitions": 5, "region": "x"}
    assert study._merged_settings({}, {"sources": ["b"], "repetitions": 2}) == {"sources": ["b"], "repetitions": 2}


def test_a_finished_case_runs_nothing_on_restart(tmp_path):
    ws = windows(1)
    kw = dict(windows=ws, tag="done", data_dir=tmp_path, progress=False, speed_ratio=0.1)
    first = run_case(FakeEngine().backend(), **kw)
    engine = FakeEngine()
    again = run_case(engine.backend(), **kw)
    assert engine.calls == [] and engine.n_probes == 0
    pd.testing.assert_frame_equal(first[IDENTITY], again[IDENTITY])


def test_a_case_reuses_lambda_refs_searched_by_another_case(tmp_path):
    import json
    ws = windows(1)
    run_case(FakeEngine().backend(), windows=ws, tag="a", data_dir=tmp_path, progress=False,
                   speed_ratio=0.1, repetitions=1)
    searched = json.loads((out_dir(tmp_path) / "a.json").read_text())["lambda_ref_real"]
    shared = {wid: {**e, "from": "a"} for wid, e in searched.items() if wid == ws[0].window_id}
    engine = FakeEngine()
    runs = run_case(engine.backend(), windows=ws, tag="b", data_dir=tmp_path, progress=False,
                          speed_ratio=0.1, repetitions=1, lambda_refs=shared)
    searched_here = {c[0] for c in engine.calls if c[1] == "fifo"}
    assert searched_here == {w.window_id for w in ws[1:]}          # only the window not shared
    stored = json.loads((out_dir(tmp_path) / "b.json").read_text())["lambda_ref_real"]
    assert stored[ws[0].window_id] == shared[ws[0].window_id]
    assert (runs.set_index("window_id")["lambda_ref_real"].groupby(level=0).first()
            == pd.Series({wid: e["lambda"] for wid, e in searched.items()})).all()
    with pytest.raises(ValueError, match="lambda_refs.*'from'"):
        run_case(FakeEngine().backend(), windows=ws, tag="c", data_dir=tmp_path, progress=False,
                       lambda_refs={ws[0].window_id: {"lambda": 2.0}})


def test_resume_refuses_an_unguarded_or_different_case(tmp_path):
    out = out_dir(tmp_path)
    out.mkdir(parents=True)
    (out / "old.json").write_text('{"backend": "vllm", "case": {"policies": ["a"]}}')
    with pytest.raises(ValueError, match="before the guarded case"):
        run_case(FakeEngine().backend(), windows=windows(1), tag="old", data_dir=tmp_path,
                       progress=False)
    run_case(FakeEngine().backend(), windows=windows(1), tag="x", data_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="different case"):
        run_case(FakeEngine().backend(), windows=windows(1), tag="x", data_dir=tmp_path,
                       progress=False, region="LOW")


# --- 5. λ_ref search that widens its bracket ---------------------------------------------------

def step_replay(knee):
    """Violation rate 1 above λ = knee, 0 at or below it; counts replays per λ."""
    seen = []

    def replay(window, policy, **kwargs):
        seen.append(window.time_scale)
        late = window.time_scale > knee
        finish = window.deadline_s + (1.0 if late else -1e-6)
        return to_run_result(window, policy, "fake", admit_s=window.arrival_s,
                             first_token_s=window.arrival_s, finish_s=finish, duration_s=1.0), {}
    return replay, seen


@pytest.mark.parametrize("knee, pinned, widenings", [
    (3.0, False, 0),           # inside [1, 8]
    (0.2, False, 1),           # one bracket below
    (0.02, False, 2),
    (30.0, False, 1),          # above
    (1e-5, True, 3),           # still below after 3 widenings
    (1e5, True, 3),
])
def test_lambda_search_widens_until_the_knee_is_inside(knee, pinned, widenings):
    w = fake_window(0, "azure_llm_2024", n=20)
    replay, seen = step_replay(knee)
    lam, probes, is_pinned = study.find_real_lambda_ref(w, replay, lo=1.0, hi=8.0, steps=8,
                                                        bracket_factor=8.0, max_widenings=3)
    assert is_pinned == pinned
    assert len(seen) == len(set(seen)) == len(probes)       # no λ replayed twice
    assert all(p["widenings"] == widenings and p["pinned"] == pinned for p in probes)
    for p in probes:
        assert (p["violation_rate"] == 1.0) == (p["lambda"] > knee)
        assert p["violation_rate"] == slo_violation_rate(replay(scale(w, p["lambda"]), "fifo")[0])
    if pinned:
        assert lam == (8.0 ** -3 if knee < 1 else 8.0 * 8.0 ** 3)
        assert probes[-1]["pinned_side"] == ("low" if knee < 1 else "high")
        assert len(probes) == (1 + 3 if knee < 1 else 2 + 3)
    else:
        # 8 halvings of a factor-8 bracket in log λ: within 8 ** (1 / 256) of the knee
        assert abs(np.log(lam / knee)) <= np.log(8.0) / 2 ** 8 + 1e-12


def test_case_records_a_pinned_window(tmp_path):
    engine = FakeEngine(knee=1e-9)
    runs = run_case(engine.backend(), windows=windows(1), tag="p", data_dir=tmp_path, progress=False,
                          guard=False, repetitions=1, max_widenings=2)
    assert runs["lambda_pinned"].all()
    cal = pd.read_parquet(out_dir(tmp_path) / "p_calibration.parquet")
    assert cal["pinned"].all() and set(cal["pinned_side"]) == {"low"}
    assert cal.groupby("window_id").size().eq(3).all()


# --- 4. the same refusal rule on both sides ----------------------------------------------------

FAITHFUL_MODEL = VllmV1Model(max_num_batched_tokens=2560, max_active_sequences=256, max_kv_tokens=500_000)


def refusal_window():
    """Prompts that fit the 2,560-token budget but whose output runs past it (index 1, 4), one that
    does not fit at all (2), and short ones."""
    inputs = [64, 2500, 3000, 32, 2400, 100]
    outputs = [8, 100, 4, 8, 200, 8]
    return make_window("refuse", "azure_llm_2024", [0.0, 0.0, 0.01, 0.02, 0.03, 0.04], inputs, outputs,
                       outputs)


def test_simulated_counterpart_refuses_what_the_real_engine_refuses():
    w = scale(refusal_window(), 1.0)
    real = fidelity.real_refused(w, 2560)
    assert real.tolist() == [False, True, True, False, True, False]
    result, refused = fidelity.simulate_counterpart(w, "vllm_faithful", StepCost())
    np.testing.assert_array_equal(refused, real)
    np.testing.assert_array_equal(np.isnan(result.finish_s), real)
    np.testing.assert_array_equal(np.isnan(result.first_token_s), real)
    # the study's oversize="reject" rule (prompt > budget) differs on this window: it serves 1 and 4
    old = sim.simulate(w, make_policy("vllm_faithful", oversize="reject"),
                       FAITHFUL_MODEL)
    assert np.isnan(old.finish_s).tolist() == [False, False, True, False, False, False]
    # the served requests are simulated as in a window without the refused ones
    keep = ~real
    alone = make_window("refuse", "azure_llm_2024", w.arrival_s[keep], w.input_tokens[keep],
                        w.output_tokens[keep], w.predicted_output_tokens[keep])
    ref = sim.simulate(alone, make_policy("vllm_faithful", oversize="reject"),
                       FAITHFUL_MODEL)
    np.testing.assert_array_equal(result.finish_s[keep], ref.finish_s)
    # slai_faithful's real engine has max_model_len = the model's positions: nothing refused here
    _, none = fidelity.simulate_counterpart(w, "slai_faithful", StepCost())
    assert not none.any()
    _, some = fidelity.simulate_counterpart(w, "slai_faithful", StepCost(), max_model_len=2560)
    np.testing.assert_array_equal(some, real)
    # the study's own policy is untouched
    assert make_policy("vllm_faithful").oversize == "block"


def test_sim_vs_real_reports_the_same_refusals_on_both_sides():
    w = refusal_window()
    rows, reqs = [], []
    for rep in (0, 1):
        real = fidelity.real_refused(w, 2560)
        finish = np.where(real, np.nan, w.arrival_s + 0.5)
        rows.append({"source": w.source, "window_id": w.window_id, "policy": "vllm_faithful",
                     "repetition": rep, "load_factor": 1.0, "anwg": 0.5, "max_model_len": 2560.0,
                     "host_flagged": rep == 1})
        reqs.append(pd.DataFrame({"window_id": w.window_id, "policy": "vllm_faithful", "repetition": rep,
                                  "request_index": np.arange(len(w)), "arrival_s": w.arrival_s,
                                  "first_token_s": finish - 0.1, "finish_s": finish, "refused": real}))
    req, run_frame, summary = fidelity.sim_vs_real(pd.DataFrame(rows), pd.concat(reqs), {w.window_id: w},
                                                   StepCost())
    assert len(run_frame) == 2 and list(run_frame["repetition"]) == [0, 1]
    assert summary["n_refused_mismatch"] == 0 and summary["n_refused_sim"] == 2 * 3
    assert (req["refused_sim"] == req["refused_real"]).all()
    assert req.loc[req["refused_sim"], "latency_error_s"].isna().all()
    _, only, _ = fidelity.sim_vs_real(pd.DataFrame(rows), pd.concat(reqs), {w.window_id: w}, StepCost(),
                                      exclude_host_flagged=True)
    assert list(only["repetition"]) == [0]


def test_rq7_counterparts_run_vllms_default_settings_and_report_preemptions():
    """RQ7's vLLM case: FCFS, SJF with aging and priority on vLLM's defaults (2,048-token budget,
    chunked prefill, 256 sequences); the counterpart is that engine model running that policy."""
    w = scale(fake_window(5, "azure_llm_2024", n=30), 4.0)
    for policy in ("fifo", "sjf_aging", "vllm_v1_priority"):
        result, refused = fidelity.simulate_counterpart(w, policy, StepCost())
        direct = sim.simulate(w, make_policy(policy), VllmV1Model(max_num_batched_tokens=2048,
                                                                  max_active_sequences=256,
                                                                  max_kv_tokens=500_000, cost=StepCost()))
        np.testing.assert_array_equal(result.finish_s, direct.finish_s)
        assert not refused.any()
    rows = [{"source": w.source, "window_id": w.window_id, "policy": p, "repetition": 0,
             "load_factor": 4.0, "anwg": 0.5} for p in ("fifo", "vllm_v1_priority")]
    reqs = pd.concat([pd.DataFrame({"window_id": w.window_id, "policy": p, "repetition": 0,
                                    "request_index": np.arange(len(w)), "arrival_s": w.arrival_s,
                                    "first_token_s": w.arrival_s + 0.1, "finish_s": w.arrival_s + 0.2})
                      for p in ("fifo", "vllm_v1_priority")])
    unscaled = {w.window_id: fake_window(5, "azure_llm_2024", n=30)}
    _, per_run, _ = fidelity.sim_vs_real(pd.DataFrame(rows), reqs, unscaled, StepCost())
    assert list(per_run["policy"]) == ["fifo", "vllm_v1_priority"]
    assert (per_run["preemptions_sim"] >= 0).all() and per_run["preemptions_sim"].dtype.kind == "i"


# --- 6. the step cost's gap ----------------------------------------------------------------------

def test_default_step_cost_has_no_gap_and_gap_adds_to_every_step():
    assert StepCost().gap_s == 0.0 and StepCost().picoseconds()[4] == 0
    w = scale(fake_window(3, "azure_llm_2024", n=24), 3.0)
    gap = StepCost(fixed_s=1e-3, per_prefill_token_s=2e-6, per_decode_seq_s=5e-6, gap_s=2.5e-4)
    folded = dataclasses.replace(gap, fixed_s=1.25e-3, gap_s=0.0)
    assert gap.picoseconds()[0] + gap.picoseconds()[4] == folded.picoseconds()[0]
    for policy in ("fifo", "slai_faithful", "vllm_faithful"):
        a = sim.simulate(w, make_policy(policy), VllmV1Model(cost=gap))
        b = sim.simulate(w, make_policy(policy), VllmV1Model(cost=folded))
        for field in ("admit_s", "first_token_s", "finish_s"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert (a.n_steps, a.duration_s) == (b.n_steps, b.duration_s)
        slow = sim.simulate(w, make_policy(policy), VllmV1Model(cost=dataclasses.replace(gap, gap_s=0.0)))
        assert np.nanmax(a.finish_s) > np.nanmax(slow.finish_s)
    assert VllmV1Model(cost=gap).longest_quiet_step_s == pytest.approx(
        VllmV1Model(cost=folded).longest_quiet_step_s)


def test_fit_takes_the_median_gap_and_reports_error_by_range():
    rng = np.random.default_rng(0)
    n = 400
    p = rng.choice([0, 16, 256, 1024, 2560], n)
    d = rng.choice([0, 1, 8, 64, 128], n)
    d[(p == 0) & (d == 0)] = 1
    c = d * rng.integers(16, 2400, n)
    true = StepCost(fixed_s=2e-3, per_prefill_token_s=8e-6, per_decode_seq_s=3e-5, per_context_token_s=1e-8)
    step = (true.fixed_s + true.per_prefill_token_s * p + true.per_decode_seq_s * d
            + true.per_context_token_s * c)
    profile = pd.DataFrame({"prefill_tokens": p, "decode_seqs": d, "kv_context_tokens": c,
                            "step_s": step * rng.uniform(0.97, 1.03, n),
                            "gap_s": np.where(rng.random(n) < 0.1, np.nan, rng.uniform(1e-4, 3e-4, n))})
    cost, err = StepCost.fit(profile)
    assert cost.gap_s == pytest.approx(np.nanmedian(profile["gap_s"]))
    assert cost.fixed_s == pytest.approx(2e-3, rel=0.1) and err < 0.03
    cost2, err2, table = StepCost.fit(profile, by_range=True)
    assert (cost2, err2) == (cost, err)
    assert {"prefill_bin", "decode_bin", "n", "median_rel_error", "median_step_s"} <= set(table.columns)
    assert table["n"].sum() == n and (table["median_rel_error"] < 0.05).all()
    assert {">=2561", "1025-2560"} & set(table["prefill_bin"]) == {"1025-2560"}
    assert StepCost.fit(profile.drop(columns="gap_s"))[0].gap_s == 0.0


@pytest.mark.parametrize("policy", ["fifo", "slai_faithful"])
def test_check_policy_with_a_gap_in_the_step_cost(policy, monkeypatch):
    """The engine's closed-form stretches (``_span_ps``) and the longest quiet step include the gap:
    the fast path still equals the step-by-step walk with a nonzero gap."""
    from hypothesis import strategies as st

    original = testing.random_cases

    def with_gap(engine_model):
        cases = original(engine_model)
        gaps = st.sampled_from([3e-4, 1.7e-3, 5e-3])
        return st.tuples(cases, gaps).map(lambda cg: (cg[0][0], dataclasses.replace(
            cg[0][1], cost=dataclasses.replace(cg[0][1].cost, gap_s=cg[1]))))

    monkeypatch.setattr(testing, "random_cases", with_gap)
    testing.check_policy(type(make_policy(policy)), engine_models=("vllm_v1",), max_examples=40)


def test_gap_in_span_matches_step_sum():
    m = VllmV1Model(cost=StepCost(fixed_s=1e-3, per_decode_seq_s=2e-6, per_context_token_s=1e-8, gap_s=4e-4))
    w = fake_window(1, "x", n=4)
    eng = m.make_engine(w, make_policy("fifo"))
    c0, _, cd, cc, cg = m.cost.picoseconds()
    D, C0, k = 5, 1000, 7
    assert eng._span_ps(k, D, C0) == sum(c0 + cg + cd * D + cc * (C0 + D * j) for j in range(k))
    assert m.longest_quiet_step_s == pytest.approx(
        (c0 + cg + cd * m.max_active_sequences + cc * m.max_kv_tokens) / PS + 1e-9)


def test_a_probe_warms_up_then_reports_the_median_replay():
    from portbench import realengine
    walls = iter([9.0, 1.3, 1.0, 5.0])                 # a cold warm-up, then three timed replays
    figures = realengine.steady_probe(lambda: {"wall_s": next(walls), "n_steps": 2, "busy_s": 0.5})
    assert realengine.PROBE_WARMUP == 1 and realengine.PROBE_REPEATS == 3
    assert figures["wall_s"] == 1.3 and figures["walls_s"] == [1.0, 1.3, 5.0]
    assert figures["mean_step_s"] == 0.25 and figures["n_steps"] == 2


def test_step_ratio_is_the_median_real_over_modelled_step_of_the_kept_attempt():
    cost = StepCost(fixed_s=1e-3, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4)
    steps = pd.DataFrame({"window_id": "w", "policy": "fifo", "repetition": 0,
                          "kept": [True, True, True, False],
                          "prefill_tokens": [100, 0, 0, 0], "decode_seqs": [0, 10, 10, 10],
                          "context_tokens": [0, 0, 0, 0],
                          "duration_s": [2e-3, 4e-3, 2e-3, 1.0]})   # ratios 1, 2, 1 (the 4th not kept)
    out = fidelity.step_ratios(steps, cost)
    assert out.to_dict("records") == [{"window_id": "w", "policy": "fifo", "repetition": 0,
                                       "step_ratio": pytest.approx(1.0)}]


def test_lambda_refs_are_reused_only_from_a_case_searched_the_same_way(tmp_path, capsys):
    entry = {"lambda": 2.5, "pinned": False, "pinned_side": None, "probes": []}
    meta = {"backend": "vllm", "case": {"bracket_factor": 8.0, "bisection_steps": 3},
            "lambda_ref_real": {"w1": entry, "w2": {**entry, "from": "older"}, "w3": entry}}
    other = results.Case("other_case", tmp_path)
    other.write(meta=meta)
    got = study.reusable_lambda_refs(other, ["w1", "w2"], backend="vllm", bracket_factor=8.0,
                                     bisection_steps=3, lambda_policy="fifo")
    # only this case's windows, each marked with the case it was found in (FIFO by default)
    assert got == {"w1": {**entry, "from": "other_case"}, "w2": {**entry, "from": "older"}}
    assert study.reusable_lambda_refs(other, ["w1"], backend="vllm", bisection_steps=5) == {}
    assert "bisection_steps" in capsys.readouterr().out
    assert study.reusable_lambda_refs(other, ["w1"], lambda_policy="vllm_faithful") == {}
    assert study.reusable_lambda_refs(results.Case("none", tmp_path), ["w1"], backend="vllm") == {}
    assert "no none.json" in capsys.readouterr().out
