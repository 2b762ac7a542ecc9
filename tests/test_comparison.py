"""The original study's published table data (data/reference/lssp_table_data) against our pipeline.

Guards the agreement the comparison chapter reports: the study's cross-source τ_b, its reversal classes
and its 36 supported reversals, recomputed from the committed campaign table. Point estimates only (they
do not depend on bootstrap draws), so a few resamples suffice and the test stays fast.
"""

import math

import pandas as pd
import pytest

from portbench import reference as ref
from portbench import stats
from portbench.policies import PRIMARY_PANEL
from portbench.reference import CLASS_NAMES, FILES

#: Floats printed in full by the study agree with ours up to summation order (a few ulps).
ROUNDING = ref.RELATIVE_TOLERANCE


@pytest.fixture(scope="module")
def reference(data_dir):
    return ref.load_published(data_dir / "reference" / "lssp_table_data")


@pytest.fixture(scope="module")
def table(data_dir):
    return pd.read_parquet(data_dir / "results" / "campaign_lssp.parquet")


@pytest.fixture(scope="module")
def reversals(table):
    return stats.reversal_analysis(table, metrics=("anwg",), n_resamples=50, seed=0, policies=PRIMARY_PANEL)


def test_reference_files_are_the_published_json(reference):
    assert [reference[n]["manifest_kind"] for n in FILES] == [
        "rq1_rq2_portability_table", "rq3_reversal_table", "rq4_sample_complexity_table",
        "rq5_temporal_robustness_table"]
    for data in reference.values():
        assert data["primary_metric"] == "arrival_normalized_weighted_goodput"


def test_the_18_cross_source_tau_b_match_the_study(reference, table):
    tau = stats.cross_source_table(table, metrics=("anwg",), n_resamples=10, seed=0, policies=PRIMARY_PANEL)
    tau = tau.set_index(["region", "source_a", "source_b"])
    records = reference["rq1_rq2_portability"]["primary_metric_source_pair_x_region_table"]
    assert len(records) == 18
    for rec in records:
        source_x, region = rec["condition_x"].split("::")
        source_y, _ = rec["condition_y"].split("::")
        row = tau.loc[(region, *sorted((source_x, source_y)))]
        assert math.isclose(row["tau_b"], rec["kendall_tau"], rel_tol=ROUNDING), (region, source_x, source_y)
        assert row["n_policies"] == rec["n_policies_compared"]
        assert (not row["top1_changed"]) == (rec["topk_overlap"]["1"] == 1.0)


def test_reversal_class_counts_match_the_study(reference, reversals):
    pub = reference["rq3_reversals"]
    counts = stats.reversal_counts(reversals)
    assert len(reversals) == pub["primary_metric_n_total_pairwise_records"] == 990
    for cls, n in pub["primary_metric_class_counts"].items():
        assert counts[CLASS_NAMES[cls]] == n, cls
    by_region = stats.reversal_counts(reversals, by="region")
    for region, rec in pub["primary_metric_by_region_class_counts"].items():
        for cls, n in rec.items():
            assert by_region.loc[region, CLASS_NAMES[cls]] == n, (region, cls)


def test_the_36_supported_reversals_are_the_studys(reference, reversals):
    pub = reference["rq3_reversals"]
    records = pub["supported_practical_reversals_primary_metric_sorted_by_effect_size"]
    assert len(records) == pub["n_supported_practical_reversals_primary_metric"] == 36
    ours = reversals[reversals["cls"] == "SUPPORTED_PRACTICAL_REVERSAL"].set_index(
        ["policy_a", "policy_b", "source_x", "source_y", "region"])
    keys = [(r["policy_a"], r["policy_b"], r["condition_x"].split("::")[0], r["condition_y"].split("::")[0],
             r["load_region"]) for r in records]
    assert sorted(keys) == sorted(ours.index)
    for rec, key in zip(records, keys):
        row = ours.loc[key]
        for tag in ("x", "y"):
            assert math.isclose(row[f"delta_{tag}"], rec[f"diff_{tag}"], rel_tol=ROUNDING), key
            assert math.isclose(row[f"margin_{tag}"], rec[f"margin_{tag}"], rel_tol=ROUNDING), key
    # The study's text names slai_faithful vs vllm_faithful only; its records hold other pairs too.
    assert {(r["policy_a"], r["policy_b"]) for r in records} > {("slai_faithful", "vllm_faithful")}


# --- the comparison's own helpers (portbench.reference) -------------------------------------------

def test_match_classes_a_published_value_beside_ours():
    assert ref.match(0.25, 0.25) == ref.EXACT
    assert ref.match(float("nan"), float("nan")) == ref.EXACT
    assert ref.match(0.1 + 0.2, 0.3) == ref.ROUNDING          # the same quantity summed in another order
    assert ref.match(0.3, 0.31) == ref.DIFFERS
    assert ref.match(0.3, None) == ref.NOT_COMPUTED
    assert ref.match(True, True) == ref.EXACT and ref.match(True, False) == ref.DIFFERS
    assert ref.match("STABLE", "STABLE") == ref.EXACT
    import numpy as np
    assert ref.match(3, np.int64(3)) == ref.EXACT               # numpy scalars read as Python numbers


