"""The study's RQ6 case on a real engine: real-engine λ_ref, then the case and its control.

Case (pre-registered by the study): ``slai_faithful`` vs ``vllm_faithful``, ANWG, HIGH_PRESSURE,
Azure vs BurstGPT; control: Azure vs Bailian. For each window, λ_ref is re-found on the real engine
(FIFO's 0.5% SLO-violation knee, a short bisection in log λ whose bracket widens when the knee is
outside it), the window is compressed to 1.5 × λ_ref, and each policy replays it ``repetitions``
times. A shared host can slow a whole stretch of runs down: every run is guarded by a fixed probe
batch before and after it, compared with a reference taken at the start, and re-run when the host
drifted (:func:`run_case`, configured by a :class:`CaseConfig`). Per-run metrics and probe figures,
per-request times, every engine step, every attempt, the λ search and the provenance (engine,
versions, model shape, hardware, date, probe references, λ_ref per window) are written as one
:class:`portbench.results.Case` under ``data/results/realengine/``; a stopped case resumes where it
stopped.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import math
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from .. import results, store
from ..metrics import cell_metrics, slo_violation_rate
from ..regions import REGIONS, VIOLATION_THRESHOLD
from ..workload import Window, scale
from ..results import realengine_dir  # noqa: F401  (where the cases are; named in portbench.results)
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


def reusable_lambda_refs(case: results.Case, windows, **ours) -> dict:
    """The real-engine λ_ref entries for ``windows`` of ``case`` (from its provenance), each marked
    with the case it came from, when that case searched with the same settings ``ours`` (by name:
    ``backend`` and ``engine_kwargs`` at the provenance's top level, the others in its ``case``
    section, where ``lambda_policy`` defaults to FIFO as in files written before it was recorded);
    else ``{}``, with the reason printed."""
    meta = case.meta
    if meta is None:
        print(f"no {case.path('meta').name}: every λ_ref is searched here", flush=True)
        return {}
    settings = {"lambda_policy": "fifo", **meta.get("case", {})}
    differ = [k for k, v in ours.items()
              if (meta.get(k) if k in ("backend", "engine_kwargs") else settings.get(k)) != v]
    if differ:
        print(f"{case.path('meta').name} searched λ_ref with other {', '.join(differ)}: every λ_ref is "
              "searched here", flush=True)
        return {}
    windows = set(windows)
    return {wid: {**entry, "from": entry.get("from", case.tag)}
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
#: Per-request arrays a backend's info may carry into the case's requests (vLLM: the loop's clock at
#: ``add_request`` and the index of the first step that could schedule the request; NaN / -1 when
#: refused; with prefix caching on, the prompt tokens served from the cache at the first
#: scheduling). Absent from the files written before 2026-12.
REQUEST_EXTRAS = ("submit_s", "submit_step", "cached_tokens")
#: What the host guard stores with every run.
GUARD_COLUMNS = ("probe_before_s", "probe_after_s", "probe_ref_s", "drift", "attempt", "host_flagged")


@dataclasses.dataclass(frozen=True)
class CaseConfig:
    """What :func:`run_case` runs: the case, its λ_ref search, its host guard and the engine.

    ``backend``: ``"vllm"`` or ``"transformers"`` (or any object with ``replay`` and ``probe``
    functions, as the tests pass). The case: ``policies`` at ``region``, ``n_per_source`` windows
    of each of ``sources`` in manifest order, interleaving sources (or the given ``windows``), each
    (window, policy) run ``repetitions`` times; ``engine_kwargs`` go to every replay and probe.

    **λ_ref on the real engine** is bracketed around ``speed_ratio`` × the simulator's λ_ref (a real
    engine that serves a request ``r`` times slower than the simulator's 1 ms per token has its knee
    about ``r`` times lower), within a factor ``bracket_factor`` either way, widened up to
    ``max_widenings`` times when the knee is outside, then bisected ``bisection_steps`` times
    (:func:`find_real_lambda_ref`), replaying ``lambda_policy`` (FIFO; the study's own real-system
    search replayed ``vllm_faithful``). ``adapt_bracket`` (a factor, e.g. 2): once a source has
    searched windows, its next windows are bracketed within that factor of the simulator's λ_ref ×
    the median real/simulated λ_ref ratio of that source so far. ``lambda_refs``: a ``{window_id:
    entry}`` mapping of searches already made by another case on the same engine and settings (that
    case's ``lambda_ref_real``: ``lambda``, ``pinned``, ``pinned_side``, ``probes`` and ``from``, the
    case it came from); those windows are not searched again, and the entry is stored as given.

    **Host guard** (``guard``): a reference probe per policy (the median wall time of
    ``reference_probes`` runs of the backend's ``probe``, measured again, up to three rounds, while
    they disagree by more than ``drift_tolerance``), then a probe before and after every run; a run
    whose probes drift by more than ``drift_tolerance`` from the reference is re-run, at most
    ``max_retries`` times (``retry_wait_s`` apart). Each probe replays its batch ``probe_warmup``
    times untimed and ``probe_repeats`` times timed.

    ``tag``: the case's files' prefix (default ``<backend>_case``) in ``data_dir``'s
    ``results/realengine/`` (:class:`portbench.results.Case`).
    """

    backend: object
    n_per_source: int = 10
    sources: tuple = CASE_SOURCES
    policies: tuple = CASE_POLICIES
    region: str = CASE_REGION
    speed_ratio: float = 1.0
    bracket_factor: float = 8.0
    max_widenings: int = 3
    bisection_steps: int = 5
    repetitions: int = 2
    guard: bool = True
    drift_tolerance: float = 0.15
    max_retries: int = 2
    reference_probes: int = 3
    retry_wait_s: float = 0.0
    tag: str | None = None
    data_dir: Path | None = None
    windows: tuple | None = None
    lambda_refs: dict | None = None
    lambda_policy: str = "fifo"
    probe_warmup: int = PROBE_WARMUP
    probe_repeats: int = PROBE_REPEATS
    adapt_bracket: float | None = None
    engine_kwargs: dict = dataclasses.field(default_factory=dict)

    def settings(self) -> dict:
        """The ``case`` section of the case's provenance."""
        return {"policies": list(self.policies), "region": self.region, "sources": list(self.sources),
                "n_per_source": self.n_per_source, "speed_ratio": self.speed_ratio,
                "bracket_factor": self.bracket_factor, "max_widenings": self.max_widenings,
                "bisection_steps": self.bisection_steps, "repetitions": self.repetitions,
                "guard": bool(self.guard), "adapt_bracket": self.adapt_bracket,
                "lambda_policy": self.lambda_policy,
                "drift_tolerance": self.drift_tolerance, "max_retries": self.max_retries,
                "reference_probes": self.reference_probes, "retry_wait_s": self.retry_wait_s}


