"""How much of the study's map is the simulator's, and how close is the simulator to a real engine?

The package's parts, each importable on its own (this module re-exports their names):

- :mod:`.headline`: headline numbers per engine model, and the head-of-line ablation;
- :mod:`.cases`: a real-engine case by its tag (the step log's readings and the step-cost models
  fitted to it are in :mod:`portbench.engine.stepcost`);
- :mod:`.counterpart`: each real run's simulated counterpart, its per-request errors, like for like;
- :mod:`.schedules`: a real run replayed with its own step times, compared step by step, classed;
- :mod:`.slai_clock`: the step length the real SLAI scheduler counts Θ in, and SLAI timed by it;
- :mod:`.tables`: the chapter's heavy computations, each a stored result (:mod:`portbench.stored`)
  under ``data/results/fidelity/``, recomputed only when its inputs or code change.

The chapter's own readings of these (its sections, tables and figures) are in
:mod:`portbench.chapters.fidelity`.

The real engine's own repeatability, beside which every per-request figure is read, is
:mod:`portbench.repeatability`.
"""

from __future__ import annotations

from .cases import (EQUAL_TAG, GUARDED_TAG, RUN_KEYS, SHAPES, batch_shape, case_tag, load_case, run_rows,
    run_steps)
from ..engine.stepcost import (COST_KINDS, RICH_TERMS, RichStepCost, SMALL_BATCH_TOKENS, ScaledStepCost,
    ShapedStepCost, cross_validated_costs, cross_validated_step_error, fit_linear, fit_median_relative,
    linear_step_ps, predict_step_s, predicted_step_s, prefill_attention, rich_design, run_speed_factors,
    step_error_table, step_ratios, window_folds)
from .slai_clock import (SLAI_BUSY_INTERVAL_S, SLAI_STEP_EMA, TIE_SPREAD_S, measured_clock_slai,
    slai_measured_step_s)
from .counterpart import (COST_CHOICES, LATENCY_MEASURES, PUBLISHED_FIDELITY, REAL_COUNTERPARTS,
    anwg_from_counterpart, conclusions_by_rule, cost_choice_errors, counterpart_requests,
    latency_error_table, latency_errors, latency_values, like_for_like, on_full_window, own_step_speed,
    real_refused, run_limits, served_part, sim_vs_real, simulate_counterpart, write_counterparts)
from .schedules import (ARRIVALS, DISAGREEMENT_CLASSES, DOWNSTREAM, ID_TIE, LAST_PROMPT_TOKEN, LENGTH,
    OTHER, RACE, REQUEST_FIELDS, ReplayedStepTimes, SAME_SHAPE, SLAI_CLOCK, STEP_FIELDS, agreement_table,
    class_counts, classify_episode, compare_schedules, raced, real_batches, replay_run,
    replayed_cost_comparison, request_steps, submitted_arrivals)
from .headline import (headline_numbers, hol_ablation, hol_reversals)
