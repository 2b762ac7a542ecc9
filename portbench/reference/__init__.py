"""Comparing portbench with the original study's published tables.

The study (Vahidi 2026, LSSP v1.0.0) publishes the data behind its tables as four JSON files, shipped
unchanged in ``data/reference/lssp_table_data/``. Every published cell is set beside the number the
same :mod:`portbench.stats` calls compute for it on our campaign table and classed as an exact match,
within rounding, different or not computed, with the reason a cell is expected to differ:

- :mod:`.cells`: the files, the study's names, how two values match, the cells and how they read,
  and the comparison's heavy statistics, stored under ``data/results/reference/``;
- :mod:`.rankings`: the cross-source and pairwise-reversal files;
- :mod:`.subsets`: the sample-complexity and temporal-robustness files (rankings of window subsets).

The book's comparison chapter shows the cells and explains every difference.
"""

from __future__ import annotations

from .cells import (CATEGORIES, CLASS_NAMES, DIFFERS, EXACT, FILES, METRIC_NAMES, NOT_COMPUTED, RELATIVE_TOLERANCE,
    RESULT_CODE, ROUNDING, WHY, Cells, agreeing, file_view, fmt, gaps, load_published, match, max_abs_diff,
    readable, short, spearman, stored_statistics, summary, top_k, topk_overlap)
from .rankings import (TEST_KEYS, bootstrap_seed_check, compare_portability, compare_reversals, count_reason,
    pair_counts, portability_numbers, reversal_numbers, study_zero_rule, zero_rule_numbers)
from .subsets import (AZURE_BOUNDARY, STRATA, bailian_split, compare_sample_complexity, compare_temporal,
    float_means, n_tied, ordered, sample_complexity_numbers, sample_complexity_settings, splits, temporal_numbers)
