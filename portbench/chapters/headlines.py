"""The RQ1–RQ5 headlines read three ways: the study's counting, the robust reading, and each under
both engine models (and RQ1–RQ2 at the attainable knee).

The study's counting breaks a tie by policy name and counts every policy it ran. The robust reading
(:mod:`portbench.robust`, RQ8's) treats ties as ties and counts duplicate policies once. Each
function takes one campaign table and returns a dict with both readings, so that a chapter states
its headline for every table in :data:`HEADLINE_ENGINES` from the same code, and the introduction's
"what holds" table glues them. :func:`headline_table` reads a committed table, or None when it is
not on disk (a build on other results), so a chapter can say "not computed" instead of failing.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from .. import results, robust, stats

#: The engine models every headline is stated under: the study's rules and vLLM v1's.
HEADLINE_ENGINES = ("lssp", "vllm_v1")
#: The ties rule of the robust reading (RQ8's defaults).
TIE_RULE = {"rtol": robust.TIE_RTOL, "confidence_level": 0.95}
#: The source whose knee is set by requests no scheduler can meet (see the workload chapter).
BURSTGPT = "burstgpt"


def headline_table(engine: str, *, knee: str = "study") -> pd.DataFrame | None:
    """The committed campaign table of ``engine`` (at the attainable knee with ``knee="attainable"``),
    or None when it is not on disk."""
    name = engine if knee == "study" else f"{engine}_{knee}_knee"
    path = results.campaign_path(name)
    return pd.read_parquet(path) if path.exists() else None


def deduplicated(table: pd.DataFrame, policies) -> tuple:
    """``policies`` with every group of identical policies (every cell equal) counted once."""
    return robust.collapse_duplicates(tuple(policies), robust.duplicate_groups(table, policies))


def rq1(table: pd.DataFrame, policies, regions=None) -> dict:
    """Cross-source τ_b range: the study's (ties by name, every policy) and the robust one; the
    range of the pairs with BurstGPT and of the others."""
    study = robust.cross_source(table, policies=policies, regions=regions, **TIE_RULE)
    rob = robust.cross_source(table, policies=deduplicated(table, policies), regions=regions, **TIE_RULE)
    burst = (study["source_a"] == BURSTGPT) | (study["source_b"] == BURSTGPT)
    burst_r = (rob["source_a"] == BURSTGPT) | (rob["source_b"] == BURSTGPT)
    return {"tau_min": float(study["tau_b"].min()), "tau_max": float(study["tau_b"].max()),
            "tau_min_robust": float(rob["tau_b_robust"].min()), "tau_max_robust": float(rob["tau_b_robust"].max()),
            "tau_burstgpt_max": float(study.loc[burst, "tau_b"].max()),
            "tau_others_min": float(study.loc[~burst, "tau_b"].min()),
            "tau_burstgpt_max_robust": float(rob.loc[burst_r, "tau_b_robust"].max()),
            "tau_others_min_robust": float(rob.loc[~burst_r, "tau_b_robust"].min())}


def burstgpt_apart(reading: dict, robust_reading: bool = True) -> bool:
    """Whether every source pair with BurstGPT agrees less than every pair without it (an RQ1
    reading of :func:`rq1`)."""
    suffix = "_robust" if robust_reading else ""
    return reading[f"tau_burstgpt_max{suffix}"] < reading[f"tau_others_min{suffix}"]


def rq2(table: pd.DataFrame, policies, regions=None, *, n_resamples: int = 2000, seed=0,
        confidence_level: float = 0.95, **options) -> dict:
    """Supported practical reversals: the study's count, with duplicates counted once, and how many
    have BurstGPT on one side. ``options`` go to :func:`portbench.stats.reversal_analysis` (``margin``)."""
    def supported(pols):
        rev = stats.reversal_analysis(table, regions=regions, n_resamples=n_resamples, seed=seed,
                                      policies=pols, confidence_level=confidence_level, **options)
        return rev, rev[rev["cls"] == "SUPPORTED_PRACTICAL_REVERSAL"]

    rev, sup = supported(tuple(policies))
    _, sup_robust = supported(deduplicated(table, policies))
    burst = (sup["source_x"] == BURSTGPT) | (sup["source_y"] == BURSTGPT)
    return {"supported": len(sup), "supported_robust": len(sup_robust), "n_tests": len(rev),
            "supported_with_burstgpt": int(burst.sum())}


def rq3(table: pd.DataFrame, policies, sources, regions) -> dict:
    """How often two metrics crown the same policy: the study's top-1 and the top-1 sets (ties as
    ties, duplicates once); ``n_tied``: comparisons where either metric's top-1 is a tie."""
    def frame(pols):
        return pd.concat([robust.cross_metric_top1(table, s, r, policies=pols, **TIE_RULE)
                          for s in sources for r in regions], ignore_index=True)

    study, rob = frame(tuple(policies)), frame(deduplicated(table, policies))
    tied = (study["top1_set_a"].map(len) > 1) | (study["top1_set_b"].map(len) > 1)
    return {"agreement": float(study["top1_agree"].mean()), "agreement_robust": float(rob["top1_agree_robust"].mean()),
            "n": len(study), "n_tied": int(tied.sum())}


