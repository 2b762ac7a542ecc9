"""The original study's published table data (data/reference/lssp_table_data) against our pipeline.

Guards the agreement the comparison chapter reports: the study's cross-source τ_b, its reversal classes
and its 36 supported reversals, recomputed from the committed campaign table. Point estimates only (they
do not depend on bootstrap draws), so a few resamples suffice and the test stays fast.
"""

import json
import math

import pandas as pd
import pytest

from portbench import stats
from portbench.policies import PRIMARY_PANEL

FILES = ("rq1_rq2_portability", "rq3_reversals", "rq4_sample_complexity", "rq5_temporal_robustness")
#: The study's class names → ours.
CLASS_NAMES = {"UNDEFINED_UNESTIMABLE": "UNDEFINED", "STABLE_NO_SIGN_CHANGE": "STABLE",
               "MICROSCOPIC_SIGN_CHANGE": "MICROSCOPIC",
               "UNSUPPORTED_SIGN_CHANGE_WIDE_CI": "UNSUPPORTED_WIDE_CI",
               "SUPPORTED_PRACTICAL_REVERSAL": "SUPPORTED_PRACTICAL_REVERSAL"}
#: Floats printed in full by the study agree with ours up to summation order (a few ulps).
ROUNDING = 1e-12


@pytest.fixture(scope="module")
def reference(data_dir):
    folder = data_dir / "reference" / "lssp_table_data"
    return {name: json.loads((folder / f"{name}.json").read_text()) for name in FILES}


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
