"""Pairwise reversals between sources: where policy A beats B on one source and B beats A on another.

:func:`reversals` classifies every policy pair × source pair of one (metric, region) into
:data:`REVERSAL_CLASSES` — undefined, stable, microscopic, unsupported (wide CI) or supported
practical reversal — from the per-source mean differences, their margins and per-source bootstrap
intervals, with Benjamini–Hochberg over the family. :func:`reversal_analysis` runs it for many
(metric, region) families and :func:`reversal_counts` tallies the classes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from ..metrics import METRICS
from .bootstrap import (_column_quantiles, _count_matrix, point_means, _rng, _weighted_means,
                        benjamini_hochberg)
from .rank import _pair_index
from .table import BASE_SLO, _policies, table_regions, select_cells, table_sources, window_matrix

#: Reversal classes, in the order in which the classifier decides them.
REVERSAL_CLASSES = ("UNDEFINED", "STABLE", "MICROSCOPIC", "UNSUPPORTED_WIDE_CI",
                    "SUPPORTED_PRACTICAL_REVERSAL")


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
    sub = select_cells(table, region=region, slo_multiplier=slo_multiplier)
    sources = table_sources(sub, sources)
    pols = _policies(sub, policies)
    ii, jj = _pair_index(len(pols))
    rng = _rng(seed)
    alpha = (1 - confidence_level) / 2
    per = {}
    for s in sources:
        v = window_matrix(sub[sub["source"] == s], metric, pols).to_numpy()
        means = point_means(v) if len(v) else np.full(len(pols), np.nan)
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


def reversal_analysis(table: pd.DataFrame, metrics=("anwg",), regions=None, **kwargs) -> pd.DataFrame:
    """:func:`reversals` for every metric × region (each family seeded afresh with ``seed``)."""
    regions = table_regions(table, regions)
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
