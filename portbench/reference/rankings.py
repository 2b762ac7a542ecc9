"""The study's cross-source (``rq1_rq2_portability``) and pairwise-reversal (``rq3_reversals``) files
beside ours: :func:`compare_portability` and :func:`compare_reversals` add every published cell to a
:class:`~portbench.reference.cells.Cells` collection; the ``*_numbers`` functions count what agrees,
under the names the comparison chapter glues them.
"""

from __future__ import annotations

import types

import numpy as np
import pandas as pd

from .. import stats
from ..metrics import METRICS
from ..policies import PRIMARY_PANEL
from .cells import (CLASS_NAMES, EXACT, METRIC_NAMES, ROUNDING, WHY, Cells, agreeing, max_abs_diff, short, spearman,
    stored_statistics, topk_overlap)


# --- rq1_rq2_portability: cross-source agreement -------------------------------------------------

def compare_portability(cells: Cells, pub: dict, table: pd.DataFrame, regions, *, n_resamples: int,
                        seed: int) -> pd.DataFrame:
    """The cross-source file's cells (τ_b with its interval, ρ, top-k overlaps, counts; τ_b per
    metric and per region). Returns our ANWG τ_b table indexed by (region, source_a, source_b)."""
    file = "rq1_rq2_portability"
    tau_all = stored_statistics("cross_source_table", table, lambda: stats.cross_source_table(
        table, metrics=tuple(METRICS), regions=list(regions), n_resamples=n_resamples, seed=seed,
        policies=PRIMARY_PANEL), regions=list(regions), n_resamples=n_resamples, seed=seed)
    cm = stats.condition_means(table, "anwg", policies=PRIMARY_PANEL)
    tau = tau_all[tau_all["metric"] == "anwg"].set_index(["region", "source_a", "source_b"]).sort_index()
    section = "per source pair × region (ANWG)"
    for rec in pub["primary_metric_source_pair_x_region_table"]:
        sx, region = rec["condition_x"].split("::")
        sy, _ = rec["condition_y"].split("::")
        row = tau.loc[(region, *sorted((sx, sy)))]
        item = f"{short(sx)}–{short(sy)} {region}"
        mx, my = cm.means[(sx, region)], cm.means[(sy, region)]
        rho, _ = spearman(mx, my)
        cells.add(file, section, item, "kendall_tau", rec["kendall_tau"], row["tau_b"])
        cells.add(file, section, item, "kendall_tau_ci low", rec["kendall_tau_ci"][0], row["ci_low"], "bootstrap")
        cells.add(file, section, item, "kendall_tau_ci high", rec["kendall_tau_ci"][1], row["ci_high"], "bootstrap")
        cells.add(file, section, item, "spearman_rho", rec["spearman_rho"], rho)
        cells.add(file, section, item, "spearman_rho_ci low", rec["spearman_rho_ci"][0], None, "spearman ci")
        cells.add(file, section, item, "spearman_rho_ci high", rec["spearman_rho_ci"][1], None, "spearman ci")
        for k, value in rec["topk_overlap"].items():
            cells.add(file, section, item, f"topk_overlap {int(k)}", value,
                      topk_overlap(row, mx, my, int(k), int(row["n_policies"])))
        cells.add(file, section, item, "n_policies_compared", rec["n_policies_compared"], int(row["n_policies"]))
        cells.add(file, section, item, "n_conditions_excluded_for_undefined_metric",
                  rec["n_conditions_excluded_for_undefined_metric"],
                  int(cm.n_excluded[(sx, region)].sum() + cm.n_excluded[(sy, region)].sum()))

    section = "τ_b per metric over the 18 conditions"
    for name, rec in pub["secondary_metric_summary"].items():
        t = tau_all.loc[tau_all["metric"] == METRIC_NAMES[name], "tau_b"]
        ours = {"n_defined": int(t.notna().sum()), "n_total": int(len(t)), "mean_kendall_tau": t.mean(),
                "min_kendall_tau": t.min(), "max_kendall_tau": t.max()}
        for field, value in rec.items():
            cells.add(file, section, name, field, value, ours[field])

    section = "τ_b per region over the 3 source pairs (ANWG)"
    for region, rec in pub["primary_metric_by_region_summary"].items():
        t = tau.loc[region, "tau_b"]
        ours = {"n_defined": int(t.notna().sum()), "mean_kendall_tau": t.mean(), "min_kendall_tau": t.min(),
                "max_kendall_tau": t.max()}
        for field, value in rec.items():
            cells.add(file, section, region, field, value, ours[field])
    return tau


