"""The study's case on a GPU, sized before it starts: its windows, their load and its device time.

A plan (:func:`make_plan`) is worked out on the CPU from a step cost measured on the GPU
(:class:`portbench.engine.StepCost`; :func:`load_cost`: the case's own refit where there is one, else
the committed ``h200_study_cost.json``) and the simulator in the case's configuration
(:func:`portbench.realconfig.simulate_configured` with :data:`~portbench.realconfig.STUDY_CONFIG`:
the ``vllm_v1`` model, a 32,768-token budget, whole-prompt admission, 32 requests in flight):

- **windows** (:func:`study_windows`): the first ``window_size`` requests of the first windows of
  every source, in manifest order (RQ8's sub-windows, each an episode from an empty engine at its
  own t = 0); every source gets as many windows, and both policies run on each;
- **load**: each window at the region's factor (HIGH_PRESSURE: 1.5) × its knee, found by bisection
  in the simulator with that cost (:func:`simulated_knee`: ``vllm_faithful``'s 0.5% SLO-violation
  knee, the study's real-system search); no λ_ref is searched on the device;
- **device time**: per run, the simulated makespan (the simulator's steps, each timed by the cost)
  and the engine's set-up; the host probes around every guarded run and the guard's references
  (replays of the probe batch, timed on the GPU where the cost's case has them:
  :func:`measured_overheads`); and what comes before the case (:data:`ALLOWANCES_S`).

A plan over its budget is refused (:class:`PlanError`) with the figure; with ``n_per_source=None``
it takes the most windows per source that fit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from .. import results, store
from ..engine import StepCost
from ..metrics import slo_violation_rate
from ..open_questions import STUDY_WINDOW_SIZE, check_window_size, sub_windows
from ..regions import REGIONS, VIOLATION_THRESHOLD, bisect_log10
from ..workload import Window, scale
from . import probe_window

#: The set-up whose step cost a plan takes when the case has none of its own (``<tag>_cost.json``).
COMMITTED_COST = "h200_study"
#: What comes before the case, in seconds: the machine's start and the working tree's transfer (the
#: device notes: "a minute or more") with imports and the model build (7.8 s on the H200); the
#: tuning's time box (three candidates of about 8 s there); the study grid's step profile (12 s there).
ALLOWANCES_S = {"start-up": 130.0, "tuning": 30.0, "profile": 15.0}
#: The plan's ceiling: 10 of a lease's 15 device-minutes, start-up included (one rerun's margin).
DEVICE_MINUTES = 10.0
#: The simulated knee's bisection: log10 λ bounds and halvings (2^-12 of 6 decades: 0.3% in λ).
KNEE_LOG10_BOUNDS = (-3.0, 3.0)
KNEE_STEPS = 12
#: The most windows per source a plan that picks its own number considers.
MAX_WINDOWS_PER_SOURCE = 10


class PlanError(ValueError):
    """A plan that cannot run as asked: over its budget, or its inputs missing."""


@dataclasses.dataclass(frozen=True)
class Overheads:
    """What a guarded run costs besides its replay: one replay of the probe batch (wall time), the
    engine's time around any replay (its set-up before the first submission, and where measured its
    stop after the last result), and where both figures come from."""

    probe_replay_s: float
    setup_s: float
    source: str


@dataclasses.dataclass(frozen=True)
class PlannedWindow:
    """One window of a plan: its simulated knee (``pinned``: ``"low"``/``"high"`` at a bound), the
    load it runs at, and each policy's simulated makespan and steps there."""

    window: Window
    knee: float
    pinned: str | None
    load_factor: float
    wall_s: dict
    steps: dict


def load_cost(tag: str, data_dir=None, path=None) -> tuple[StepCost, str, results.Case]:
    """The step cost a plan takes: the JSON at ``path`` (a set-up's ``<tag>_cost.json``, or the
    cost's terms alone), else the set-up ``tag``'s own refit, else :data:`COMMITTED_COST`'s. Returns
    the cost, a line naming it, and the case of the set-up it came from (whose runs measured the
    guard's overheads, where it has any)."""
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no step cost file {path}")
        data, name = json.loads(path.read_text()), path.name
        case = results.setup_case(name.removesuffix("_cost.json"), data_dir)
    else:
        case = next((c for c in (results.setup_case(t, data_dir) for t in (tag, COMMITTED_COST)) if c.has("cost")),
                    None)
        if case is None:
            raise FileNotFoundError(f"no step cost to plan with: neither {tag}_cost.json nor "
                                    f"{COMMITTED_COST}_cost.json in {results.realengine_dir(data_dir)}")
        data, name = case.cost, case.path("cost").name
    terms = data.get("cost", data) if isinstance(data, dict) else {}
    try:
        cost = StepCost(**{k: float(terms[k]) for k in ("fixed_s", "per_prefill_token_s", "per_decode_seq_s",
                                                        "per_context_token_s", "gap_s")})
    except KeyError as exc:
        raise PlanError(f"{name}: no step cost term {exc.args[0]!r}") from None
    gpu = ((case.meta or {}).get("environment") or {}).get("gpu") or (case.tuning or {}).get("gpu")
    return cost, name + (f" (measured on {gpu})" if gpu else ""), case


