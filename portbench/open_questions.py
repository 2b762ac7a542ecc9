"""RQ8, what the study left open: shorter windows, SLOs stated per phase, other ANWG weightings.

Three additions to the study's cells, all under the study's own engine, calibration and SLO budget:

- **Window size.** The raw traces are not shipped, so windows shorter than the study's 200 requests
  are cut from the frozen windows: :func:`sub_windows` splits a window into consecutive blocks of
  ``size`` requests, each an independent episode from an empty engine at its own t = 0 with its own
  λ_ref (recalibrated). Larger windows need the raw traces (``portbench windows add --window-size``).
- **SLO definition.** Beside the study's end-to-end deadline, DistServe-style per-phase SLOs: a bound
  on the time to first token (TTFT) and one on the time per output token after the first (TPOT), and
  their *attainment* (share of requests that complete and meet the bound) as the metric
  (:data:`SLO_KINDS`). The bounds split the study's own per-request budget by phase
  (:func:`phase_bounds`), so they scale with the SLO multiplier and the load compression exactly as
  the study's deadlines do.
- **Metric definition.** ANWG with other request weights (:data:`WEIGHTINGS`).

:func:`run_subwindow_campaign` simulates every (window or sub-window, region, policy) cell with the
study's 11 metrics and these new ones, cached per frozen window and resumable by the main campaign's
runner (:func:`portbench.campaign.run_sharded`), and writes ``data/results/rq8_<engine>_n<size>.parquet``
(:func:`portbench.results.subwindow_path`). It never touches the study's tables.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import results, store
from .engine import engine_model, simulate
from .campaign import cell_key, code_fingerprint, run_sharded
from .metrics import METRICS, cell_metrics, phase_attainment, phase_bounds  # noqa: F401 (re-exported)
from .policies import PRIMARY_PANEL, make_policy
from .regions import REGIONS, find_lambda_ref
from .workload import (BASE_SLO_MULTIPLIER, DECODE_S_PER_TOKEN, PREDICTION_RELATIVE_ERROR, PREFILL_S_PER_TOKEN,
                       Window, make_window, scale, with_slo)

#: The study's window length; sub-window sizes divide it.
STUDY_WINDOW_SIZE = 200
#: The shortest sub-window: below it a window's λ_ref rests on a handful of requests.
MIN_WINDOW_SIZE = 10
#: The sub-window sizes of the book's RQ8 chapter (200: the study's own windows).
RQ8_WINDOW_SIZES = (50, 100, STUDY_WINDOW_SIZE)

#: SLO kinds: the study's end-to-end deadline and the per-phase bounds (metric column of each).
SLO_KINDS = {
    "e2e": "anwg_unweighted",          # completed by the study's deadline (= ANWG with equal weights)
    "ttft": "attainment_ttft",         # completed, first token within the TTFT bound
    "tpot": "attainment_tpot",         # completed, mean time per later token within the TPOT bound
    "ttft_tpot": "attainment_ttft_tpot",   # both (DistServe's attainment)
}
#: ANWG request weights (metric column of each).
WEIGHTINGS = {
    "unweighted": "anwg_unweighted",   # every request counts 1
    "study": "anwg_study",             # the study's priority weights (1.0 for every request)
    "output_tokens": "anwg_output_tokens",   # a request counts its true output length
}
#: The new per-cell metrics (all higher-is-better shares in [0, 1]).
RQ8_METRICS = ("attainment_ttft", "attainment_tpot", "attainment_ttft_tpot", "anwg_unweighted",
               "anwg_study", "anwg_output_tokens")
#: Readable names of the new metrics and the ones they stand beside.
METRIC_LABELS = {
    "anwg": "ANWG (end-to-end deadline)", "anwg_unweighted": "ANWG, every request 1",
    "anwg_study": "ANWG, the study's weights", "anwg_output_tokens": "ANWG, weighted by output tokens",
    "attainment_ttft": "TTFT attainment", "attainment_tpot": "TPOT attainment",
    "attainment_ttft_tpot": "TTFT and TPOT attainment",
}


def check_window_size(size, window_length: int = STUDY_WINDOW_SIZE) -> int:
    """``size`` as an int that cuts ``window_length``-request windows into whole blocks; ValueError
    naming the bad value otherwise."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        else:
            raise ValueError(f"window size must be a whole number of requests, got {size!r}")
    size = int(size)
    if not MIN_WINDOW_SIZE <= size <= window_length:
        raise ValueError(f"window size must be between {MIN_WINDOW_SIZE} and {window_length} requests "
                         f"(sub-windows are cut from the {window_length}-request windows), got {size}")
    if window_length % size:
        fits = [d for d in range(MIN_WINDOW_SIZE, window_length + 1) if window_length % d == 0]
        raise ValueError(f"window size {size} does not divide the {window_length}-request windows into "
                         f"whole blocks; sizes that do: {', '.join(map(str, fits))}")
    return size