class _Try(NamedTuple):
    """One attempt of a run: the replay and the host probes around it."""
    attempt: int
    result: object
    info: dict
    before: dict
    after: dict
    ref: float
    drift: float
    accepted: bool


@dataclasses.dataclass
class _Session:
    """A case being run: what an earlier session wrote and what this one adds, rewritten whole (and
    atomically) after every run and every λ_ref search."""

    case: results.Case
    meta: dict
    runs: list
    attempts: list
    calibration: list
    requests: list
    steps: list

    @property
    def lambdas(self) -> dict:
        return self.meta["lambda_ref_real"]

    def write(self) -> None:
        """The five tables, the runs last, then the provenance (which names what they hold). A run is
        done once the runs table holds it: a case stopped between two files leaves rows of a run the
        runs table does not hold, which :func:`_finished_runs_only` drops when the case resumes."""
        self.case.write(
            requests=pd.concat(self.requests, ignore_index=True) if self.requests else pd.DataFrame(),
            calibration=pd.DataFrame(self.calibration),
            steps=pd.concat(self.steps, ignore_index=True) if self.steps else pd.DataFrame(),
            attempts=pd.DataFrame(self.attempts), runs=pd.DataFrame(self.runs), meta=self.meta)


def _finished_runs_only(case: results.Case, runs: pd.DataFrame | None, parts: dict) -> tuple:
    """A stored case's runs and ``parts`` (part name → frame keyed by :data:`RUN_KEY`), each
    holding only the runs that were finished: those in the runs table with their requests on disk
    (a case written before the runs table came last could stop between its runs and its requests).
    Says what it drops."""
    if runs is None or not len(runs):
        return runs, parts
    keys = pd.MultiIndex.from_frame(runs[list(RUN_KEY)])
    requests = parts.get("requests")
    if requests is not None and len(requests):
        keys = keys[keys.isin(pd.MultiIndex.from_frame(requests[list(RUN_KEY)]))]
    kept_runs = runs[pd.MultiIndex.from_frame(runs[list(RUN_KEY)]).isin(keys)]
    kept = {name: (f[pd.MultiIndex.from_frame(f[list(RUN_KEY)]).isin(keys)]
                   if f is not None and len(f) and set(RUN_KEY) <= set(f.columns) else f)
            for name, f in parts.items()}
    dropped = {name: len(parts[name]) - len(kept[name]) for name in parts
               if parts[name] is not None and len(parts[name]) != len(kept[name])}
    if len(kept_runs) != len(runs):
        dropped["runs"] = len(runs) - len(kept_runs)
    if dropped:
        print(f"resuming {case.tag}: dropping the rows of runs not finished when it stopped ("
              + ", ".join(f"{n} {name}" for name, n in dropped.items()) + "); they are run again", flush=True)
    return kept_runs.reset_index(drop=True), {n: (f.reset_index(drop=True) if f is not None else f)
                                              for n, f in kept.items()}


