"""The study's files on window subsets beside ours: how many windows a ranking needs
(``rq4_sample_complexity``, :func:`compare_sample_complexity`) and rankings over time within a source
(``rq5_temporal_robustness``: the study's chronology splits, :func:`compare_temporal`); the
``*_numbers`` functions count what agrees, under the names the comparison chapter glues them.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pandas as pd

from .. import stats
from ..metrics import METRICS
from ..policies import PRIMARY_PANEL
from .cells import (DIFFERS, EXACT, METRIC_NAMES, NOT_COMPUTED, ROUNDING, WHY, Cells, agreeing, match, short,
    spearman, topk_overlap)

#: Manifest chronology strata in time order; the study's Azure calendar boundary (epoch seconds).
STRATA = {"EARLY": 0, "MIDDLE": 1, "LATE": 2}
AZURE_BOUNDARY = pd.Timestamp("2024-05-15", tz="UTC").timestamp()


# --- rq4_sample_complexity: how many windows a ranking needs --------------------------------------

def sample_complexity_settings() -> tuple[tuple, int]:
    """The ladder of window counts and the draws per count of :func:`portbench.stats.sample_complexity`."""
    defaults = {k: v.default for k, v in inspect.signature(stats.sample_complexity).parameters.items()}
    return tuple(defaults["sizes"]), int(defaults["n_draws"])


def compare_sample_complexity(cells: Cells, pub: dict, table: pd.DataFrame, sources, *,
                              recovery_threshold: float) -> dict:
    """The sample-complexity file's cells: settings, the ANWG recovery curves and every metric's
    thresholds (the study's variant: regions pooled, raw values best first). Returns our recovery
    curve behind each per-metric threshold row, by the row's item."""
    file = "rq4_sample_complexity"
    sizes, n_draws = sample_complexity_settings()
    section = "settings"
    for n_pub, n_ours in zip(pub["ladder_n_values"], sizes):
        cells.add(file, section, "ladder", "n", n_pub, n_ours)
    cells.add(file, section, "draws", "draws_per_n", pub["draws_per_n"], n_draws)
    cells.add(file, section, "threshold", "recovery_threshold", pub["recovery_threshold"], recovery_threshold)

    def first_n(frame, column):
        ok = frame[frame[column] >= recovery_threshold]
        return int(ok["n"].min()) if len(ok) else None

    def add_thresholds(section, item, rec, curve):
        cells.add(file, section, item, "first_n_meeting_exact_threshold", rec["first_n_meeting_exact_threshold"],
                  first_n(curve, "p_full"), "subsample")
        cells.add(file, section, item, "first_n_meeting_topk_threshold 1",
                  rec["first_n_meeting_topk_threshold"]["1"], first_n(curve, "p_top1"), "subsample")
        cells.add(file, section, item, "first_n_meeting_topk_threshold 3",
                  rec["first_n_meeting_topk_threshold"]["3"], None, "top-3 recovery")

    recovery = {(s, m): stats.sample_complexity(table, m, s, pool_regions=True, direction_aware=False,
                                                policies=PRIMARY_PANEL).set_index("n")
                for s in sources for m in METRICS}
    section = "recovery curves (ANWG)"
    for rec in pub["primary_metric_rows"]:
        sc = recovery[(rec["source"], "anwg")]
        for pt in rec["points"]:
            item = f"{short(rec['source'])} n={pt['n']}"
            cells.add(file, section, item, "p_exact_recovery", pt["p_exact_recovery"], sc.loc[pt["n"], "p_full"],
                      "subsample")
            cells.add(file, section, item, "p_topk_recovery 1", pt["p_topk_recovery"]["1"],
                      sc.loc[pt["n"], "p_top1"], "subsample")
            cells.add(file, section, item, "p_topk_recovery 3", pt["p_topk_recovery"]["3"], None, "top-3 recovery")
        item = short(rec["source"])
        sc = sc.reset_index()
        add_thresholds(section, item, rec, sc)
        cells.add(file, section, item, "reaches_0.9_exact_by_n40", rec["reaches_0.9_exact_by_n40"],
                  bool(sc.loc[sc["n"] <= 40, "p_full"].max() >= recovery_threshold), "subsample")
    section = "concentrated vs spread"
    for rec in pub["concentrated_vs_spread"]:
        for field in ("mean_tau_concentrated", "mean_tau_spread", "n_draws", "n_total"):
            cells.add(file, section, rec["metric"], field, rec[field], None, "concentrated")
    section = "thresholds per metric"
    curve_of = {}
    for rec in pub["secondary_metric_thresholds"]:
        sc = recovery[(rec["source"], METRIC_NAMES[rec["metric"]])].reset_index()
        item = f"{short(rec['source'])} {rec['metric']}"
        curve_of[item] = sc
        add_thresholds(section, item, rec, sc)
    return curve_of


def sample_complexity_numbers(cells: Cells, curve_of: dict) -> tuple[dict, pd.DataFrame]:
    """What agrees in the sample-complexity file (glued ``cmp_rq4_*``), and our recovery curves behind
    the per-metric threshold cells that differ (probability by window count)."""
    rq4 = cells.frame("rq4_sample_complexity")
    p = rq4["field"].isin(["p_exact_recovery", "p_topk_recovery 1"])
    diff = (rq4[p]["ours"].astype(float) - rq4[p]["published"].astype(float)).abs()
    thr = rq4["field"].str.startswith("first_n") & (rq4["match"] != NOT_COMPUTED)
    numbers = {"cmp_rq4_p_n": int(p.sum()), "cmp_rq4_p_agree": agreeing(rq4[p]),
               "cmp_rq4_p_max_abs_diff": float(diff.max()), "cmp_rq4_p_median_abs_diff": float(diff.median()),
               "cmp_rq4_thr_n": int(thr.sum()), "cmp_rq4_thr_agree": int((rq4[thr]["match"] == EXACT).sum()),
               "cmp_rq4_not_computed": int((rq4["match"] == NOT_COMPUTED).sum()),
               # a proportion's largest standard error
               "cmp_rq4_max_se": math.sqrt(0.25 / sample_complexity_settings()[1])}
    off_thr = rq4[thr & (rq4["match"] == DIFFERS) & (rq4["section"] == "thresholds per metric")]
    curves = (pd.concat({item: curve_of[item].set_index("n")[["p_full", "p_top1"]].T
                         for item in off_thr["item"].unique()}, names=["curve", "probability"])
              .rename(columns=lambda n: f"n = {n}") if len(off_thr) else pd.DataFrame())
    return numbers, curves


# --- rq5_temporal_robustness: rankings over time within a source ----------------------------------

def ordered(manifest: pd.DataFrame, source: str, by_stratum: bool = False) -> pd.DataFrame:
    """A source's windows in time order (first arrival, then window id: the study's order);
    ``by_stratum`` puts the manifest's chronology stratum first."""
    m = manifest[manifest["source"] == source].assign(stratum=lambda d: d["chronology_stratum"].map(STRATA))
    return m.sort_values((["stratum"] if by_stratum else []) + ["arrival_time_s_min", "window_id"])


def splits(manifest: pd.DataFrame, source: str, split: str, bailian_by_stratum: bool = True) -> dict:
    """window_id → group of one of the study's chronology treatments (``TERCILE``, ``BISECT``,
    ``RELATIVE_CHRONOLOGY_ONLY``: Bailian's EARLY stratum against the rest unless
    ``bailian_by_stratum`` is false, ``CALENDAR_BOUNDARY``: Azure before or after 2024-05-15)."""
    m = ordered(manifest, source, by_stratum=bailian_by_stratum and split == "RELATIVE_CHRONOLOGY_ONLY")
    if split == "TERCILE":
        return stats.chronological_groups(m["window_id"].tolist(), ("EARLY", "MIDDLE", "LATE"))
    if split == "BISECT":
        return stats.chronological_groups(m["window_id"].tolist(), ("EARLY", "LATE"))
    if split == "RELATIVE_CHRONOLOGY_ONLY":
        return stats.chronological_groups(m["window_id"].tolist(), ("EARLY_RELATIVE", "LATE_RELATIVE"))
    if split == "CALENDAR_BOUNDARY":
        return dict(zip(m["window_id"], np.where(m["arrival_time_s_min"] >= AZURE_BOUNDARY,
                                                 "AT_OR_AFTER_BOUNDARY", "BEFORE_BOUNDARY")))
    raise ValueError(split)


def float_means(table: pd.DataFrame, source: str, region: str, windows) -> pd.Series:
    """The study's aggregation: per primary policy, a plain float mean of ANWG at the base SLO over
    ``windows`` in the order given, no tie tolerance."""
    base = table[np.isclose(table["slo_multiplier"], stats.BASE_SLO) & table["policy"].isin(PRIMARY_PANEL)]
    v = base[(base["source"] == source) & (base["region"] == region)].pivot_table(
        index="window_id", columns="policy", values="anwg")
    return pd.Series({p: float(np.mean(v.loc[windows, p].to_numpy())) for p in sorted(PRIMARY_PANEL)})


def n_tied(means: pd.Series) -> int:
    """Policies whose mean equals another's exactly (as stored)."""
    return int(means.duplicated(keep=False).sum())


def compare_temporal(cells: Cells, pub: dict, table: pd.DataFrame, regions, tau: pd.DataFrame,
                     manifest: pd.DataFrame, *, n_resamples: int, seed: int) -> pd.DataFrame:
    """The temporal file's cells: every split's τ_b, ρ, overlaps and counts, then the leave-one-source-out
    and four-region robustness means (``tau``: :func:`compare_portability`'s) and the policy-family
    means (not computed). Returns the comparisons whose τ_b differs from the study's, beside τ_b of
    the study's plain float means and the tied policies on each side."""
    from scipy import stats as sps

    file = "rq5_temporal_robustness"
    base = table[np.isclose(table["slo_multiplier"], stats.BASE_SLO) & table["policy"].isin(PRIMARY_PANEL)]
    temporal, group_means, group_of, order_of = {}, {}, {}, {}
    for source, split in {(r["source"], r["split"]) for r in pub["temporal_records"]}:
        groups = splits(manifest, source, split)
        group_of[(source, split)] = groups
        order_of[(source, split)] = ordered(manifest, source, split == "RELATIVE_CHRONOLOGY_ONLY")["window_id"].tolist()
        sub = table[table["source"] == source].assign(group=lambda d: d["window_id"].map(groups))
        group_means[(source, split)] = stats.condition_means(sub, "anwg", by=("group", "region"),
                                                             policies=PRIMARY_PANEL)
        for region in regions:
            res = stats.temporal_split(table, "anwg", region, source, groups, n_resamples=n_resamples, seed=seed,
                                       policies=PRIMARY_PANEL)
            for _, row in res.iterrows():
                temporal[(source, split, region, frozenset((row["group_a"], row["group_b"])))] = row

    section = "temporal splits (ANWG)"
    tie_rows = []
    for rec in pub["temporal_records"]:
        source, region, split, gx = rec["condition_x"].split("::")
        gy = rec["condition_y"].split("::")[3]
        row = temporal[(source, split, region, frozenset((gx, gy)))]
        gm = group_means[(source, split)]
        mx, my = gm.means[(gx, region)], gm.means[(gy, region)]
        rho, rho_p = spearman(mx, my)
        # the same comparison on the study's plain float means, to tell a tie artefact from a real difference
        order, groups = order_of[(source, split)], group_of[(source, split)]
        fx, fy = (float_means(base, source, region, [w for w in order if groups[w] == g]) for g in (gx, gy))
        f_tau = sps.kendalltau(fx.to_numpy(), fy.to_numpy())
        ties = "float ties" if match(rec["kendall_tau"], f_tau.statistic) in (EXACT, ROUNDING) else ""
        item = f"{short(source)} {region} {split.lower()} {gx.lower()}–{gy.lower()}"
        if match(rec["kendall_tau"], row["tau_b"]) == DIFFERS:
            tie_rows.append({"comparison": item, "published τ_b": rec["kendall_tau"], "ours": row["tau_b"],
                             "study's float means": f_tau.statistic,
                             "tied policies, ours": n_tied(mx) + n_tied(my),
                             "tied policies, float means": n_tied(fx) + n_tied(fy)})
        cells.add(file, section, item, "kendall_tau", rec["kendall_tau"], row["tau_b"], ties)
        cells.add(file, section, item, "kendall_p", rec["kendall_p"], row["pvalue"], ties)
        cells.add(file, section, item, "kendall_tau_ci low", rec["kendall_tau_ci"][0], row["ci_low"], "bootstrap")
        cells.add(file, section, item, "kendall_tau_ci high", rec["kendall_tau_ci"][1], row["ci_high"], "bootstrap")
        cells.add(file, section, item, "spearman_rho", rec["spearman_rho"], rho, ties)
        cells.add(file, section, item, "spearman_p", rec["spearman_p"], rho_p, ties)
        cells.add(file, section, item, "spearman_rho_ci low", rec["spearman_rho_ci"][0], None, "spearman ci")
        cells.add(file, section, item, "spearman_rho_ci high", rec["spearman_rho_ci"][1], None, "spearman ci")
        n_pol = int(row["n_policies"])
        for k, value in rec["topk_overlap"].items():
            cells.add(file, section, item, f"topk_overlap {int(k)}", value, topk_overlap(row, mx, my, int(k), n_pol),
                      ties)
        for k, value in rec["topk_k_reduced"].items():
            cells.add(file, section, item, f"topk_k_reduced {k}", value, int(k) > n_pol)
        cells.add(file, section, item, "n_policies_compared", rec["n_policies_compared"], n_pol)
        cells.add(file, section, item, "n_conditions_excluded_for_undefined_metric",
                  rec["n_conditions_excluded_for_undefined_metric"],
                  int(gm.n_excluded[(gx, region)].sum() + gm.n_excluded[(gy, region)].sum()))

    tau_anwg = tau.reset_index()
    full_mean = tau_anwg["tau_b"].mean()
    loso = pd.concat([stats.leave_one_source_out(table, "anwg", r, policies=PRIMARY_PANEL, n_permutations=0)
                      .assign(region=r) for r in regions], ignore_index=True)
    rec = pub["robustness_leave_one_source_out"]
    section = "leave one source out (ANWG)"
    cells.add(file, section, "all sources", "full_panel_mean_kendall_tau", rec["full_panel_mean_kendall_tau"],
              full_mean)
    for source, r in rec["per_excluded_source"].items():
        t = loso.loc[loso["left_out"] == source, "tau_b"]
        cells.add(file, section, f"without {short(source)}", "n_conditions_remaining", r["n_conditions_remaining"],
                  int(t.notna().sum()))
        cells.add(file, section, f"without {short(source)}", "mean_kendall_tau_excluding_this_source",
                  r["mean_kendall_tau_excluding_this_source"], t.mean())
    rec = pub["robustness_load_calibration_sensitivity"]
    section = "four-region subset (ANWG)"
    subset = "+".join(rec["four_region_subset"])
    four = tau_anwg[tau_anwg["region"].isin(rec["four_region_subset"])]["tau_b"]
    cells.add(file, section, subset, "n_conditions_four_region", rec["n_conditions_four_region"],
              int(four.notna().sum()))
    cells.add(file, section, subset, "mean_kendall_tau_four_region", rec["mean_kendall_tau_four_region"],
              four.mean())
    cells.add(file, section, "all six regions", "mean_kendall_tau_full_six_region",
              rec["mean_kendall_tau_full_six_region"], full_mean)
    rec = pub["robustness_leave_one_policy_family_out"]
    section = "leave one policy family out (ANWG)"
    cells.add(file, section, "all policies", "full_panel_mean_kendall_tau", rec["full_panel_mean_kendall_tau"],
              full_mean)
    for family, r in rec["per_excluded_family"].items():
        for field, value in r.items():
            cells.add(file, section, f"without {family}", field, value, None, "family")
    return pd.DataFrame(tie_rows)


def temporal_numbers(cells: Cells, pub: dict) -> dict:
    """What agrees in the temporal file, under the chapter's glue names (``cmp_rq5_*``)."""
    rq5 = cells.frame("rq5_temporal_robustness")
    tmp = rq5[rq5["section"] == "temporal splits (ANWG)"]
    point = tmp["field"].isin(["kendall_tau", "kendall_p", "spearman_rho", "spearman_p"]) | \
        tmp["field"].str.startswith("topk") | tmp["field"].str.startswith("n_")
    ci = tmp["field"].str.startswith("kendall_tau_ci")
    rob = rq5[(rq5["section"] != "temporal splits (ANWG)") & (rq5["match"] != NOT_COMPUTED)]
    return {"cmp_rq5_records": int(len(pub["temporal_records"])),
            "cmp_rq5_point_n": int(point.sum()), "cmp_rq5_point_agree": agreeing(tmp[point]),
            "cmp_rq5_ci_n": int(ci.sum()), "cmp_rq5_ci_agree": agreeing(tmp[ci]),
            "cmp_rq5_rob_n": int(len(rob)), "cmp_rq5_rob_agree": agreeing(rob),
            "cmp_rq5_family_n": int((rq5["why"] == WHY["family"]).sum()),
            "cmp_rq5_n_families": int(len(pub["robustness_leave_one_policy_family_out"]["per_excluded_family"]))}


def bailian_split(pub: dict, table: pd.DataFrame, regions, manifest: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """Bailian's "relative chronology" split done two ways (the EARLY stratum against the rest, and
    halves by first timestamp), τ_b per region beside the study's; glued ``cmp_rq5_bailian_*``."""
    rows = []
    for region in regions:
        rec = next(r for r in pub["temporal_records"]
                   if r["source"] == "bailian_qwen" and r["condition_x"].split("::")[1] == region)
        row = {"region": region, "published τ_b": rec["kendall_tau"]}
        for label, by_stratum in (("ours: EARLY stratum vs the rest", True), ("first-timestamp halves", False)):
            groups = splits(manifest, "bailian_qwen", "RELATIVE_CHRONOLOGY_ONLY", bailian_by_stratum=by_stratum)
            row[label] = stats.temporal_split(table, "anwg", region, "bailian_qwen", groups, n_resamples=1,
                                              policies=PRIMARY_PANEL)["tau_b"].iloc[0]
        rows.append(row)
    bailian = pd.DataFrame(rows).set_index("region")
    disagree = [match(p, o) == DIFFERS for p, o in zip(bailian["published τ_b"], bailian["first-timestamp halves"])]
    strata = manifest.loc[manifest["source"] == "bailian_qwen", "chronology_stratum"]
    return ({"cmp_rq5_bailian_time_disagree": int(sum(disagree)),
             "cmp_rq5_bailian_early_n": int((strata == "EARLY").sum())}, bailian)
