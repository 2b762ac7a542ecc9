"""The study's RQ6 case on a real engine: real-engine λ_ref, then the case and its control.

Case (pre-registered by the study): ``slai_faithful`` vs ``vllm_faithful``, ANWG, HIGH_PRESSURE,
Azure vs BurstGPT; control: Azure vs Bailian. For each window, λ_ref is re-found on the real engine
(FIFO's 0.5% SLO-violation knee, a short bisection in log λ whose bracket widens when the knee is
outside it), the window is compressed to 1.5 × λ_ref, and each policy replays it ``repetitions``
times. A shared host can slow a whole stretch of runs down: every run is guarded by a fixed probe
batch before and after it, compared with a reference taken at the start, and re-run when the host
drifted (:func:`run_case`). Per-request times are written to
``data/results/realengine/<tag>_requests.parquet``, per-run metrics and probe figures to
``<tag>_runs.parquet``, every engine step to ``<tag>_steps.parquet``, every attempt to
``<tag>_attempts.parquet``, the λ search to ``<tag>_calibration.parquet`` and the provenance
(engine, versions, model shape, hardware, date, probe references, λ_ref per window) to
``<tag>.json``; a stopped case resumes where it stopped.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store
from ..metrics import cell_metrics, slo_violation_rate
from ..regions import REGIONS, VIOLATION_THRESHOLD
from ..workload import Window, scale
from . import BACKENDS, PROBE_OUTPUT_TOKENS, PROBE_PROMPT_TOKENS, PROBE_REPEATS, PROBE_REQUESTS, PROBE_WARMUP

CASE_POLICIES = ("slai_faithful", "vllm_faithful")
CASE_REGION = "HIGH_PRESSURE"
CASE_SOURCES = ("azure_llm_2024", "burstgpt", "bailian_qwen")   # Bailian: the stable control


def case_deltas(runs: pd.DataFrame, label: str, *, policies=CASE_POLICIES, metric: str = "anwg",
                n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per source: mean ``policies[0] − policies[1]`` difference of ``metric`` over paired windows
    (column ``delta``; repetitions of a run are averaged first), with a percentile bootstrap 95% CI
    (``ci_low``, ``ci_high``; windows resampled with replacement; one seeded generator)."""
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
                     "delta": mean, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)


def backend(name: str):
    """The backend module (``replay``, ``probe``, ``step_profile``) for ``name``."""
    if name not in BACKENDS:
        raise KeyError(f"unknown real-engine backend {name!r}; backends: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__package__}.{name}_backend")


def realengine_dir(data_dir: Path | None = None) -> Path:
    return Path(data_dir or store.default_data_dir()) / "results" / "realengine"


def reusable_lambda_refs(path: Path, windows, **ours) -> dict:
    """The real-engine λ_ref entries for ``windows`` of the case whose provenance file is ``path``
    (``<tag>.json``), each marked with the case it came from, when that case searched with the same
    settings ``ours`` (by name: ``backend`` and ``engine_kwargs`` at the file's top level, the others
    in its ``case`` section, where ``lambda_policy`` defaults to FIFO as in files written before it
    was recorded); else ``{}``, with the reason printed."""
    if not path.exists():
        print(f"no {path.name}: every λ_ref is searched here", flush=True)
        return {}
    meta = json.loads(path.read_text())
    case = {"lambda_policy": "fifo", **meta.get("case", {})}
    differ = [k for k, v in ours.items() if (meta.get(k) if k in ("backend", "engine_kwargs") else case.get(k)) != v]
    if differ:
        print(f"{path.name} searched λ_ref with other {', '.join(differ)}: every λ_ref is searched here",
              flush=True)
        return {}
    windows = set(windows)
    return {wid: {**entry, "from": entry.get("from", path.stem)}
            for wid, entry in meta.get("lambda_ref_real", {}).items() if wid in windows}


