"""Statistics of the portability study: rankings, their agreement and their reversals.

Plain functions over the campaign's tidy table (one row per (source, window_id, region, policy,
slo_multiplier) cell, one column per metric; see :data:`portbench.campaign.RESULT_COLUMNS`) or over
numpy arrays, returning small frozen result objects or tidy frames. One module per subject, every
name importable from here (``from portbench import stats; stats.reversals(...)``):

- :mod:`~portbench.stats.rank` — pairwise signs, Kendall τ_b, the top-1 policy;
- :mod:`~portbench.stats.bootstrap` — the window bootstrap, percentile and BCa intervals,
  Benjamini–Hochberg;
- :mod:`~portbench.stats.table` — the campaign table as the statistics read it, condition means;
- :mod:`~portbench.stats.compare` — two rankings compared by τ_b: across sources, SLO definitions,
  window groups in time, metrics;
- :mod:`~portbench.stats.concordance` — Kendall's W across sources, Friedman with post-hoc tests;
- :mod:`~portbench.stats.reversal` — pairwise reversals between sources and their classes;
- :mod:`~portbench.stats.recovery` — how many windows recover the all-window ranking.

Conventions shared by all: the unit is the window (a repeated (window, policy) cell is averaged
first; NaN is never imputed); policies in alphabetical order, a pair (a, b) with a < b and
Δ = a − b, top-1 ties broken by the first id (the original's rule) and reported; randomness only
from ``seed``, each condition seeded afresh; bootstraps vectorised (a resample is a row of window
counts); means within ``TIE_RTOL`` tie in the table functions; ``slo_multiplier`` selects one SLO
definition (default ×20; ``None`` refused when the table holds several).
"""

from __future__ import annotations

from .bootstrap import (_NAN_CI, ConfidenceInterval, _column_quantiles, _count_matrix,
                        _jackknife_weights, _percentile_interval, point_means, _rng,
                        _weighted_means, bca_interval, benjamini_hochberg, paired_difference)
from .compare import (CrossMetricResult, TauComparison, _compare, chronological_groups,
                      cross_metric, cross_metric_summary, cross_source_table, cross_source_tau,
                      slo_sensitivity, temporal_split)
from .concordance import (FriedmanResult, KendallW, _tie_term, _w_from_ranks, friedman, kendalls_w,
                          leave_one_source_out, source_concordance)
from .rank import TIE_RTOL, _pair_index, pair_signs, tau_from_signs, _tau_rows, top1_of, kendall_tau_b
from .recovery import sample_complexity
from .reversal import REVERSAL_CLASSES, reversal_analysis, reversal_counts, reversals
from .table import (BASE_SLO, ConditionMeans, _policies, table_regions, select_cells, table_sources,
                    window_matrix, condition_means)

__all__ = [
    "BASE_SLO", "TIE_RTOL", "REVERSAL_CLASSES", "paired_difference",
    "ConfidenceInterval", "ConditionMeans", "TauComparison", "KendallW", "CrossMetricResult",
    "FriedmanResult",
    "benjamini_hochberg", "kendall_tau_b", "bca_interval", "condition_means", "cross_source_tau",
    "cross_source_table", "kendalls_w", "source_concordance", "leave_one_source_out", "reversals",
    "reversal_analysis", "reversal_counts", "cross_metric_summary", "cross_metric",
    "slo_sensitivity", "sample_complexity", "chronological_groups", "temporal_split", "friedman",
    # the building blocks the robust readings (portbench.robust) share with these statistics
    "point_means", "pair_signs", "tau_from_signs", "top1_of", "select_cells", "table_regions",
    "table_sources", "window_matrix",
]