def measured_overheads(case: results.Case, cost: StepCost) -> Overheads:
    """The guard's probe replay and the set-up as ``case``'s runs measured them (the median of its
    probes before and after each run; its engine's set-up: the stop after a replay was not
    recorded), else the probe batch simulated with ``cost`` and no set-up (on the H200 the simulated
    probe took half the measured one: the cost's fit leaves small steps short)."""
    runs = case.runs
    walls = (pd.concat([runs["probe_before_s"], runs["probe_after_s"]]).dropna()
             if runs is not None and {"probe_before_s", "probe_after_s"} <= set(runs.columns) else pd.Series([]))
    if len(walls):
        setup = float(((case.meta or {}).get("engine_info") or {}).get("setup_s", 0.0))
        return Overheads(float(walls.median()), setup, f"{case.tag}'s host probes ({len(walls)})")
    wall, _ = predict_run(probe_window(), "vllm_faithful", cost, 1.0)
    return Overheads(wall, 0.0, "the probe batch simulated with the cost")


def study_windows(n_per_source: int | None, window_size: int, *, sources,
                  data_dir=None) -> dict[str, list[Window]]:
    """The first ``window_size`` requests of each of the first ``n_per_source`` windows of every
    source (None: as many as every source has, up to :data:`MAX_WINDOWS_PER_SOURCE`); a window of
    ``window_size`` requests is taken whole. Each sub-window carries RQ8's λ_ref from the study's
    simulator (``paper_lambda_ref``, where ``rq8_lssp_n<size>`` has it)."""
    parents = {source: store.load_windows(data_dir, source) for source in sources}
    fewest = min(len(ws) for ws in parents.values())
    n = min(fewest, MAX_WINDOWS_PER_SOURCE) if n_per_source is None else int(n_per_source)
    short = [f"{s} has {len(ws)}" for s, ws in parents.items() if len(ws) < max(n, 1)]
    if n < 1 or short:
        raise PlanError(f"the plan asks for {n_per_source or 1} window(s) per source; " + "; ".join(short))
    rq8 = _rq8_lambda_refs(window_size, data_dir)
    out = {}
    for source, ws in parents.items():
        out[source] = []
        for w in ws[:n]:
            sub = sub_windows(w, check_window_size(window_size, len(w)))[0]
            if sub is not w and sub.window_id in rq8:
                sub = dataclasses.replace(sub, meta={**sub.meta, "paper_lambda_ref": rq8[sub.window_id]})
            out[source].append(sub)
    return out


def _rq8_lambda_refs(window_size: int, data_dir=None) -> dict:
    path = results.subwindow_path("lssp", window_size, data_dir)
    if window_size == STUDY_WINDOW_SIZE or not path.exists():
        return {}
    table = pd.read_parquet(path, columns=["window_id", "lambda_ref"]).drop_duplicates("window_id")
    return dict(zip(table["window_id"], table["lambda_ref"].astype(float)))


def check_cache(windows, block_size: int, num_blocks: int, in_flight: int) -> None:
    """:class:`PlanError` naming the first window whose ``in_flight`` largest requests (prompt and
    output, each in whole blocks plus one, as the engine may allocate) do not fit ``num_blocks``
    blocks of ``block_size`` tokens: only a cache that holds them all at once never evicts."""
    for w in windows:
        blocks = np.ceil((w.input_tokens + w.output_tokens + 1) / block_size).astype(np.int64) + 1
        need = int(np.sort(blocks)[-int(in_flight):].sum())
        if need > num_blocks:
            raise PlanError(f"window {w.window_id}: its {in_flight} largest requests need {need} KV blocks of "
                            f"{block_size} tokens; the engine's cache has {num_blocks}")


def simulated_knee(window: Window, cost: StepCost, policy: str = "vllm_faithful",
                   config: dict | None = None) -> tuple[float, str | None]:
    """``policy``'s 0.5% SLO-violation knee of ``window`` in the simulator with ``cost`` and the
    case's configuration (``config``: :data:`portbench.realconfig.STUDY_CONFIG`'s keywords by
    default): (λ, pinned) by :func:`portbench.regions.bisect_log10`."""
    def ok(log_lambda):
        return slo_violation_rate(_simulate(scale(window, 10.0 ** log_lambda), policy, cost, config)) \
            < VIOLATION_THRESHOLD

    return bisect_log10(ok, *KNEE_LOG10_BOUNDS, KNEE_STEPS)


