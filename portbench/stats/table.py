"""The campaign table as the statistics read it: rows of one condition, ids in order, window matrices.

Selects the rows of one SLO definition (and region, source), lists policies and sources
alphabetically and regions by load, and turns a condition's rows into a windows × policies matrix
of one metric (repeated cells averaged over their defined values). :func:`condition_means` gives the
policy × condition means every chapter starts from, with the undefined windows counted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..workload import BASE_SLO_MULTIPLIER

BASE_SLO = BASE_SLO_MULTIPLIER


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


def select_cells(table: pd.DataFrame, *, region=None, source=None, slo_multiplier=BASE_SLO) -> pd.DataFrame:
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


def table_sources(table: pd.DataFrame, sources) -> tuple:
    names = table["source"].unique() if sources is None else sources
    return tuple(sorted(str(s) for s in names))


def table_regions(table: pd.DataFrame, regions) -> tuple:
    """Regions by increasing load factor when the table has it, else alphabetically."""
    if regions is not None:
        return tuple(regions)
    if "region_factor" in table.columns:
        order = table.groupby("region")["region_factor"].first().sort_values(kind="stable")
        return tuple(order.index)
    return tuple(sorted(table["region"].unique()))


def window_matrix(sub: pd.DataFrame, metric, policies, keys=("window_id",)) -> pd.DataFrame:
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
# Condition means

def condition_means(table: pd.DataFrame, metric: str, by=("source", "region"), *, policies=None,
                    slo_multiplier=BASE_SLO) -> ConditionMeans:
    """Policy × condition means of ``metric`` over windows, undefined values excluded and counted.

    A cell counts as excluded when its (repetition-averaged) value is NaN; ``n_windows`` counts the
    windows that entered the mean.
    """
    by = [by] if isinstance(by, str) else list(by)
    sub = select_cells(table, slo_multiplier=slo_multiplier)
    pols = _policies(sub, policies)
    sub = sub[sub["policy"].isin(pols)]
    per_window = sub.groupby(by + ["window_id", "policy"], sort=True)[metric].mean()
    grouped = per_window.groupby(level=by + ["policy"], sort=True)
    means = grouped.mean().unstack(by).reindex(list(pols))
    n_def = grouped.count().unstack(by).reindex(list(pols)).fillna(0).astype(int)
    n_nan = (grouped.size() - grouped.count()).unstack(by).reindex(list(pols)).fillna(0).astype(int)
    return ConditionMeans(means, n_def, n_nan, int(n_nan.to_numpy().sum()))
