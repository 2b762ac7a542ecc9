"""Agreement of several rankings at once: Kendall's W across sources and Friedman's test.

:func:`kendalls_w` (tie-corrected, permutation p-value) over a raters × items matrix;
:func:`source_concordance` and :func:`leave_one_source_out` apply it to the sources' policy means of
one (metric, region). :func:`friedman` asks whether the policies differ at all, with the windows as
blocks, and gives Nemenyi and Conover post-hoc p-values.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from ..metrics import METRICS
from .bootstrap import point_means, _rng
from .rank import _tau_rows
from .table import BASE_SLO, _policies, select_cells, table_sources, window_matrix


@dataclasses.dataclass(frozen=True)
class KendallW:
    """Kendall's W (tie-corrected) with a permutation p-value and the χ² approximation."""

    statistic: float
    pvalue: float
    chi2_pvalue: float
    n_raters: int
    n_items: int
    n_permutations: int


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
# Kendall's W

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
    sub = select_cells(table, region=region, slo_multiplier=slo_multiplier)
    sources = table_sources(sub, sources)
    pols = _policies(sub, policies)
    rows = [point_means(window_matrix(sub[sub["source"] == s], metric, pols).to_numpy())
            for s in sources]
    return kendalls_w(np.vstack(rows), n_permutations=n_permutations, seed=seed)


def leave_one_source_out(table: pd.DataFrame, metric: str, region: str, *, sources=None,
                         policies=None, n_permutations: int = 9999, seed=0,
                         slo_multiplier=BASE_SLO) -> pd.DataFrame:
    """W of the remaining sources with each source left out in turn (τ_b too when two remain)."""
    sub = select_cells(table, region=region, slo_multiplier=slo_multiplier)
    sources = table_sources(sub, sources)
    pols = _policies(sub, policies)
    means = {s: point_means(window_matrix(sub[sub["source"] == s], metric, pols).to_numpy())
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
# Friedman with post-hoc tests

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
    sub = select_cells(table, region=region, source=source, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    v = window_matrix(sub, metric, pols, keys=("source", "window_id"))
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
