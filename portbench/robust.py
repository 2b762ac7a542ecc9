"""RQ8's robust reading of the study's headlines: ties treated as ties, duplicate policies once.

The study breaks every top-1 tie by policy name and counts every policy it ran, so two policies that
are the same scheduler in every cell count twice and a policy that ties for the best "wins" by its
name. The reading here, beside (never instead of) the study's:

- **Ties.** In a condition, two policies *tie* when their mean difference is within ``rtol`` of the
  larger mean (a practical tolerance), or when the ``confidence_level`` t-interval of their
  per-window paired difference contains 0 (a statistical one). A tied pair has no sign: τ_b leaves
  it out of the concordant and discordant counts (:func:`robust_signs`), and the **top-1 set** holds
  every policy tied with the best mean (:func:`top1_set`). Two top-1 sets *agree* when they share a
  policy. With no ties, every function gives the study's number.
- **Duplicates.** Policies with identical values in every cell of a table are one scheduler
  (:func:`duplicate_groups`); the first id of each group stands for it (:func:`collapse_duplicates`).

Values handed to these functions are windows × policies matrices oriented so that higher is better
(lower-is-better metrics negated), as :mod:`portbench.stats` builds them.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from .metrics import METRICS
from . import stats

#: The default practical tolerance: half a percent of the larger mean (one request in a 200-request
#: window's ANWG).
TIE_RTOL = 0.005


def _check_tie_rule(rtol, confidence_level):
    if not (isinstance(rtol, (int, float)) and 0 <= rtol < 1):
        raise ValueError(f"tie tolerance rtol must be a number in [0, 1), got {rtol!r}")
    if confidence_level is not None and not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must lie strictly between 0 and 1 (or be None: no "
                         f"interval rule), got {confidence_level!r}")


# ---------------------------------------------------------------------------------------------
# Duplicates

def duplicate_groups(table: pd.DataFrame, policies=None, metrics=tuple(METRICS)) -> list[tuple]:
    """Groups (sorted ids, two or more) of policies whose every metric is identical in every cell
    (window, region, SLO multiplier) of ``table``; NaN equals NaN. A policy missing a cell another
    has is not its duplicate."""
    keys = [k for k in ("window_id", "region", "slo_multiplier") if k in table.columns]
    names = sorted(table["policy"].unique() if policies is None else policies)
    sub = table[table["policy"].isin(names)]
    wide = sub.set_index(keys + ["policy"])[list(metrics)].unstack("policy")
    groups, seen = [], set()
    for a in names:
        if a in seen or a not in wide.columns.get_level_values("policy"):
            continue
        va = wide.xs(a, axis=1, level="policy").to_numpy()
        group = [a]
        for b in names:
            if b <= a or b in seen or b not in wide.columns.get_level_values("policy"):
                continue
            if np.array_equal(va, wide.xs(b, axis=1, level="policy").to_numpy(), equal_nan=True):
                group.append(b)
        if len(group) > 1:
            groups.append(tuple(group))
            seen.update(group)
    return groups


def collapse_duplicates(policies, groups) -> tuple:
    """``policies`` with every duplicate group reduced to its first id (order kept)."""
    drop = {p for g in groups for p in sorted(g)[1:]}
    return tuple(p for p in policies if p not in drop)


# ---------------------------------------------------------------------------------------------
# Ties

def tie_matrix(values, *, rtol: float = TIE_RTOL, confidence_level: float | None = 0.95) -> np.ndarray:
    """policies × policies: True where two policies tie (see the module docstring).

    ``values``: windows × policies, higher is better, NaN where undefined (a pair uses the windows
    where both are defined; fewer than two leaves only the tolerance rule). ``rtol=0`` and
    ``confidence_level=None`` tie only exactly equal means. A policy with no defined window ties
    nothing.
    """
    _check_tie_rule(rtol, confidence_level)
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ValueError("values must be a windows × policies matrix")
    means = stats.point_means(v) if len(v) else np.full(v.shape[1], np.nan)
    a, b = means[:, None], means[None, :]
    with np.errstate(invalid="ignore"):
        tied = np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b))
    if confidence_level is not None and len(v) >= 2:
        d = v[:, :, None] - v[:, None, :]                     # windows × p × p
        ok = ~np.isnan(d)
        n = ok.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(ok, d, 0.0).sum(axis=0) / n
            var = np.where(ok, (d - mean) ** 2, 0.0).sum(axis=0) / (n - 1)
            half = sps.t.ppf(0.5 + confidence_level / 2, np.maximum(n - 1, 1)) * np.sqrt(var / n)
            tied |= (n >= 2) & (np.abs(mean) <= half)
    defined = np.isfinite(means)
    tied &= defined[:, None] & defined[None, :]
    np.fill_diagonal(tied, defined)
    return tied


def robust_signs(values, **tie_rule) -> np.ndarray:
    """sign(mean_i − mean_j) for the pairs i < j (numpy's triu order), 0 where they tie, NaN where
    either is undefined."""
    v = np.asarray(values, dtype=float)
    means = stats.point_means(v) if len(v) else np.full(v.shape[1], np.nan)
    s = stats.pair_signs(means[None, :], rtol=0.0)[0]
    i, j = np.triu_indices(v.shape[1], 1)
    s[tie_matrix(v, **tie_rule)[i, j] & ~np.isnan(s)] = 0.0
    return s


def robust_tau(va, vb, **tie_rule) -> float:
    """Kendall τ_b between two window matrices' policy means with ties treated as ties on each side."""
    return float(stats.tau_from_signs(robust_signs(va, **tie_rule), robust_signs(vb, **tie_rule)))


def top1_set(values, policies, **tie_rule) -> frozenset:
    """Every policy tied with the best mean (the best included); empty when none is defined."""
    v = np.asarray(values, dtype=float)
    means = stats.point_means(v) if len(v) else np.full(v.shape[1], np.nan)
    if not np.isfinite(means).any():
        return frozenset()
    best = int(np.nanargmax(means))
    tied = tie_matrix(v, **tie_rule)[best]
    return frozenset(p for p, t in zip(policies, tied) if t)


def _oriented(sub: pd.DataFrame, metric: str, policies) -> np.ndarray:
    v = stats.window_matrix(sub, metric, policies).to_numpy()
    return v if METRICS.get(metric, True) else -v


# ---------------------------------------------------------------------------------------------
# The study's headlines, read robustly

def cross_source(table: pd.DataFrame, metric: str = "anwg", *, policies, regions=None, sources=None,
                 slo_multiplier=stats.BASE_SLO, **tie_rule) -> pd.DataFrame:
    """Per (region, source pair): the study's τ_b and the robust τ_b (ties as ties) of the means."""
    rows = []
    pols = tuple(sorted(policies))
    for region in stats.table_regions(table, regions):
        sub = stats.select_cells(table, region=region, slo_multiplier=slo_multiplier)
        mats = {s: _oriented(sub[sub["source"] == s], metric, pols) for s in stats.table_sources(sub, sources)}
        for sa, sb in itertools.combinations(sorted(mats), 2):
            ma, mb = stats.point_means(mats[sa]), stats.point_means(mats[sb])
            rows.append({"region": region, "source_a": sa, "source_b": sb,
                         "tau_b": stats.kendall_tau_b(ma, mb, rtol=stats.TIE_RTOL),
                         "tau_b_robust": robust_tau(mats[sa], mats[sb], **tie_rule)})
    return pd.DataFrame(rows)


def cross_metric_top1(table: pd.DataFrame, source: str, region: str, *, policies, metrics=tuple(METRICS),
                      slo_multiplier=stats.BASE_SLO, **tie_rule) -> pd.DataFrame:
    """Per metric pair of one (source, region): whether the two metrics crown the same policy — the
    study's name-ordered top-1 and the robust top-1 sets (agree: they share a policy). As in the
    study, each pair ranks the policies defined under both metrics."""
    sub = stats.select_cells(table, source=source, region=region, slo_multiplier=slo_multiplier)
    pols = tuple(sorted(policies))
    mats = {m: _oriented(sub, m, pols) for m in metrics}
    rows = []
    for a, b in itertools.combinations(sorted(metrics), 2):
        common = np.isfinite(stats.point_means(mats[a])) & np.isfinite(stats.point_means(mats[b]))
        cp = tuple(p for p, c in zip(pols, common) if c)
        ta = stats.top1_of(stats.point_means(mats[a][:, common]), cp)[0] if cp else None
        tb = stats.top1_of(stats.point_means(mats[b][:, common]), cp)[0] if cp else None
        sa = top1_set(mats[a][:, common], cp, **tie_rule)
        sb = top1_set(mats[b][:, common], cp, **tie_rule)
        rows.append({"source": source, "region": region, "metric_a": a, "metric_b": b,
                     "n_policies": len(cp), "top1_agree": ta is not None and ta == tb,
                     "top1_set_a": sa, "top1_set_b": sb, "top1_agree_robust": bool(sa & sb),
                     "all_tied": len(sa) == len(cp) or len(sb) == len(cp)})
    return pd.DataFrame(rows)


def slo_top1_changes(table: pd.DataFrame, metric: str = "anwg", *, policies, base=stats.BASE_SLO,
                     variants=(10.0, 40.0), regions=None, sources=None, **tie_rule) -> pd.DataFrame:
    """Per (source, region, SLO variant): top-1 change against the base SLO, the study's way and
    robustly (changed: the two top-1 sets share no policy)."""
    pols = tuple(sorted(policies))
    rows = []
    for variant in variants:
        for source in stats.table_sources(table, sources):
            for region in stats.table_regions(table, regions):
                vb = _oriented(stats.select_cells(table, source=source, region=region, slo_multiplier=base),
                               metric, pols)
                vv = _oriented(stats.select_cells(table, source=source, region=region, slo_multiplier=variant),
                               metric, pols)
                if not len(vb) or not len(vv):
                    continue
                ta = stats.top1_of(stats.point_means(vb), pols)[0]
                tb = stats.top1_of(stats.point_means(vv), pols)[0]
                sa, sb = top1_set(vb, pols, **tie_rule), top1_set(vv, pols, **tie_rule)
                rows.append({"source": source, "region": region, "variant": float(variant),
                             "top1_base": ta, "top1_variant": tb, "top1_changed": ta != tb,
                             "top1_set_base": sa, "top1_set_variant": sb,
                             "top1_changed_robust": not (sa & sb)})
    return pd.DataFrame(rows)


def top1_recovery(table: pd.DataFrame, metric: str, source: str, *, policies, sizes=(5, 10, 20, 30, 40),
                  n_draws: int = 500, seed: int = 12345, regions=None, slo_multiplier=stats.BASE_SLO,
                  **tie_rule) -> pd.DataFrame:
    """Probability that n windows drawn without replacement recover the all-window top-1: the study's
    way (:func:`portbench.stats.sample_complexity`'s draws and rule) beside the robust one (the
    draw's top-1 set shares a policy with the all-window top-1 set). The same draws serve both."""
    rtol = tie_rule.get("rtol", TIE_RTOL)
    level = tie_rule.get("confidence_level", 0.95)
    _check_tie_rule(rtol, level)
    pols = tuple(sorted(policies))
    sub = stats.select_cells(table, source=source, slo_multiplier=slo_multiplier)
    rows = []
    for region in stats.table_regions(sub, regions):
        v = _oriented(sub[sub["region"] == region], metric, pols)
        keep = np.isfinite(stats.point_means(v))
        v = v[:, keep]
        kp = tuple(p for p, k in zip(pols, keep) if k)
        if np.isnan(v).any():
            raise ValueError(f"{metric} is undefined in some {source} {region} window: the robust top-1 "
                             "recovery needs a metric defined in every window")
        nw = len(v)
        ref_top = stats.top1_of(stats.point_means(v), range(len(kp)))[0]
        ref_set = np.array([p in top1_set(v, kp, **tie_rule) for p in kp])
        for n in sizes:
            row = {"source": source, "region": region, "n": int(n), "n_draws": n_draws}
            if n > nw or n < 2:
                rows.append({**row, "p_top1": math.nan, "p_top1_robust": math.nan})
                continue
            rng = np.random.default_rng(seed + int(n))
            order = np.argsort(rng.random((n_draws, nw)), axis=1)[:, :n]
            x = v[order]                                           # draws × n × policies
            means = x.mean(axis=1)
            best = np.nanmax(means, axis=1, keepdims=True)
            near = means >= best - stats.TIE_RTOL * np.abs(best)
            study = np.argmax(near, axis=1) == ref_top
            top = np.argmax(means, axis=1)
            d = x - x[np.arange(n_draws), :, top][:, :, None]     # differences with the draw's best
            md = d.mean(axis=1)
            tied = np.abs(md) <= rtol * np.maximum(np.abs(means), np.abs(best))
            if level is not None:
                sd = d.std(axis=1, ddof=1)
                tied |= np.abs(md) <= sps.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
            robust = (tied & ref_set[None, :]).any(axis=1)
            rows.append({**row, "p_top1": float(study.mean()), "p_top1_robust": float(robust.mean())})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# The study's conclusions as checks

#: The study's conclusions that RQ8 re-checks, with the rule each is read by.
CONCLUSIONS = {
    "rq1_azure_bailian": ("RQ1: Azure and Bailian rank the policies alike",
                          "Azure–Bailian τ_b ≥ 0.89 (the study's lowest) in every region"),
    "rq1_burstgpt_apart": ("RQ1: BurstGPT ranks them apart",
                           "every pair with BurstGPT at τ_b ≤ 0.71 (the study's highest) in every region"),
    "rq2_rare": ("RQ2: supported reversals are rare", "fewer than 5% of the tests (the study: 3.6%)"),
    "rq2_slai_vllm": ("RQ2: they are all slai_faithful vs vllm_faithful",
                      "every supported reversal is that pair"),
    "rq2_burstgpt": ("RQ2: they all have BurstGPT on one side",
                     "every supported reversal has BurstGPT as one source"),
    "rq2_heavy": ("RQ2: they sit at heavy load", "none at LOW (the study: 0 at LOW)"),
    "rq3_metric_flips": ("RQ3: the best policy changes with the metric",
                         "top-1 differs between two metrics in more than half of the comparisons "
                         "(the study: 68.1%)"),
}


def conclusion_checks(tau: pd.DataFrame, supported: pd.DataFrame, n_tests: int,
                      top1_change_rate: float, *, tau_column: str = "tau_b",
                      burstgpt: str = "burstgpt", azure: str = "azure_llm_2024",
                      bailian: str = "bailian_qwen") -> dict:
    """Whether each of :data:`CONCLUSIONS` holds, from a cross-source τ table (``tau_column``), the
    supported reversals (rows of :func:`portbench.stats.reversals`), the number of reversal tests and
    the cross-metric top-1 change rate. τ_b is compared at two decimals, as the study reports it."""
    pair = {frozenset((a, b)) for a, b in zip(tau["source_a"], tau["source_b"])}
    ab = tau[[frozenset((a, b)) == frozenset((azure, bailian)) for a, b in zip(tau["source_a"], tau["source_b"])]]
    with_b = tau[(tau["source_a"] == burstgpt) | (tau["source_b"] == burstgpt)]
    if frozenset((azure, bailian)) not in pair or with_b.empty:
        raise ValueError("the τ table needs the Azure–Bailian pair and pairs with BurstGPT")
    tau_ab = ab[tau_column].to_numpy(dtype=float).round(2)
    tau_b = with_b[tau_column].to_numpy(dtype=float).round(2)
    pairs = set(zip(supported["policy_a"], supported["policy_b"]))
    return {
        "rq1_azure_bailian": bool(np.all(tau_ab >= 0.89)),
        "rq1_burstgpt_apart": bool(np.all(tau_b <= 0.71)),
        "rq2_rare": bool(len(supported) < 0.05 * n_tests),
        "rq2_slai_vllm": bool(len(supported) > 0 and pairs <= {("slai_faithful", "vllm_faithful")}),
        "rq2_burstgpt": bool(len(supported) > 0 and ((supported["source_x"] == burstgpt)
                                                     | (supported["source_y"] == burstgpt)).all()),
        "rq2_heavy": bool(len(supported) > 0 and not (supported["region"] == "LOW").any()),
        "rq3_metric_flips": bool(top1_change_rate > 0.5),
    }
