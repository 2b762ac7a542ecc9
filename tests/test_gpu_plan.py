"""The GPU case's plan: its prediction against the committed H200 run, the ``--plan`` command, and the
study configuration end to end on the CPU with a tiny model (plan, tuning with the attention paths,
profile, plan again with the measured cost, guarded case at the planned loads)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from portbench import results, store
from portbench.realengine import gpu_plan

REPO_DATA = Path(__file__).resolve().parent.parent / "data"


def test_plan_predicts_the_committed_h200_run_within_a_quarter():
    # the committed H200 run: one window of the study's configuration, slai_faithful, at its load
    case = results.setup_case("h200_study", REPO_DATA)
    run = case.runs.iloc[0]
    steps = case.steps[case.steps["kept"].astype(bool)]
    measured_wall = float(run["wall_s"])
    # the wall time the run recorded is its last step's end, give or take the final delivery
    assert measured_wall == pytest.approx(steps["start_s"].max() + steps["duration_s"].dropna().iloc[-1], abs=0.1)

    cost, source, cost_case = gpu_plan.load_cost("no_such_setup", REPO_DATA)
    assert source.startswith("h200_study_cost.json") and "H200" in source
    window = store.load_window(run["window_id"], REPO_DATA)
    wall, n_steps = gpu_plan.predict_run(window, run["policy"], cost, float(run["load_factor"]))
    assert abs(wall / measured_wall - 1) <= 0.25, (wall, measured_wall)
    assert abs(n_steps / len(steps) - 1) <= 0.05, (n_steps, len(steps))
    # the guard's probe replay, as that case measured it
    overheads = gpu_plan.measured_overheads(cost_case, cost)
    assert 0.5 < overheads.probe_replay_s < 1.0 and overheads.setup_s > 0


def test_plan_command_prints_the_case_and_refuses_one_over_budget(capsys):
    from portbench.realengine import gpu

    base = ["--config", "study", "--plan", "--tag", "plan_test_nothing_here", "--data-dir", str(REPO_DATA)]
    assert gpu.main(base + ["--windows-per-source", "2"]) == 0
    out = capsys.readouterr().out
    assert "6 windows (2 per source)" in out and "12 guarded runs" in out
    assert "no lambda_ref bisection on the device" in out and "h200_study_cost.json" in out
    assert "fits" in out and out.count("_n25_0") == 6
    for source in ("azure_llm_2024", "burstgpt", "bailian_qwen"):
        assert f"{source}_pilot_v2_w10_n25_0" in out

    assert gpu.main(base + ["--windows-per-source", "2", "--device-minutes", "3"]) == 2
    captured = capsys.readouterr()
    assert "OVER BUDGET" in captured.out
    assert "device-minutes" in captured.err and "against a budget of 180 s" in captured.err

    assert gpu.main(["--config", "policy", "--plan"]) == 2
    assert "for --config study" in capsys.readouterr().err
    with pytest.raises(ValueError, match="window size"):
        gpu.main(base + ["--window-size", "30"])


def test_auto_plan_takes_the_most_windows_that_fit():
    cost, source, case = gpu_plan.load_cost("no_such_setup", REPO_DATA)
    overheads = gpu_plan.Overheads(0.5, 0.1, "test")
    windows = gpu_plan.study_windows(3, 25, sources=("azure_llm_2024", "burstgpt"), data_dir=REPO_DATA)
    kw = dict(cost_source=source, overheads=overheads, fixed_s={"start-up": 10.0}, window_size=25)
    full = gpu_plan.make_plan(windows, cost, budget_s=1e6, n_per_source=3, **kw)
    two = gpu_plan.make_plan(windows, cost, budget_s=1e6, n_per_source=2, **kw)
    auto = gpu_plan.make_plan(windows, cost, budget_s=(two.total_s + full.total_s) / 2, **kw)
    assert auto.n_per_source == 2 and auto.fits and auto.total_s == pytest.approx(two.total_s)
    # every window at 1.5 x its simulated knee, both policies on it; the case takes those as its λ_ref
    refs = full.lambda_refs()
    for pw in full.windows:
        assert pw.load_factor == pytest.approx(1.5 * pw.knee) and set(pw.wall_s) == {"slai_faithful", "vllm_faithful"}
        assert refs[pw.window.window_id]["lambda"] == pw.knee and refs[pw.window.window_id]["from"]
    assert gpu_plan.make_plan(windows, cost, budget_s=1.0, **kw).n_per_source == 1
    with pytest.raises(gpu_plan.PlanError, match="against a budget of 1 s"):
        gpu_plan.make_plan(windows, cost, budget_s=1.0, **kw).check()
    with pytest.raises(gpu_plan.PlanError, match="between 1 and 3"):
        gpu_plan.make_plan(windows, cost, budget_s=1.0, n_per_source=4, **kw)


@pytest.fixture
def tiny_store(make_tiny_store):
    """Short prompts and outputs: a replay takes a fraction of a second whatever load the tiny
    model's noisy profile sets."""
    return make_tiny_store(span_s=0.2, max_input=64, max_output=8)