def rq4(table: pd.DataFrame, policies, regions, variants) -> dict:
    """Top-1 changes with the SLO multiplier: the study's count and the robust one (the two top-1
    sets share no policy)."""
    study = robust.slo_top1_changes(table, policies=tuple(policies), variants=variants, regions=regions, **TIE_RULE)
    rob = robust.slo_top1_changes(table, policies=deduplicated(table, policies), variants=variants,
                                  regions=regions, **TIE_RULE)
    return {"changes": int(study["top1_changed"].sum()), "changes_robust": int(rob["top1_changed_robust"].sum()),
            "n": len(study)}


def rq5(table: pd.DataFrame, policies, sources, *, metric: str = "anwg", n: int = 10, n_draws: int = 500,
        threshold: float = 0.9) -> dict:
    """Top-1 recovery with ``n`` windows: the lowest over (source, region) and how many conditions
    fall below ``threshold``, the study's way and the robust way."""
    def frame(pols):
        return pd.concat([robust.top1_recovery(table, metric, s, policies=pols, sizes=(n,), n_draws=n_draws,
                                               **TIE_RULE) for s in sources], ignore_index=True)

    study, rob = frame(tuple(policies)), frame(deduplicated(table, policies))
    return {"min_p": float(study["p_top1"].min()), "min_p_robust": float(rob["p_top1_robust"].min()),
            "unreliable": int((study["p_top1"] < threshold).sum()),
            "unreliable_robust": int((rob["p_top1_robust"] < threshold).sum()), "n": len(study)}


def by_engine(reading, tables: dict, *args, **kwargs) -> dict:
    """``reading(table, *args, **kwargs)`` for each table of ``tables`` (engine → table or None);
    None where the table is missing. Each reading is a stored result (:func:`stored_reading`)."""
    return {e: (None if t is None else stored_reading(reading, t, *args, **kwargs)) for e, t in tables.items()}


#: The modules a reading's value depends on (their source is in its stored key).
CODE = ("chapters/headlines.py", "robust.py", "stats", "metrics.py")


def stored_reading(reading, table: pd.DataFrame, *args, data_dir=None, **kwargs) -> dict:
    """``reading(table, *args, **kwargs)``, kept as a stored result (:mod:`portbench.stored`, folder
    ``headlines``) keyed on the table's content, the arguments and :data:`CODE`: a rebuild of the
    book on the same tables reads it instead of recomputing it."""
    from ..stored import frame_sha256, frame_values, source_fingerprint, stored, values_frame

    params = {"reading": reading.__name__, "args": _plain(args), **_plain(kwargs)}
    digest = frame_sha256(table)
    name = f"{reading.__name__}.{hashlib.sha256((digest + repr(params)).encode()).hexdigest()[:16]}"
    result = stored("headlines", name, lambda: {"values": values_frame(reading(table, *args, **kwargs))},
                    code=source_fingerprint(CODE), params=params, frames=[table], data_dir=data_dir)
    return frame_values(result["values"])


def _plain(value):
    """Arguments as JSON values (tuples as lists, numpy numbers as Python ones) for a stored key."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def value(readings: dict, engine: str, key: str, fmt=lambda v: v, missing: str = "not computed"):
    """``fmt(readings[engine][key])``, or ``missing`` where that engine's table was not on disk."""
    r = readings.get(engine)
    return missing if r is None or r.get(key) is None or (isinstance(r[key], float) and np.isnan(r[key])) \
        else fmt(r[key])


def rank_summary(table: pd.DataFrame, policies, metric: str = "anwg") -> pd.DataFrame:
    """Each policy's best, median and worst rank among ``policies`` by mean ``metric`` over the
    (source, region) conditions at the base SLO (1 = best; tied means share the best rank)."""
    from ..metrics import METRICS

    means = stats.condition_means(table, metric, policies=tuple(policies)).means
    rank = means.rank(axis=0, ascending=not METRICS[metric], method="min")
    return pd.DataFrame({"best rank": rank.min(axis=1), "median rank": rank.median(axis=1),
                         "worst rank": rank.max(axis=1)})


def knee_ratio(table: pd.DataFrame, knee_table: pd.DataFrame, source: str = BURSTGPT) -> float:
    """Median over ``source``'s windows of λ_ref at the attainable knee ÷ λ_ref at the study's."""
    lam = table[table["source"] == source].groupby("window_id")["lambda_ref"].first()
    knee = knee_table[knee_table["source"] == source].groupby("window_id")["lambda_ref"].first()
    return float((knee / lam.reindex(knee.index)).median())


def knee_clause(table: pd.DataFrame, knee_table: pd.DataFrame, engine: str) -> str:
    """Whether BurstGPT's knee under ``engine`` is set by requests no scheduler can meet (its
    attainable knee lies well above it) or by queueing, in words with the ratio."""
    ratio = knee_ratio(table, knee_table)
    what = ("set by requests no scheduler can meet" if ratio > 1.05 else "a queueing knee")
    return f"BurstGPT's knee under {engine} is {what} (its attainable knee is {ratio:.2f}× it, median)"


def claim_cells(readings: dict, study, robust, holds) -> dict:
    """One row of the introduction's "what holds" table from an RQ's readings (engine → reading):
    ``claim_study`` and ``claim_robust`` (``(key, format)`` of the ``lssp`` reading, the study's
    rules), and ``holds_<engine>`` for each engine ("holds"/"fails": ``holds(reading)`` on the robust
    reading; "not computed" where the engine's table is missing)."""
    cells = {"claim_study": value(readings, "lssp", *study), "claim_robust": value(readings, "lssp", *robust)}
    for e, r in readings.items():
        cells[f"holds_{e}"] = "not computed" if r is None else ("holds" if holds(r) else "fails")
    return cells
