"""Two rankings of the same policies compared with Kendall τ_b and a window bootstrap.

The rankings may come from two sources in one region (:func:`cross_source_tau`,
:func:`cross_source_table`), from two SLO definitions of the same windows (:func:`slo_sensitivity`),
from two groups of windows in time (:func:`chronological_groups`, :func:`temporal_split`) or from two
metrics in one condition (:func:`cross_metric`). Each gives τ_b on the point means with percentile
and BCa intervals, and whether the top-1 policy changed (:class:`TauComparison`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from ..metrics import METRICS
from .bootstrap import (_NAN_CI, ConfidenceInterval, _count_matrix, _jackknife_weights,
                        _percentile_interval, point_means, _rng, _weighted_means, bca_interval,
                        benjamini_hochberg)
from .rank import _pair_index, pair_signs, _tau_from_counts, tau_from_signs, _tau_rows, top1_of
from .table import BASE_SLO, _policies, table_regions, select_cells, table_sources, window_matrix


@dataclasses.dataclass(frozen=True)
class TauComparison:
    """Kendall τ_b between two rankings of the same policies, with bootstrap intervals.

    ``confidence_interval`` is the BCa interval (the percentile one is biased toward 0 when
    resampled means are re-ranked); ``pvalue`` is scipy's Kendall test on the point means.
    ``acceleration`` and ``bias_correction`` (z0) are the BCa constants.
    """

    statistic: float
    pvalue: float
    percentile_interval: ConfidenceInterval
    bca_interval: ConfidenceInterval
    n_policies: int
    n_windows_a: int
    n_windows_b: int
    n_resamples: int
    n_valid_resamples: int
    bias_correction: float
    acceleration: float
    top1_a: str | None
    top1_b: str | None
    top1_tied_a: bool
    top1_tied_b: bool
    policies: tuple = ()
    bootstrap_distribution: np.ndarray = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def confidence_interval(self) -> ConfidenceInterval:
        return self.bca_interval

    @property
    def top1_changed(self) -> bool:
        return self.top1_a != self.top1_b

    def row(self) -> dict:
        """The scalar fields, flat, for a tidy frame."""
        return {
            "tau_b": self.statistic, "pvalue": self.pvalue,
            "ci_low": self.percentile_interval.low, "ci_high": self.percentile_interval.high,
            "bca_low": self.bca_interval.low, "bca_high": self.bca_interval.high,
            "n_policies": self.n_policies, "n_windows_a": self.n_windows_a,
            "n_windows_b": self.n_windows_b, "n_valid_resamples": self.n_valid_resamples,
            "top1_a": self.top1_a, "top1_b": self.top1_b, "top1_tied_a": self.top1_tied_a,
            "top1_tied_b": self.top1_tied_b, "top1_changed": self.top1_changed,
        }


@dataclasses.dataclass(frozen=True)
class CrossMetricResult:
    """One (source, region): per metric-pair τ_b rows in ``pairs`` and their summary."""

    pairs: pd.DataFrame = dataclasses.field(compare=False)
    median_tau: float = math.nan
    share_negative: float = math.nan
    top1_agreement: float = math.nan
    n_defined: int = 0


# ---------------------------------------------------------------------------------------------
# Across sources

def _compare(va: np.ndarray, vb: np.ndarray, policies: tuple, higher_is_better: bool, *,
             paired: bool, n_resamples: int, rng: np.random.Generator,
             confidence_level: float) -> TauComparison:
    """τ_b between the policy means of two window matrices, with percentile and BCa intervals.

    Unpaired: windows are resampled independently on each side and the jackknife leaves out one
    window of either side (two-sample BCa). Paired: one resample of the shared windows serves both.
    """
    ma, mb = point_means(va), point_means(vb)
    common = np.isfinite(ma) & np.isfinite(mb)
    pols = tuple(p for p, c in zip(policies, common) if c)
    top_a = top1_of(ma[common], pols, higher_is_better)
    top_b = top1_of(mb[common], pols, higher_is_better)
    na, nb = va.shape[0], vb.shape[0]
    if common.sum() < 2:
        return TauComparison(math.nan, math.nan, _NAN_CI, _NAN_CI, int(common.sum()), na, nb,
                             n_resamples, 0, math.nan, math.nan, top_a[0], top_b[0],
                             top_a[1], top_b[1], pols, np.array([]))
    va, vb, ma, mb = va[:, common], vb[:, common], ma[common], mb[common]
    tau = float(_tau_rows(ma, mb))
    if paired:
        if na != nb:
            raise ValueError("a paired comparison needs the same windows on both sides")
        counts = _count_matrix(rng, na, n_resamples)
        boot = _tau_rows(_weighted_means(counts, va), _weighted_means(counts, vb))
        jw = _jackknife_weights(na)
        jack = [_tau_rows(_weighted_means(jw, va), _weighted_means(jw, vb))]
    else:
        ca = _count_matrix(rng, na, n_resamples)
        cb = _count_matrix(rng, nb, n_resamples)
        boot = _tau_rows(_weighted_means(ca, va), _weighted_means(cb, vb))
        sa, sb = pair_signs(ma), pair_signs(mb)
        jack = [tau_from_signs(pair_signs(_weighted_means(_jackknife_weights(na), va)), sb),
                tau_from_signs(sa, pair_signs(_weighted_means(_jackknife_weights(nb), vb)))]
    pct = _percentile_interval(boot, confidence_level)
    bca, z0, acc = bca_interval(tau, boot, jack, confidence_level)
    pvalue = float(sps.kendalltau(ma, mb, variant="b").pvalue) if np.isfinite(tau) else math.nan
    return TauComparison(tau, pvalue, pct, bca, len(pols), na, nb, n_resamples,
                         int(np.isfinite(boot).sum()), z0, acc, top_a[0], top_b[0], top_a[1],
                         top_b[1], pols, boot)


def cross_source_tau(table: pd.DataFrame, metric: str, region: str, source_a: str, source_b: str, *,
                     n_resamples: int = 2000, seed=0, confidence_level: float = 0.95,
                     policies=None, slo_multiplier=BASE_SLO, paired: bool = False) -> TauComparison:
    """Kendall τ_b between two sources' policy means in one region, bootstrapped over windows.

    Windows are resampled independently within each source (the original's scheme); a resample
    where one side is constant (τ undefined) is skipped. Policies are those defined on both sides.
    ``paired``: the two "sources" are the same windows under two conditions (labelled as sources,
    e.g. an engine setting off and on), resampled together.
    """
    sub = select_cells(table, region=region, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    va = window_matrix(sub[sub["source"] == source_a], metric, pols)
    vb = window_matrix(sub[sub["source"] == source_b], metric, pols)
    if paired and not va.index.equals(vb.index):
        raise ValueError(f"a paired comparison needs the same windows under {source_a!r} and "
                         f"{source_b!r}")
    return _compare(va.to_numpy(), vb.to_numpy(), pols, METRICS.get(metric, True), paired=paired,
                    n_resamples=n_resamples, rng=_rng(seed), confidence_level=confidence_level)


def cross_source_table(table: pd.DataFrame, metrics=("anwg",), regions=None, sources=None, *,
                       n_resamples: int = 2000, seed=0, confidence_level: float = 0.95,
                       fdr_q: float = 0.05, policies=None, slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """:func:`cross_source_tau` for every metric × region × source pair, one row each.

    ``q`` is the BH-adjusted Kendall p-value within each (metric, region) family of source pairs.
    """
    regions = table_regions(table, regions)
    sources = table_sources(table, sources)
    rows = []
    for metric in metrics:
        for region in regions:
            family = []
            for sa, sb in itertools.combinations(sources, 2):
                res = cross_source_tau(table, metric, region, sa, sb, n_resamples=n_resamples,
                                       seed=seed, confidence_level=confidence_level,
                                       policies=policies, slo_multiplier=slo_multiplier)
                family.append({"metric": metric, "region": region, "source_a": sa,
                               "source_b": sb, **res.row()})
            q = benjamini_hochberg([r["pvalue"] for r in family])
            for r, qi in zip(family, q):
                r["q"] = qi
                r["bh"] = bool(qi <= fdr_q)
            rows.extend(family)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Across SLO definitions

def slo_sensitivity(table: pd.DataFrame, *, metric: str = "anwg", base: float = BASE_SLO,
                    variants=(10.0, 40.0), sources=None, regions=None, policies=None,
                    n_resamples: int = 2000, seed=0, paired: bool = True,
                    confidence_level: float = 0.95) -> pd.DataFrame:
    """Per (source, region, variant): τ_b between the base-SLO ranking and the variant's.

    ``paired=True`` (our default) resamples the same windows on both sides, since both rankings
    come from the same windows; ``paired=False`` resamples them independently, as the original did.
    Regions default to those present under both the base and the variant.
    """
    sources = table_sources(table, sources)
    pols = _policies(table, policies)
    base_rows = select_cells(table, slo_multiplier=base)
    rows = []
    for variant in variants:
        var_rows = select_cells(table, slo_multiplier=variant)
        present = set(base_rows["region"]) & set(var_rows["region"])
        for source in sources:
            for region in (r for r in table_regions(table, regions) if r in present):
                vb = window_matrix(base_rows[(base_rows["source"] == source)
                                              & (base_rows["region"] == region)], metric, pols)
                vv = window_matrix(var_rows[(var_rows["source"] == source)
                                             & (var_rows["region"] == region)], metric, pols)
                if paired:
                    shared = vb.index.intersection(vv.index)
                    vb, vv = vb.loc[shared], vv.loc[shared]
                if vb.empty or vv.empty:
                    continue
                res = _compare(vb.to_numpy(), vv.to_numpy(), pols, METRICS.get(metric, True),
                               paired=paired, n_resamples=n_resamples, rng=_rng(seed),
                               confidence_level=confidence_level)
                rows.append({"source": source, "region": region, "base": float(base),
                             "variant": float(variant), **res.row()})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Across time

def chronological_groups(window_ids_in_time_order: Sequence[str],
                         labels=("EARLY", "LATE")) -> dict:
    """Split ordered windows into len(labels) groups by count (n // k each, the last takes the rest).

    With three labels and 40 windows this is the original's 13/13/14 terciles.
    """
    ids = list(window_ids_in_time_order)
    k = len(labels)
    size = len(ids) // k
    return {w: labels[min(pos // size, k - 1) if size else k - 1] for pos, w in enumerate(ids)}


def temporal_split(table: pd.DataFrame, metric: str, region: str, source: str,
                   groups: Mapping[str, str], *, n_resamples: int = 2000, seed=0,
                   confidence_level: float = 0.95, policies=None,
                   slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """τ_b between the rankings of window groups (e.g. early vs late) of one source and region.

    ``groups`` maps window_id → label; windows not in it are ignored. Every unordered pair of
    labels (in order of first appearance) is compared, resampling windows independently within each
    group (they are different windows), with percentile and BCa intervals.
    """
    sub = select_cells(table, source=source, region=region, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    v = window_matrix(sub, metric, pols)
    labels = list(dict.fromkeys(groups.values()))
    member = pd.Series([groups.get(w) for w in v.index], index=v.index)
    rows = []
    for ga, gb in itertools.combinations(labels, 2):
        va = v[(member == ga).to_numpy()].to_numpy()
        vb = v[(member == gb).to_numpy()].to_numpy()
        res = _compare(va, vb, pols, METRICS.get(metric, True), paired=False,
                       n_resamples=n_resamples, rng=_rng(seed), confidence_level=confidence_level)
        rows.append({"source": source, "region": region, "metric": metric, "group_a": ga,
                     "group_b": gb, **res.row()})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Across metrics

def cross_metric_summary(pairs: pd.DataFrame) -> dict:
    """Median τ_b, share of negative τ_b and top-1 agreement over the rows with τ_b defined."""
    ok = pairs[np.isfinite(pairs["tau_b"].to_numpy(dtype=float))]
    if ok.empty:
        return {"median_tau": math.nan, "share_negative": math.nan, "top1_agreement": math.nan,
                "n_defined": 0}
    return {"median_tau": float(ok["tau_b"].median()),
            "share_negative": float((ok["tau_b"] < 0).mean()),
            "top1_agreement": float(ok["top1_agree"].astype(bool).mean()),
            "n_defined": int(len(ok))}


def _metric_signs(values: np.ndarray) -> list:
    """:func:`~portbench.stats.rank.pair_signs` of ``values`` (resamples × metrics × policies), one
    metric at a time, as ``(signs, defined)``: int8 signs with the undefined pairs 0, and a boolean
    mask of the defined ones (or None when all are). τ_b's arithmetic on signs is integer, so
    :func:`_paired_tau` gives :func:`~portbench.stats.rank.tau_from_signs`'s values exactly, with a
    metric's signs worked out once for all its pairs."""
    out = []
    for m in range(values.shape[1]):
        s = pair_signs(np.ascontiguousarray(values[:, m]))
        undefined = np.isnan(s)
        out.append((np.where(undefined, 0, s).astype(np.int8), ~undefined if undefined.any() else None))
    return out


def _paired_tau(signs: list, a: int, b: int, use: np.ndarray) -> np.ndarray:
    """τ_b of each resample between metrics ``a`` and ``b`` (:func:`_metric_signs`) over the
    policy pairs ``use``, a pair undefined on either side left out (as ``tau_from_signs``)."""
    (sa, da), (sb, db) = signs[a], signs[b]
    if not use.all():
        sa, sb = sa[:, use], sb[:, use]
        da = None if da is None else da[:, use]
        db = None if db is None else db[:, use]
    if da is not None or db is not None:
        defined = da if db is None else db if da is None else da & db
        sa, sb = np.where(defined, sa, 0), np.where(defined, sb, 0)
    return _tau_from_counts(np.multiply(sa, sb, dtype=np.int8).sum(axis=-1, dtype=np.int64),
                            np.count_nonzero(sa, axis=-1), np.count_nonzero(sb, axis=-1))


def cross_metric(table: pd.DataFrame, source: str, region: str, *, metrics=tuple(METRICS),
                 policies=None, n_resamples: int = 2000, seed=0, confidence_level: float = 0.95,
                 min_policies: int = 3, slo_multiplier=BASE_SLO) -> CrossMetricResult:
    """τ_b between every pair of metrics' policy rankings in one (source, region).

    Lower-is-better metrics are negated first. Per metric pair, the policies are those defined
    under both; with fewer than ``min_policies`` τ_b is NaN (the original's rule). The bootstrap is
    paired: one window resample serves every metric. Top-1 per metric over the pair's common
    policies, ties to the alphabetically first id; ``top1_tied_*`` says whether it was tied (a
    fully tied metric "agrees" by construction, as in the original).
    """
    sub = select_cells(table, source=source, region=region, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    metrics = tuple(sorted(metrics))
    frame = window_matrix(sub, list(metrics), pols)
    x = frame.to_numpy().reshape(len(frame), len(metrics), len(pols))
    sign = np.array([1.0 if METRICS.get(m, True) else -1.0 for m in metrics])
    x = x * sign[None, :, None]
    nw, nm, npol = x.shape
    flat = x.reshape(nw, nm * npol)
    rng = _rng(seed)
    point = point_means(flat).reshape(nm, npol) if nw else np.full((nm, npol), np.nan)
    counts = _count_matrix(rng, nw, n_resamples) if nw else np.zeros((n_resamples, 0))
    boot = _weighted_means(counts, flat).reshape(n_resamples, nm, npol)
    jack = _weighted_means(_jackknife_weights(nw), flat).reshape(nw, nm, npol)
    s_point = pair_signs(point)
    # the resampled signs per metric, once: as integers with undefined pairs 0, and where defined
    s_boot, s_jack = _metric_signs(boot), _metric_signs(jack)
    ii, jj = _pair_index(npol)
    rows = []
    for a, b in itertools.combinations(range(nm), 2):
        common = np.isfinite(point[a]) & np.isfinite(point[b])
        cp = tuple(p for p, c in zip(pols, common) if c)
        t1a = top1_of(point[a][common], cp)
        t1b = top1_of(point[b][common], cp)
        row = {"source": source, "region": region, "metric_a": metrics[a], "metric_b": metrics[b],
               "n_policies": int(common.sum()), "top1_a": t1a[0], "top1_b": t1b[0],
               "top1_tied_a": t1a[1], "top1_tied_b": t1b[1],
               "top1_agree": t1a[0] is not None and t1a[0] == t1b[0]}
        if common.sum() < max(min_policies, 2):
            row.update(tau_b=math.nan, ci_low=math.nan, ci_high=math.nan, bca_low=math.nan,
                       bca_high=math.nan, status="UNDEFINED_INSUFFICIENT_COMMON_POLICIES")
            rows.append(row)
            continue
        use = common[ii] & common[jj]
        tau = float(tau_from_signs(s_point[a][use], s_point[b][use]))
        tb = _paired_tau(s_boot, a, b, use)
        tj = _paired_tau(s_jack, a, b, use)
        pct = _percentile_interval(tb, confidence_level)
        bca = bca_interval(tau, tb, [tj], confidence_level)[0]
        row.update(tau_b=tau, ci_low=pct.low, ci_high=pct.high, bca_low=bca.low, bca_high=bca.high,
                   status="OK" if np.isfinite(tau) else "UNDEFINED_CONSTANT_RANKING")
        rows.append(row)
    pairs = pd.DataFrame(rows)
    return CrossMetricResult(pairs, **cross_metric_summary(pairs))