def check_slo_kind(kind: str) -> str:
    if kind not in SLO_KINDS:
        raise ValueError(f"unknown SLO kind {kind!r}; kinds: {', '.join(SLO_KINDS)}")
    return kind


def check_weighting(name: str) -> str:
    if name not in WEIGHTINGS:
        raise ValueError(f"unknown ANWG weighting {name!r}; weightings: {', '.join(WEIGHTINGS)}")
    return name


# ---------------------------------------------------------------------------------------------
# Sub-windows

def sub_windows(window: Window, size: int) -> list[Window]:
    """``window`` cut into consecutive blocks of ``size`` requests, each rebased to its own t = 0.

    Each block keeps its requests' token counts, frozen predictions and SLO slack (deadline minus
    arrival) and is named ``<window_id>_n<size>_<k>``; its metadata names the parent. ``size`` equal
    to the window's length returns the window itself.
    """
    size = check_window_size(size, len(window))
    if size == len(window):
        return [window]
    if window.time_scale != 1.0:
        raise ValueError("sub_windows() expects an unscaled window: scale() each block afterwards")
    out = []
    for k, start in enumerate(range(0, len(window), size)):
        part = slice(start, start + size)
        arrival = window.arrival_s[part]
        sub = make_window(f"{window.window_id}_n{size}_{k}", window.source, arrival,
                          window.input_tokens[part], window.output_tokens[part],
                          window.predicted_output_tokens[part], slo_multiplier=window.slo_multiplier,
                          meta={"parent_window_id": window.window_id, "sub_index": k, "window_size": size,
                                "synthesis_seed": window.meta.get("synthesis_seed"),
                                **({"block_tokens": window.meta["block_tokens"]}
                                   if window.block_hashes is not None else {})},
                          block_hashes=None if window.block_hashes is None else window.block_hashes[part])
        # the parent's own deadlines, rebased (make_window rebuilt the same budget)
        slack = window.deadline_s[part] - arrival
        out.append(dataclasses.replace(sub, deadline_s=sub.arrival_s + slack))
    return out


# ---------------------------------------------------------------------------------------------
# Per-phase SLOs and ANWG weightings

def request_weights(result, weighting: str) -> np.ndarray:
    """Each request's weight in ANWG under ``weighting`` (:data:`WEIGHTINGS`)."""
    check_weighting(weighting)
    n = len(result.arrival_s)
    if weighting == "unweighted":
        return np.ones(n)
    if weighting == "study":          # as portbench.metrics.cell_metrics weighs
        return np.where(result.priority > 0, result.priority, 1.0)
    return np.asarray(result.output_tokens, dtype=np.float64)


def weighted_anwg(result, weighting: str) -> float:
    """Weight of the requests completed by their deadline ÷ the weight of all arrivals.

    With ``"study"`` this is :func:`portbench.metrics.cell_metrics`' ANWG, bit for bit.
    """
    weight = request_weights(result, weighting)
    done = result.completed
    met = result.finish_s[done] <= result.deadline_s[done]
    total = float(weight.sum())
    return float(weight[done][met].sum()) / total if total > 0 else 0.0


def rq8_metrics(result, window: Window) -> dict:
    """The new metrics of one run (``window``: the scaled window it ran on)."""
    out = phase_attainment(result, window)
    for name, column in WEIGHTINGS.items():
        out[column] = weighted_anwg(result, name)
    return {m: out[m] for m in RQ8_METRICS}


