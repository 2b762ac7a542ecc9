"""The study's RQ6 case on a real engine: real-engine λ_ref, then the case and its control.

Case (pre-registered by the study): ``slai_faithful`` vs ``vllm_faithful``, ANWG, HIGH_PRESSURE,
Azure vs BurstGPT; control: Azure vs Bailian. For each window, λ_ref is re-found on the real engine
(FIFO's 0.5% SLO-violation knee, a short bisection in log λ), the window is compressed to
1.5 × λ_ref, and each policy replays it. Per-request times are written to
``data/results/realengine/<tag>_requests.parquet``, per-run metrics to ``<tag>_runs.parquet`` and
the provenance (engine, versions, model shape, hardware, date) to ``<tag>.json``.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store
from ..metrics import cell_metrics, slo_violation_rate
from ..regions import REGIONS, VIOLATION_THRESHOLD, bisect_log10
from ..workload import Window, scale
from . import BACKENDS

CASE_POLICIES = ("slai_faithful", "vllm_faithful")
CASE_REGION = "HIGH_PRESSURE"
CASE_SOURCES = ("azure_llm_2024", "burstgpt", "bailian_qwen")   # Bailian: the stable control


def case_deltas(runs: pd.DataFrame, label: str, *, policies=CASE_POLICIES, metric: str = "anwg",
                n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per source: mean ``policies[0] − policies[1]`` difference of ``metric`` over paired windows,
    with a percentile bootstrap 95% CI (windows resampled with replacement; one seeded generator)."""
    rng = np.random.default_rng(seed)
    rows = []
    for source, g in runs.groupby("source"):
        wide = g.pivot_table(index="window_id", columns="policy", values=metric)
        if not set(policies) <= set(wide.columns):
            continue
        d = (wide[policies[0]] - wide[policies[1]]).dropna().to_numpy()
        if len(d):
            boot = rng.choice(d, size=(n_resamples, len(d)), replace=True).mean(axis=1)
            mean, low, high = d.mean(), np.quantile(boot, 0.025), np.quantile(boot, 0.975)
        else:
            mean = low = high = np.nan
        rows.append({"source": source, "engine": label, "n_windows": len(d),
                     "delta_slai_minus_vllm": mean, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)


def backend(name: str):
    """The backend module (``replay``, ``step_profile``) for ``name``."""
    if name not in BACKENDS:
        raise KeyError(f"unknown real-engine backend {name!r}; backends: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__package__}.{name}_backend")


def realengine_dir(data_dir: Path | None = None) -> Path:
    return Path(data_dir or store.default_data_dir()) / "results" / "realengine"


def find_real_lambda_ref(window: Window, replay, *, lo: float, hi: float, steps: int = 6,
                         policy: str = "fifo", **kwargs) -> tuple[float, list[dict]]:
    """Bisection in log λ on the real engine for FIFO's violation knee, from a bracket [lo, hi].

    Real runs are noisy and slow, so the search is short (``steps`` halvings of the bracket) and every
    probe is returned for the record. If the rate is already over the threshold at ``lo`` (or under it
    at ``hi``) the bound is returned and the probes show it.
    """
    probes = []

    def rate(lam):
        result, _ = replay(scale(window, lam), policy, **kwargs)
        r = slo_violation_rate(result)
        probes.append({"window_id": window.window_id, "lambda": lam, "violation_rate": r})
        return r

    lam, _ = bisect_log10(lambda log_lambda: rate(10.0 ** log_lambda) < VIOLATION_THRESHOLD,
                          math.log10(lo), math.log10(hi), steps)
    return lam, probes


def run_case(backend_name: str, *, n_per_source: int = 10, sources=CASE_SOURCES,
             policies=CASE_POLICIES, region: str = CASE_REGION, speed_ratio: float = 1.0,
             bracket_factor: float = 8.0, bisection_steps: int = 5, time_budget_s: float | None = None,
             tag: str | None = None, data_dir: Path | None = None, progress: bool = True,
             **engine_kwargs) -> pd.DataFrame:
    """Calibrate and replay the case on a real engine; returns the per-run table.

    λ_ref on the real engine is bracketed around ``speed_ratio`` × the simulator's λ_ref (a real
    engine that serves a request ``r`` times slower than the simulator's 1 ms per token has its knee
    about ``r`` times lower), within a factor ``bracket_factor`` either way, then bisected
    ``bisection_steps`` times. Results are written after every window (atomically), so a run that is
    stopped — or that reaches ``time_budget_s`` — keeps what it finished. Windows are taken in
    manifest order, interleaving sources, so a partial run covers every source.
    """
    import time

    from tqdm.auto import tqdm

    mod = backend(backend_name)
    tag = tag or f"{backend_name}_case"
    per_source = [store.load_windows(data_dir, s)[:n_per_source] for s in sources]
    windows = [w for group in zip(*per_source) for w in group]
    out = realengine_dir(data_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs, requests, probes, info = [], [], [], {}
    t_start = time.perf_counter()
    bar = tqdm(total=len(windows), unit="window", desc=f"RQ6 [{backend_name}]", disable=not progress)
    for w in windows:
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            print(f"time budget of {time_budget_s:.0f} s reached: stopping after {len(runs) // len(policies)} windows")
            break
        guess = float(w.meta.get("paper_lambda_ref", 1.0)) * speed_ratio
        lam, p = find_real_lambda_ref(w, mod.replay, lo=guess / bracket_factor, hi=guess * bracket_factor,
                                      steps=bisection_steps, **engine_kwargs)
        probes += p
        scaled = scale(w, REGIONS[region] * lam)
        for policy in policies:
            result, info = mod.replay(scaled, policy, **engine_kwargs)
            runs.append({"source": w.source, "window_id": w.window_id, "region": region,
                         "slo_multiplier": w.slo_multiplier, "policy": policy, "lambda_ref_real": lam,
                         "lambda_ref_sim": w.meta.get("paper_lambda_ref", np.nan),
                         "load_factor": REGIONS[region] * lam, "wall_s": info.get("wall_s", np.nan),
                         **cell_metrics(result)})
            requests.append(pd.DataFrame({
                "window_id": w.window_id, "policy": policy, "request_index": np.arange(len(w)),
                "arrival_s": result.arrival_s, "deadline_s": result.deadline_s,
                "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
                "admit_s": result.admit_s, "first_token_s": result.first_token_s,
                "finish_s": result.finish_s}))
        _write_case(out, tag, runs, requests, probes, {
            "backend": backend_name,
            "case": {"policies": list(policies), "region": region, "sources": list(sources),
                     "n_per_source": n_per_source, "speed_ratio": speed_ratio,
                     "bracket_factor": bracket_factor, "bisection_steps": bisection_steps},
            "engine_kwargs": {k: repr(v) for k, v in engine_kwargs.items()},
            "environment": info.get("environment", {}),
            "engine_info": {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))}})
        bar.update(1)
    bar.close()
    return pd.DataFrame(runs)


def _write_case(out: Path, tag: str, runs, requests, probes, meta) -> None:
    frames = {"runs": pd.DataFrame(runs), "requests": pd.concat(requests, ignore_index=True),
              "calibration": pd.DataFrame(probes)}
    for name, frame in frames.items():
        store.atomic_write(out / f"{tag}_{name}.parquet", lambda p, f=frame: f.to_parquet(p, index=False))
    store.atomic_write(out / f"{tag}.json", lambda p: p.write_text(json.dumps(meta, indent=1, default=str)))
