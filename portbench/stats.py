"""Statistics of the portability study: rankings, their agreement and their reversals.

Plain functions over the campaign's tidy table (one row per (source, window_id, region, policy,
slo_multiplier) cell, one column per metric; see :data:`portbench.campaign.RESULT_COLUMNS`) or over
numpy arrays, returning small frozen result objects or tidy frames. Conventions shared by all:

- The unit is the window. Rows that repeat a (window, policy) cell are averaged over their defined
  values first. A condition value is the mean over the windows where the metric is defined; NaN
  (undefined) is never imputed, and a policy with no defined window leaves that condition's ranking.
- Policies are always handled in alphabetical order; a pair (a, b) has a < b and Δ = a − b. Top-1
  ties are broken by the alphabetically first policy id (the original's rule) and reported.
- Randomness comes only from the ``seed`` argument (an int or a ``numpy.random.Generator``). Each
  condition or family is seeded afresh from it, so a condition's numbers do not depend on which
  other conditions were computed in the same call.
- Bootstraps are vectorised: a resample is a row of window counts, so all resampled means are one
  matrix product ``counts @ values`` and Kendall τ_b for all resamples comes from pairwise sign
  comparisons in numpy.
- Two means closer than ``TIE_RTOL`` (relative) count as tied in the table-based functions: the
  same values summed in a different order (by the BLAS kernel, say) must not break a real tie.
  :func:`kendall_tau_b` itself is exact by default, like scipy.
- ``slo_multiplier`` selects rows of one SLO definition (default: the base 20×); ``None`` means no
  filter and is refused when the table holds several multipliers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import special
from scipy import stats as sps

from .metrics import METRICS
from .workload import BASE_SLO_MULTIPLIER

BASE_SLO = BASE_SLO_MULTIPLIER
#: Relative tolerance under which two (resampled) means count as tied.
TIE_RTOL = 1e-12
#: Reversal classes, in the order in which the classifier decides them.
REVERSAL_CLASSES = ("UNDEFINED", "STABLE", "MICROSCOPIC", "UNSUPPORTED_WIDE_CI",
                    "SUPPORTED_PRACTICAL_REVERSAL")


# ---------------------------------------------------------------------------------------------
# Result objects

@dataclasses.dataclass(frozen=True)
class ConfidenceInterval:
    low: float
    high: float

    def excludes(self, value: float = 0.0) -> bool:
        """True when ``value`` lies strictly outside the interval (a bound equal to it includes it)."""
        return bool(self.low > value or self.high < value)


_NAN_CI = ConfidenceInterval(math.nan, math.nan)


@dataclasses.dataclass(frozen=True)
class ConditionMeans:
    """Policy × condition means over windows.

    ``means``, ``n_windows`` (defined windows) and ``n_excluded`` (windows whose value is undefined)
    are frames indexed by policy with one column per condition; ``n_excluded_total`` sums the last.
    """

    means: pd.DataFrame = dataclasses.field(compare=False)
    n_windows: pd.DataFrame = dataclasses.field(compare=False)
    n_excluded: pd.DataFrame = dataclasses.field(compare=False)
    n_excluded_total: int = 0


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
class KendallW:
    """Kendall's W (tie-corrected) with a permutation p-value and the χ² approximation."""

    statistic: float
    pvalue: float
    chi2_pvalue: float
    n_raters: int
    n_items: int
    n_permutations: int


@dataclasses.dataclass(frozen=True)
class CrossMetricResult:
    """One (source, region): per metric-pair τ_b rows in ``pairs`` and their summary."""

    pairs: pd.DataFrame = dataclasses.field(compare=False)
    median_tau: float = math.nan
    share_negative: float = math.nan
    top1_agreement: float = math.nan
    n_defined: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class FriedmanResult:
    """Friedman omnibus test with Nemenyi and Conover post-hoc p-value matrices.

    ``mean_ranks``: rank 1 = best (metric orientation applied). ``policies``: those defined in every
    block (the others are in ``dropped_policies``). Post-hoc p-values are unadjusted.
    """

    statistic: float
    pvalue: float
    n_blocks: int
    n_policies: int
    policies: tuple
    dropped_policies: tuple
    mean_ranks: pd.Series
    nemenyi: pd.DataFrame
    conover: pd.DataFrame


# ---------------------------------------------------------------------------------------------
# Small numeric pieces