def portability_numbers(cells: Cells) -> dict:
    """What agrees in the cross-source file, under the chapter's glue names (``cmp_rq1_*``)."""
    rq1 = cells.frame("rq1_rq2_portability")
    is_tau = rq1["field"] == "kendall_tau"
    ci = rq1["field"].str.startswith("kendall_tau_ci")
    rest = ~ci & ~rq1["field"].str.startswith("spearman_rho_ci")
    return {"cmp_rq1_tau_n": int(is_tau.sum()),
            "cmp_rq1_tau_exact": int((rq1[is_tau]["match"] == EXACT).sum()),
            "cmp_rq1_tau_rounding": int((rq1[is_tau]["match"] == ROUNDING).sum()),
            "cmp_rq1_ci_n": int(ci.sum()), "cmp_rq1_ci_agree": agreeing(rq1[ci]),
            "cmp_rq1_ci_max_abs_diff": max_abs_diff(rq1[ci]),
            "cmp_rq1_rest_n": int(rest.sum()), "cmp_rq1_rest_agree": agreeing(rq1[rest])}


# --- rq3_reversals: pairwise reversals ------------------------------------------------------------

def study_zero_rule(frame: pd.DataFrame) -> pd.Series:
    """Our tests re-counted under the study's UNDEFINED rule, which leaves a test with Δ = 0 defined.

    Ours: UNDEFINED when the loser's mean is 0 in either source. The study's: only when Δ ≠ 0 there;
    a test with Δ = 0 and both means 0 has no sign change, so the study counts it STABLE.
    """
    undefined = frame[["mean_a_x", "mean_b_x", "mean_a_y", "mean_b_y"]].isna().any(axis=1)
    for tag in ("x", "y"):
        loser = np.minimum(frame[f"mean_a_{tag}"], frame[f"mean_b_{tag}"])
        undefined |= (frame[f"delta_{tag}"] != 0) & (loser == 0)
    moved = (frame["cls"] == "UNDEFINED") & ~undefined
    return stats.reversal_counts(frame.assign(cls=frame["cls"].astype(str).where(~moved, "STABLE")))


def count_reason(ours_counts, pub_counts: dict, frame: pd.DataFrame):
    """Why a metric's class counts differ: the zero rule, the bootstrap, or neither. Returns the
    reasons by published class and the counts under the study's zero rule."""
    study = study_zero_rule(frame)
    ci_classes = ("UNSUPPORTED_SIGN_CHANGE_WIDE_CI", "SUPPORTED_PRACTICAL_REVERSAL")
    reasons = {}
    for cls in pub_counts:
        ours = int(ours_counts[CLASS_NAMES[cls]])
        if ours == pub_counts[cls]:
            continue
        if cls in ci_classes and sum(int(ours_counts[CLASS_NAMES[c]]) for c in ci_classes) == \
                sum(pub_counts[c] for c in ci_classes):
            reasons[cls] = "bootstrap"        # only the interval check separates these two classes
        elif int(study[CLASS_NAMES[cls]]) == pub_counts[cls]:
            reasons[cls] = "zero ties"
    return reasons, study


#: The columns that name one pairwise reversal test.
TEST_KEYS = ["policy_a", "policy_b", "source_x", "source_y", "region"]


