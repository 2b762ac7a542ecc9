"""The window bootstrap and what is read from it: resampled means, intervals, adjusted p-values.

A bootstrap resample of n windows is a row of draw counts, so the means of every resample are one
matrix product ``counts @ values`` (:func:`_weighted_means`); the jackknife is the same product
with one window left out per row. From the resampled statistics come percentile and BCa intervals
(:class:`ConfidenceInterval`); a family of p-values is adjusted with Benjamini–Hochberg. Randomness
comes only from the seed handed to :func:`_rng`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
from scipy import special
from scipy import stats as sps


@dataclasses.dataclass(frozen=True)
class ConfidenceInterval:
    low: float
    high: float

    def excludes(self, value: float = 0.0) -> bool:
        """True when ``value`` lies strictly outside the interval (a bound equal to it includes it)."""
        return bool(self.low > value or self.high < value)


_NAN_CI = ConfidenceInterval(math.nan, math.nan)


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


def paired_difference(a, b, *, n_resamples: int = 2000, seed=0,
                      confidence_level: float = 0.95) -> tuple[float, ConfidenceInterval]:
    """The mean of ``a − b`` over windows (two equal-length arrays, one value per window, paired) and
    its percentile interval from resampling the windows; windows where either is NaN are left out."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return math.nan, _NAN_CI
    means = _weighted_means(_count_matrix(_rng(seed), d.size, n_resamples), d[:, None])[:, 0]
    return float(d.mean()), _percentile_interval(means, confidence_level)


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


def point_means(values: np.ndarray) -> np.ndarray:
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


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def _column_quantiles(x: np.ndarray, q) -> np.ndarray:
    """Quantiles ``q`` of each column over its finite entries; NaN for a column with none."""
    with warnings.catch_warnings():
        # a pair undefined in every resample has no interval: NaN is the answer, not a problem
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(np.where(np.isfinite(x), x, np.nan), q, axis=0)
