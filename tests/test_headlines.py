"""The chapters' headlines read three ways (portbench.chapters.headlines): on small hand-made tables
whose study counting and robust reading are known."""

import numpy as np
import pandas as pd
import pytest

from portbench.chapters import headlines
from portbench.metrics import METRICS


def table_of(values: dict, *, sources=("azure_llm_2024", "burstgpt"), regions=("KNEE",), windows=4,
             slo=20.0, jitter=None) -> pd.DataFrame:
    """A campaign-shaped table: every metric of policy p in every cell is ``values[p]`` (plus
    ``jitter[p] * k`` in window k, so that a paired interval has a spread)."""
    rows = []
    for s in sources:
        for r in regions:
            for k in range(windows):
                for p, v in values.items():
                    x = v + (jitter or {}).get(p, 0.0) * k
                    rows.append({"source": s, "window_id": f"{s}_w{k}", "region": r, "policy": p,
                                 "slo_multiplier": slo, **{m: x for m in METRICS}})
    return pd.DataFrame(rows)


def test_identical_policies_count_once():
    t = table_of({"a": 0.9, "b": 0.9, "c": 0.5})
    assert headlines.deduplicated(t, ("a", "b", "c")) == ("a", "c")


def test_a_tie_broken_by_name_is_a_top1_change_only_in_the_studys_counting():
    # base SLO: a and b equal; at 40x b is ahead of a by 0.1% of its mean (within the tie tolerance)
    base = table_of({"a": 1.0, "b": 1.0, "c": 0.5}, jitter={"c": 0.01})
    loose = table_of({"a": 0.999, "b": 1.0, "c": 0.5}, slo=40.0, jitter={"c": 0.01})
    r = headlines.rq4(pd.concat([base, loose]), ("a", "b", "c"), ["KNEE"], (40.0,))
    assert (r["changes"], r["changes_robust"], r["n"]) == (2, 0, 2)      # one condition per source
    # a clear change (b drops by 40%) is a change in both readings
    drop = table_of({"a": 0.9, "b": 0.6, "c": 0.5}, slo=40.0, jitter={"c": 0.01})
    base2 = table_of({"a": 0.8, "b": 1.0, "c": 0.5}, jitter={"c": 0.01})
    r = headlines.rq4(pd.concat([base2, drop]), ("a", "b", "c"), ["KNEE"], (40.0,))
    assert (r["changes"], r["changes_robust"]) == (2, 2)


def test_rq1_splits_the_pairs_with_burstgpt_from_the_others():
    sources = ("azure_llm_2024", "bailian_qwen", "burstgpt")
    t = pd.concat([table_of({"a": 0.9, "b": 0.6, "c": 0.3}, sources=sources[:2], jitter={"a": 0.01}),
                   table_of({"a": 0.3, "b": 0.6, "c": 0.9}, sources=sources[2:], jitter={"a": 0.01})])
    r = headlines.rq1(t, ("a", "b", "c"))
    assert r["tau_others_min"] == pytest.approx(1.0) and r["tau_burstgpt_max"] == pytest.approx(-1.0)
    assert headlines.burstgpt_apart(r) and headlines.burstgpt_apart(r, robust_reading=False)


def test_a_missing_table_reads_as_not_computed(tmp_path, monkeypatch):
    from portbench import results

    monkeypatch.setattr(results, "campaign_path", lambda name: tmp_path / f"campaign_{name}.parquet")
    assert headlines.headline_table("lssp", knee="attainable") is None
    readings = headlines.by_engine(headlines.rq1, {"lssp": None}, ("a",))
    assert readings == {"lssp": None}
    assert headlines.value(readings, "lssp", "tau_min") == "not computed"
    assert headlines.value({"lssp": {"x": np.nan}}, "lssp", "x") == "not computed"


def test_rank_summary_gives_each_policys_best_median_and_worst_rank():
    t = pd.concat([table_of({"a": 0.9, "b": 0.6, "c": 0.3}, sources=("azure_llm_2024",)),
                   table_of({"a": 0.3, "b": 0.6, "c": 0.9}, sources=("burstgpt",))])
    s = headlines.rank_summary(t, ("a", "b", "c"))
    assert s.loc["a"].tolist() == [1.0, 2.0, 3.0] and s.loc["b"].tolist() == [2.0, 2.0, 2.0]


def test_claim_cells_read_the_study_rules_and_judge_every_engine():
    readings = {"lssp": {"n": 30, "changes": 13, "changes_robust": 0},
                "vllm_v1": {"n": 30, "changes": 13, "changes_robust": 2}, "other": None}
    of_n = lambda v: f"{v} of 30"                                                   # noqa: E731
    cells = headlines.claim_cells(readings, ("changes", of_n), ("changes_robust", of_n),
                                  lambda r: r["changes_robust"] > 0)
    assert cells == {"claim_study": "13 of 30", "claim_robust": "0 of 30", "holds_lssp": "fails",
                     "holds_vllm_v1": "holds", "holds_other": "not computed"}


def test_a_reading_is_stored_and_read_back_until_its_table_changes(tmp_path):
    calls = []

    def reading(table, policies, *, scale=1):
        calls.append(1)
        return {"n": len(table) * scale, "mean": float(table["anwg"].mean()), "name": policies[0]}

    reading.__name__ = "toy"
    t = table_of({"a": 0.9, "b": 0.5})
    first = headlines.stored_reading(reading, t, ("a", "b"), scale=2, data_dir=tmp_path)
    again = headlines.stored_reading(reading, t, ("a", "b"), scale=2, data_dir=tmp_path)
    assert first == again == {"n": 2 * len(t), "mean": pytest.approx(0.7), "name": "a"} and len(calls) == 1
    assert isinstance(again["n"], int)
    headlines.stored_reading(reading, t.assign(anwg=t["anwg"] / 2), ("a", "b"), scale=2, data_dir=tmp_path)
    headlines.stored_reading(reading, t, ("a", "b"), scale=3, data_dir=tmp_path)
    assert len(calls) == 3                      # another table, other arguments: computed again
