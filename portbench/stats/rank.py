"""Rankings as arrays: pairwise signs, Kendall τ_b and the top-1 policy.

The arithmetic every comparison of rankings shares. A ranking is a vector of policy means (policies in
alphabetical order); its pairwise signs sign(v_i − v_j) for i < j carry the whole order, so τ_b
between two rankings — or between thousands of resampled rankings at once — is a product of sign
arrays. Two means closer than :data:`TIE_RTOL` (relative) are tied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Relative tolerance under which two (resampled) means count as tied.
TIE_RTOL = 1e-12


def _pair_index(n: int):
    return np.triu_indices(n, 1)


def pair_signs(values: np.ndarray, rtol: float = TIE_RTOL) -> np.ndarray:
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


def tau_from_signs(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """τ_b from pairwise signs (last axis = pairs); pairs undefined on either side are left out."""
    valid = ~(np.isnan(sx) | np.isnan(sy))
    sx = np.where(valid, sx, 0.0)
    sy = np.where(valid, sy, 0.0)
    return _tau_from_counts((sx * sy).sum(axis=-1), np.count_nonzero(sx, axis=-1),
                            np.count_nonzero(sy, axis=-1))


def _tau_from_counts(num, n1, n2) -> np.ndarray:
    """τ_b from Σ sx·sy and the counts of non-zero signs on each side (all over the defined pairs)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = num / np.sqrt(n1.astype(float) * n2)
    # n1 == 0 (or n2 == 0): one side is constant, τ_b undefined.
    return np.where((n1 > 0) & (n2 > 0), np.clip(tau, -1.0, 1.0), np.nan)


def _tau_rows(x: np.ndarray, y: np.ndarray, rtol: float = TIE_RTOL) -> np.ndarray:
    """τ_b between matching rows of x and y (…, n_items), all at once; NaN items left out."""
    return tau_from_signs(pair_signs(x, rtol), pair_signs(y, rtol))


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


def top1_of(values: np.ndarray, policies: Sequence[str], higher_is_better: bool = True,
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