def find_real_lambda_ref(window: Window, replay, *, lo: float, hi: float, steps: int = 6,
                         policy: str = "fifo", bracket_factor: float = 8.0, max_widenings: int = 3,
                         threshold: float = VIOLATION_THRESHOLD, **kwargs) -> tuple[float, list[dict], bool]:
    """Bisection in log λ on the real engine for FIFO's violation knee, from a bracket [lo, hi].

    Real runs are noisy and slow, so the search is short (``steps`` halvings of the bracket) and every
    probe is returned for the record. If the rate is already over the threshold at ``lo``, the bracket
    is widened downwards (``hi`` becomes ``lo``, ``lo`` is divided by ``bracket_factor``), at most
    ``max_widenings`` times; likewise upwards if it is under the threshold at ``hi``. No λ is replayed
    twice. Returns ``(λ_ref, probes, pinned)``: ``pinned`` is True when the knee is still outside
    the widened bracket (λ_ref is then that bound); each probe row records its ``phase``
    (``bracket``, ``widen_low``, ``widen_high``, ``bisect``) and, once known, ``lambda_ref`` and
    ``pinned`` (``pinned_side``: ``low``/``high``).
    """
    probes: list[dict] = []
    rates: dict[float, float] = {}

    def ok(lam: float, phase: str) -> bool:
        if lam not in rates:
            result, _ = replay(scale(window, lam), policy, **kwargs)
            rates[lam] = slo_violation_rate(result)
            probes.append({"window_id": window.window_id, "lambda": lam, "violation_rate": rates[lam],
                           "phase": phase})
        return rates[lam] < threshold

    lo, hi = float(lo), float(hi)
    side = None
    widenings = 0
    lo_ok = ok(lo, "bracket")
    while not lo_ok and widenings < max_widenings:
        lo, hi = lo / bracket_factor, lo
        widenings += 1
        lo_ok = ok(lo, "widen_low")
    if not lo_ok:
        lam, side = lo, "low"
    else:
        hi_ok = ok(hi, "bracket")
        while hi_ok and widenings < max_widenings:
            lo, hi = hi, hi * bracket_factor
            widenings += 1
            hi_ok = ok(hi, "widen_high")
        if hi_ok:
            lam, side = hi, "high"
        else:
            a, b = math.log10(lo), math.log10(hi)
            for _ in range(steps):
                mid = (a + b) / 2
                if ok(10.0 ** mid, "bisect"):
                    a = mid
                else:
                    b = mid
            lam = 10.0 ** ((a + b) / 2)
    for p in probes:
        p.update(lambda_ref=lam, pinned=side is not None, pinned_side=side or "", widenings=widenings)
    return lam, probes, side is not None


# --------------------------------------------------------------------------------------------
# the guarded case
# --------------------------------------------------------------------------------------------

#: Columns that identify a run of the case (a resumed case skips those already in its table).
RUN_KEY = ("window_id", "policy", "repetition")
#: Per-request arrays a backend's info may carry into ``<tag>_requests`` (vLLM: the loop's clock at
#: ``add_request`` and the index of the first step that could schedule the request; NaN / -1 when
#: refused). Absent from the files written before 2026-12.
REQUEST_EXTRAS = ("submit_s", "submit_step")
#: What the host guard stores with every run.
GUARD_COLUMNS = ("probe_before_s", "probe_after_s", "probe_ref_s", "drift", "attempt", "host_flagged")


def _steps_frame(info: dict) -> pd.DataFrame:
    """A backend's per-step log as a table with common names (``start_s``, ``duration_s``, …)."""
    steps = info.get("steps")
    if steps is None:
        return pd.DataFrame()
    df = steps.copy() if isinstance(steps, pd.DataFrame) else pd.DataFrame(steps)
    df = df.rename(columns={"t_s": "start_s", "step_s": "duration_s"})
    df.insert(0, "step", np.arange(len(df)))
    return df