def _steps_frame(info: dict) -> pd.DataFrame:
    """A backend's per-step log as a table with common names (``start_s``, ``duration_s``, …)."""
    steps = info.get("steps")
    if steps is None:
        return pd.DataFrame()
    df = steps.copy() if isinstance(steps, pd.DataFrame) else pd.DataFrame(steps)
    df = df.rename(columns={"t_s": "start_s", "step_s": "duration_s"})
    df.insert(0, "step", np.arange(len(df)))
    return df


def _engine_setting(info: dict, key: str) -> float:
    """The replay's engine setting ``key`` (``max_model_len``, ``max_num_seqs``), NaN where the
    backend does not report it."""
    cfg = info.get("engine_config") or {}
    value = cfg.get(key) if isinstance(cfg, dict) else None
    return float(value) if value is not None else np.nan


def _backend_of(config: CaseConfig):
    """``(module, name, probe)`` of the case's backend (``probe``: None without the host guard)."""
    mod = backend(config.backend) if isinstance(config.backend, str) else config.backend
    name = config.backend if isinstance(config.backend, str) else getattr(mod, "ENGINE", "custom")
    probe = getattr(mod, "probe", None) if config.guard else None
    if config.guard and probe is None:
        raise ValueError(f"backend {name!r} has no probe(): pass guard=False")
    if config.guard and (int(config.probe_warmup), int(config.probe_repeats)) != (PROBE_WARMUP, PROBE_REPEATS):
        probe = functools.partial(probe, warmup=int(config.probe_warmup), repeats=int(config.probe_repeats))
    return mod, name, probe


def _case_windows(config: CaseConfig) -> list:
    if config.windows is not None:
        return list(config.windows)
    per_source = [store.load_windows(config.data_dir, s)[:config.n_per_source] for s in config.sources]
    return [w for group in zip(*per_source) for w in group]