def test_cells_name_the_reason_only_where_two_values_differ():
    cells = ref.Cells()
    cells.add("f", "s", "i", "a", 1.0, 1.0, "bootstrap")
    cells.add("f", "s", "i", "b", 1.0, 2.0, "bootstrap")
    cells.add("f", "s", "i", "c", 1.0, 2.0)
    cells.add("g", "s", "i", "d", 1.0, None, "family")
    frame = cells.frame()
    assert list(frame["why"]) == ["", ref.WHY["bootstrap"], "unexplained", ref.WHY["family"]]
    assert len(cells.frame("f")) == 3
    line, shown = ref.file_view(cells, "f")
    assert line.startswith("`f.json`: 3 published cells") and "1 differs" not in line and "2 differs" in line
    assert "file" not in shown


def test_cells_read_as_the_book_names_them():
    assert ref.fmt(None) == "—" and ref.fmt(True) == "true" and ref.fmt(1234) == "1,234"
    assert ref.fmt(-0.5) == "\u22120.5"
    assert ref.readable("SUPPORTED_PRACTICAL_REVERSAL") == "supported practical reversal"
    assert ref.readable("UNSUPPORTED_SIGN_CHANGE_WIDE_CI count") == "unsupported (wide CI) count"


def test_top_k_breaks_ties_by_the_alphabetically_first_policy():
    means = pd.Series({"c": 0.5, "a": 0.5, "b": 0.9, "d": float("nan")})
    assert ref.top_k(means, 1) == {"b"}
    assert ref.top_k(means, 2) == {"b", "a"}


def test_the_studys_zero_rule_leaves_a_tie_at_zero_stable():
    row = {"policy_a": "p", "policy_b": "q", "source_x": "x", "source_y": "y", "region": "r",
           "mean_a_x": 0.0, "mean_b_x": 0.0, "mean_a_y": 0.2, "mean_b_y": 0.1,
           "delta_x": 0.0, "delta_y": 0.1, "cls": "UNDEFINED"}
    counts = ref.study_zero_rule(pd.DataFrame([row, {**row, "mean_a_x": 0.1, "delta_x": 0.1}]))
    assert counts["STABLE"] == 1 and counts["UNDEFINED"] == 1


def test_the_studys_chronology_splits_from_the_manifest():
    from portbench import store

    manifest = store.list_windows()
    terciles = ref.splits(manifest, "burstgpt", "TERCILE")
    assert sorted(pd.Series(terciles).value_counts()) == [13, 13, 14]
    halves = pd.Series(ref.splits(manifest, "azure_llm_2024", "CALENDAR_BOUNDARY"))
    assert set(halves) <= {"BEFORE_BOUNDARY", "AT_OR_AFTER_BOUNDARY"} and len(halves) == 40
    with pytest.raises(ValueError):
        ref.splits(manifest, "burstgpt", "NO_SUCH_SPLIT")


def test_every_published_cross_source_point_estimate_agrees(reference, table):
    cells = ref.Cells()
    regions = sorted(set(table["region"]))
    ref.compare_portability(cells, reference["rq1_rq2_portability"], table, regions, n_resamples=5, seed=0)
    frame = cells.frame()
    points = frame[~frame["field"].str.contains("_ci")]
    assert len(points) > 150 and set(points["match"]) <= {ref.EXACT, ref.ROUNDING}
    numbers = ref.portability_numbers(cells)
    assert numbers["cmp_rq1_tau_n"] == 18 == numbers["cmp_rq1_tau_exact"] + numbers["cmp_rq1_tau_rounding"]
    totals, summary = ref.summary(cells)
    assert totals["cmp_n_cells"] == len(frame) == summary.loc["all files", "cells"]
    assert totals["cmp_n_unexplained"] == 0


def test_the_stored_statistics_are_reused_for_the_same_table_only(table, tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"rows": [len(small)], "calls": [len(calls)]})

    small = table.head(60)
    first = ref.stored_statistics("probe", small, compute, data_dir=tmp_path, n_resamples=7)
    again = ref.stored_statistics("probe", small.copy(), compute, data_dir=tmp_path, n_resamples=7)
    pd.testing.assert_frame_equal(first, again)
    assert len(calls) == 1
    assert [p.name for p in (tmp_path / "results" / "cache" / "reference").iterdir()] == ["probe.lssp.table.parquet"]
    ref.stored_statistics("probe", small.assign(anwg=small["anwg"] * 0.5), compute, data_dir=tmp_path, n_resamples=7)
    ref.stored_statistics("probe", small, compute, data_dir=tmp_path, n_resamples=8)
    assert len(calls) == 3