def _engine_max_model_len(info: dict) -> float:
    cfg = info.get("engine_config") or {}
    value = cfg.get("max_model_len") if isinstance(cfg, dict) else None
    return float(value) if value is not None else np.nan


def _load_case(out: Path, tag: str, backend_name: str, policies, region: str) -> dict:
    """What an earlier (stopped) run of this case wrote, to resume it; empty when there is none."""
    runs_path = out / f"{tag}_runs.parquet"
    meta_path = out / f"{tag}.json"
    if not runs_path.exists() and not meta_path.exists():
        return {}
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    case = meta.get("case", {})
    if "guard" not in case:
        raise ValueError(f"{runs_path.parent / tag}_* was written before the guarded case (no "
                         f"repetitions or host probes): use another tag, or resume=False to overwrite it")
    if (meta.get("backend") != backend_name or case.get("policies") != list(policies)
            or case.get("region") != region):
        raise ValueError(f"{meta_path} is a different case (backend {meta.get('backend')!r}, policies "
                         f"{case.get('policies')}, region {case.get('region')!r}): use another tag, or "
                         f"resume=False to overwrite it")

    def read(name):
        path = out / f"{tag}_{name}.parquet"
        return pd.read_parquet(path) if path.exists() else pd.DataFrame()

    return {"meta": meta, "runs": read("runs"), "requests": read("requests"),
            "calibration": read("calibration"), "steps": read("steps"), "attempts": read("attempts")}