def _stored_case(case: results.Case, config: CaseConfig, name: str) -> dict | None:
    """The provenance of what an earlier (stopped) session of this case wrote, to resume it; None
    when there is none. Refuses a case written before the guard, or another case under the tag."""
    if not case.has("runs") and not case.has("meta"):
        return None
    meta = case.provenance
    settings = meta.get("case", {})
    if "guard" not in settings:
        raise ValueError(f"{case.folder / case.tag}_* was written before the guarded case (no "
                         f"repetitions or host probes): use another tag, or resume=False to overwrite it")
    if (meta.get("backend") != name or settings.get("policies") != list(config.policies)
            or settings.get("region") != config.region):
        raise ValueError(f"{case.path('meta')} is a different case (backend {meta.get('backend')!r}, policies "
                         f"{settings.get('policies')}, region {settings.get('region')!r}): use another tag, or "
                         f"resume=False to overwrite it")
    if settings.get("lambda_policy", "fifo") != config.lambda_policy:
        raise ValueError(f"{case.tag}: its λ_ref searches replayed {settings.get('lambda_policy', 'fifo')!r}, "
                         f"not {config.lambda_policy!r}: use another tag, or resume=False to overwrite it")
    return meta


def _lambda_refs(stored: dict, shared: dict | None) -> dict:
    """The case's λ_ref entries: those it searched, then those shared by another case."""
    lambdas = dict(stored)
    for wid, entry in (shared or {}).items():
        if wid not in lambdas:
            if not (isinstance(entry, dict) and float(entry.get("lambda", 0)) > 0 and entry.get("from")):
                raise ValueError(f"lambda_refs[{wid!r}] = {entry!r}: expected a dict with a positive "
                                 "'lambda' and 'from' (the case it was searched in)")
            lambdas[wid] = dict(entry)
    return lambdas


def _open_session(config: CaseConfig, name: str, windows: list, resume: bool) -> tuple[_Session, list]:
    """The case's session (resumed from its files when ``resume``) and its plan: the (window,
    repetition, policy) runs still to do, in order."""
    case = results.Case(config.tag or f"{name}_case", config.data_dir)
    case.folder.mkdir(parents=True, exist_ok=True)
    stored = _stored_case(case, config, name) if resume else None
    meta_old = stored or {}

    stored_runs, parts = _finished_runs_only(
        case, case.runs if stored is not None else None,
        {p: getattr(case, p) if stored is not None else None for p in ("requests", "steps", "attempts")})
    parts.update(runs=stored_runs, calibration=case.calibration if stored is not None else None)

    def rows(part):
        frame = parts[part]
        return frame.to_dict("records") if frame is not None and len(frame) else []

    def frames(part):
        frame = parts[part]
        return [frame] if frame is not None and len(frame) else []

    runs = rows("runs")
    lambdas = _lambda_refs(meta_old.get("lambda_ref_real", {}), config.lambda_refs)
    done = {tuple(r[k] for k in RUN_KEY) for r in runs}
    # repetition by repetition: a case stopped part-way leaves every window with as many repetitions
    # as the others, give or take one
    plan = [(w, rep, policy) for rep in range(config.repetitions) for w in windows for policy in config.policies
            if (w.window_id, policy, rep) not in done]
    if stored is not None:
        print(f"resuming {case.tag}: {len(runs)} runs done, {len(plan)} to go", flush=True)
    meta = {
        "backend": name,
        "case": _merged_settings(meta_old.get("case", {}), config.settings()),
        "probe": {"requests": PROBE_REQUESTS, "prompt_tokens": PROBE_PROMPT_TOKENS,
                  "output_tokens": PROBE_OUTPUT_TOKENS, "arrival_s": 0.0, "warmup": int(config.probe_warmup),
                  "repeats": int(config.probe_repeats)},
        "engine_kwargs": {k: repr(v) for k, v in config.engine_kwargs.items() if k != "model"},
        "environment": meta_old.get("environment", {}),
        "engine_info": meta_old.get("engine_info", {}),
        "probe_reference": dict(meta_old.get("probe_reference", {})),
        "lambda_ref_real": lambdas,
        "sessions": list(meta_old.get("sessions", [])) + [
            {"started": _now(), "runs_before": len(runs), "sources": list(config.sources),
             "repetitions": config.repetitions, "max_retries": config.max_retries,
             "retry_wait_s": config.retry_wait_s}],
    }
    session = _Session(case, meta, runs, rows("attempts"), rows("calibration"), frames("requests"), frames("steps"))
    return session, plan