# ---------------------------------------------------------------------------------------------
# The sub-window campaign

IDENTITY_COLUMNS = ["source", "window_id", "parent_window_id", "sub_index", "window_size", "region",
                    "region_factor", "lambda_ref", "load_factor", "policy", "slo_multiplier",
                    "prediction_error", "engine_model"]
DIAGNOSTIC_COLUMNS = ["n_completed", "n_dropped", "n_unfinished", "n_preemptions", "n_steps"]
RESULT_COLUMNS = IDENTITY_COLUMNS + list(METRICS) + list(RQ8_METRICS) + DIAGNOSTIC_COLUMNS + ["cell_key"]


@dataclasses.dataclass(frozen=True)
class SubWindowConfig:
    """What the RQ8 campaign simulates: every block of ``window_size`` requests of the frozen windows
    (``window_ids=None``: all of them), in every region, under each policy, at one SLO multiplier."""

    window_size: int = STUDY_WINDOW_SIZE
    engine_model: str = "lssp"
    policies: tuple = PRIMARY_PANEL
    regions: tuple = tuple(REGIONS)
    slo_multiplier: float = BASE_SLO_MULTIPLIER
    window_ids: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "window_size", check_window_size(self.window_size))
        engine_model(self.engine_model)
        if not self.policies or not self.regions:
            raise ValueError("the RQ8 campaign needs at least one policy and one region")
        for p in self.policies:
            make_policy(p)
        for r in self.regions:
            if r not in REGIONS:
                raise KeyError(f"unknown region {r!r}; regions: {', '.join(REGIONS)}")
        if not float(self.slo_multiplier) > 0:
            raise ValueError(f"SLO multiplier must be positive, got {self.slo_multiplier!r}")