def test_study_case_end_to_end_on_cpu(tiny_store, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from portbench.realengine import gpu

    committed = results.setup_case("h200_study", REPO_DATA).path("cost")
    assert gpu.main(["--device", "cpu", "--tiny", "--config", "study", "--window-size", "10", "--burst", "6",
                     "--tag", "t", "--startup-s", "0", "--device-minutes", "3", "--reference-probes", "1",
                     "--cost", str(committed), "--data-dir", str(tiny_store)]) == 0
    out = capsys.readouterr().out
    assert "no lambda_ref bisection on the device" in out and "refitted on this engine's profile" in out
    case = results.setup_case("t", tiny_store)
    tuning = case.tuning
    rows = {r["attn_implementation"]: r for r in tuning["tuning"] if r["block_size"] == 32}
    assert set(rows) == set(gpu.ATTENTION)
    assert rows["paged|sdpa"]["accepted"] and rows["paged|eager"]["accepted"]
    assert rows["paged|eager"]["token_agreement"] >= gpu.MIN_TOKEN_AGREEMENT
    assert "flex_attention" in rows["flex_attention"]["error"]        # 5.17's continuous batching refuses it
    assert tuning["best_config"]["attn_implementation"] in ("paged|sdpa", "paged|eager")
    assert case.has("cost", "profile")

    runs = case.runs
    assert set(runs["policy"]) == {"slai_faithful", "vllm_faithful"} and len(runs) == 6
    assert set(runs["source"]) == {"azure_llm_2024", "burstgpt", "bailian_qwen"}
    # the load is the plan's (made again with the cost measured here), not searched on the engine
    planned = {w["window_id"]: w for w in tuning["plan"]["windows"]}
    assert set(runs["window_id"]) == set(planned)
    for _, r in runs.iterrows():
        assert r["lambda_ref_real"] == pytest.approx(planned[r["window_id"]]["knee"])
        assert r["load_factor"] == pytest.approx(planned[r["window_id"]]["load_factor"])
    assert case.calibration is None or len(case.calibration) == 0
    meta = json.loads(case.path("meta").read_text())
    assert all(e["from"].startswith("simulator") for e in meta["lambda_ref_real"].values())
    # every run guarded: a probe before and after, drift recorded, a drifted run flagged
    assert (runs["probe_before_s"] > 0).all() and (runs["probe_after_s"] > 0).all()
    assert runs["host_flagged"].eq(runs["drift"] > 0.15).all()
    assert pd.read_parquet(case.path("requests")).shape[0] == 10 * len(runs)


def test_the_command_line_parser_does_not_load_the_engine_model():
    # the parser imports the GPU script and its plan; the simulator they run compiles with numba,
    # which a process that builds a vLLM engine must not load (tests/test_policy_contract.py)
    import subprocess
    import sys

    code = ("import sys\nimport portbench.cli\nportbench.cli.build_parser()\n"
            "assert 'llvmlite' not in sys.modules and 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
