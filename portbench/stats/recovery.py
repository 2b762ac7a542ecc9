"""Sample complexity: how often a draw of n windows recovers the ranking all windows give.

:func:`sample_complexity` draws n windows without replacement many times per n and counts the draws
whose n-window means order the policies as the all-window means do (the whole order, and the top-1).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..metrics import METRICS
from .bootstrap import point_means, _rng, _weighted_means
from .rank import TIE_RTOL, pair_signs, top1_of
from .table import BASE_SLO, _policies, table_regions, select_cells, window_matrix


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
    sub = select_cells(table, source=source, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    sign = 1.0 if (METRICS.get(metric, True) or not direction_aware) else -1.0
    if pool_regions:
        groups = [("ALL", sub)]
    else:
        groups = [(r, sub[sub["region"] == r]) for r in table_regions(sub, regions)]
    rows = []
    for region, part in groups:
        v = sign * window_matrix(part, metric, pols).to_numpy()
        nw = v.shape[0]
        ref = point_means(v) if nw else np.full(len(pols), np.nan)
        keep = np.isfinite(ref)
        ref_signs = pair_signs(ref[keep])
        ref_top = top1_of(ref[keep], range(int(keep.sum())))[0]
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
            s = pair_signs(means)
            # i (alphabetically first) precedes j iff v_i ≥ v_j: compare "≥" patterns, not signs
            same = np.all(np.where(np.isnan(s), False, (s >= 0) == (ref_signs >= 0)), axis=1)
            full = same & np.all(np.isfinite(means), axis=1)
            best = np.nanmax(np.where(np.isfinite(means), means, -np.inf), axis=1, keepdims=True)
            near = np.isfinite(means) & (means >= best - TIE_RTOL * np.abs(best))
            top = np.argmax(near, axis=1)
            rows.append({**row, "p_full": float(full.mean()), "p_top1": float((top == ref_top).mean())})
    return pd.DataFrame(rows)
