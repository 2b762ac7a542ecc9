"""The RQ6 chapter's reading of the study-configuration case: settled or not, the runs still needed,
the host-steady robust reading and the short finding."""

import pandas as pd
import pytest

from portbench import results
from portbench.chapters import rq6


def row(**sources):
    """A per-source interval table: source -> (delta, ci_low, ci_high)."""
    return pd.DataFrame([{"source": s, "delta": d, "ci_low": lo, "ci_high": hi, "half_width": (hi - lo) / 2}
                         for s, (d, lo, hi) in sources.items()]).set_index("source")


def test_a_verdict_is_settled_by_an_interval_off_zero_or_narrow_enough():
    r = row(azure_llm_2024=(-0.03, -0.05, -0.01), burstgpt=(0.0, -0.004, 0.004), bailian_qwen=(0.0, -0.01, 0.01))
    assert [rq6.settled(r.loc[s]) for s in r.index] == ["sign settled", "no difference beyond ±0.005",
                                                         "not settled"]


def test_an_interval_reading_names_each_source_with_its_verdict():
    r = row(azure_llm_2024=(0.0, -0.004, 0.004), bailian_qwen=(-0.005, -0.008, -0.003))
    assert rq6.interval_reading(r, ["azure_llm_2024", "bailian_qwen", "burstgpt"]) == (
        "0.000 on Azure [−0.004, +0.004] (no difference beyond ±0.005) and "
        "−0.005 on Bailian [−0.008, −0.003] (sign settled)")


def test_the_robust_clause_names_only_the_sources_whose_verdict_it_changes():
    real = row(azure_llm_2024=(0.0, -0.01, 0.01), burstgpt=(-0.05, -0.09, -0.01))
    steady = row(azure_llm_2024=(0.0, -0.007, 0.007), burstgpt=(-0.03, -0.07, 0.001))
    clause = rq6.robust_clause(real, steady, ["azure_llm_2024", "burstgpt"])
    assert "BurstGPT is not settled" in clause and "Azure" not in clause
    assert rq6.robust_clause(real, real, ["azure_llm_2024", "burstgpt"]) == ""
    assert rq6.robust_clause(real, None, ["azure_llm_2024"]) == ""


def test_host_steady_runs_leave_out_the_runs_whose_own_steps_ran_slow():
    case = results.Case("vllm_cpu_study_case")
    if not case.has("steps"):
        pytest.skip("no study-configuration case committed")
    runs = rq6.host_steady_runs(case)
    assert len(runs) == len(case.runs) and runs["step_ratio"].notna().all()
    off = runs[runs["speed_off"]]
    assert 0 < len(off) < len(runs) / 4
    # each left-out run is off its own window and policy's median by more than the tolerance
    med = runs.groupby(["window_id", "policy"])["step_ratio"].transform("median")
    assert ((runs["step_ratio"] / med - 1).abs()[runs["speed_off"]] > 0.15).all()