def predict_run(window: Window, policy: str, cost: StepCost, load_factor: float,
                config: dict | None = None) -> tuple[float, int]:
    """A replay of ``window`` compressed by ``load_factor`` under ``policy``, simulated: its wall
    time (the last request's finish; the replay starts with the first arrival) and its steps."""
    result = _simulate(scale(window, load_factor), policy, cost, config)
    finish = result.finish_s[np.isfinite(result.finish_s)]
    return (float(finish.max()) if finish.size else 0.0), int(result.n_steps)


def _simulate(scaled: Window, policy: str, cost: StepCost, config: dict | None):
    # imported here: the engine model compiles with numba, which the command line's parser (that
    # imports this module) must not load in a process that builds a vLLM engine
    from ..realconfig import STUDY_CONFIG, simulate_configured

    result, *_ = simulate_configured(scaled, policy, cost, **(STUDY_CONFIG if config is None else config))
    return result


def plan_window(window: Window, cost: StepCost, *, policies, region: str, lambda_policy: str) -> PlannedWindow:
    """One window's knee, load and each policy's simulated replay there."""
    knee, pinned = simulated_knee(window, cost, lambda_policy)
    load = REGIONS[region] * knee
    runs = {p: predict_run(window, p, cost, load) for p in policies}
    return PlannedWindow(window, knee, pinned, load, {p: r[0] for p, r in runs.items()},
                         {p: r[1] for p, r in runs.items()})


@dataclasses.dataclass(frozen=True)
class Plan:
    """A case sized to a budget: its windows (sources interleaved), how it runs, and what it costs.

    ``probe_replays``: replays of the probe batch around each guarded run (before and after);
    ``reference_replays``: those of the guard's references; ``fixed_s``: what comes before the case
    (:data:`ALLOWANCES_S`, or the time already spent); ``budget_s``: the ceiling, all of it included."""

    windows: tuple
    n_per_source: int
    window_size: int
    policies: tuple
    region: str
    lambda_policy: str
    repetitions: int
    cost: StepCost
    cost_source: str
    overheads: Overheads
    probe_replays: int
    reference_replays: int
    max_retries: int
    fixed_s: dict
    budget_s: float

    @property
    def n_runs(self) -> int:
        return len(self.windows) * len(self.policies) * self.repetitions

    def parts_s(self) -> dict:
        """The predicted device time, part by part (seconds)."""
        o = self.overheads
        replays = sum(sum(pw.wall_s.values()) for pw in self.windows) * self.repetitions
        return {**self.fixed_s,
                "reference probes": self.reference_replays * (o.probe_replay_s + o.setup_s),
                "replays": replays + self.n_runs * o.setup_s,
                "host probes": self.n_runs * self.probe_replays * (o.probe_replay_s + o.setup_s)}

    @property
    def total_s(self) -> float:
        return float(sum(self.parts_s().values()))

    @property
    def fits(self) -> bool:
        return self.total_s <= self.budget_s

    def check(self) -> "Plan":
        """The plan, or :class:`PlanError` with the figure when it is over its budget."""
        if not self.fits:
            raise PlanError(f"the plan needs {self.total_s:.0f} s ({self.total_s / 60:.1f} device-minutes) "
                            f"against a budget of {self.budget_s:.0f} s ({self.budget_s / 60:.1f} min): take "
                            "fewer windows (--windows-per-source) or shorter ones (--window-size)")
        return self

    def case_windows(self) -> tuple:
        return tuple(pw.window for pw in self.windows)

    def lambda_refs(self) -> dict:
        """Each window's λ_ref entry for :class:`portbench.realengine.study.CaseConfig`: the simulated knee."""
        source = f"simulator (vllm_v1, study configuration, {self.lambda_policy}; cost {self.cost_source})"
        return {pw.window.window_id: {"lambda": pw.knee, "pinned": pw.pinned is not None,
                                      "pinned_side": pw.pinned or "", "probes": 0, "from": source}
                for pw in self.windows}

    def record(self) -> dict:
        """The plan as plain data (for the set-up's provenance)."""
        return {"windows": [{"window_id": pw.window.window_id, "source": pw.window.source,
                             "n_requests": len(pw.window), "knee": pw.knee, "pinned": pw.pinned or "",
                             "load_factor": pw.load_factor, "wall_s": pw.wall_s, "steps": pw.steps}
                            for pw in self.windows],
                "n_per_source": self.n_per_source, "window_size": self.window_size,
                "repetitions": self.repetitions, "cost": dataclasses.asdict(self.cost),
                "cost_source": self.cost_source, "overheads": dataclasses.asdict(self.overheads),
                "parts_s": self.parts_s(), "total_s": self.total_s, "budget_s": self.budget_s}

    def describe(self) -> str:
        """The plan in words and a table, as ``--plan`` prints it."""
        c, o = self.cost, self.overheads
        lines = [
            f"plan: {len(self.policies)} policies ({', '.join(self.policies)}) x {len(self.windows)} windows "
            f"({self.n_per_source} per source) x {self.repetitions} repetition(s) = {self.n_runs} guarded runs",
            f"windows: the first {self.window_size} requests of the first {self.n_per_source} windows of each "
            "source, each from an empty engine at its own t = 0",
            f"step cost: {self.cost_source}: {c.fixed_s * 1e3:.2f} ms + {c.per_prefill_token_s * 1e6:.2f} us/prefill "
            f"token + {c.per_decode_seq_s * 1e6:.2f} us/decode + {c.per_context_token_s * 1e6:.3f} us/context "
            f"token, gap {c.gap_s * 1e3:.2f} ms",
            f"load: {self.region} = {REGIONS[self.region]} x each window's knee, set in the simulator "
            f"(vllm_v1 in the study's configuration, {self.lambda_policy}'s {VIOLATION_THRESHOLD:.1%} "
            "SLO-violation knee) with this cost: no lambda_ref bisection on the device",
            f"guard: {self.probe_replays} probe replays around every run ({o.probe_replay_s:.3f} s each, from "
            f"{o.source}; {o.setup_s:.3f} s around each replay); a drifted run is "
            + (f"re-run up to {self.max_retries} time(s), re-runs not counted below" if self.max_retries
               else "flagged, not re-run"),
            "", f"{'window':<38} {'knee':>8} {'load':>8} "
            + " ".join(f"{p[:4] + ' s/steps':>16}" for p in self.policies)]
        for pw in self.windows:
            pin = "*" if pw.pinned else " "
            lines.append(f"{pw.window.window_id:<38} {pw.knee:>7.3g}{pin} {pw.load_factor:>8.3g} "
                         + " ".join(f"{pw.wall_s[p]:>9.1f}/{pw.steps[p]:<6d}" for p in self.policies))
        parts = " + ".join(f"{k} {v:.0f} s" for k, v in self.parts_s().items())
        if any(pw.pinned for pw in self.windows):
            lines.append("* the knee is at a bound of the simulated search")
        lines += ["", f"device time: {parts} = {self.total_s:.0f} s ({self.total_s / 60:.1f} min) of "
                      f"{self.budget_s:.0f} s ({self.budget_s / 60:.1f} min): "
                      + ("fits" if self.fits else "OVER BUDGET")]
        return "\n".join(lines)