def benjamini_hochberg(p) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (same shape) from ``scipy.stats.false_discovery_control``.

    NaN entries stay NaN and are not counted in the family; p-values outside [0, 1] are refused.
    """
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    keep = ~np.isnan(p)
    if keep.any():
        # scipy refuses NaN, so the family is the defined entries only
        out[keep] = sps.false_discovery_control(p[keep], method="bh")
    return out


def _pair_index(n: int):
    return np.triu_indices(n, 1)


def _signs(values: np.ndarray, rtol: float = TIE_RTOL) -> np.ndarray:
    """sign(v_i − v_j) for all i < j along the last axis; NaN where either is NaN.

    Differences within ``rtol`` of the larger magnitude count as ties (0).
    """
    i, j = _pair_index(values.shape[-1])
    a, b = values[..., i], values[..., j]
    d = a - b
    s = np.sign(d)
    if rtol > 0:
        with np.errstate(invalid="ignore"):
            s[np.abs(d) <= rtol * np.maximum(np.abs(a), np.abs(b))] = 0.0
    return s


def _tau_from_signs(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """τ_b from pairwise signs (last axis = pairs); pairs undefined on either side are left out."""
    valid = ~(np.isnan(sx) | np.isnan(sy))
    sx = np.where(valid, sx, 0.0)
    sy = np.where(valid, sy, 0.0)
    num = (sx * sy).sum(axis=-1)
    n1 = np.count_nonzero(sx, axis=-1)
    n2 = np.count_nonzero(sy, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = num / np.sqrt(n1.astype(float) * n2)
    # n1 == 0 (or n2 == 0): one side is constant, τ_b undefined.
    return np.where((n1 > 0) & (n2 > 0), np.clip(tau, -1.0, 1.0), np.nan)


def _tau_rows(x: np.ndarray, y: np.ndarray, rtol: float = TIE_RTOL) -> np.ndarray:
    """τ_b between matching rows of x and y (…, n_items), all at once; NaN items left out."""
    return _tau_from_signs(_signs(x, rtol), _signs(y, rtol))


def kendall_tau_b(x, y, *, rtol: float = 0.0) -> float:
    """Kendall τ_b with ties; equals ``scipy.stats.kendalltau(x, y, variant="b").statistic``.

    Positions where either side is NaN are left out (an undefined policy leaves the ranking).
    NaN when fewer than two positions remain or one side is constant.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be 1-D and of the same length")
    keep = ~(np.isnan(x) | np.isnan(y))
    if keep.sum() < 2:
        return math.nan
    return float(_tau_rows(x[keep], y[keep], rtol))


def bca_interval(theta_hat: float, bootstrap_distribution, jackknife, confidence_level: float = 0.95):
    """BCa interval from a bootstrap distribution and jackknife values; returns (interval, z0, a).

    ``jackknife`` is a sequence with one array per independently resampled sample (the statistic
    with one observation of that sample left out), as in scipy's multi-sample BCa. z0 counts
    resamples equal to θ̂ as half below (scipy's rule; it matters for a discrete statistic like τ).
    When every jackknife value is equal there is no skewness information and a = 0.
    Non-finite resamples and jackknife values are ignored. Matches ``scipy.stats.bootstrap(...,
    method="BCa")`` given the same resamples.
    """
    boot = np.asarray(bootstrap_distribution, dtype=float)
    boot = boot[np.isfinite(boot)]
    if not np.isfinite(theta_hat) or boot.size == 0:
        return _NAN_CI, math.nan, math.nan
    share = (np.count_nonzero(boot < theta_hat) + np.count_nonzero(boot <= theta_hat)) / (2 * boot.size)
    z0 = float(special.ndtri(share))
    num = den = 0.0
    for jack in jackknife:
        jack = np.asarray(jack, dtype=float)
        jack = jack[np.isfinite(jack)]
        n = jack.size
        if n < 2:
            continue
        u = (n - 1) * (jack.mean() - jack)
        num += (u ** 3).sum() / n ** 3
        den += (u ** 2).sum() / n ** 2
    a = num / (6 * den ** 1.5) if den > 0 else 0.0
    alpha = (1 - confidence_level) / 2
    z = np.array([special.ndtri(alpha), -special.ndtri(alpha)])
    with np.errstate(invalid="ignore", divide="ignore"):
        levels = special.ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))
    if not np.all(np.isfinite(levels)):
        return _NAN_CI, z0, a
    low, high = np.quantile(boot, levels)
    return ConfidenceInterval(float(low), float(high)), z0, float(a)


def _percentile_interval(boot: np.ndarray, confidence_level: float) -> ConfidenceInterval:
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return _NAN_CI
    alpha = (1 - confidence_level) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha])
    return ConfidenceInterval(float(low), float(high))


def _count_matrix(rng: np.random.Generator, n: int, n_resamples: int) -> np.ndarray:
    """Bootstrap resamples of n windows as a (n_resamples, n) matrix of draw counts."""
    idx = rng.integers(0, n, size=(n_resamples, n))
    flat = idx + n * np.arange(n_resamples)[:, None]
    return np.bincount(flat.ravel(), minlength=n_resamples * n).reshape(n_resamples, n).astype(float)