def compare_reversals(cells: Cells, pub: dict, table: pd.DataFrame, regions, *, n_resamples: int,
                      seed: int) -> types.SimpleNamespace:
    """The reversal file's cells: class counts and rates (ANWG, per region, per metric), the supported
    reversals record by record, the sample STABLE tests. Returns ``rev_all`` (our tests, every
    metric), ``rev`` (ANWG), ``tests`` (ANWG, indexed by :data:`TEST_KEYS`), ``published_supported``
    (the study's supported tests as keys) and ``zero_rule`` (the counts under each zero rule)."""
    file = "rq3_reversals"
    rev_all = stored_statistics("reversal_analysis", table, lambda: stats.reversal_analysis(
        table, metrics=tuple(METRICS), regions=list(regions), n_resamples=n_resamples, seed=seed,
        policies=PRIMARY_PANEL), regions=list(regions), n_resamples=n_resamples, seed=seed)
    rev = rev_all[rev_all["metric"] == "anwg"]
    counts = stats.reversal_counts(rev)
    by_region = stats.reversal_counts(rev, by="region")
    section = "class counts (ANWG)"
    for name, value in pub["primary_metric_class_counts"].items():
        cells.add(file, section, "all regions", name, value, int(counts[CLASS_NAMES[name]]))
    section = "class rates (ANWG)"
    for name, value in pub["primary_metric_class_rates"].items():
        cells.add(file, section, "all regions", name, value, counts[CLASS_NAMES[name]] / len(rev))
    cells.add(file, "class counts (ANWG)", "all regions", "n_total_pairwise_records",
              pub["primary_metric_n_total_pairwise_records"], int(len(rev)))
    section = "class counts per region (ANWG)"
    for region, rec in pub["primary_metric_by_region_class_counts"].items():
        for name, value in rec.items():
            cells.add(file, section, region, name, value, int(by_region.loc[region, CLASS_NAMES[name]]))

    tests = rev.set_index(TEST_KEYS)

    def our_test(rec):
        sx, sy = rec["condition_x"].split("::")[0], rec["condition_y"].split("::")[0]
        if sx > sy:
            raise ValueError(f"unexpected source order in {rec}")
        return tests.loc[(rec["policy_a"], rec["policy_b"], sx, sy, rec["load_region"])], sx, sy

    section = "supported reversals (ANWG)"
    published_supported = set()
    for rec in pub["supported_practical_reversals_primary_metric_sorted_by_effect_size"]:
        t, sx, sy = our_test(rec)
        published_supported.add((rec["policy_a"], rec["policy_b"], sx, sy, rec["load_region"]))
        item = f"{rec['policy_a']} vs {rec['policy_b']}, {short(sx)}–{short(sy)} {rec['load_region']}"
        cells.add(file, section, item, "class", "SUPPORTED_PRACTICAL_REVERSAL", str(t["cls"]))
        for tag in ("x", "y"):
            cells.add(file, section, item, f"margin_{tag}", rec[f"margin_{tag}"], t[f"margin_{tag}"])
            cells.add(file, section, item, f"diff_{tag}", rec[f"diff_{tag}"], t[f"delta_{tag}"])
            cells.add(file, section, item, f"ci_{tag} low", rec[f"ci_{tag}"][0], t[f"ci_low_{tag}"], "bootstrap")
            cells.add(file, section, item, f"ci_{tag} high", rec[f"ci_{tag}"][1], t[f"ci_high_{tag}"], "bootstrap")
        cells.add(file, section, item, "bh_fdr_p_pair_iut", rec["bh_fdr_p_pair_iut"], t["p"], "bootstrap")
        cells.add(file, section, item, "supported_after_fdr", rec["supported_after_fdr"], bool(t["bh"]),
                  "bh family")
        cells.add(file, section, item, "operationalized_effect_size_min_abs_margin",
                  rec["operationalized_effect_size_min_abs_margin"], min(abs(t["margin_x"]), abs(t["margin_y"])))
    cells.add(file, "class counts (ANWG)", "all regions", "n_supported_practical_reversals",
              pub["n_supported_practical_reversals_primary_metric"], int(counts["SUPPORTED_PRACTICAL_REVERSAL"]))
    section = "sample STABLE tests (ANWG)"
    for rec in pub["stable_examples_primary_metric_sample"]:
        t, sx, sy = our_test(rec)
        item = f"{rec['policy_a']} vs {rec['policy_b']}, {short(sx)}–{short(sy)} {rec['load_region']}"
        cells.add(file, section, item, "class", "STABLE", str(t["cls"]))

    section = "class counts per metric"
    zero_rule_rows = []
    for name, rec in pub["secondary_metric_class_counts"].items():
        frame = rev_all[rev_all["metric"] == METRIC_NAMES[name]]
        c = stats.reversal_counts(frame)
        reasons, study = count_reason(c, rec, frame)
        for cls, value in rec.items():
            cells.add(file, section, name, cls, value, int(c[CLASS_NAMES[cls]]), reasons.get(cls, ""))
        for cls in ("UNDEFINED_UNESTIMABLE", "STABLE_NO_SIGN_CHANGE"):
            zero_rule_rows.append({"metric": name, "class": cls, "published": rec[cls],
                                   "ours": int(c[CLASS_NAMES[cls]]),
                                   "ours, study's zero rule": int(study[CLASS_NAMES[cls]])})
    return types.SimpleNamespace(rev_all=rev_all, rev=rev, tests=tests, published_supported=published_supported,
                                 zero_rule=pd.DataFrame(zero_rule_rows))