def run_case(backend_name, *, n_per_source: int = 10, sources=CASE_SOURCES,
             policies=CASE_POLICIES, region: str = CASE_REGION, speed_ratio: float = 1.0,
             bracket_factor: float = 8.0, max_widenings: int = 3, bisection_steps: int = 5,
             repetitions: int = 2, guard: bool = True, drift_tolerance: float = 0.15,
             max_retries: int = 2, reference_probes: int = 3, retry_wait_s: float = 0.0,
             resume: bool = True, time_budget_s: float | None = None, tag: str | None = None,
             data_dir: Path | None = None, progress: bool = True, windows=None,
             lambda_refs: dict | None = None, lambda_policy: str = "fifo",
             probe_warmup: int = PROBE_WARMUP, probe_repeats: int = PROBE_REPEATS,
             adapt_bracket: float | None = None, **engine_kwargs) -> pd.DataFrame:
    """Calibrate and replay the case on a real engine, guarded against a slow host; returns the
    per-run table (one row per window × policy × repetition).

    ``backend_name``: ``"vllm"`` or ``"transformers"`` (or any object with ``replay`` and ``probe``
    functions, as the tests pass). λ_ref on the real engine is bracketed around ``speed_ratio`` × the
    simulator's λ_ref (a real engine that serves a request ``r`` times slower than the simulator's
    1 ms per token has its knee about ``r`` times lower), within a factor ``bracket_factor`` either
    way, widened up to ``max_widenings`` times when the knee is outside, then bisected
    ``bisection_steps`` times (:func:`find_real_lambda_ref`), replaying ``lambda_policy`` (FIFO; the
    study's own real-system search replayed ``vllm_faithful``). ``adapt_bracket`` (a factor, e.g. 2):
    once a source has searched windows, its next windows are bracketed within that factor of the
    simulator's λ_ref × the median real/simulated λ_ref ratio of that source so far (a narrower
    bracket, fewer replays; widened as before when the knee is outside it).

    **Host guard** (``guard=True``): at the start, a reference probe per policy (the median wall time
    of ``reference_probes`` runs of the backend's ``probe``: a fixed 8-request batch on that
    policy's engine; measured again, up to three rounds, while those probes disagree by more than
    the tolerance, and the most consistent round kept); then a probe before and after every run. A
    run whose probes drift by more than ``drift_tolerance`` (relative) from the reference is re-run,
    at most ``max_retries`` times (``retry_wait_s`` apart); when every attempt drifted the
    least-drifting one is kept with ``host_flagged=True``. Every run stores its probe figures (:data:`GUARD_COLUMNS`); every attempt
    also goes to ``<tag>_attempts.parquet`` (``accepted``: within tolerance, ``kept``: the run
    table's). When a resumed case's new reference is slower than the stored one by more than the
    tolerance, the stored one is kept (the host is slow now). Each probe replays the batch
    ``probe_warmup`` times untimed and ``probe_repeats`` times timed (the median counts).

    ``repetitions`` runs of each (window, policy) (column ``repetition``), interleaved in time, show
    the run-to-run noise floor. Written under ``data/results/realengine/``: ``<tag>_runs``,
    ``<tag>_requests`` (per request, with ``refused``, and where the backend records them
    ``submit_s``, the replay loop's clock when the request was added to the engine, and
    ``submit_step``, the first step that could schedule it), ``<tag>_steps`` (every attempt's engine
    steps: start, duration, running, waiting, and what the backend records — prefill tokens, decode
    sequences, context tokens, scheduler time, and on vLLM the requests of the step with their
    tokens, ``scheduled``), ``<tag>_calibration`` (λ search probes),
    ``<tag>_attempts`` (Parquet) and ``<tag>.json`` (provenance, the case's parameters, probe
    references, each window's λ_ref).

    **Shared λ_ref** (``lambda_refs``): a ``{window_id: entry}`` mapping of real-engine λ_ref searches
    already made by another case on the same engine and settings (that case's ``lambda_ref_real``,
    each entry with ``lambda``, ``pinned``, ``pinned_side``, ``probes`` and ``from``, the case it came
    from). Those windows are not searched again: the search replays FIFO on the engine built from the
    same ``engine_kwargs``, so it would look for the same knee. The entry is stored as given.

    **Resume**: everything is rewritten (atomically) after every run and every calibration, and a case
    restarted with the same tag (``resume=True``) skips the (window, policy, repetition) runs and the
    λ_ref searches it already has, so a stop — or ``time_budget_s`` — loses at most the run (or λ_ref
    search) in progress. Windows are taken in manifest order, interleaving sources, so a partial run
    covers every source.
    """
    import time

    from tqdm.auto import tqdm

    mod = backend(backend_name) if isinstance(backend_name, str) else backend_name
    name = backend_name if isinstance(backend_name, str) else getattr(mod, "ENGINE", "custom")
    probe = getattr(mod, "probe", None) if guard else None
    if guard and probe is None:
        raise ValueError(f"backend {name!r} has no probe(): pass guard=False")
    tag = tag or f"{name}_case"
    if windows is None:
        per_source = [store.load_windows(data_dir, s)[:n_per_source] for s in sources]
        windows = [w for group in zip(*per_source) for w in group]
    windows = list(windows)
    out = realengine_dir(data_dir)
    out.mkdir(parents=True, exist_ok=True)

    old = _load_case(out, tag, name, policies, region) if resume else {}
    meta_old = old.get("meta", {})
    if meta_old and meta_old["case"].get("lambda_policy", "fifo") != lambda_policy:
        raise ValueError(f"{tag}: its λ_ref searches replayed {meta_old['case'].get('lambda_policy', 'fifo')!r}, "
                         f"not {lambda_policy!r}: use another tag, or resume=False to overwrite it")
    runs = old["runs"].to_dict("records") if len(old.get("runs", ())) else []
    attempts = old["attempts"].to_dict("records") if len(old.get("attempts", ())) else []
    calibration = old["calibration"].to_dict("records") if len(old.get("calibration", ())) else []
    requests = [old["requests"]] if len(old.get("requests", ())) else []
    steps = [old["steps"]] if len(old.get("steps", ())) else []
    lambdas: dict = dict(meta_old.get("lambda_ref_real", {}))
    for wid, entry in (lambda_refs or {}).items():
        if wid not in lambdas:
            if not (isinstance(entry, dict) and float(entry.get("lambda", 0)) > 0 and entry.get("from")):
                raise ValueError(f"lambda_refs[{wid!r}] = {entry!r}: expected a dict with a positive "
                                 "'lambda' and 'from' (the case it was searched in)")
            lambdas[wid] = dict(entry)
    done = {tuple(r[k] for k in RUN_KEY) for r in runs}
    plan = [(w, rep, policy) for w in windows for rep in range(repetitions) for policy in policies
            if (w.window_id, policy, rep) not in done]
    if old:
        print(f"resuming {tag}: {len(runs)} runs done, {len(plan)} to go", flush=True)
    meta = {
        "backend": name,
        "case": {"policies": list(policies), "region": region, "sources": list(sources),
                 "n_per_source": n_per_source, "speed_ratio": speed_ratio,
                 "bracket_factor": bracket_factor, "max_widenings": max_widenings,
                 "bisection_steps": bisection_steps, "repetitions": repetitions, "guard": bool(guard),
                 "adapt_bracket": adapt_bracket,
                 "lambda_policy": lambda_policy,
                 "drift_tolerance": drift_tolerance, "max_retries": max_retries,
                 "reference_probes": reference_probes, "retry_wait_s": retry_wait_s},
        "probe": {"requests": PROBE_REQUESTS, "prompt_tokens": PROBE_PROMPT_TOKENS,
                  "output_tokens": PROBE_OUTPUT_TOKENS, "arrival_s": 0.0, "warmup": int(probe_warmup),
                  "repeats": int(probe_repeats)},
        "engine_kwargs": {k: repr(v) for k, v in engine_kwargs.items() if k != "model"},
        "environment": meta_old.get("environment", {}),
        "engine_info": meta_old.get("engine_info", {}),
        "probe_reference": dict(meta_old.get("probe_reference", {})),
        "lambda_ref_real": lambdas,
        "sessions": list(meta_old.get("sessions", [])) + [
            {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "runs_before": len(runs), "max_retries": max_retries, "retry_wait_s": retry_wait_s}],
    }

    def write():
        _write_case(out, tag, runs, requests, calibration, steps, attempts, meta)

    if guard and (int(probe_warmup), int(probe_repeats)) != (PROBE_WARMUP, PROBE_REPEATS):
        probe = functools.partial(probe, warmup=int(probe_warmup), repeats=int(probe_repeats))

    def bracket_guess(w) -> tuple[float, float]:
        """The search's first guess and bracket factor for window ``w``."""
        sim = float(w.meta.get("paper_lambda_ref", 1.0))
        if adapt_bracket:
            ratios = [float(e["lambda"]) / float(ws.meta.get("paper_lambda_ref", 1.0))
                      for ws in windows if ws.source == w.source and ws.window_id in lambdas
                      for e in (lambdas[ws.window_id],) if not e.get("pinned")]
            if ratios:
                return sim * float(np.median(ratios)), float(adapt_bracket)
        return sim * speed_ratio, bracket_factor

    if not plan:
        return pd.DataFrame(runs)

    t_start = time.perf_counter()
    refs: dict[str, float] = {}
    if guard:
        for policy in policies:
            # a reference taken on a noisy host is no reference: up to 3 rounds, until its probes agree
            rounds = []
            for k in range(3):
                walls = [float(probe(policy, **engine_kwargs)["wall_s"]) for _ in range(reference_probes)]
                spread = max(walls) / min(walls) - 1 if min(walls) > 0 else math.inf
                rounds.append((spread, walls))
                if spread <= drift_tolerance:
                    break
                print(f"host probe for {policy}: reference probes {', '.join(f'{x:.3f}' for x in walls)} s "
                      f"disagree by {spread:.0%}; the host is noisy" + ("; measuring again" if k < 2 else ""),
                      flush=True)
                if k < 2 and retry_wait_s:
                    time.sleep(retry_wait_s)
            spread, walls = min(rounds, key=lambda r: r[0])
            ref = float(np.median(walls))
            stored = meta["probe_reference"].get(policy, {}).get("wall_s")
            kept_stored = stored is not None and ref > stored * (1 + drift_tolerance)
            if kept_stored:
                print(f"host probe for {policy}: {ref:.3f} s now vs {stored:.3f} s at the case's start "
                      f"(+{ref / stored - 1:.0%}): the host is slow now; keeping the earlier reference",
                      flush=True)
            refs[policy] = float(stored) if kept_stored else ref
            meta["probe_reference"][policy] = {
                "wall_s": refs[policy], "probes_s": walls, "spread": spread, "rounds": len(rounds),
                "kept_earlier": bool(kept_stored),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write()

    bar = tqdm(total=len(plan), unit="run", desc=f"{tag} [{name}]", disable=not progress)
    scaled_of: dict[str, Window] = {}
    for w, rep, policy in plan:
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            print(f"time budget of {time_budget_s:.0f} s reached: stopping with {len(runs)} runs "
                  f"(restart with the same tag to resume)", flush=True)
            break
        cal = lambdas.get(w.window_id)
        if cal is None:
            guess, factor = bracket_guess(w)
            lam, p, pinned = find_real_lambda_ref(
                w, mod.replay, lo=guess / factor, hi=guess * factor,
                steps=bisection_steps, bracket_factor=factor, max_widenings=max_widenings,
                policy=lambda_policy, **engine_kwargs)
            calibration += p
            cal = lambdas[w.window_id] = {"lambda": lam, "pinned": bool(pinned),
                                          "pinned_side": p[-1]["pinned_side"] if p else "",
                                          "probes": len(p)}
            write()
        lam = float(cal["lambda"])
        if w.window_id not in scaled_of:
            scaled_of[w.window_id] = scale(w, REGIONS[region] * lam)
        scaled = scaled_of[w.window_id]

        tries = []
        for attempt in range(max_retries + 1 if guard else 1):
            before = probe(policy, **engine_kwargs) if guard else {}
            result, info = mod.replay(scaled, policy, **engine_kwargs)
            after = probe(policy, **engine_kwargs) if guard else {}
            if guard:
                ref = refs[policy]
                drift = max(abs(before["wall_s"] / ref - 1), abs(after["wall_s"] / ref - 1))
            else:
                ref = drift = np.nan
            accepted = not guard or drift <= drift_tolerance
            tries.append((attempt, result, info, before, after, ref, drift, accepted))
            if accepted:
                break
            if attempt < max_retries:
                print(f"{w.window_id} {policy} rep {rep}: host probe drifted {drift:.0%} "
                      f"(> {drift_tolerance:.0%}); re-running", flush=True)
                if retry_wait_s:
                    time.sleep(retry_wait_s)
        final = tries[-1] if tries[-1][7] else min(tries, key=lambda t: t[6])
        for attempt, result, info, before, after, ref, drift, accepted in tries:
            rejected = set(info.get("rejected", ()))
            row = {"source": w.source, "window_id": w.window_id, "region": region,
                   "slo_multiplier": w.slo_multiplier, "policy": policy, "repetition": rep,
                   "lambda_ref_real": lam, "lambda_pinned": bool(cal.get("pinned", False)),
                   "lambda_ref_sim": w.meta.get("paper_lambda_ref", np.nan),
                   "load_factor": REGIONS[region] * lam, "wall_s": info.get("wall_s", np.nan),
                   "n_steps": int(result.n_steps), "n_preemptions": int(result.n_preemptions),
                   "mean_step_ms": info.get("mean_step_ms", np.nan),
                   "mean_schedule_ms": info.get("mean_schedule_ms", np.nan),
                   "max_model_len": _engine_max_model_len(info), "n_refused": len(rejected),
                   "probe_before_s": before.get("wall_s", np.nan),
                   "probe_after_s": after.get("wall_s", np.nan), "probe_ref_s": ref,
                   "probe_before_step_s": before.get("mean_step_s", np.nan),
                   "probe_after_step_s": after.get("mean_step_s", np.nan),
                   "drift": drift, "attempt": attempt, "n_attempts": len(tries),
                   "host_flagged": not final[7], **cell_metrics(result)}
            is_final = attempt == final[0]
            attempts.append({**row, "accepted": bool(accepted), "kept": is_final})
            frame = _steps_frame(info)
            if len(frame):
                for col, value in (("kept", is_final), ("attempt", attempt), ("repetition", rep),
                                   ("policy", policy), ("window_id", w.window_id)):
                    frame.insert(0, col, value)
                steps.append(frame)
            if is_final:
                runs.append(row)
                extra = {key: np.asarray(info[key]) for key in REQUEST_EXTRAS
                         if info.get(key) is not None and len(info[key]) == len(w)}
                requests.append(pd.DataFrame({
                    "window_id": w.window_id, "policy": policy, "repetition": rep, "attempt": attempt,
                    "request_index": np.arange(len(w)),
                    "arrival_s": result.arrival_s, "deadline_s": result.deadline_s,
                    "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
                    "admit_s": result.admit_s, "first_token_s": result.first_token_s,
                    "finish_s": result.finish_s, "refused": np.isin(np.arange(len(w)), list(rejected)),
                    **extra}))
                meta["environment"] = info.get("environment", meta["environment"])
                meta["engine_info"] = {k: v for k, v in info.items()
                                       if isinstance(v, (str, int, float, bool))}
        write()
        bar.update(1)
    bar.close()
    return pd.DataFrame(runs)


#: Queue-length bins of :func:`scheduler_time` (left-closed; the last is open).
QUEUE_BINS = (0, 1, 8, 32, 128, 512)


def scheduler_time(steps: pd.DataFrame, *, queue: str | None = None, bins=QUEUE_BINS) -> pd.DataFrame:
    """The scheduler's own time per step (``schedule_s`` of a case's step log), by policy and queue
    length: the waiting requests the scheduler found (``waiting_before`` on vLLM, ``waiting`` on
    transformers, or ``queue``). Columns ``policy, queue_bin, steps, median_ms, p95_ms, mean_ms``."""
    if queue is None:
        queue = "waiting_before" if "waiting_before" in steps else "waiting"
    d = steps.dropna(subset=["schedule_s", queue])
    edges = list(bins)
    names = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
    names.append(f">={edges[-1]}")
    idx = np.searchsorted(np.asarray(edges), d[queue].to_numpy(dtype=float), side="right") - 1
    d = d.assign(queue_bin=pd.Categorical([names[max(i, 0)] for i in idx], categories=names, ordered=True),
                 ms=d["schedule_s"] * 1e3)
    out = (d.groupby(["policy", "queue_bin"], observed=True)["ms"]
           .agg(steps="size", median_ms="median", p95_ms=lambda x: float(np.quantile(x, 0.95)),
                mean_ms="mean")
           .reset_index())
    return out


def _write_case(out: Path, tag: str, runs, requests, probes, steps, attempts, meta) -> None:
    frames = {"runs": pd.DataFrame(runs),
              "requests": pd.concat(requests, ignore_index=True) if requests else pd.DataFrame(),
              "calibration": pd.DataFrame(probes),
              "steps": pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(),
              "attempts": pd.DataFrame(attempts)}
    for name, frame in frames.items():
        store.atomic_write(out / f"{tag}_{name}.parquet", lambda p, f=frame: f.to_parquet(p, index=False))
    store.atomic_write(out / f"{tag}.json", lambda p: p.write_text(json.dumps(meta, indent=1, default=str)))