def _merged_settings(stored: dict, now: dict) -> dict:
    """The case's settings after a resumed session: this session's, with the sources and the
    repetitions of every session (a session may add repetitions to some sources only)."""
    if not stored:
        return now
    merged = dict(now)
    merged["sources"] = list(dict.fromkeys(list(stored.get("sources", [])) + list(now["sources"])))
    merged["repetitions"] = max(int(stored.get("repetitions", 0)), int(now["repetitions"]))
    return merged


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _reference_probes(config: CaseConfig, session: _Session, probe) -> dict[str, float]:
    """The host guard's reference probe wall time per policy (see :class:`CaseConfig`): measured in
    up to three rounds until the probes agree, the most consistent round kept; a resumed case keeps
    its stored reference when the host is slower now. Recorded in the provenance and written."""
    kw, tolerance = config.engine_kwargs, config.drift_tolerance
    refs: dict[str, float] = {}
    for policy in config.policies:
        # a reference taken on a noisy host is no reference: up to 3 rounds, until its probes agree
        rounds = []
        for k in range(3):
            walls = [float(probe(policy, **kw)["wall_s"]) for _ in range(config.reference_probes)]
            spread = max(walls) / min(walls) - 1 if min(walls) > 0 else math.inf
            rounds.append((spread, walls))
            if spread <= tolerance:
                break
            print(f"host probe for {policy}: reference probes {', '.join(f'{x:.3f}' for x in walls)} s "
                  f"disagree by {spread:.0%}; the host is noisy" + ("; measuring again" if k < 2 else ""),
                  flush=True)
            if k < 2 and config.retry_wait_s:
                time.sleep(config.retry_wait_s)
        spread, walls = min(rounds, key=lambda r: r[0])
        ref = float(np.median(walls))
        stored = session.meta["probe_reference"].get(policy, {}).get("wall_s")
        # Either way: a slower host now would make a noisy reference, and a faster one (another
        # machine) would serve the case's λ_ref, searched on the earlier host, at a lighter load.
        kept_stored = stored is not None and abs(ref / stored - 1) > tolerance
        if kept_stored:
            print(f"host probe for {policy}: {ref:.3f} s now vs {stored:.3f} s at the case's start "
                  f"({ref / stored - 1:+.0%}): the host is "
                  + ("slow now" if ref > stored else "faster now, and the case's λ_ref would be a lighter "
                     "load on it (its runs are re-run and flagged while it stays so)")
                  + "; keeping the earlier reference", flush=True)
        refs[policy] = float(stored) if kept_stored else ref
        session.meta["probe_reference"][policy] = {
            "wall_s": refs[policy], "probes_s": walls, "spread": spread, "rounds": len(rounds),
            "kept_earlier": bool(kept_stored), "date": _now()}
    session.write()
    return refs


def _bracket_guess(config: CaseConfig, lambdas: dict, windows: list, w) -> tuple[float, float]:
    """The λ_ref search's first guess and bracket factor for window ``w``."""
    sim = float(w.meta.get("paper_lambda_ref", 1.0))
    if config.adapt_bracket:
        ratios = [float(e["lambda"]) / float(ws.meta.get("paper_lambda_ref", 1.0))
                  for ws in windows if ws.source == w.source and ws.window_id in lambdas
                  for e in (lambdas[ws.window_id],) if not e.get("pinned")]
        if ratios:
            return sim * float(np.median(ratios)), float(config.adapt_bracket)
    return sim * config.speed_ratio, config.bracket_factor


def _window_lambda_ref(config: CaseConfig, session: _Session, replay, windows: list, w) -> dict:
    """Window ``w``'s real-engine λ_ref entry: stored or shared, else searched now (and written)."""
    cal = session.lambdas.get(w.window_id)
    if cal is None:
        guess, factor = _bracket_guess(config, session.lambdas, windows, w)
        lam, p, pinned = find_real_lambda_ref(
            w, replay, lo=guess / factor, hi=guess * factor,
            steps=config.bisection_steps, bracket_factor=factor, max_widenings=config.max_widenings,
            policy=config.lambda_policy, **config.engine_kwargs)
        session.calibration += p
        cal = session.lambdas[w.window_id] = {"lambda": lam, "pinned": bool(pinned),
                                              "pinned_side": p[-1]["pinned_side"] if p else "",
                                              "probes": len(p)}
        session.write()
    return cal