def _weighted_means(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Means of the columns of ``values`` (windows × k) under each row of window ``weights``.

    Undefined (NaN) values carry no weight; a column with no defined window gets NaN.
    """
    defined = ~np.isnan(values)
    total = weights @ np.where(defined, values, 0.0)
    count = weights @ defined.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.where(count > 0, count, 1.0), np.nan)


def _point_means(values: np.ndarray) -> np.ndarray:
    """Column means over defined values, NaN for a column with none.

    A plain column reduction rather than a BLAS product: identical columns give bit-identical
    means, so an exact tie between policies (Δ = 0 in the reversal classifier) stays exact.
    """
    defined = ~np.isnan(values)
    count = defined.sum(axis=0)
    total = np.where(defined, values, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _jackknife_weights(n: int) -> np.ndarray:
    return 1.0 - np.eye(n)


def _top1(values: np.ndarray, policies: Sequence[str], higher_is_better: bool = True,
          rtol: float = TIE_RTOL):
    """Best policy (ties: alphabetically first; ``policies`` is sorted) and whether it was tied."""
    v = np.asarray(values, dtype=float)
    v = v if higher_is_better else -v
    finite = np.isfinite(v)
    if not finite.any():
        return None, False
    best = v[finite].max()
    near = finite & (v >= best - rtol * abs(best))
    return policies[int(np.argmax(near))], bool(near.sum() > 1)


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# Table access

def _select(table: pd.DataFrame, *, region=None, source=None, slo_multiplier=BASE_SLO) -> pd.DataFrame:
    if "engine_model" in table.columns and table["engine_model"].nunique() > 1:
        raise ValueError("the table mixes engine models; analyse one at a time")
    mask = np.ones(len(table), dtype=bool)
    for column, wanted in (("region", region), ("source", source)):
        if wanted is None:
            continue
        if isinstance(wanted, str):
            mask &= (table[column] == wanted).to_numpy()
        else:
            mask &= table[column].isin(list(wanted)).to_numpy()
    if "slo_multiplier" in table.columns:
        slo = table["slo_multiplier"].to_numpy(dtype=float)
        if slo_multiplier is None:
            if np.unique(slo[mask]).size > 1:
                raise ValueError("the table holds several SLO multipliers: pass slo_multiplier")
        else:
            mask &= np.isclose(slo, float(slo_multiplier))
    return table[mask]


def _policies(table: pd.DataFrame, policies) -> tuple:
    names = table["policy"].unique() if policies is None else policies
    return tuple(sorted(str(p) for p in names))


def _sources(table: pd.DataFrame, sources) -> tuple:
    names = table["source"].unique() if sources is None else sources
    return tuple(sorted(str(s) for s in names))


def _regions(table: pd.DataFrame, regions) -> tuple:
    """Regions by increasing load factor when the table has it, else alphabetically."""
    if regions is not None:
        return tuple(regions)
    if "region_factor" in table.columns:
        order = table.groupby("region")["region_factor"].first().sort_values(kind="stable")
        return tuple(order.index)
    return tuple(sorted(table["region"].unique()))


def _window_matrix(sub: pd.DataFrame, metric, policies, keys=("window_id",)) -> pd.DataFrame:
    """windows × policies of ``metric`` (repeated cells averaged over defined values).

    ``metric`` may be a list, giving a (policy-major, metric) column MultiIndex per metric.
    """
    if isinstance(metric, str):
        if metric not in sub.columns:
            raise KeyError(f"no metric column {metric!r}")
        g = sub.groupby(list(keys) + ["policy"], sort=True)[metric].mean()
        return g.unstack("policy").reindex(columns=list(policies)).astype(float)
    g = sub.groupby(list(keys) + ["policy"], sort=True)[list(metric)].mean()
    frame = g.unstack("policy")
    cols = pd.MultiIndex.from_product([list(metric), list(policies)])
    return frame.reindex(columns=cols).astype(float)


# ---------------------------------------------------------------------------------------------
# 1. Condition means

def condition_means(table: pd.DataFrame, metric: str, by=("source", "region"), *, policies=None,
                    slo_multiplier=BASE_SLO) -> ConditionMeans:
    """Policy × condition means of ``metric`` over windows, undefined values excluded and counted.

    A cell counts as excluded when its (repetition-averaged) value is NaN; ``n_windows`` counts the
    windows that entered the mean.
    """
    by = [by] if isinstance(by, str) else list(by)
    sub = _select(table, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    sub = sub[sub["policy"].isin(pols)]
    per_window = sub.groupby(by + ["window_id", "policy"], sort=True)[metric].mean()
    grouped = per_window.groupby(level=by + ["policy"], sort=True)
    means = grouped.mean().unstack(by).reindex(list(pols))
    n_def = grouped.count().unstack(by).reindex(list(pols)).fillna(0).astype(int)
    n_nan = (grouped.size() - grouped.count()).unstack(by).reindex(list(pols)).fillna(0).astype(int)
    return ConditionMeans(means, n_def, n_nan, int(n_nan.to_numpy().sum()))


# ---------------------------------------------------------------------------------------------
# 3. Two rankings compared (cross-source, temporal, SLO variants)

def _compare(va: np.ndarray, vb: np.ndarray, policies: tuple, higher_is_better: bool, *,
             paired: bool, n_resamples: int, rng: np.random.Generator,
             confidence_level: float) -> TauComparison:
    """τ_b between the policy means of two window matrices, with percentile and BCa intervals.

    Unpaired: windows are resampled independently on each side and the jackknife leaves out one
    window of either side (two-sample BCa). Paired: one resample of the shared windows serves both.
    """
    ma, mb = _point_means(va), _point_means(vb)
    common = np.isfinite(ma) & np.isfinite(mb)
    pols = tuple(p for p, c in zip(policies, common) if c)
    top_a = _top1(ma[common], pols, higher_is_better)
    top_b = _top1(mb[common], pols, higher_is_better)
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
        sa, sb = _signs(ma), _signs(mb)
        jack = [_tau_from_signs(_signs(_weighted_means(_jackknife_weights(na), va)), sb),
                _tau_from_signs(sa, _signs(_weighted_means(_jackknife_weights(nb), vb)))]
    pct = _percentile_interval(boot, confidence_level)
    bca, z0, acc = bca_interval(tau, boot, jack, confidence_level)
    pvalue = float(sps.kendalltau(ma, mb, variant="b").pvalue) if np.isfinite(tau) else math.nan
    return TauComparison(tau, pvalue, pct, bca, len(pols), na, nb, n_resamples,
                         int(np.isfinite(boot).sum()), z0, acc, top_a[0], top_b[0], top_a[1],
                         top_b[1], pols, boot)


def cross_source_tau(table: pd.DataFrame, metric: str, region: str, source_a: str, source_b: str, *,
                     n_resamples: int = 2000, seed=0, confidence_level: float = 0.95,
                     policies=None, slo_multiplier=BASE_SLO) -> TauComparison:
    """Kendall τ_b between two sources' policy means in one region, bootstrapped over windows.

    Windows are resampled independently within each source (the original's scheme); a resample
    where one side is constant (τ undefined) is skipped. Policies are those defined on both sides.
    """
    sub = _select(table, region=region, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    va = _window_matrix(sub[sub["source"] == source_a], metric, pols).to_numpy()
    vb = _window_matrix(sub[sub["source"] == source_b], metric, pols).to_numpy()
    return _compare(va, vb, pols, METRICS.get(metric, True), paired=False,
                    n_resamples=n_resamples, rng=_rng(seed), confidence_level=confidence_level)


def cross_source_table(table: pd.DataFrame, metrics=("anwg",), regions=None, sources=None, *,
                       n_resamples: int = 2000, seed=0, confidence_level: float = 0.95,
                       fdr_q: float = 0.05, policies=None, slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """:func:`cross_source_tau` for every metric × region × source pair, one row each.

    ``q`` is the BH-adjusted Kendall p-value within each (metric, region) family of source pairs.
    """
    regions = _regions(table, regions)
    sources = _sources(table, sources)
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
# 4. Kendall's W

def _tie_term(ranks: np.ndarray) -> float:
    total = 0.0
    for row in ranks:
        _, t = np.unique(row, return_counts=True)
        total += float((t ** 3 - t).sum())
    return total


def _w_from_ranks(ranks: np.ndarray, tie_term: float) -> np.ndarray:
    m, n = ranks.shape[-2:]
    rsum = ranks.sum(axis=-2)
    s = ((rsum - rsum.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    den = m ** 2 * (n ** 3 - n) - m * tie_term
    return 12.0 * s / den if den > 0 else np.full(np.shape(s), np.nan)


def kendalls_w(matrix, *, n_permutations: int = 9999, seed=0) -> KendallW:
    """Kendall's W of agreement, rows = raters (sources), columns = items (policies).

    Ties get average ranks and the usual correction (m²(n³−n) − mΣ(t³−t) in the denominator).
    Columns with any NaN are dropped. The permutation p-value shuffles each row's ranks
    independently (seeded): p = (1 + #{W* ≥ W}) / (1 + n_permutations). ``chi2_pvalue`` uses
    m(n−1)W ~ χ²(n−1).
    """
    x = np.asarray(matrix, dtype=float)
    if x.ndim != 2:
        raise ValueError("matrix must be 2-D (raters × items)")
    x = x[:, ~np.isnan(x).any(axis=0)]
    m, n = x.shape
    if m < 2 or n < 2:
        return KendallW(math.nan, math.nan, math.nan, m, n, 0)
    ranks = sps.rankdata(x, axis=1)
    ties = _tie_term(ranks)
    w = float(_w_from_ranks(ranks, ties))
    if not np.isfinite(w):
        return KendallW(math.nan, math.nan, math.nan, m, n, 0)
    chi2_p = float(sps.chi2.sf(m * (n - 1) * w, n - 1))
    p = math.nan
    if n_permutations > 0:
        rng = _rng(seed)
        shuffled = rng.permuted(np.broadcast_to(ranks, (n_permutations, m, n)), axis=-1)
        w_perm = _w_from_ranks(shuffled, ties)
        # a tolerance so permutations reproducing W exactly are counted despite rounding
        p = (1 + np.count_nonzero(w_perm >= w - 1e-12)) / (1 + n_permutations)
    return KendallW(w, float(p), chi2_p, m, n, int(n_permutations))


def source_concordance(table: pd.DataFrame, metric: str, region: str, *, sources=None, policies=None,
                       n_permutations: int = 9999, seed=0, slo_multiplier=BASE_SLO) -> KendallW:
    """Kendall's W across sources of the policy means of one (metric, region)."""
    sub = _select(table, region=region, slo_multiplier=slo_multiplier)
    sources = _sources(sub, sources)
    pols = _policies(sub, policies)
    rows = [_point_means(_window_matrix(sub[sub["source"] == s], metric, pols).to_numpy())
            for s in sources]
    return kendalls_w(np.vstack(rows), n_permutations=n_permutations, seed=seed)


def leave_one_source_out(table: pd.DataFrame, metric: str, region: str, *, sources=None,
                         policies=None, n_permutations: int = 9999, seed=0,
                         slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """W of the remaining sources with each source left out in turn (τ_b too when two remain)."""
    sub = _select(table, region=region, slo_multiplier=slo_multiplier)
    sources = _sources(sub, sources)
    pols = _policies(sub, policies)
    means = {s: _point_means(_window_matrix(sub[sub["source"] == s], metric, pols).to_numpy())
             for s in sources}
    rows = []
    for out in sources:
        kept = [s for s in sources if s != out]
        res = kendalls_w(np.vstack([means[s] for s in kept]), n_permutations=n_permutations, seed=seed)
        tau = (float(_tau_rows(means[kept[0]], means[kept[1]])) if len(kept) == 2 else math.nan)
        rows.append({"left_out": out, "sources": ",".join(kept), "w": res.statistic,
                     "pvalue": res.pvalue, "n_policies": res.n_items, "tau_b": tau})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# 5. Reversals

def reversals(table: pd.DataFrame, metric: str, region: str, *, sources=None, policies=None,
              n_resamples: int = 2000, seed=0, margin: float = 0.10, absolute_floor: float | None = None,
              direction_aware: bool = False, confidence_level: float = 0.95, fdr_q: float = 0.05,
              slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """Classify every policy pair × source pair of one (metric, region); one row per test.

    Per source, Δ = mean_a − mean_b (condition means). ``margin_x`` = |Δ| ÷ |loser|, where the loser
    is the policy with the *lower raw value* — the original's rule, kept by default although for a
    lower-is-better metric that is the better policy; ``direction_aware=True`` takes the worse
    policy under the metric's orientation instead. Classes, decided in this order:

    1. UNDEFINED: a mean is missing in either source, or the loser's mean is 0 in either.
    2. STABLE: unless both Δ are nonzero with opposite signs (exact ties are stable).
    3. MICROSCOPIC: unless margin > ``margin`` in both sources (and |Δ| > ``absolute_floor`` in
       both, when given: our sensitivity knob, not in the original).
    4. SUPPORTED_PRACTICAL_REVERSAL when the bootstrap CI of the per-window paired difference
       excludes 0 in both sources (a bound equal to 0 includes it), else UNSUPPORTED_WIDE_CI.

    Bootstrap (per source, all pairs at once): windows are resampled with replacement; windows
    where either policy is undefined carry no weight; percentile CI. p-value per source (our
    definition; the original's is not public): p = min(1, 2·min(share of resampled mean
    differences ≤ 0, share ≥ 0)). The test's p = max(p_x, p_y) (intersection–union), BH-adjusted
    (``q``) over all tests of the family with a finite p; ``bh`` = q ≤ ``fdr_q``.
    """
    sub = _select(table, region=region, slo_multiplier=slo_multiplier)
    sources = _sources(sub, sources)
    pols = _policies(sub, policies)
    ii, jj = _pair_index(len(pols))
    rng = _rng(seed)
    alpha = (1 - confidence_level) / 2
    per = {}
    for s in sources:
        v = _window_matrix(sub[sub["source"] == s], metric, pols).to_numpy()
        means = _point_means(v) if len(v) else np.full(len(pols), np.nan)
        diff = v[:, ii] - v[:, jj]                       # windows × pairs, NaN unless both defined
        n_paired = np.count_nonzero(~np.isnan(diff), axis=0)
        if len(v):
            boot = _weighted_means(_count_matrix(rng, len(v), n_resamples), diff)
        else:
            boot = np.full((n_resamples, len(ii)), np.nan)
        finite = np.isfinite(boot)
        n_fin = finite.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            le = np.where(finite, boot <= 0, False).sum(axis=0) / n_fin
            ge = np.where(finite, boot >= 0, False).sum(axis=0) / n_fin
        p = np.where(n_fin > 0, np.minimum(1.0, 2 * np.minimum(le, ge)), np.nan)
        ci = _column_quantiles(boot, [alpha, 1 - alpha])
        per[s] = {"a": means[ii], "b": means[jj], "n": n_paired, "p": p, "lo": ci[0], "hi": ci[1]}
    orient = METRICS.get(metric, True)
    frames = []
    for sx, sy in itertools.combinations(sources, 2):
        cols = {"metric": metric, "region": region, "policy_a": np.array(pols)[ii],
                "policy_b": np.array(pols)[jj], "source_x": sx, "source_y": sy}
        deltas, margins, losers = {}, {}, {}
        for tag, s in (("x", sx), ("y", sy)):
            d = per[s]
            delta = d["a"] - d["b"]
            if direction_aware and not orient:
                loser = np.maximum(d["a"], d["b"])
            else:
                loser = np.minimum(d["a"], d["b"])
            with np.errstate(invalid="ignore", divide="ignore"):
                mg = np.where(delta == 0, 0.0, np.abs(delta) / np.abs(loser))
            deltas[tag], margins[tag], losers[tag] = delta, mg, loser
            cols.update({f"mean_a_{tag}": d["a"], f"mean_b_{tag}": d["b"], f"delta_{tag}": delta,
                         f"margin_{tag}": mg, f"ci_low_{tag}": d["lo"], f"ci_high_{tag}": d["hi"],
                         f"p_{tag}": d["p"], f"n_windows_{tag}": d["n"]})
        dx, dy = deltas["x"], deltas["y"]
        undefined = (np.isnan(dx) | np.isnan(dy) | np.isnan(losers["x"]) | np.isnan(losers["y"])
                     | (losers["x"] == 0) | (losers["y"] == 0))
        flip = (dx != 0) & (dy != 0) & (np.sign(dx) != np.sign(dy))
        practical = (margins["x"] > margin) & (margins["y"] > margin)
        if absolute_floor is not None:
            practical &= (np.abs(dx) > absolute_floor) & (np.abs(dy) > absolute_floor)
        excl = ((cols["ci_low_x"] > 0) | (cols["ci_high_x"] < 0)) & \
               ((cols["ci_low_y"] > 0) | (cols["ci_high_y"] < 0))
        cls = np.select([undefined, ~flip, ~practical, ~excl], list(REVERSAL_CLASSES[:4]),
                        default=REVERSAL_CLASSES[4])
        cols["p"] = np.fmax(cols["p_x"], cols["p_y"])
        cols["p"][np.isnan(cols["p_x"]) | np.isnan(cols["p_y"])] = np.nan
        cols["cls"] = cls
        frames.append(pd.DataFrame(cols))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    out["q"] = benjamini_hochberg(out["p"].to_numpy())
    out["bh"] = (out["q"] <= fdr_q).fillna(False).astype(bool)
    out["cls"] = pd.Categorical(out["cls"], categories=list(REVERSAL_CLASSES), ordered=True)
    return out


def _column_quantiles(x: np.ndarray, q) -> np.ndarray:
    """Quantiles ``q`` of each column over its finite entries; NaN for a column with none."""
    with warnings.catch_warnings():
        # a pair undefined in every resample has no interval: NaN is the answer, not a problem
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(np.where(np.isfinite(x), x, np.nan), q, axis=0)


def reversal_analysis(table: pd.DataFrame, metrics=("anwg",), regions=None, **kwargs) -> pd.DataFrame:
    """:func:`reversals` for every metric × region (each family seeded afresh with ``seed``)."""
    regions = _regions(table, regions)
    frames = [reversals(table, m, r, **kwargs) for m in metrics for r in regions]
    out = pd.concat(frames, ignore_index=True)
    out["cls"] = pd.Categorical(out["cls"], categories=list(REVERSAL_CLASSES), ordered=True)
    return out


def reversal_counts(frame: pd.DataFrame, by=None) -> pd.DataFrame | pd.Series:
    """Counts of the five classes (all five always shown, in order), optionally per ``by``."""
    cls = pd.Categorical(frame["cls"], categories=list(REVERSAL_CLASSES), ordered=True)
    if by is None:
        return pd.Series(cls).value_counts(sort=False).reindex(list(REVERSAL_CLASSES))
    return (frame.assign(cls=cls).groupby(by, sort=False, observed=True)["cls"]
            .value_counts(sort=False).unstack("cls").reindex(columns=list(REVERSAL_CLASSES))
            .fillna(0).astype(int))


# ---------------------------------------------------------------------------------------------
# 6. Cross-metric

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
    sub = _select(table, source=source, region=region, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    metrics = tuple(sorted(metrics))
    frame = _window_matrix(sub, list(metrics), pols)
    x = frame.to_numpy().reshape(len(frame), len(metrics), len(pols))
    sign = np.array([1.0 if METRICS.get(m, True) else -1.0 for m in metrics])
    x = x * sign[None, :, None]
    nw, nm, npol = x.shape
    flat = x.reshape(nw, nm * npol)
    rng = _rng(seed)
    point = _point_means(flat).reshape(nm, npol) if nw else np.full((nm, npol), np.nan)
    counts = _count_matrix(rng, nw, n_resamples) if nw else np.zeros((n_resamples, 0))
    boot = _weighted_means(counts, flat).reshape(n_resamples, nm, npol)
    jack = _weighted_means(_jackknife_weights(nw), flat).reshape(nw, nm, npol)
    s_point, s_boot, s_jack = _signs(point), _signs(boot), _signs(jack)
    ii, jj = _pair_index(npol)
    rows = []
    for a, b in itertools.combinations(range(nm), 2):
        common = np.isfinite(point[a]) & np.isfinite(point[b])
        cp = tuple(p for p, c in zip(pols, common) if c)
        t1a = _top1(point[a][common], cp)
        t1b = _top1(point[b][common], cp)
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
        tau = float(_tau_from_signs(s_point[a][use], s_point[b][use]))
        tb = _tau_from_signs(s_boot[:, a][:, use], s_boot[:, b][:, use])
        tj = _tau_from_signs(s_jack[:, a][:, use], s_jack[:, b][:, use])
        pct = _percentile_interval(tb, confidence_level)
        bca = bca_interval(tau, tb, [tj], confidence_level)[0]
        row.update(tau_b=tau, ci_low=pct.low, ci_high=pct.high, bca_low=bca.low, bca_high=bca.high,
                   status="OK" if np.isfinite(tau) else "UNDEFINED_CONSTANT_RANKING")
        rows.append(row)
    pairs = pd.DataFrame(rows)
    return CrossMetricResult(pairs, **cross_metric_summary(pairs))


# ---------------------------------------------------------------------------------------------
# 7. SLO sensitivity

def slo_sensitivity(table: pd.DataFrame, *, metric: str = "anwg", base: float = BASE_SLO,
                    variants=(10.0, 40.0), sources=None, regions=None, policies=None,
                    n_resamples: int = 2000, seed=0, paired: bool = True,
                    confidence_level: float = 0.95) -> pd.DataFrame:
    """Per (source, region, variant): τ_b between the base-SLO ranking and the variant's.

    ``paired=True`` (our default) resamples the same windows on both sides, since both rankings
    come from the same windows; ``paired=False`` resamples them independently, as the original did.
    Regions default to those present under both the base and the variant.
    """
    sources = _sources(table, sources)
    pols = _policies(table, policies)
    base_rows = _select(table, slo_multiplier=base)
    rows = []
    for variant in variants:
        var_rows = _select(table, slo_multiplier=variant)
        present = set(base_rows["region"]) & set(var_rows["region"])
        for source in sources:
            for region in (r for r in _regions(table, regions) if r in present):
                vb = _window_matrix(base_rows[(base_rows["source"] == source)
                                              & (base_rows["region"] == region)], metric, pols)
                vv = _window_matrix(var_rows[(var_rows["source"] == source)
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
# 8. Sample complexity

def sample_complexity(table: pd.DataFrame, metric: str, source: str, *, sizes=(5, 10, 20, 30, 40),
                      n_draws: int = 500, seed=12345, regions=None, pool_regions: bool = False,
                      direction_aware: bool = True, policies=None,
                      slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """Probability that n windows (drawn without replacement) recover the all-window ranking.

    Per region by default; ``pool_regions=True`` reproduces the original, whose per-window value
    averages all regions of the source (one row, region "ALL"). Orders are by value, best first,
    ties to the alphabetically first id; ``direction_aware=False`` orders by raw value descending as
    the original did (it matters for top-1 of lower-is-better metrics only). ``p_full`` needs the
    whole order of the policies defined over all windows; ``p_top1`` the same best policy. With an
    int seed each n uses ``default_rng(seed + n)`` (the original's scheme), so a size's numbers do
    not depend on the other sizes asked for. Sizes above the number of windows give NaN.
    """
    sub = _select(table, source=source, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    sign = 1.0 if (METRICS.get(metric, True) or not direction_aware) else -1.0
    if pool_regions:
        groups = [("ALL", sub)]
    else:
        groups = [(r, sub[sub["region"] == r]) for r in _regions(sub, regions)]
    rows = []
    for region, part in groups:
        v = sign * _window_matrix(part, metric, pols).to_numpy()
        nw = v.shape[0]
        ref = _point_means(v) if nw else np.full(len(pols), np.nan)
        keep = np.isfinite(ref)
        ref_signs = _signs(ref[keep])
        ref_top = _top1(ref[keep], range(int(keep.sum())))[0]
        for n in sizes:
            row = {"source": source, "region": region, "n": int(n), "n_windows": nw,
                   "n_policies": int(keep.sum()), "n_draws": n_draws}
            if n > nw or n < 1 or keep.sum() < 2:
                rows.append({**row, "p_full": math.nan, "p_top1": math.nan})
                continue
            rng = _rng(seed + int(n)) if isinstance(seed, (int, np.integer)) else _rng(seed)
            order = np.argsort(rng.random((n_draws, nw)), axis=1)[:, :n]
            weights = np.zeros((n_draws, nw))
            np.put_along_axis(weights, order, 1.0, axis=1)
            means = _weighted_means(weights, v[:, keep])
            s = _signs(means)
            # i (alphabetically first) precedes j iff v_i ≥ v_j: compare "≥" patterns, not signs
            same = np.all(np.where(np.isnan(s), False, (s >= 0) == (ref_signs >= 0)), axis=1)
            full = same & np.all(np.isfinite(means), axis=1)
            best = np.nanmax(np.where(np.isfinite(means), means, -np.inf), axis=1, keepdims=True)
            near = np.isfinite(means) & (means >= best - TIE_RTOL * np.abs(best))
            top = np.argmax(near, axis=1)
            rows.append({**row, "p_full": float(full.mean()), "p_top1": float((top == ref_top).mean())})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# 9. Temporal splits

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
    sub = _select(table, source=source, region=region, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    v = _window_matrix(sub, metric, pols)
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
# 10. Friedman with post-hoc tests

def friedman(table: pd.DataFrame, metric: str, region: str, *, source=None, policies=None,
             slo_multiplier=BASE_SLO) -> FriedmanResult:
    """Friedman test over policies with windows as blocks; equals ``scipy.stats.friedmanchisquare``.

    ``source=None`` pools the windows of all sources (the original's driver); a source id or a list
    restricts the blocks. Only policies defined in every block are kept. Post-hoc: Nemenyi
    (|R̄_i − R̄_j| / √(k(k+1)/(6n)) · √2 against the studentized range with k groups and df = ∞) and
    Conover (t-test on rank sums with (n−1)(k−1) df and the tie-aware variance); both unadjusted,
    as scikit-posthocs' ``posthoc_nemenyi_friedman`` and ``posthoc_conover_friedman(p_adjust=None)``
    except that equal rank sums under zero variance give p = 1 (the library's 0/0 is NaN).
    NaN statistic when fewer than 3 policies or 2 blocks remain.
    """
    sub = _select(table, region=region, source=source, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    v = _window_matrix(sub, metric, pols, keys=("source", "window_id"))
    defined = v.notna().all(axis=0).to_numpy() if len(v) else np.zeros(len(pols), bool)
    kept = tuple(p for p, d in zip(pols, defined) if d)
    dropped = tuple(p for p, d in zip(pols, defined) if not d)
    x = v.to_numpy()[:, defined]
    n, k = x.shape
    empty = pd.DataFrame(np.nan, index=list(kept), columns=list(kept))
    if k < 3 or n < 2:
        return FriedmanResult(math.nan, math.nan, n, k, kept, dropped,
                              pd.Series(np.nan, index=list(kept)), empty, empty.copy())
    oriented = x if METRICS.get(metric, True) else -x
    ranks = sps.rankdata(-oriented, axis=1)               # 1 = best in each block
    rsum = ranks.sum(axis=0)
    ties = _tie_term(ranks)
    c = 1 - ties / (k * (k * k - 1) * n)
    with np.errstate(invalid="ignore", divide="ignore"):
        chisq = (12.0 / (k * n * (k + 1)) * (rsum ** 2).sum() - 3 * n * (k + 1)) / c
    pvalue = float(sps.chi2.sf(chisq, k - 1)) if np.isfinite(chisq) else math.nan
    diff = np.abs(rsum[:, None] - rsum[None, :])
    # Nemenyi on mean ranks
    q = diff / n / math.sqrt(k * (k + 1) / (6.0 * n))
    nem = sps.studentized_range.sf(q * math.sqrt(2.0), k, np.inf)
    # Conover (1999): A = Σ R², C = n k (k+1)²/4, T1 the tie-corrected Friedman statistic
    a_sum = float((ranks ** 2).sum())
    c1 = n * k * (k + 1) ** 2 / 4.0
    with np.errstate(invalid="ignore", divide="ignore"):
        t1 = (k - 1) * ((rsum ** 2).sum() - n * c1) / (a_sum - c1)
        var = 2 * n * (a_sum - c1) / ((n - 1) * (k - 1)) * (1 - t1 / (n * (k - 1)))
        tstat = diff / np.sqrt(max(var, 0.0))
    con = 2 * sps.t.sf(tstat, (n - 1) * (k - 1))
    for mat in (nem, con):
        mat[diff == 0] = 1.0          # equal rank sums (also 0/0 under perfect agreement)
        np.fill_diagonal(mat, 1.0)
    idx = list(kept)
    return FriedmanResult(float(chisq), pvalue, n, k, kept, dropped,
                          pd.Series(rsum / n, index=idx), pd.DataFrame(nem, index=idx, columns=idx),
                          pd.DataFrame(con, index=idx, columns=idx))