def pair_counts(tests_) -> pd.Series:
    """Tests (keys as :data:`TEST_KEYS`) per policy pair."""
    frame = pd.DataFrame(sorted(tests_), columns=TEST_KEYS)
    return frame.groupby(["policy_a", "policy_b"]).size()


def reversal_numbers(cells: Cells, rq3) -> tuple[dict, pd.DataFrame]:
    """What agrees in the reversal file, under the chapter's glue names (``cmp_rq3_*``), and the
    supported tests per policy pair, published beside ours. ``rq3``: :func:`compare_reversals`."""
    frame = cells.frame("rq3_reversals")
    published_supported, tests, rev = rq3.published_supported, rq3.tests, rq3.rev
    ours_supported = set(rev[rev["cls"] == "SUPPORTED_PRACTICAL_REVERSAL"].set_index(TEST_KEYS).index)
    pub_pairs = pair_counts(published_supported)
    is_count = frame["section"].str.startswith("class") | frame["section"].str.startswith("sample")
    point = frame["field"].str.match(r"(margin|diff)_|operationalized|class$")
    ci = frame["field"].str.startswith("ci_")
    is_p = frame["field"] == "bh_fdr_p_pair_iut"
    our_36 = tests.loc[sorted(published_supported)]
    both_exclude = (((our_36["ci_low_x"] > 0) | (our_36["ci_high_x"] < 0))
                    & ((our_36["ci_low_y"] > 0) | (our_36["ci_high_y"] < 0)))
    is_bh = frame["field"] == "supported_after_fdr"
    numbers = {
        "cmp_rq3_supported_same": len(published_supported & ours_supported),
        "cmp_rq3_supported_published_only": len(published_supported - ours_supported),
        "cmp_rq3_supported_ours_only": len(ours_supported - published_supported),
        "cmp_rq3_published_pairs": int(len(pub_pairs)),
        "cmp_rq3_published_slai_vllm": int(pub_pairs.get(("slai_faithful", "vllm_faithful"), 0)),
        "cmp_rq3_published_with_burstgpt": sum("burstgpt" in (sx, sy) for _, _, sx, sy, _ in published_supported),
        "cmp_rq3_count_n": int(is_count.sum()), "cmp_rq3_count_agree": agreeing(frame[is_count]),
        "cmp_rq3_point_n": int((point & ~is_count).sum()), "cmp_rq3_point_agree": agreeing(frame[point & ~is_count]),
        "cmp_rq3_ci_n": int(ci.sum()), "cmp_rq3_ci_agree": agreeing(frame[ci]),
        "cmp_rq3_ci_max_abs_diff": max_abs_diff(frame[ci]),
        "cmp_rq3_p_n": int(is_p.sum()), "cmp_rq3_p_agree": agreeing(frame[is_p]),
        "cmp_rq3_ci_exclude0": int(both_exclude.sum()),
        "cmp_rq3_bh_agree": int((frame[is_bh]["match"] == EXACT).sum()),
    }
    pairs = pd.DataFrame({"published supported": pub_pairs, "ours supported": pair_counts(ours_supported)}
                         ).fillna(0).astype(int)
    return numbers, pairs