def _guarded_replay(config: CaseConfig, mod, probe, refs: dict, scaled, policy: str, label: str) -> list[_Try]:
    """Replay ``scaled`` under ``policy`` between two host probes, again while the probes drifted
    (at most ``max_retries`` times); every attempt, in order."""
    kw, guard = config.engine_kwargs, config.guard
    tries = []
    for attempt in range(config.max_retries + 1 if guard else 1):
        before = probe(policy, **kw) if guard else {}
        result, info = mod.replay(scaled, policy, **kw)
        after = probe(policy, **kw) if guard else {}
        if guard:
            ref = refs[policy]
            drift = max(abs(before["wall_s"] / ref - 1), abs(after["wall_s"] / ref - 1))
        else:
            ref = drift = np.nan
        accepted = not guard or drift <= config.drift_tolerance
        tries.append(_Try(attempt, result, info, before, after, ref, drift, accepted))
        if accepted:
            break
        if attempt < config.max_retries:
            print(f"{label}: host probe drifted {drift:.0%} (> {config.drift_tolerance:.0%}); re-running",
                  flush=True)
            if config.retry_wait_s:
                time.sleep(config.retry_wait_s)
    return tries


def _run_row(config: CaseConfig, w, rep: int, policy: str, cal: dict, t: _Try, n_attempts: int,
             flagged: bool) -> dict:
    """One attempt's row of the case's runs (and attempts) table."""
    lam = float(cal["lambda"])
    result, info, before, after = t.result, t.info, t.before, t.after
    return {"source": w.source, "window_id": w.window_id, "region": config.region,
            "slo_multiplier": w.slo_multiplier, "policy": policy, "repetition": rep,
            "lambda_ref_real": lam, "lambda_pinned": bool(cal.get("pinned", False)),
            "lambda_ref_sim": w.meta.get("paper_lambda_ref", np.nan),
            "load_factor": REGIONS[config.region] * lam, "wall_s": info.get("wall_s", np.nan),
            "n_steps": int(result.n_steps), "n_preemptions": int(result.n_preemptions),
            "mean_step_ms": info.get("mean_step_ms", np.nan),
            "mean_schedule_ms": info.get("mean_schedule_ms", np.nan),
            "max_model_len": _engine_setting(info, "max_model_len"),
            "max_num_seqs": _engine_setting(info, "max_num_seqs"), "n_refused": len(set(info.get("rejected", ()))),
            "probe_before_s": before.get("wall_s", np.nan),
            "probe_after_s": after.get("wall_s", np.nan), "probe_ref_s": t.ref,
            "probe_before_step_s": before.get("mean_step_s", np.nan),
            "probe_after_step_s": after.get("mean_step_s", np.nan),
            "drift": t.drift, "attempt": t.attempt, "n_attempts": n_attempts,
            "host_flagged": flagged, **cell_metrics(result)}


def _request_frame(w, rep: int, policy: str, t: _Try) -> pd.DataFrame:
    """The kept attempt's requests, one row each (refused ones marked)."""
    result, info = t.result, t.info
    rejected = set(info.get("rejected", ()))
    extra = {key: np.asarray(info[key]) for key in REQUEST_EXTRAS
             if info.get(key) is not None and len(info[key]) == len(w)}
    return pd.DataFrame({
        "window_id": w.window_id, "policy": policy, "repetition": rep, "attempt": t.attempt,
        "request_index": np.arange(len(w)),
        "arrival_s": result.arrival_s, "deadline_s": result.deadline_s,
        "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
        "admit_s": result.admit_s, "first_token_s": result.first_token_s,
        "finish_s": result.finish_s, "refused": np.isin(np.arange(len(w)), list(rejected)),
        **extra})