def make_plan(windows: dict[str, list[Window]], cost: StepCost, *, cost_source: str, overheads: Overheads,
              budget_s: float, fixed_s: dict, n_per_source: int | None = None, window_size: int,
              repetitions: int = 1, policies=("slai_faithful", "vllm_faithful"), region: str = "HIGH_PRESSURE",
              lambda_policy: str = "vllm_faithful", probe_replays: int = 2, reference_replays: int = 0,
              max_retries: int = 0) -> Plan:
    """The plan of ``windows`` (per source, in order; :func:`study_windows`) with ``cost``: the first
    ``n_per_source`` of every source, or (None) the most of them that fit ``budget_s``, at least one.
    Raises nothing over budget: :meth:`Plan.check` does."""
    if region not in REGIONS:
        raise PlanError(f"unknown region {region!r}; regions: {', '.join(REGIONS)}")
    if int(repetitions) < 1:
        raise PlanError(f"repetitions must be >= 1 (got {repetitions})")
    available = min(len(ws) for ws in windows.values())
    if n_per_source is not None and not 1 <= int(n_per_source) <= available:
        raise PlanError(f"windows per source must be between 1 and {available} (got {n_per_source})")
    common = dict(window_size=int(window_size), policies=tuple(policies), region=region,
                  lambda_policy=lambda_policy, repetitions=int(repetitions), cost=cost, cost_source=cost_source,
                  overheads=overheads, probe_replays=int(probe_replays), reference_replays=int(reference_replays),
                  max_retries=int(max_retries), fixed_s=dict(fixed_s), budget_s=float(budget_s))
    planned, plan = [], None
    for k in range(int(n_per_source) if n_per_source is not None else available):
        row = [plan_window(ws[k], cost, policies=policies, region=region, lambda_policy=lambda_policy)
               for ws in windows.values()]
        nxt = Plan(windows=tuple(planned + row), n_per_source=k + 1, **common)
        if n_per_source is None and plan is not None and not nxt.fits:
            break
        planned, plan = planned + row, nxt
    return plan