def zero_rule_numbers(zero_rule: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """The tests the zero rule moves (glued ``cmp_rq3_zero_rule_*``) and the metrics where it matters,
    with their counts under both rules. ``zero_rule``: :func:`compare_reversals`'s."""
    changed = zero_rule.groupby("metric").apply(lambda d: (d["ours"] != d["ours, study's zero rule"]).any(),
                                                include_groups=False)
    moved = int((zero_rule["ours"] - zero_rule["ours, study's zero rule"]).clip(lower=0).sum())
    numbers = {"cmp_rq3_zero_rule_moved": moved,
               "cmp_rq3_zero_rule_metrics": ", ".join(changed[changed].index) or "none"}
    return numbers, zero_rule[zero_rule["metric"].isin(changed[changed].index)]


def bootstrap_seed_check(cells: Cells, pub: dict, table: pd.DataFrame, regions, rev_all: pd.DataFrame, *,
                         n_resamples: int, seed: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """For the metrics whose SUPPORTED and UNSUPPORTED counts differ from the study's only by the
    bootstrap: the counts re-run at the next seeds, and the tests of those two classes whose interval
    bound comes closest to 0. Returns the glued numbers (``cmp_rq3_boot_*``) and the two tables."""
    boot_metrics = sorted({c["item"] for c in cells.rows if c["file"] == "rq3_reversals"
                           and c["why"] == WHY["bootstrap"] and c["section"] == "class counts per metric"})

    def reruns():
        rows = []
        for name in boot_metrics:
            rec = pub["secondary_metric_class_counts"][name]
            for other_seed in range(seed, seed + 4):
                c = stats.reversal_counts(stats.reversal_analysis(
                    table, metrics=(METRIC_NAMES[name],), regions=list(regions), n_resamples=n_resamples,
                    seed=other_seed, policies=PRIMARY_PANEL))
                rows.append({"metric": name, "seed": other_seed, "UNSUPPORTED_WIDE_CI": int(c["UNSUPPORTED_WIDE_CI"]),
                             "SUPPORTED_PRACTICAL_REVERSAL": int(c["SUPPORTED_PRACTICAL_REVERSAL"]),
                             "as published": bool(c["SUPPORTED_PRACTICAL_REVERSAL"]
                                                  == rec["SUPPORTED_PRACTICAL_REVERSAL"])})
        return pd.DataFrame(rows)

    seeds = stored_statistics("reversal_seeds", table, reruns, metrics=boot_metrics, regions=list(regions),
                              n_resamples=n_resamples, seed=seed,
                              published=[pub["secondary_metric_class_counts"][m] for m in boot_metrics])
    near_rows = []
    for name in boot_metrics:
        f = rev_all[(rev_all["metric"] == METRIC_NAMES[name])
                    & rev_all["cls"].isin(["UNSUPPORTED_WIDE_CI", "SUPPORTED_PRACTICAL_REVERSAL"])]
        bounds = f[["ci_low_x", "ci_high_x", "ci_low_y", "ci_high_y"]].abs().min(axis=1)
        near_rows.append(f.assign(closest_bound_to_0=bounds).nsmallest(3, "closest_bound_to_0")[
            ["metric", "region", "policy_a", "policy_b", "source_x", "source_y", "cls", "closest_bound_to_0"]])
    numbers = {"cmp_rq3_boot_metrics": ", ".join(boot_metrics) or "none",
               "cmp_rq3_boot_seeds_as_published": int(seeds["as published"].sum()) if len(seeds) else 0,
               "cmp_rq3_boot_seeds_n": int(len(seeds))}
    near = pd.concat(near_rows, ignore_index=True) if near_rows else pd.DataFrame()
    return numbers, seeds, near