def _record(config: CaseConfig, session: _Session, w, rep: int, policy: str, cal: dict,
            tries: list[_Try]) -> None:
    """Every attempt of a run into the session: attempts and steps for each, and for the kept one
    (the accepted one, else the least drifting, flagged) its run row, requests and environment."""
    final = tries[-1] if tries[-1].accepted else min(tries, key=lambda t: t.drift)
    for t in tries:
        row = _run_row(config, w, rep, policy, cal, t, len(tries), not final.accepted)
        is_final = t.attempt == final.attempt
        session.attempts.append({**row, "accepted": bool(t.accepted), "kept": is_final})
        frame = _steps_frame(t.info)
        if len(frame):
            for col, value in (("kept", is_final), ("attempt", t.attempt), ("repetition", rep),
                               ("policy", policy), ("window_id", w.window_id)):
                frame.insert(0, col, value)
            session.steps.append(frame)
        if is_final:
            session.runs.append(row)
            session.requests.append(_request_frame(w, rep, policy, t))
            session.meta["environment"] = t.info.get("environment", session.meta["environment"])
            session.meta["engine_info"] = {k: v for k, v in t.info.items()
                                           if isinstance(v, (str, int, float, bool))}


def run_case(config: CaseConfig, *, resume: bool = True, time_budget_s: float | None = None,
             progress: bool = True) -> pd.DataFrame:
    """Calibrate and replay the case of ``config`` on a real engine, guarded against a slow host;
    returns the per-run table (one row per window × policy × repetition).

    Phases: the session is opened (:func:`_open_session`: resumed from the case's files), the host
    guard's reference probes are taken, then for each run still to do the window's λ_ref is searched
    when not known yet, the window is compressed to the region's load and replayed between host
    probes (re-run while they drift), and every attempt is recorded. When every attempt drifted the
    least-drifting one is kept with ``host_flagged=True``; every attempt also goes to the case's
    attempts (``accepted``: within tolerance, ``kept``: the run table's). When a resumed case's new
    reference is slower than the stored one by more than the tolerance, the stored one is kept.

    Written (:class:`portbench.results.Case`): runs, requests (per request, with ``refused``, and
    where the backend records them ``submit_s``, the replay loop's clock when the request was added
    to the engine, and ``submit_step``, the first step that could schedule it), steps (every
    attempt's engine steps: start, duration, running, waiting, and what the backend records), the
    λ search's probes (calibration), attempts, and the provenance (engine, versions, model shape,
    hardware, date, the case's settings, probe references, each window's λ_ref).

    **Resume**: everything is rewritten (atomically) after every run and every λ_ref search, and a
    case restarted with the same tag (``resume=True``) skips the (window, policy, repetition) runs
    and the λ_ref searches it already has, so a stop — or ``time_budget_s``, checked before each
    run — loses at most the run (or λ_ref search) in progress.
    """
    from tqdm.auto import tqdm

    mod, name, probe = _backend_of(config)
    windows = _case_windows(config)
    session, plan = _open_session(config, name, windows, resume)
    if not plan:
        return pd.DataFrame(session.runs)
    t_start = time.perf_counter()
    refs = _reference_probes(config, session, probe) if config.guard else {}
    bar = tqdm(total=len(plan), unit="run", desc=f"{session.case.tag} [{name}]", disable=not progress)
    scaled_of: dict[str, Window] = {}
    for w, rep, policy in plan:
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            print(f"time budget of {time_budget_s:.0f} s reached: stopping with {len(session.runs)} runs "
                  f"(restart with the same tag to resume)", flush=True)
            break
        cal = _window_lambda_ref(config, session, mod.replay, windows, w)
        if w.window_id not in scaled_of:
            scaled_of[w.window_id] = scale(w, REGIONS[config.region] * float(cal["lambda"]))
        tries = _guarded_replay(config, mod, probe, refs, scaled_of[w.window_id], policy,
                                f"{w.window_id} {policy} rep {rep}")
        _record(config, session, w, rep, policy, cal, tries)
        session.write()
        bar.update(1)
    bar.close()
    return pd.DataFrame(session.runs)


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