def fingerprint(engine_model: str | None = None) -> str:
    """The campaign's code fingerprint (of ``engine_model``) and this module's source: what decides
    an RQ8 cell."""
    h = hashlib.sha256(code_fingerprint(engine_model).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def _shard_key(window: Window, config: SubWindowConfig, code: str) -> str:
    payload = {
        "window_sha256": store.rows_sha256(window.arrival_s, window.input_tokens, window.output_tokens,
                                           window.predicted_output_tokens),
        "window_size": config.window_size,
        "engine": [config.engine_model, dataclasses.asdict(engine_model(config.engine_model))],
        "slo_multiplier": float(config.slo_multiplier), "code": code,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def run_parent(window: Window, config: SubWindowConfig, code: str) -> pd.DataFrame:
    """Every (sub-window, region, policy) cell of one frozen window, one row each."""
    model = engine_model(config.engine_model)
    key = _shard_key(window, config, code)
    base = window if window.slo_multiplier == config.slo_multiplier else with_slo(window, config.slo_multiplier)
    rows = []
    for sub in sub_windows(base, config.window_size):
        lam = find_lambda_ref(sub, model=model).lambda_ref
        for region in config.regions:
            factor = REGIONS[region]
            scaled = scale(sub, factor * lam)
            for policy in config.policies:
                result = simulate(scaled, make_policy(policy), model)
                n_done = int(result.completed.sum())
                n_never = int(np.isnan(result.admit_s).sum())
                rows.append({
                    "source": window.source, "window_id": sub.window_id,
                    "parent_window_id": window.window_id, "sub_index": sub.meta.get("sub_index", 0),
                    "window_size": config.window_size, "region": region, "region_factor": factor,
                    "lambda_ref": lam, "load_factor": factor * lam, "policy": policy,
                    "slo_multiplier": float(config.slo_multiplier), "prediction_error": PREDICTION_RELATIVE_ERROR,
                    "engine_model": config.engine_model, **cell_metrics(result), **rq8_metrics(result, scaled),
                    "n_completed": n_done, "n_dropped": n_never, "n_unfinished": len(sub) - n_done - n_never,
                    "n_preemptions": result.n_preemptions, "n_steps": result.n_steps,
                    "cell_key": cell_key(key, f"{sub.window_id}|{region}", policy),
                })
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def subwindow_results_path(engine: str, window_size: int, data_dir: Path | None = None) -> Path:
    return results.subwindow_path(engine, check_window_size(window_size), data_dir)


def _stamp(config: SubWindowConfig, windows, code: str) -> dict:
    return {"study": "rq8", "window_size": config.window_size, "engine_model": config.engine_model,
            "policies": list(config.policies), "regions": list(config.regions),
            "slo_multiplier": float(config.slo_multiplier), "code_fingerprint": code,
            "windows": {w.window_id: w.meta.get("sha256", "") for w in windows}}


def subwindow_results_current(config: SubWindowConfig, data_dir: Path | None = None) -> bool:
    """True when the table on disk was made by this code from these windows and this config."""
    path = subwindow_results_path(config.engine_model, config.window_size, data_dir)
    saved = results.read_stamp(path)
    if saved is None:
        return False
    manifest = store.list_windows(data_dir)
    if config.window_ids is not None:
        manifest = manifest[manifest["window_id"].isin(config.window_ids)]
    expected = _stamp(config, [], fingerprint(config.engine_model))
    expected["windows"] = dict(zip(manifest["window_id"], manifest["sha256"]))
    return path.exists() and saved == expected


def _task(window, config, code, stem):
    return [(stem, run_parent(window, config, code))]


def run_subwindow_campaign(config: SubWindowConfig | None = None, *, data_dir: Path | None = None,
                           workers: int | None = None, progress: bool = True) -> tuple[pd.DataFrame, Path]:
    """Run (or resume) the RQ8 campaign of one window size; returns its table and where it went.

    Each frozen window's cells (all its sub-windows) are one task, written to its own cache shard as
    soon as it finishes, so a killed run resumes and a rerun reuses every finished window.
    """
    config = config or SubWindowConfig()
    t0 = time.perf_counter()
    windows = store.load_windows(data_dir, window_ids=config.window_ids)
    code = fingerprint(config.engine_model)
    cache = results.ShardCache(results.subwindow_cache_dir(config.engine_model, config.window_size, data_dir),
                               RESULT_COLUMNS)
    wanted = [(r, p) for r in config.regions for p in config.policies]
    todo = []
    for w in windows:
        stem = results.shard_stem(w.window_id)
        shard = cache.read(stem, _shard_key(w, config, code))
        if shard is None or not set(wanted) <= set(zip(shard["region"], shard["policy"])):
            todo.append((w, config, code, stem))          # every cell of the window, afresh
    run_sharded(_task, todo, cache, workers=workers, progress=progress, total=len(todo), unit="window",
                desc=f"RQ8 campaign [{config.engine_model}, {config.window_size}-request windows]",
                count=lambda frame: 1)
    frames = [cache.frames[w.window_id] for w in windows if w.window_id in cache.frames]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS)
    table = table[table["region"].isin(config.regions) & table["policy"].isin(config.policies)]
    table = table.reset_index(drop=True)[RESULT_COLUMNS]
    path = subwindow_results_path(config.engine_model, config.window_size, data_dir)
    results.write_table(path, table, _stamp(config, windows, code))
    if progress:
        print(f"{len(table)} cells of {config.window_size}-request windows ({len(todo)} frozen windows "
              f"simulated, {len(windows) - len(todo)} reused) in {time.perf_counter() - t0:.1f} s -> {path}")
    return table, path


def load_subwindow_results(window_size: int, engine: str = "lssp", data_dir: Path | None = None) -> pd.DataFrame:
    """The RQ8 table of one window size (``portbench rq8-campaign`` writes it)."""
    return results.read_subwindow_table(check_window_size(window_size), engine, data_dir)


def per_parent(table: pd.DataFrame, metrics=None) -> pd.DataFrame:
    """Sub-window cells averaged per (frozen window, region, policy): the unit of analysis stays the
    study's window, so every window size has the same 40 windows per source and a bootstrap over
    windows resamples sibling sub-windows together."""
    metrics = list(metrics or [m for m in list(METRICS) + list(RQ8_METRICS) if m in table.columns])
    keys = ["source", "parent_window_id", "region", "region_factor", "policy", "slo_multiplier",
            "engine_model"]
    out = table.groupby(keys, sort=False, observed=True)[metrics].mean().reset_index()
    return out.rename(columns={"parent_window_id": "window_id"})
