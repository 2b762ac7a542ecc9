"""How much of the study's map is the simulator's? Headline numbers per engine model, and the
head-of-line ablation of ``vllm_faithful``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from . import sim, stats
from .metrics import cell_metrics
from .policies import PRIMARY_PANEL, make_policy
from .regions import REGIONS
from .workload import scale


def headline_numbers(table: pd.DataFrame, *, n_resamples: int = 2000, seed: int = 0) -> dict:
    """The RQ1–RQ5 headline numbers of one campaign table (primary panel, ANWG unless named)."""
    regions = [r for r in REGIONS if r in set(table["region"])]
    out = {}
    tau = stats.cross_source_table(table, metrics=("anwg",), regions=regions, n_resamples=n_resamples,
                                   seed=seed, policies=PRIMARY_PANEL)
    ab = (tau["source_a"] == "azure_llm_2024") & (tau["source_b"] == "bailian_qwen")
    out.update(tau_min=tau["tau_b"].min(), tau_max=tau["tau_b"].max(),
               tau_azure_bailian_min=tau.loc[ab, "tau_b"].min(),
               tau_azure_bailian_max=tau.loc[ab, "tau_b"].max(),
               tau_with_burstgpt_min=tau.loc[~ab, "tau_b"].min(),
               tau_with_burstgpt_max=tau.loc[~ab, "tau_b"].max())
    rev = stats.reversal_analysis(table, metrics=("anwg",), regions=regions, n_resamples=n_resamples,
                                  seed=seed, policies=PRIMARY_PANEL)
    for cls, n in stats.reversal_counts(rev).items():
        out[f"reversals_{cls.lower()}"] = int(n)
    sup = rev[rev["cls"] == "SUPPORTED_PRACTICAL_REVERSAL"]
    out["reversals_supported_slai_vllm"] = int(((sup["policy_a"] == "slai_faithful")
                                                & (sup["policy_b"] == "vllm_faithful")).sum())
    pairs = pd.concat([stats.cross_metric(table, s, r, n_resamples=n_resamples, seed=seed,
                                          policies=PRIMARY_PANEL).pairs
                       for s in sorted(set(table["source"])) for r in regions], ignore_index=True)
    cm = stats.cross_metric_summary(pairs)
    out.update(cross_metric_median_tau=cm["median_tau"], cross_metric_top1_agreement=cm["top1_agreement"])
    variants = tuple(m for m in (10.0, 40.0) if m in set(table["slo_multiplier"]))
    if variants:
        slo = stats.slo_sensitivity(table, variants=variants, regions=[r for r in regions if r != "LOW"],
                                    n_resamples=n_resamples, seed=seed, policies=PRIMARY_PANEL)
        out.update(slo_median_tau=slo["tau_b"].median(), slo_top1_changes=int(slo["top1_changed"].sum()),
                   slo_conditions=int(len(slo)))
    sc = pd.concat([stats.sample_complexity(table, "anwg", s, sizes=(10,), n_draws=500,
                                            policies=PRIMARY_PANEL) for s in sorted(set(table["source"]))])
    out["sample_top1_unreliable_at_10"] = int((sc["p_top1"] < 0.9).sum())
    out["sample_conditions"] = int(len(sc))
    return {k: (float(v) if isinstance(v, (np.floating, float)) else v) for k, v in out.items()}


def hol_ablation(windows, lambda_refs: dict, *, region: str = "HIGH_PRESSURE", model=None,
                 variants=("block", "reject", "chunk")) -> pd.DataFrame:
    """ANWG of ``slai_faithful`` and of ``vllm_faithful`` under each ``oversize`` rule, per window.

    ``lambda_refs``: window_id → λ_ref (from the campaign), so cells sit at the campaign's load.
    Returns a tidy table with one row per (window, policy label) and the columns the statistics
    functions expect (``policy`` is ``vllm_faithful[<rule>]`` for the variants).
    """
    model = model or sim.LsspModel()
    rows = []
    for w in windows:
        scaled = scale(w, REGIONS[region] * lambda_refs[w.window_id])
        runs = [("slai_faithful", make_policy("slai_faithful"))]
        runs += [(f"vllm_faithful[{v}]", make_policy("vllm_faithful", oversize=v)) for v in variants]
        for label, policy in runs:
            m = cell_metrics(sim.simulate(scaled, policy, model))
            rows.append({"source": w.source, "window_id": w.window_id, "region": region,
                         "slo_multiplier": w.slo_multiplier, "policy": label, **m})
    return pd.DataFrame(rows)


def hol_reversals(ablation: pd.DataFrame, *, n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The RQ2 classifier on slai_faithful vs each vllm_faithful variant, every source pair."""
    region = ablation["region"].iloc[0]
    frames = []
    for label in sorted(p for p in set(ablation["policy"]) if p.startswith("vllm_faithful")):
        sub = ablation[ablation["policy"].isin(["slai_faithful", label])]
        rev = stats.reversals(sub, "anwg", region, policies=("slai_faithful", label),
                              n_resamples=n_resamples, seed=seed)
        frames.append(rev.assign(variant=label))
    return pd.concat(frames, ignore_index=True)


#: How each policy of the real-engine case is modelled in the ``vllm_v1`` engine model, so that the
#: simulator sees what the real engine ran: vLLM's FCFS with a 2,560-token budget and chunked prefill
#: off, and SLAI with a 512-token budget and 128 sequences. ``max_model_len`` is the real engine's
#: (vLLM requires it ≤ the budget when chunked prefill is off): the real replay refuses every request
#: with prompt + output > max_model_len (:data:`portbench.realengine.vllm_backend.REFUSAL_RULE`), and
#: the simulated counterpart refuses the same requests (:func:`real_refused`) — not the
#: ``oversize="reject"`` rule of the study's policy (prompt > budget), which serves requests whose
#: prompt fits but whose output would run past max_model_len. ``None``: the run's own
#: ``max_model_len`` column decides (no refusal without one). RQ7's vLLM case (``fifo``,
#: ``sjf_aging``, ``vllm_priority``) runs vLLM's defaults: a 2,048-token budget, chunked prefill,
#: 256 sequences (:data:`portbench.realengine.vllm_backend.POLICIES`). The simulator's
#: ``vllm_priority`` also evicts lower priorities for a waiting request that does not fit (vLLM v0's
#: rule, which v1 dropped); :func:`sim_vs_real` reports each counterpart's preemptions
#: (``preemptions_sim``), so a reader sees whether that difference was ever exercised.
REAL_COUNTERPARTS = {
    "vllm_faithful": {"budget": 2560, "seqs": 256, "params": {"oversize": "reject"}, "max_model_len": 2560},
    "slai_faithful": {"budget": 512, "seqs": 128, "params": {}, "max_model_len": None},
    "fifo": {"budget": 2048, "seqs": 256, "params": {}, "max_model_len": None},
    "sjf_aging": {"budget": 2048, "seqs": 256, "params": {}, "max_model_len": None},
    "vllm_priority": {"budget": 2048, "seqs": 256, "params": {}, "max_model_len": None},
}


def real_refused(window, max_model_len) -> np.ndarray:
    """The requests the real engine refuses: prompt + output > ``max_model_len`` (None: none).

    vLLM 0.32 refuses a prompt of ``max_model_len`` tokens or more and caps a longer sequence's
    output at ``max_model_len``; the replay cannot serve a capped output (lengths must be the
    trace's), so it refuses both up front (:data:`portbench.realengine.vllm_backend.REFUSAL_RULE`).
    """
    n = len(window)
    if max_model_len is None or not np.isfinite(max_model_len):
        return np.zeros(n, dtype=bool)
    total = window.input_tokens.astype(np.int64) + window.output_tokens.astype(np.int64)
    return total > int(max_model_len)


def simulate_counterpart(window, policy: str, cost, *, kv_tokens: int = 500_000,
                         max_model_len=None, policy_obj=None, on_engine=None):
    """The ``vllm_v1`` counterpart of a real run of ``policy`` on ``window`` (already scaled), with the
    real engine's refusal rule: the requests of :func:`real_refused` are taken out of the window
    before simulating and come back as never served (NaN times). ``max_model_len``: the real run's
    (default: :data:`REAL_COUNTERPARTS`); ``policy_obj``: a policy object to run in place of
    ``make_policy(policy, ...)`` (the same policy, instrumented: :class:`MeasuredClockSlai`);
    ``on_engine(engine, index)``: called with the engine before it runs and ``index`` (the engine's
    request id → the window's request index), as :class:`ReplayedStepTimes` needs to log batches
    (the run is :func:`portbench.sim.simulate`'s, step for step).
    Returns ``(RunResult, refused mask)``.
    """
    from .engine_v1 import VllmV1Model

    spec = REAL_COUNTERPARTS[policy]
    if max_model_len is None or not np.isfinite(max_model_len):
        max_model_len = spec["max_model_len"]
    refused = real_refused(window, max_model_len)
    model = VllmV1Model(max_num_batched_tokens=spec["budget"], max_active_sequences=spec["seqs"],
                        max_kv_tokens=kv_tokens, cost=cost)
    if policy_obj is None:
        policy_obj = make_policy(policy, **spec["params"])

    def run(win, index):
        if on_engine is None:
            return sim.simulate(win, policy_obj, model)
        engine = model.make_engine(win, policy_obj)
        on_engine(engine, index)
        engine.run()
        return engine.result(win)

    if not refused.any():
        return run(window, np.arange(len(window))), refused
    return on_full_window(window, run(served_part(window, refused), np.flatnonzero(~refused)), refused), refused


def served_part(window, refused):
    """``window`` without the requests of the ``refused`` mask (the rest in order)."""
    keep = ~np.asarray(refused, dtype=bool)
    return dataclasses.replace(window, **{f: getattr(window, f)[keep] for f in (
        "arrival_s", "input_tokens", "output_tokens", "predicted_output_tokens", "deadline_s")})


def on_full_window(window, result, refused):
    """A run of :func:`served_part` as a run of the whole ``window``: the refused requests come back
    never served (NaN times), the others with their times."""
    keep = ~np.asarray(refused, dtype=bool)

    def full(values):
        out = np.full(len(window), np.nan)
        out[keep] = values
        return out

    return sim.RunResult(window.window_id, result.policy, result.engine_model, window.arrival_s,
                         window.deadline_s, window.input_tokens, window.output_tokens,
                         np.ones(len(window)), admit_s=full(result.admit_s),
                         first_token_s=full(result.first_token_s), finish_s=full(result.finish_s),
                         duration_s=result.duration_s, n_steps=result.n_steps,
                         n_preemptions=result.n_preemptions)


def linear_step_ps(cost, prefill: int, decodes: int, context: int) -> int:
    """One step's time (ps, the gap included) by ``cost``'s linear coefficients
    (``cost.picoseconds()``), as the ``vllm_v1`` engine times a step without a per-step cost."""
    c0, cp, cd, cc, cg = cost.picoseconds()
    return c0 + cg + cp * prefill + cd * decodes + cc * context


def predicted_step_s(cost, prefill, decode, context) -> np.ndarray:
    """The cost model's step time (gap excluded) for batches given column by column."""
    return (cost.fixed_s + cost.per_prefill_token_s * np.asarray(prefill, dtype=float)
            + cost.per_decode_seq_s * np.asarray(decode, dtype=float)
            + cost.per_context_token_s * np.asarray(context, dtype=float))


def step_ratios(steps: pd.DataFrame, cost) -> pd.DataFrame:
    """Each run's **step ratio**: the median, over the steps of a real-engine case's step log, of the
    real step time ÷ ``cost``'s time for the same batch (about 1 when the engine ran at its profiled
    speed). Columns ``window_id, policy, repetition, step_ratio``; only the kept attempt's steps
    where the log says which (``kept``)."""
    if "kept" in steps:
        steps = steps[steps["kept"].astype(bool)]
    keys = ["window_id", "policy", "repetition"]
    ratio = steps["duration_s"] / predicted_step_s(cost, steps["prefill_tokens"], steps["decode_seqs"],
                                                  steps["context_tokens"])
    return steps.assign(step_ratio=ratio).groupby(keys)["step_ratio"].median().reset_index()


def sim_vs_real(runs: pd.DataFrame, requests: pd.DataFrame, windows: dict, cost, *,
                kv_tokens: int = 500_000, exclude_host_flagged: bool = False
                ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Replay the real engine's runs in the calibrated ``vllm_v1`` model and compare.

    ``windows``: window_id → Window; ``cost``: a :class:`portbench.engine_v1.StepCost` fitted to
    the real engine's step profile. Both sides refuse the same requests (:func:`simulate_counterpart`;
    the run's ``max_model_len`` where the table has it). Repetitions of a run (column
    ``repetition``) are compared one by one with the same simulation; ``exclude_host_flagged`` drops
    the runs the host guard flagged. Returns per-request errors (simulated − real TTFT and latency,
    s; ``refused_sim`` and, where the real table records it, ``refused_real``), per-run ANWG (real
    and simulated; ``preemptions_sim``: the counterpart's preemptions) and a summary: median
    absolute errors, the ANWG error, Kendall τ_b between real and simulated ANWG over all runs, and
    the refusals (``n_refused_sim``, ``n_refused_mismatch``).
    """
    per_request, per_run = [], []
    if exclude_host_flagged and "host_flagged" in runs:
        runs = runs[~runs["host_flagged"].astype(bool)]
    cache: dict = {}
    for _, run in runs.iterrows():
        if run["policy"] not in REAL_COUNTERPARTS:
            continue
        mml = run.get("max_model_len", None)
        mml = None if mml is None or pd.isna(mml) else float(mml)
        key = (run["window_id"], run["policy"], float(run["load_factor"]), mml)
        if key not in cache:
            w = scale(windows[run["window_id"]], run["load_factor"])
            cache[key] = simulate_counterpart(w, run["policy"], cost, kv_tokens=kv_tokens,
                                              max_model_len=mml)
        result, refused = cache[key]
        sel = (requests["window_id"] == run["window_id"]) & (requests["policy"] == run["policy"])
        rep = run.get("repetition", None)
        if "repetition" in requests and rep is not None and not pd.isna(rep):
            sel &= requests["repetition"] == rep
        real = requests[sel].sort_values("request_index")
        ttft_sim = result.first_token_s - result.arrival_s
        ttft_real = real["first_token_s"].to_numpy() - real["arrival_s"].to_numpy()
        lat_sim = result.finish_s - result.arrival_s
        lat_real = real["finish_s"].to_numpy() - real["arrival_s"].to_numpy()
        frame = pd.DataFrame({"window_id": run["window_id"], "policy": run["policy"],
                              "source": run["source"], "ttft_error_s": ttft_sim - ttft_real,
                              "latency_error_s": lat_sim - lat_real, "latency_real_s": lat_real,
                              "refused_sim": refused})
        if "refused" in real:
            frame["refused_real"] = real["refused"].to_numpy(dtype=bool)
        if rep is not None and not pd.isna(rep):
            frame.insert(2, "repetition", int(rep))
        per_request.append(frame)
        per_run.append({"source": run["source"], "window_id": run["window_id"], "policy": run["policy"],
                        **({"repetition": int(rep)} if rep is not None and not pd.isna(rep) else {}),
                        "anwg_real": run["anwg"], "anwg_sim": cell_metrics(result)["anwg"],
                        "preemptions_sim": int(result.n_preemptions)})
    req = pd.concat(per_request, ignore_index=True) if per_request else pd.DataFrame()
    run_frame = pd.DataFrame(per_run)
    summary = {}
    if len(run_frame):
        err = run_frame["anwg_sim"] - run_frame["anwg_real"]
        summary = {
            "n_runs": int(len(run_frame)),
            "median_abs_ttft_error_s": float(np.nanmedian(np.abs(req["ttft_error_s"]))),
            "median_abs_latency_error_s": float(np.nanmedian(np.abs(req["latency_error_s"]))),
            "median_relative_latency_error": float(np.nanmedian(np.abs(req["latency_error_s"])
                                                                / req["latency_real_s"])),
            "mean_abs_anwg_error": float(np.abs(err).mean()),
            "max_abs_anwg_error": float(np.abs(err).max()),
            "tau_b_anwg": stats.kendall_tau_b(run_frame["anwg_real"].to_numpy(),
                                              run_frame["anwg_sim"].to_numpy()),
            "n_refused_sim": int(req["refused_sim"].sum()),
        }
        if "refused_real" in req:
            known = req["refused_real"].notna()
            summary["n_refused_mismatch"] = int(
                (req.loc[known, "refused_real"].astype(bool) != req.loc[known, "refused_sim"]).sum())
    return req, run_frame, summary


# --- a real-engine case by its tag ----------------------------------------------------------------
#: The headline real-engine case (max_model_len 2,560 for vllm_faithful, 32,768 for slai_faithful).
GUARDED_TAG = "vllm_cpu_guarded"
#: The same RQ6 case with the same max_model_len (2,560) for both policies, each step's batch and
#: each request's submission logged.
EQUAL_TAG = "vllm_cpu_equal"


def case_tag(tag: str) -> str:
    """A case's tag as its files are named (``<tag>_case_runs.parquet``): ``vllm_cpu_equal`` and
    ``vllm_cpu_equal_case`` name the same case."""
    return tag[: -len("_case")] if tag.endswith("_case") else tag


def load_case(tag: str = GUARDED_TAG, *, data_dir=None) -> dict:
    """A committed real-engine case's runs, requests, steps, windows (window_id → Window) and
    ``profile_cost``: the :class:`~portbench.engine_v1.StepCost` fitted to the step profile
    (``<tag>_cost.json``; a case without its own profile takes the guarded case's, measured on the
    same host with the same model shape), and ``cost_tag``, the tag it came from."""
    import json

    from . import store as _store
    from .engine_v1 import StepCost
    from .realengine.study import realengine_dir

    tag = case_tag(tag)
    d = realengine_dir(data_dir)
    runs = pd.read_parquet(d / f"{tag}_case_runs.parquet")
    cost_tag = tag if (d / f"{tag}_cost.json").exists() else GUARDED_TAG
    return {"tag": tag, "runs": runs,
            "requests": pd.read_parquet(d / f"{tag}_case_requests.parquet"),
            "steps": pd.read_parquet(d / f"{tag}_case_steps.parquet"),
            "windows": {w.window_id: w for w in _store.load_windows(window_ids=sorted(set(runs["window_id"])))},
            "profile_cost": StepCost(**json.loads((d / f"{cost_tag}_cost.json").read_text())["cost"]),
            "cost_tag": cost_tag}


# --- the real engine's step log ------------------------------------------------------------------
#: The columns that name one real run (a window, a policy, a repetition).
RUN_KEYS = ["window_id", "policy", "repetition"]

#: Batch shapes of a step: prompt tokens only, one-token decodes only, or both in the same step.
SHAPES = ("prefill only", "decode only", "mixed")


def batch_shape(prefill, decode) -> np.ndarray:
    """Each step's batch shape (:data:`SHAPES`; "empty" when nothing was scheduled)."""
    p, d = np.asarray(prefill) > 0, np.asarray(decode) > 0
    return np.select([p & ~d, ~p & d, p & d], list(SHAPES), "empty")


def run_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The kept attempt's steps of each run, in order, with ``end_s`` (start + duration), ``busy``
    (the engine had unfinished requests after the step, so the next step followed at once),
    ``gap_s`` (the next step's start − this step's end, where busy) and ``shape``."""
    if "kept" in steps:
        steps = steps[steps["kept"].astype(bool)]
    missing = {"start_s", "duration_s", "prefill_tokens", "decode_seqs", "context_tokens",
               "scheduled_seqs", "running", "waiting"} - set(steps.columns)
    if missing:
        raise ValueError(f"step log lacks columns {sorted(missing)}")
    steps = steps.sort_values(RUN_KEYS + ["step"]).reset_index(drop=True)
    end = steps["start_s"] + steps["duration_s"]
    same = (steps[RUN_KEYS].shift(-1) == steps[RUN_KEYS]).all(axis=1)
    busy = same & (steps["running"] + steps["waiting"] > 0)
    nxt = steps["start_s"].shift(-1)
    return steps.assign(end_s=end, busy=busy, next_start_s=nxt.where(same),
                        gap_s=(nxt - end).where(busy),
                        shape=batch_shape(steps["prefill_tokens"], steps["decode_seqs"]))


# --- replayed cost: the k-th simulated step takes as long as the real k-th step did --------------
class ReplayedStepTimes:
    """A step cost for :class:`portbench.engine_v1.VllmV1Model` that replays one real run's step
    times: step ``k`` ends where the real step ``k`` was followed by the real step ``k + 1`` (its
    start), or at the real step's end where the real engine then waited for an arrival; so each
    simulated step starts when the real one did, whatever the batch. Steps beyond the real run's
    last are timed by ``fallback`` (a :class:`~portbench.engine_v1.StepCost`); ``beyond`` counts them.
    Every step's batch is logged (:meth:`log`): its counts always, and which requests ran with how
    many tokens when :meth:`attach` has given it the engine (``simulate_counterpart(on_engine=
    replay.attach)``)."""

    def __init__(self, run_steps_frame: pd.DataFrame, fallback):
        from .engine_v1 import PS

        frame = run_steps_frame.sort_values("step")
        if len(frame) and not (frame["step"].to_numpy() == np.arange(len(frame))).all():
            raise ValueError("a run's step log must number its steps 0, 1, 2, ... without gaps")
        self.fallback = fallback
        self.fixed_s = fallback.fixed_s
        target = np.where(frame["busy"].to_numpy(dtype=bool), frame["next_start_s"].to_numpy(),
                          frame["end_s"].to_numpy())
        self._target_ps = np.round(target * PS).astype(np.int64).tolist()
        self._rows: list[tuple] = []
        self.beyond = 0
        self._engine, self._index = None, None

    def attach(self, engine, index) -> None:
        """Log each step's batch from ``engine`` (a ``vllm_v1`` engine about to run; read only: its
        batch table at the moment the step is timed) with ``index`` (the engine's request id → the
        window's request index)."""
        self._engine, self._index = engine, np.asarray(index, dtype=np.int64)

    def picoseconds(self):
        return self.fallback.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        if step < len(self._target_ps):
            dur = max(1, self._target_ps[step] - start_ps)
        else:
            dur = linear_step_ps(self.fallback, prefill, decodes, context)
            self.beyond += 1
        batch = None
        if self._engine is not None:
            rows = self._engine._sched[:scheduled].tolist()
            batch = {int(self._index[i]): int(n) for i, n in rows}
        self._rows.append((step, start_ps, start_ps + dur, prefill, decodes, context, scheduled, batch))
        return dur

    def log(self) -> pd.DataFrame:
        """The simulated steps: ``step, start_ps, end_ps, prefill_tokens, decode_seqs,
        context_tokens, scheduled_seqs, batch`` (``{request index: tokens}``; None unless attached)."""
        return pd.DataFrame(self._rows, columns=["step", "start_ps", "end_ps", "prefill_tokens", "decode_seqs",
                                                 "context_tokens", "scheduled_seqs", "batch"])


#: How the real SLAI scheduler (:mod:`portbench.realengine.vllm_slai_scheduler`, ``step_ema`` and
#: its busy-interval bound) measures the step length Θ counts: an exponential moving average, with
#: this weight, of the interval between consecutive scheduler calls that found running requests
#: and came less than :data:`SLAI_BUSY_INTERVAL_S` apart, started from the rule's ``step_s`` at
#: each replay. Written here because that module needs vLLM to import.
SLAI_STEP_EMA = 0.2
SLAI_BUSY_INTERVAL_S = 1.0
#: The spread :class:`MeasuredClockSlai` puts between equal LSTs, per place in admission order.
TIE_SPREAD_S = 1e-12


def slai_measured_step_s(run_steps_frame: pd.DataFrame, *, first_s: float | None = None,
                         ema: float = SLAI_STEP_EMA, busy_interval_s: float = SLAI_BUSY_INTERVAL_S) -> np.ndarray:
    """The step length the real SLAI scheduler counted Θ in at each of a run's steps, rebuilt from
    its step log: at step ``k`` (after its own update) the moving average of the intervals between
    step starts ``start_s[j] − start_s[j−1]``, ``j ≤ k``, of the steps that found running requests
    (``running_before`` > 0) and came under ``busy_interval_s`` apart; ``first_s`` (default: the
    study's :data:`~portbench.policies.slai_faithful.SLAI` ``step_s``) before any. The step start
    stands for the scheduler's own clock read, a few microseconds later in the same step."""
    from .policies.slai_faithful import SLAI

    frame = run_steps_frame.sort_values("step")
    start = frame["start_s"].to_numpy(dtype=float)
    running = (frame["running_before"].to_numpy() if "running_before" in frame
               else np.r_[0, frame["running"].to_numpy()[:-1]])
    est = float(SLAI.step_s if first_s is None else first_s)
    out = np.empty(len(start))
    for k in range(len(start)):
        if k and running[k] > 0:
            dt = start[k] - start[k - 1]
            if dt < busy_interval_s:
                est += ema * (dt - est)
        out[k] = est
    return out


def _measured_clock_slai_class():
    from .policies.slai_faithful import SlaiFaithful

    class MeasuredClockSlai(SlaiFaithful):
        """``slai_faithful`` whose Θ counts, at step ``k``, the step length the real scheduler had
        measured by then (``step_s_by_step[k]``, :func:`slai_measured_step_s`; the last value past
        the end) instead of the study's fixed 1 ms: the replayed-cost comparison's SLAI, timed like
        the real one. It walks every step (no skipping: the clock changes from step to step).

        It also breaks ties between decoders of equal LST the real scheduler's way: the real one
        sorts its running list (admission order) by LST with a stable sort, ``slai_faithful`` by
        (LST, request id). Decoders served in the same step share one LST, so under SLAI's
        shortest-prompt-first admission the two orders differ and the engines hold different
        decoders of the same count. After each call the LSTs the call set are spread by
        :data:`TIE_SPREAD_S` per place in the running list (admission order), so a later sort by
        LST keeps admission order among them (at most 128 × 1e-12 s apart: no step boundary moves).
        Everything else is ``slai_faithful``'s."""

        def __init__(self, step_s_by_step, **params):
            super().__init__(**params)
            self._clock = [float(x) for x in step_s_by_step]

        def reset(self, view):
            super().reset(view)
            self._never_skip = True

        def schedule(self, view):
            if self._clock:
                s = self._clock[min(view.step, len(self._clock) - 1)]
                if s != self.rule.step_s:
                    self.rule = dataclasses.replace(self.rule, step_s=s)
            before = dict(self._lst)
            d = super().schedule(view)
            lst = self._lst
            for place, r in enumerate(view.running):
                if r in lst and before.get(r) != lst[r]:
                    lst[r] += place * TIE_SPREAD_S
            return d

    return MeasuredClockSlai


def measured_clock_slai(step_s_by_step, **params):
    """A :class:`MeasuredClockSlai` (``slai_faithful`` with the real scheduler's measured step
    length per step; see :func:`slai_measured_step_s`)."""
    return _measured_clock_slai_class()(step_s_by_step, **params)


def _step_index(times, edges, *, tol: float = 1e-7) -> np.ndarray:
    """For each time (s) the index of the step edge (sorted step starts or ends, s) within ``tol``
    of it; -1 where none is (and for NaN)."""
    times, edges = np.asarray(times, dtype=float), np.asarray(edges, dtype=float)
    out = np.full(len(times), -1, dtype=np.int64)
    if not len(edges):
        return out
    j = np.searchsorted(edges, times)
    for cand in (np.clip(j - 1, 0, len(edges) - 1), np.clip(j, 0, len(edges) - 1)):
        hit = (out < 0) & (np.abs(edges[cand] - times) <= tol)
        out[hit] = cand[hit]
    return out


def request_steps(admit_s, first_s, finish_s, starts, ends) -> pd.DataFrame:
    """Each request's step of admission (the step starting at its admission time; one admitted
    and finished between two reads of the running queue carries its first token's time, the end of
    that step), of its first token and of its finish (the steps ending then); -1: never."""
    admit = _step_index(admit_s, starts)
    at_end = _step_index(admit_s, ends)
    admit = np.where(admit < 0, at_end, admit)
    return pd.DataFrame({"admit_step": admit, "first_step": _step_index(first_s, ends),
                         "finish_step": _step_index(finish_s, ends)})


#: What a step of the replayed-cost comparison compares, real against simulated.
STEP_FIELDS = ("scheduled_seqs", "prefill_tokens", "decode_seqs")
#: What a request of it compares: the step of its admission, of its first token and of its finish.
REQUEST_FIELDS = ("admit_step", "first_step", "finish_step")

#: The classes of a disagreement (an *episode*: consecutive steps that disagree, named by its first).
RACE = "arrival racing a step"
SLAI_CLOCK = "SLAI's critical-decode clock"
LENGTH = "one schedule runs longer"
SAME_SHAPE = "same batch shapes, other requests"
DOWNSTREAM = "downstream of an earlier disagreement"
LAST_PROMPT_TOKEN = "SLAI holds a prompt's last token"
ID_TIE = "a tie broken by the request id's text"
OTHER = "unexplained"
DISAGREEMENT_CLASSES = {
    RACE: "a request reached the two engines at different steps: the real serving loop reads its clock "
          "once, submits what has arrived by then and starts the step a little later, so a request "
          "arriving in between waits for the next step there, while the model, whose step starts at "
          "the real step's start, counts it (where the requests log has ``submit_step``, the step "
          "each request was submitted before, this is read from the log; else inferred from an "
          "arrival between the real step before and this one)",
    SLAI_CLOCK: "the two SLAIs serve a different number of decodes: the real scheduler counts Θ in a "
                "moving average of its measured step interval (starting from 1 ms), the study's policy "
                "in a fixed 1 ms, so a decoder turns critical at another step (the replay gives the "
                "model the real scheduler's measured step length by default, slai_clock='measured')",
    LENGTH: "the schedules agree on every step both ran, but one ran more steps",
    LAST_PROMPT_TOKEN: "a request with one prompt token left to compute ran it on one side only: the real "
                       "SLAI scheduler (portbench.realengine.vllm_slai_scheduler) counts a running request "
                       "with at most one token left to compute as a decode, so a prompt's last one-token "
                       "chunk gets a decode's fresh LST and is held like a non-critical decode when "
                       "admissions take the budget; the model's SLAI finishes the prompt as an in-flight "
                       "prefill chunk, before admissions (read from both steps' batches; where the "
                       "real step log lacks them, inferred: the model ran one more request, a one-token "
                       "chunk completing its prompt, with the same prefill tokens and decodes)",
    ID_TIE: "the batches differ only by requests of the same prompt length and the same arrival: the "
            "real engine's priority queue breaks the tie by the request id as text (the port's ids "
            "r<k>-<index>-<hex>, so index 10 comes before 9), the model by the index (read from both "
            "steps' batches)",
    SAME_SHAPE: "the steps have the same batch shape (scheduled sequences, prefill tokens, decodes), "
                "yet other requests ran (where both steps' batches are logged), or a request was "
                "admitted, started or finished at another step",
    DOWNSTREAM: "a request was already admitted, started or finished at another step before this "
                "episode began: the two engines no longer hold the same requests, so the episode "
                "follows from an earlier one",
    OTHER: "none of the above",
}


def _episodes(equal: np.ndarray) -> list[tuple[int, int]]:
    """(first, last + 1) of each run of False in ``equal``."""
    bad = np.flatnonzero(~equal)
    if not len(bad):
        return []
    cuts = np.flatnonzero(np.diff(bad) > 1)
    starts = np.r_[bad[0], bad[cuts + 1]]
    ends = np.r_[bad[cuts] + 1, bad[-1] + 1]
    return list(zip(starts.tolist(), ends.tolist()))


def raced(k: int, real_visible, sim_visible, served) -> np.ndarray:
    """The served requests that step ``k`` could schedule on one engine and not on the other:
    ``real_visible`` is each request's first step the real engine could schedule it (the requests
    log's ``submit_step``; -1: never submitted), ``sim_visible`` the model's (its first step
    starting at or after the arrival). Returns their window indices."""
    rv, sv = np.asarray(real_visible, dtype=np.int64), np.asarray(sim_visible, dtype=np.int64)
    ok = np.asarray(served, dtype=bool) & (rv >= 0) & (sv >= 0)
    lo, hi = np.minimum(rv, sv), np.maximum(rv, sv)
    return np.flatnonzero(ok & (lo <= k) & (k < hi))


def _batch_rule(k: int, policy: str, real: pd.DataFrame, sim: pd.DataFrame, arrival_s, input_tokens) -> str:
    """:data:`LAST_PROMPT_TOKEN` or :data:`ID_TIE` where step ``k``'s logged batches show it, else ""."""
    if input_tokens is None or "batch" not in sim or sim["batch"].iloc[k] is None:
        return ""
    sb = sim["batch"].iloc[k]
    rb = real["batch"].iloc[k] if "batch" in real else None
    if rb is None:
        # only the model's batch is known (a step log without ``scheduled``): the model ran one more
        # request, a one-token chunk that completes its prompt, and otherwise the same counts
        if policy != "slai_faithful":
            return ""
        counts = [(int(real[f].iloc[k]), int(sim[f].iloc[k])) for f in STEP_FIELDS]
        if counts[0][1] != counts[0][0] + 1 or counts[1][0] != counts[1][1] or counts[2][0] != counts[2][1]:
            return ""
        inp = np.asarray(input_tokens)
        for i, n in sb.items():
            if n == 1 and sum(b.get(i, 0) for b in sim["batch"].iloc[:k]) == int(inp[i]) - 1:
                return LAST_PROMPT_TOKEN
        return ""
    diff = [i for i in set(rb) | set(sb) if rb.get(i, 0) != sb.get(i, 0) and isinstance(i, (int, np.integer))]
    if not diff:
        return ""
    inp = np.asarray(input_tokens)
    if policy == "slai_faithful":
        for i in diff:
            if {rb.get(i, 0), sb.get(i, 0)} == {0, 1}:
                done = sum(b.get(i, 0) for b in real["batch"].iloc[:k])
                if done == int(inp[i]) - 1:
                    return LAST_PROMPT_TOKEN
    arr = np.asarray(arrival_s)
    if (sorted(rb.values()) == sorted(sb.values()) and len({(int(inp[i]), float(arr[i])) for i in diff}) == 1):
        return ID_TIE
    return ""


def classify_episode(k: int, policy: str, real: pd.DataFrame, sim: pd.DataFrame, arrival_s,
                     served, *, real_visible=None, sim_visible=None, input_tokens=None) -> str:
    """The class (:data:`DISAGREEMENT_CLASSES`) of an episode of disagreeing steps starting at
    step ``k`` (both schedules ran it): a race when a served request could be scheduled at step
    ``k`` on one engine and not on the other — read from ``real_visible``/``sim_visible`` where
    given (:func:`raced`), else inferred from an arrival between the real previous step's end and
    step ``k``'s start; where both steps' batches are logged (``batch``) and ``input_tokens`` given,
    the two rules they show (:data:`LAST_PROMPT_TOKEN`, :data:`ID_TIE`); SLAI's clock when the
    decode counts differ under ``slai_faithful``; the same shapes when the counts agree (so the
    batches' requests differ); else unexplained."""
    if real_visible is not None and sim_visible is not None:
        if len(raced(k, real_visible, sim_visible, served)):
            return RACE
    else:
        start = real["start_s"].iloc[k]
        before = real["end_s"].iloc[k - 1] if k > 0 else start - 1e-3
        a = np.asarray(arrival_s)[np.asarray(served, dtype=bool)]
        if ((a > before) & (a <= start)).any():
            return RACE
    rule = _batch_rule(k, policy, real, sim, arrival_s, input_tokens)
    if rule:
        return rule
    if policy == "slai_faithful" and real["decode_seqs"].iloc[k] != sim["decode_seqs"].iloc[k]:
        return SLAI_CLOCK
    fields = list(STEP_FIELDS)
    if set(fields) <= set(real) & set(sim) and (real[fields].iloc[k].to_numpy() == sim[fields].iloc[k].to_numpy()).all():
        return SAME_SHAPE
    return OTHER


def real_batches(steps: pd.DataFrame):
    """Each logged step's batch, ``{request index: tokens}`` (the step log's ``scheduled``,
    :func:`portbench.realengine.vllm_backend.parse_scheduled`); None where the log has no
    ``scheduled`` column (logs written before 2026-12)."""
    from .realengine.vllm_backend import parse_scheduled

    if "scheduled" not in steps:
        return None
    return [{(int(k) if k.isdigit() else k): n for k, n in parse_scheduled(t).items()}
            for t in steps["scheduled"].tolist()]


def compare_schedules(real_steps: pd.DataFrame, sim_steps: pd.DataFrame, real_req: pd.DataFrame,
                      sim_req: pd.DataFrame, *, policy: str, arrival_s, served, real_visible=None,
                      sim_visible=None, input_tokens=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's real and replayed-cost schedules, step by step and request by request.

    ``real_steps``/``sim_steps``: the steps in order (:data:`STEP_FIELDS`; the real ones also
    ``start_s``, ``end_s``; where both have a ``batch`` column of ``{request index: tokens}`` —
    :func:`real_batches`, :meth:`ReplayedStepTimes.log` — each step's exact set of requests and
    their tokens is compared too); ``real_req``/``sim_req``: :data:`REQUEST_FIELDS` per request (in
    window order); ``served``: the requests neither side refused; ``real_visible``/``sim_visible``
    (optional, per request): the first step each engine could schedule it, for the race class
    (:func:`raced`); ``input_tokens`` (optional, per request): the prompts, for the rules the
    batches show (:func:`classify_episode`). Returns (steps, requests): a row per step index of the longer schedule with
    ``agree_counts`` (the counts of :data:`STEP_FIELDS` agree), ``agree_batch`` (the exact batches
    agree; NaN where not logged on both sides), ``agree`` (both) and ``cls`` (the class of the
    episode it belongs to, "" where it agrees), and a row per served request with ``agree`` and
    ``cls``.
    """
    big = np.iinfo(np.int64).max
    served = np.asarray(served, dtype=bool)
    r = real_req[list(REQUEST_FIELDS)].to_numpy()[served]
    s = sim_req[list(REQUEST_FIELDS)].to_numpy()[served]
    agree = (r == s).all(axis=1)
    # each request's first step at which the two schedules treat it differently
    first_diff = np.where(r != s, np.minimum(np.where(r < 0, big, r), np.where(s < 0, big, s)), big).min(axis=1)
    n_real, n_sim = len(real_steps), len(sim_steps)
    n = min(n_real, n_sim)
    fields = list(STEP_FIELDS)
    counts = np.zeros(max(n_real, n_sim), dtype=bool)
    counts[:n] = (real_steps[fields].to_numpy()[:n] == sim_steps[fields].to_numpy()[:n]).all(axis=1)
    batch = np.full(len(counts), np.nan)
    equal = counts.copy()
    if "batch" in real_steps and "batch" in sim_steps:
        rb, sb = real_steps["batch"].tolist()[:n], sim_steps["batch"].tolist()[:n]
        if all(x is not None for x in rb) and all(x is not None for x in sb):
            same = np.array([a == b for a, b in zip(rb, sb)], dtype=bool)
            batch[:n] = same
            batch[n:] = 0.0
            equal[:n] &= same
    cls = np.full(len(equal), "", dtype=object)
    starts = []
    for a, b in _episodes(equal):
        if (first_diff < a).any():
            c = DOWNSTREAM
        elif a >= n:
            c = LENGTH
        else:
            c = classify_episode(a, policy, real_steps, sim_steps, arrival_s, served,
                                 real_visible=real_visible, sim_visible=sim_visible, input_tokens=input_tokens)
        cls[a:b] = c
        starts.append((a, c))
    steps = pd.DataFrame({"step": np.arange(len(equal)), "agree_counts": counts, "agree_batch": batch,
                          "agree": equal, "cls": cls})
    # a disagreeing request: the class of the last episode that started by its first differing step
    rcls = np.full(len(agree), "", dtype=object)
    for i in np.flatnonzero(~agree):
        named = [c for a, c in starts if a <= first_diff[i]]
        rcls[i] = named[-1] if named else SAME_SHAPE
    requests = pd.DataFrame({"request_index": np.flatnonzero(served), "agree": agree, "cls": rcls})
    return steps, requests


def _run_rows(frame: pd.DataFrame, run) -> pd.DataFrame:
    sel = np.ones(len(frame), dtype=bool)
    for k in RUN_KEYS:
        if k in frame:
            sel &= (frame[k] == run[k]).to_numpy()
    return frame[sel]


#: How the replayed-cost comparison sets each request's arrival in the model: "trace" (the window's
#: arrival, as the serving loop's schedule had it) or "submitted" (where the requests log has
#: ``submit_step``: the time that makes the model's first step able to schedule it the real one's,
#: :func:`submitted_arrivals` — the serving loop's clock read taken into the replay's configuration).
ARRIVALS = ("trace", "submitted")


def submitted_arrivals(arrival_s, submit_step, step_starts, *, eps_s: float = 1e-9) -> np.ndarray:
    """Arrival times that make the model's replay see each request first at the step the real
    engine did (``submit_step``, the requests log's: the index of the first step that could
    schedule it; -1 keeps the trace's arrival). The requests submitted before step ``s`` all arrive
    at the first of their trace arrivals, or just after step ``s − 1``'s start when that is later
    (the real loop read its clock after that step, so the model must not see them at it): the model,
    whose step ``s`` starts at the real step's start (or, after an idle engine, at the first
    arrival), then admits them at step ``s`` and not before. Arrival order is kept (ties in window
    order, as both engines break them)."""
    a = np.asarray(arrival_s, dtype=float)
    s = np.asarray(submit_step, dtype=np.int64)
    starts = np.asarray(step_starts, dtype=float)
    out = a.copy()
    for g in np.unique(s[s >= 0]):
        m = s == g
        t = float(a[m].min())
        if 1 <= g <= len(starts):
            t = max(t, float(starts[g - 1]) + eps_s)
        out[m] = t
    return out


def replay_run(run, requests: pd.DataFrame, steps: pd.DataFrame, windows: dict, fallback, *,
               kv_tokens: int = 500_000, slai_clock: str = "measured", arrivals: str = "trace") -> dict:
    """One real run (a row of the runs table) replayed with its own step times and compared
    (:func:`replayed_cost_comparison` does this for every run; ``steps``: :func:`run_steps`'s).
    Returns ``steps`` and ``requests`` (:func:`compare_schedules`), ``real_steps`` (with ``batch``
    where logged), ``sim_steps`` (:meth:`ReplayedStepTimes.log`), ``real_requests`` and
    ``sim_requests`` (:func:`request_steps`), ``real_visible``, ``sim_visible``, ``served``,
    ``arrival_s`` (the replay's) and ``result``."""
    from .engine_v1 import PS

    rs = _run_rows(steps, run).reset_index(drop=True)
    if not len(rs):
        raise ValueError(f"no steps logged for run {tuple(run[k] for k in RUN_KEYS)}")
    real = _run_rows(requests, run).sort_values("request_index")
    replay = ReplayedStepTimes(rs, fallback)
    w = scale(windows[run["window_id"]], run["load_factor"])
    submit = real["submit_step"].to_numpy(dtype=np.int64) if "submit_step" in real else None
    if arrivals == "submitted":
        w = dataclasses.replace(w, arrival_s=submitted_arrivals(w.arrival_s, submit, rs["start_s"]))
    mml = run.get("max_model_len", None)
    pol = None
    if run["policy"] == "slai_faithful" and slai_clock == "measured":
        pol = measured_clock_slai(slai_measured_step_s(rs), **REAL_COUNTERPARTS["slai_faithful"]["params"])
    result, refused = simulate_counterpart(w, run["policy"], replay, kv_tokens=kv_tokens,
                                           max_model_len=None if mml is None or pd.isna(mml) else mml,
                                           policy_obj=pol, on_engine=replay.attach)
    log = replay.log()
    batches = real_batches(rs)
    if batches is not None:
        rs = rs.assign(batch=batches)
    real_req = request_steps(real["admit_s"], real["first_token_s"], real["finish_s"], rs["start_s"], rs["end_s"])
    sim_req = request_steps(result.admit_s, result.first_token_s, result.finish_s,
                            log["start_ps"] / PS, log["end_ps"] / PS)
    served = ~refused
    if "refused" in real:
        served &= ~real["refused"].to_numpy(dtype=bool)
    sim_visible = None
    if submit is not None:
        sim_visible = np.searchsorted(log["start_ps"].to_numpy(), np.ceil(w.arrival_s * PS).astype(np.int64))
    st, rq = compare_schedules(rs, log, real_req, sim_req, policy=run["policy"], arrival_s=w.arrival_s,
                               served=served, real_visible=submit, sim_visible=sim_visible,
                               input_tokens=w.input_tokens)
    return {"steps": st, "requests": rq, "real_steps": rs, "sim_steps": log, "real_requests": real_req,
            "sim_requests": sim_req, "real_visible": submit, "sim_visible": sim_visible, "served": served,
            "arrival_s": w.arrival_s, "result": result}


def replayed_cost_comparison(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame,
                             windows: dict, fallback, *, kv_tokens: int = 500_000,
                             slai_clock: str = "measured", arrivals: str = "trace"):
    """Every real run replayed in ``vllm_v1`` with its own recorded step times
    (:class:`ReplayedStepTimes`; ``fallback`` times steps past the real run's last) and compared
    with the real schedule (:func:`compare_schedules`), as the run ran: its ``max_model_len`` (the
    runs table's, where it has one) refuses the same requests on both sides. ``slai_clock``:
    "measured" runs ``slai_faithful`` with the step length the real scheduler measured at each step
    (:func:`measured_clock_slai`); "fixed" with the study's 1 ms. ``arrivals``: :data:`ARRIVALS`.

    Where the step log has ``scheduled`` (each step's batch), each step's exact set of requests and
    their tokens is compared as well as the counts; where the requests log has ``submit_step``, the
    race class is read from it (:func:`raced`).

    Returns (steps, requests, per_run): the step and request tables of every run (with the run's
    keys and ``source``), and per run the counts ``n_steps_real``, ``n_steps_sim``,
    ``steps_agree``, ``steps_agree_counts``, ``requests``, ``requests_agree`` and
    ``first_disagreement`` (step; -1: none).
    """
    if slai_clock not in ("measured", "fixed"):
        raise ValueError(f"slai_clock must be 'measured' or 'fixed', got {slai_clock!r}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    if arrivals == "submitted" and "submit_step" not in requests:
        raise ValueError("arrivals='submitted' needs the requests log's submit_step")
    steps = run_steps(steps)
    step_frames, req_frames, per_run = [], [], []
    for _, run in runs.iterrows():
        if run["policy"] not in REAL_COUNTERPARTS:
            continue
        one = replay_run(run, requests, steps, windows, fallback, kv_tokens=kv_tokens, slai_clock=slai_clock,
                         arrivals=arrivals)
        st, rq, rs, log = one["steps"], one["requests"], one["real_steps"], one["sim_steps"]
        keys = {"source": run["source"], **{k: run[k] for k in RUN_KEYS}}
        step_frames.append(st.assign(**keys))
        req_frames.append(rq.assign(**keys))
        bad = np.flatnonzero(~st["agree"].to_numpy())
        per_run.append({**keys, "n_steps_real": len(rs), "n_steps_sim": len(log),
                        "steps_agree": int(st["agree"].sum()), "steps_agree_counts": int(st["agree_counts"].sum()),
                        "requests": len(rq), "requests_agree": int(rq["agree"].sum()),
                        "first_disagreement": int(bad[0]) if len(bad) else -1})
    return (pd.concat(step_frames, ignore_index=True), pd.concat(req_frames, ignore_index=True),
            pd.DataFrame(per_run))


def agreement_table(frame: pd.DataFrame, by=("policy",)) -> pd.DataFrame:
    """Share of ``agree`` rows of a step or request table, overall and ``by`` group, and each
    disagreement class's share of the rows (columns: the group, ``n``, ``agree``, one per class;
    for a step table whose batches were compared, also ``agree, counts only``: the share whose
    counts agree, whatever requests ran)."""
    by = list(by)
    groups = [("all", frame)] + ([(k if len(by) > 1 else k[0], g) for k, g in frame.groupby(by)] if by else [])
    rows = []
    for name, g in groups:
        row = {"group": name if isinstance(name, str) else " / ".join(map(str, name)), "n": len(g),
               "agree": float(g["agree"].mean())}
        if "agree_batch" in frame and frame["agree_batch"].notna().any():
            row["agree, counts only"] = float(g["agree_counts"].mean())
        for c in DISAGREEMENT_CLASSES:
            row[c] = float((g["cls"] == c).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def class_counts(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each disagreement class (:data:`DISAGREEMENT_CLASSES`) counted three ways: the episodes it
    names (runs of consecutive disagreeing steps within a run), their steps, and the requests it
    names; from :func:`replayed_cost_comparison`'s step and request tables."""
    order = steps.sort_values(RUN_KEYS + ["step"])
    bad = ~order["agree"].to_numpy(dtype=bool)
    same_run = (order[RUN_KEYS].shift(1) == order[RUN_KEYS]).all(axis=1).to_numpy()
    prev_bad = np.r_[False, bad[:-1]] & same_run
    first = bad & ~prev_bad
    cls = order["cls"].to_numpy()
    rows = []
    for c in DISAGREEMENT_CLASSES:
        rows.append({"class": c, "episodes": int((first & (cls == c)).sum()), "steps": int((bad & (cls == c)).sum()),
                     "requests": int((requests["cls"] == c).sum())})
    return pd.DataFrame(rows).set_index("class")


# --- the step cost, cross-validated by window -----------------------------------------------------
#: A step of at most this many tokens (prefill tokens + decoding sequences) is in the small-batch
#: range, where the cases run most of their steps.
SMALL_BATCH_TOKENS = 512


class ShapedStepCost:
    """A richer step cost: a separate non-negative linear fit (fixed + per prefill token + per
    decoding sequence + per context token) for each batch shape (:data:`SHAPES`), each fitted to
    the relative error (the linear :class:`~portbench.engine_v1.StepCost` fits the absolute one,
    which the few long prefill steps dominate), plus the gap.
    The ``vllm_v1`` engine takes it through its per-step hook (``step_ps``); ``picoseconds()`` and
    ``fixed_s`` are the pooled linear fit's (``pooled``), for the model's nominal bounds."""

    def __init__(self, coef: dict, pooled, gap_s: float):
        from .engine_v1 import PS

        missing = set(SHAPES) - set(coef)
        if missing:
            raise ValueError(f"ShapedStepCost needs coefficients for every shape; missing {sorted(missing)}")
        self.coef, self.pooled, self.gap_s = coef, pooled, gap_s
        self.fixed_s = pooled.fixed_s
        self._ps = {k: tuple(int(round(x * PS)) for x in v) for k, v in coef.items()}
        self._gap_ps = int(round(gap_s * PS))

    @classmethod
    def fit(cls, steps: pd.DataFrame):
        """Fit on a step log (``duration_s``, ``prefill_tokens``, ``decode_seqs``,
        ``context_tokens``, optionally ``gap_s``); a shape without steps takes the pooled fit."""
        from scipy.optimize import nnls

        pooled = fit_linear(steps)
        shape = batch_shape(steps["prefill_tokens"], steps["decode_seqs"])
        coef = {}
        for name in SHAPES:
            g = steps[shape == name]
            if len(g) < 8:
                coef[name] = (pooled.fixed_s, pooled.per_prefill_token_s, pooled.per_decode_seq_s,
                              pooled.per_context_token_s)
                continue
            x = np.column_stack([np.ones(len(g)), g["prefill_tokens"], g["decode_seqs"], g["context_tokens"]])
            y = g["duration_s"].to_numpy(dtype=float)
            # rows divided by the measured time: least squares of the *relative* error
            coef[name] = tuple(map(float, nnls(x.astype(float) / y[:, None], np.ones(len(y)))[0]))
        return cls(coef, pooled, pooled.gap_s)

    def predict(self, prefill, decode, context) -> np.ndarray:
        """Step time (s, gap excluded) of batches given column by column."""
        prefill, decode, context = (np.asarray(v, dtype=float) for v in (prefill, decode, context))
        shape = batch_shape(prefill, decode)
        out = np.full(len(prefill), np.nan)
        for name, (c0, cp, cd, cc) in self.coef.items():
            m = shape == name
            out[m] = c0 + cp * prefill[m] + cd * decode[m] + cc * context[m]
        return out

    def picoseconds(self):
        return self.pooled.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        name = "mixed" if prefill and decodes else "prefill only" if prefill else "decode only"
        c0, cp, cd, cc = self._ps[name]
        return c0 + self._gap_ps + cp * prefill + cd * decodes + cc * context


#: The terms of :class:`RichStepCost`, per batch shape: a fixed time, per prefill token, per
#: decoding sequence, per context token (attention reads of the tokens already computed) and per
#: unit of the prefill chunks' own attention (``prefill_tokens² ÷ (2 · prefill sequences)``: the
#: token pairs inside the chunks when the step's prefill tokens are split evenly over its prefilling
#: sequences).
RICH_TERMS = ("fixed", "prefill_tokens", "decode_seqs", "context_tokens", "prefill_attention")


def prefill_attention(prefill, decode, scheduled) -> np.ndarray:
    """The prefill chunks' own attention work of each step (token pairs, see :data:`RICH_TERMS`);
    ``scheduled``: the step's scheduled sequences (its prefilling ones: scheduled − decodes, at
    least 1 where it prefills)."""
    prefill = np.asarray(prefill, dtype=float)
    seqs = np.maximum(np.asarray(scheduled, dtype=float) - np.asarray(decode, dtype=float), 1.0)
    return prefill * prefill / (2.0 * seqs)


def _rich_design(prefill, decode, context, scheduled) -> np.ndarray:
    prefill, decode, context = (np.asarray(v, dtype=float) for v in (prefill, decode, context))
    return np.column_stack([np.ones(len(prefill)), prefill, decode, context,
                            prefill_attention(prefill, decode, scheduled)])


def fit_median_relative(x: np.ndarray, y: np.ndarray, *, iterations: int = 30) -> np.ndarray:
    """Non-negative coefficients ``c`` that minimise the summed |x·c − y| ÷ y (least absolute
    relative error, so the fit aims at the median relative error and no few long steps dominate it),
    by iteratively reweighted non-negative least squares from the relative least-squares fit."""
    from scipy.optimize import nnls

    a = np.asarray(x, dtype=float) / np.asarray(y, dtype=float)[:, None]
    ones = np.ones(len(a))
    # columns that are zero throughout (a term a shape never has) keep a zero coefficient
    used = np.flatnonzero(np.abs(a).max(axis=0) > 0) if len(a) else np.arange(a.shape[1])
    c = np.zeros(a.shape[1])
    if not len(a):
        return c
    au = a[:, used]
    cu = nnls(au, ones)[0]
    for _ in range(iterations):
        w = np.sqrt(1.0 / np.maximum(np.abs(au @ cu - 1.0), 1e-3))
        cu = nnls(au * w[:, None], w)[0]
    c[used] = cu
    return c


class RichStepCost:
    """The richer step cost: for each batch shape (:data:`SHAPES`) its own non-negative
    coefficients for the terms of :data:`RICH_TERMS` — a fixed time per shape, prefill tokens,
    decoding sequences, context tokens and the prefill chunks' own attention — fitted to the least
    absolute *relative* error (:func:`fit_median_relative`), then (``match_total``, the default)
    scaled so that the shape's predicted steps add up to their measured total; plus the mean gap
    between busy steps. A shape with fewer than 8 steps takes the fit over every step.

    Why the total: a request's latency is a *sum* of step times, and a real step log is skewed to
    the right (most steps near the typical time, a few much slower: the host's jitter, the
    allocator, the scheduler's own work on a long queue). A fit aimed at the median step predicts
    the typical step well and every sum short — by 6–9% of the busy time on the committed CPU
    cases, which the queue then amplifies into latencies 12–15% short (median). The shape's relative terms
    come from the robust fit, its level from the total. Like
    :class:`ShapedStepCost`, the ``vllm_v1`` engine takes it through its per-step hook
    (``step_ps``, which knows the step's scheduled sequences); ``picoseconds()`` and ``fixed_s`` are
    the pooled linear fit's, for the model's nominal bounds."""

    def __init__(self, coef: dict, pooled, gap_s: float):
        from .engine_v1 import PS

        missing = set(SHAPES) - set(coef)
        if missing:
            raise ValueError(f"RichStepCost needs coefficients for every shape; missing {sorted(missing)}")
        bad = {k: v for k, v in coef.items() if len(v) != len(RICH_TERMS)}
        if bad:
            raise ValueError(f"RichStepCost needs {len(RICH_TERMS)} coefficients {RICH_TERMS} per shape; "
                             f"got {bad}")
        self.coef = {k: tuple(map(float, v)) for k, v in coef.items()}
        self.pooled, self.gap_s = pooled, gap_s
        self.fixed_s = pooled.fixed_s
        self._gap_ps = int(round(gap_s * PS))
        self._ps = {k: tuple(x * PS for x in v) for k, v in self.coef.items()}

    @classmethod
    def fit(cls, steps: pd.DataFrame, *, match_total: bool = True):
        """Fit on a step log (``duration_s``, ``prefill_tokens``, ``decode_seqs``,
        ``context_tokens``, ``scheduled_seqs``, optionally ``gap_s``, as :func:`run_steps` gives
        them). ``match_total=False``: the robust fit alone (aimed at the
        median step; its totals fall short)."""
        pooled = fit_linear(steps)
        x = _rich_design(steps["prefill_tokens"], steps["decode_seqs"], steps["context_tokens"],
                         steps["scheduled_seqs"])
        y = steps["duration_s"].to_numpy(dtype=float)
        shape = batch_shape(steps["prefill_tokens"], steps["decode_seqs"])
        everything = None
        coef = {}
        for name in SHAPES:
            m = shape == name
            if m.sum() < 8:
                m = np.ones(len(y), dtype=bool)
                if everything is None:
                    everything = fit_median_relative(x, y)
                c = everything
            else:
                c = fit_median_relative(x[m], y[m])
            if match_total:
                predicted = float((x[m] @ c).sum())
                c = c * (float(y[m].sum()) / predicted if predicted > 0 else 1.0)
            coef[name] = tuple(c)
        gap_s = pooled.gap_s
        if match_total and "gap_s" in steps:
            busy = steps["gap_s"].dropna()
            gap_s = float(busy.mean()) if len(busy) else gap_s
        return cls(coef, pooled, gap_s)

    def predict(self, prefill, decode, context, scheduled=None) -> np.ndarray:
        """Step time (s, gap excluded) of batches given column by column (``scheduled``: the steps'
        scheduled sequences; None: one prefilling sequence per prefilling step)."""
        prefill = np.asarray(prefill, dtype=float)
        decode = np.asarray(decode, dtype=float)
        if scheduled is None:
            scheduled = decode + (prefill > 0)
        x = _rich_design(prefill, decode, context, scheduled)
        shape = batch_shape(prefill, decode)
        out = np.full(len(prefill), np.nan)
        for name, c in self.coef.items():
            m = shape == name
            out[m] = x[m] @ np.asarray(c)
        return out

    def table(self) -> pd.DataFrame:
        """The coefficients, a row per shape and a column per term (s per unit)."""
        return pd.DataFrame(self.coef, index=list(RICH_TERMS)).T.rename_axis("shape")

    def picoseconds(self):
        return self.pooled.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        name = "mixed" if prefill and decodes else "prefill only" if prefill else "decode only"
        c0, cp, cd, cc, ca = self._ps[name]
        attn = prefill * prefill / (2.0 * max(scheduled - decodes, 1)) if prefill else 0.0
        return max(1, int(round(c0 + cp * prefill + cd * decodes + cc * context + ca * attn))) + self._gap_ps


class ScaledStepCost:
    """Another per-step cost with every step's time (gap included) multiplied by ``factor``: the
    cost as it would run at a known speed level (a separate reading, not a prediction)."""

    def __init__(self, cost, factor: float):
        self.cost, self.factor = cost, float(factor)
        self.fixed_s = cost.fixed_s
        self.gap_s = getattr(cost, "gap_s", 0.0)

    def picoseconds(self):
        return self.cost.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        if hasattr(self.cost, "step_ps"):
            base = self.cost.step_ps(step, start_ps, prefill, decodes, context, scheduled)
        else:
            base = linear_step_ps(self.cost, prefill, decodes, context)
        return max(1, int(round(base * self.factor)))


def fit_linear(steps: pd.DataFrame):
    """:class:`~portbench.engine_v1.StepCost` fitted to a real step log (gap: the median busy gap)."""
    from .engine_v1 import StepCost

    cost, _ = StepCost.fit(steps, step="duration_s", context="context_tokens", gap="gap_s")
    return cost


def predict_step_s(cost, prefill, decode, context, scheduled=None) -> np.ndarray:
    """Any of the cost models' step time (s, gap excluded); ``scheduled`` (the steps' scheduled
    sequences) is used by :class:`RichStepCost` only."""
    if isinstance(cost, RichStepCost):
        return cost.predict(prefill, decode, context, scheduled)
    if hasattr(cost, "predict"):
        return cost.predict(prefill, decode, context)
    return predicted_step_s(cost, prefill, decode, context)


#: The step-cost models that can be cross-validated, by name: the linear
#: :class:`~portbench.engine_v1.StepCost`, the per-shape :class:`ShapedStepCost`, the
#: :class:`RichStepCost` and, for comparison, its robust fit alone (``rich_median``: aimed at the
#: median step, its totals short).
COST_KINDS = {"linear": fit_linear, "shaped": ShapedStepCost.fit, "rich": RichStepCost.fit,
              "rich_median": lambda steps: RichStepCost.fit(steps, match_total=False)}


def window_folds(window_ids, sources, k: int = 4) -> dict:
    """window_id → fold (0..k-1): each source's windows dealt round-robin in name order, so every
    fold holds windows of every source."""
    if k < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got k={k}")
    pairs = sorted(set(zip(sources, window_ids)))
    out, seen = {}, {}
    for src, w in pairs:
        out[w] = seen.get(src, 0) % k
        seen[src] = seen.get(src, 0) + 1
    return out


def cross_validated_costs(steps: pd.DataFrame, runs: pd.DataFrame, *, k: int = 4, kind: str = "linear",
                          by_policy: bool = True) -> dict:
    """(fold, policy) → cost model fitted on that policy's steps of the other folds' windows only
    (``kind``: one of :data:`COST_KINDS`); also ``"folds"``: window_id → fold.

    Each policy gets its own fit: a real step is the engine's whole ``step()``, and on the
    committed CPU cases batches of the same counts take longer in total under ``slai_faithful``'s
    port than under vLLM's own scheduler (one rich fit for both predicts ``slai_faithful``'s total
    1.6–2.8% short and ``vllm_faithful``'s 2.4–3.9% long; the ``schedule()`` time logged apart
    differs between them by at most 1% of the step time, and the rest is not in the step's counts).
    ``by_policy=False``: one fit over every policy's steps, the same for each policy."""
    if kind not in COST_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, COST_KINDS))}, got {kind!r}")
    src = runs.groupby("window_id")["source"].first()
    folds = window_folds(src.index.tolist(), src.tolist(), k)
    steps = run_steps(steps)
    fold = steps["window_id"].map(folds)
    if fold.isna().any():
        raise ValueError(f"steps of windows without a run: {sorted(set(steps.loc[fold.isna(), 'window_id']))[:5]}")
    fit = COST_KINDS[kind]
    policies = sorted(set(steps["policy"]))
    if by_policy:
        out = {(f, p): fit(steps[(fold != f) & (steps["policy"] == p)]) for f in range(k) for p in policies}
    else:
        pooled = {f: fit(steps[fold != f]) for f in range(k)}
        out = {(f, p): pooled[f] for f in range(k) for p in policies}
    out["folds"] = folds
    return out


def cross_validated_step_error(steps: pd.DataFrame, runs: pd.DataFrame, *, k: int = 4,
                               kind: str = "linear", by_policy: bool = True) -> pd.DataFrame:
    """Every step's time predicted by the cost fitted on its policy's steps without its window's
    fold (:func:`cross_validated_costs`): the step log with
    ``predicted_s``, ``rel_error`` (|predicted − measured| ÷ measured), ``shape``, ``small``
    (at most :data:`SMALL_BATCH_TOKENS` batch tokens) and ``fold``."""
    costs = cross_validated_costs(steps, runs, k=k, kind=kind, by_policy=by_policy)
    steps = run_steps(steps)
    fold = steps["window_id"].map(costs["folds"]).to_numpy()
    pred = np.full(len(steps), np.nan)
    policy = steps["policy"].to_numpy()
    for f, p in (key for key in costs if key != "folds"):
        m = (fold == f) & (policy == p)
        pred[m] = predict_step_s(costs[(f, p)], steps.loc[m, "prefill_tokens"], steps.loc[m, "decode_seqs"],
                                 steps.loc[m, "context_tokens"], steps.loc[m, "scheduled_seqs"])
    rel = np.abs(pred - steps["duration_s"].to_numpy()) / steps["duration_s"].to_numpy()
    small = (steps["prefill_tokens"] + steps["decode_seqs"]) <= SMALL_BATCH_TOKENS
    return steps.assign(predicted_s=pred, rel_error=rel, small=small, fold=fold)


def step_error_table(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 relative step-time error and the step count, overall, in the small-batch
    range and per batch shape (rows), from :func:`cross_validated_step_error`."""
    groups = [("all steps", errors), (f"small batch (≤ {SMALL_BATCH_TOKENS} tokens)", errors[errors["small"]])]
    groups += [(s, errors[errors["shape"] == s]) for s in SHAPES]
    return pd.DataFrame([{"steps": name, "n": len(g), "median": float(g["rel_error"].median()),
                          "p90": float(g["rel_error"].quantile(0.9))} for name, g in groups]).set_index("steps")


# --- per-request latency with the cross-validated cost, and the stored counterpart ---------------
def run_speed_factors(steps: pd.DataFrame, runs: pd.DataFrame, *, k: int = 4, kind: str = "rich") -> pd.DataFrame:
    """Each run's own speed level against the cross-validated cost: the measured total of the
    run's decode-only steps ÷ the total the cost fitted without its window's fold predicts for them
    (1: the run ran at the cost's speed; a total, as the cost is matched to totals). It reads the
    run's *own measured steps*, so a counterpart scaled by it (:func:`counterpart_requests` with
    ``speed_known``) is not a prediction: it separates the host's speed drift between runs from the
    model's error. Columns: the run's keys and ``speed_factor``."""
    err = cross_validated_step_error(steps, runs, k=k, kind=kind)
    dec = err[err["shape"] == "decode only"]
    total = dec.groupby(RUN_KEYS)[["duration_s", "predicted_s"]].sum()
    return (total["duration_s"] / total["predicted_s"]).rename("speed_factor").reset_index()


def counterpart_requests(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame, windows: dict,
                         *, k: int = 4, kind: str = "rich", kv_tokens: int = 500_000,
                         speed_known: bool = False, by_policy: bool = True) -> pd.DataFrame:
    """Each real run's simulated counterpart, request by request: the ``vllm_v1`` model with the
    cost fitted (``kind``, :func:`cross_validated_costs`) on the run's policy's steps in the
    windows of the other folds, the run's refusal rule on both sides. Columns: the run's keys, ``source``, ``host_flagged``,
    ``request_index``, ``arrival_s``, ``output_tokens``, ``deadline_s``, real ``admit_s, first_token_s,
    finish_s``, the simulated ``*_sim``, ``refused_real``/``refused_sim``, ``cost_fold`` and
    ``speed_factor`` (1 unless ``speed_known``).

    ``speed_known``: a separate reading, not the headline — each run's cost is scaled by the run's
    own speed level (:func:`run_speed_factors`, read from its measured decode steps).
    ``by_policy=False``: one cost for every policy (:func:`cross_validated_costs`)."""
    costs = cross_validated_costs(steps, runs, k=k, kind=kind, by_policy=by_policy)
    factors = {}
    if speed_known:
        sf = run_speed_factors(steps, runs, k=k, kind=kind)
        factors = {tuple(r[c] for c in RUN_KEYS): float(r["speed_factor"]) for _, r in sf.iterrows()}
    cache, frames = {}, []
    for _, run in runs.iterrows():
        if run["policy"] not in REAL_COUNTERPARTS:
            continue
        fold = costs["folds"][run["window_id"]]
        mml = run.get("max_model_len", None)
        mml = None if mml is None or pd.isna(mml) else float(mml)
        factor = factors.get(tuple(run[c] for c in RUN_KEYS), 1.0) if speed_known else 1.0
        if not np.isfinite(factor):
            factor = 1.0
        key = (run["window_id"], run["policy"], float(run["load_factor"]), mml, factor)
        if key not in cache:
            w = scale(windows[run["window_id"]], run["load_factor"])
            cost = costs[(fold, run["policy"])]
            cost = cost if factor == 1.0 else ScaledStepCost(cost, factor)
            cache[key] = simulate_counterpart(w, run["policy"], cost, kv_tokens=kv_tokens, max_model_len=mml)
        result, refused = cache[key]
        real = _run_rows(requests, run).sort_values("request_index")
        if len(real) != len(result.arrival_s):
            raise ValueError(f"run {tuple(run[c] for c in RUN_KEYS)} has {len(real)} requests, its window "
                             f"{len(result.arrival_s)}")
        frames.append(pd.DataFrame({
            "source": run["source"], **{c: run[c] for c in RUN_KEYS},
            "host_flagged": bool(run.get("host_flagged", False)),
            "request_index": real["request_index"].to_numpy(), "arrival_s": real["arrival_s"].to_numpy(),
            "output_tokens": real["output_tokens"].to_numpy(), "deadline_s": real["deadline_s"].to_numpy(),
            "admit_s": real["admit_s"].to_numpy(), "first_token_s": real["first_token_s"].to_numpy(),
            "finish_s": real["finish_s"].to_numpy(), "admit_s_sim": result.admit_s,
            "first_token_s_sim": result.first_token_s, "finish_s_sim": result.finish_s,
            "refused_real": real["refused"].to_numpy(dtype=bool) if "refused" in real else refused,
            "refused_sim": refused, "cost_fold": fold, "speed_factor": factor}))
    return pd.concat(frames, ignore_index=True)


#: The per-request latency measures: end-to-end (arrival to last token), time to first token, and
#: time between tokens (first to last token ÷ the tokens after the first; requests of 2+ tokens).
LATENCY_MEASURES = ("end-to-end", "TTFT", "TBT")


def latency_errors(counterpart: pd.DataFrame) -> pd.DataFrame:
    """Relative error |sim − real| ÷ real of each measure (:data:`LATENCY_MEASURES`) per request
    finished on both sides: long format (the run's keys, ``source``, ``host_flagged``, ``measure``,
    ``rel_error``)."""
    c = counterpart[counterpart["finish_s"].notna() & counterpart["finish_s_sim"].notna()]
    gaps = np.maximum(c["output_tokens"].to_numpy() - 1, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = {
            "end-to-end": (c["finish_s"] - c["arrival_s"], c["finish_s_sim"] - c["arrival_s"]),
            "TTFT": (c["first_token_s"] - c["arrival_s"], c["first_token_s_sim"] - c["arrival_s"]),
            "TBT": ((c["finish_s"] - c["first_token_s"]) / gaps, (c["finish_s_sim"] - c["first_token_s_sim"]) / gaps),
        }
    keys = c[["source", *RUN_KEYS, "host_flagged"]]
    frames = []
    for m, (real, sim) in values.items():
        ok = np.isfinite(real) & np.isfinite(sim) & (real > 0)
        frames.append(keys[ok].assign(measure=m, rel_error=(np.abs(sim - real) / real)[ok]))
    return pd.concat(frames, ignore_index=True)


def latency_error_table(errors: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Median and p90 relative error per measure (columns ``<measure> median``/``p90``), overall or
    per ``by`` (rows)."""
    groups = [("all", errors)] if by is None else list(errors.groupby(by))
    rows = []
    for name, g in groups:
        row = {"group": name}
        for m in LATENCY_MEASURES:
            e = g.loc[g["measure"] == m, "rel_error"]
            row[f"{m} median"] = float(e.median()) if len(e) else np.nan
            row[f"{m} p90"] = float(e.quantile(0.9)) if len(e) else np.nan
        rows.append(row)
    return pd.DataFrame(rows).set_index("group")


#: The step cost's fitting choices :func:`cost_choice_errors` compares, as (label, kind, by_policy):
#: the robust fit alone and one cost for both policies, then each change in turn (the last is the
#: cost every other figure uses).
COST_CHOICES = (("robust fit (median step), one cost for both policies", "rich_median", False),
                ("matched to the total, one cost for both policies", "rich", False),
                ("matched to the total, a cost per policy (used)", "rich", True))


def cost_choice_errors(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame, windows: dict, *,
                       k: int = 4) -> pd.DataFrame:
    """How the rich cost's fitting choices (:data:`COST_CHOICES`) move the per-request errors: a
    row per choice, :func:`latency_error_table`'s columns plus ``end-to-end signed median``
    (the median of (sim − real) ÷ real: below 0, the model is fast)."""
    rows = []
    for label, kind, by_policy in COST_CHOICES:
        cp = counterpart_requests(runs, requests, steps, windows, k=k, kind=kind, by_policy=by_policy)
        row = latency_error_table(latency_errors(cp)).iloc[0].rename(label)
        done = cp[cp["finish_s"].notna() & cp["finish_s_sim"].notna()]
        real = done["finish_s"] - done["arrival_s"]
        row["end-to-end signed median"] = float(((done["finish_s_sim"] - done["arrival_s"] - real) / real).median())
        rows.append(row)
    return pd.DataFrame(rows).rename_axis("step cost")


def write_counterparts(tag: str = GUARDED_TAG, *, data_dir=None, kind: str = "rich", k: int = 4):
    """Store each real run of case ``tag`` with its simulated counterpart per request
    (:func:`counterpart_requests`) as ``<tag>_case_sim_requests.parquet`` beside the case's files;
    the separate reading at the run's own speed level (``speed_known``) sits beside it as
    ``admit_s_sim_run_speed``, ``first_token_s_sim_run_speed``, ``finish_s_sim_run_speed`` with the
    run's ``speed_factor``. Returns the path."""
    from . import store as _store
    from .realengine.study import realengine_dir

    tag = case_tag(tag)
    d = realengine_dir(data_dir)
    runs = pd.read_parquet(d / f"{tag}_case_runs.parquet")
    requests = pd.read_parquet(d / f"{tag}_case_requests.parquet")
    steps = pd.read_parquet(d / f"{tag}_case_steps.parquet")
    windows = {w.window_id: w for w in _store.load_windows(window_ids=sorted(set(runs["window_id"])))}
    frame = counterpart_requests(runs, requests, steps, windows, k=k, kind=kind).drop(columns="speed_factor")
    known = counterpart_requests(runs, requests, steps, windows, k=k, kind=kind, speed_known=True)
    for c in ("admit_s_sim", "first_token_s_sim", "finish_s_sim"):
        frame[f"{c}_run_speed"] = known[c].to_numpy()
    frame["speed_factor"] = known["speed_factor"].to_numpy()
    frame = frame.assign(cost_kind=kind)
    path = d / f"{tag}_case_sim_requests.parquet"
    _store.atomic_write(path, lambda p: frame.to_parquet(p, index=False))
    return path


#: Published fidelity figures of other simulators, for scale (not comparable one to one: other
#: hardware, models and workloads, and aggregate rather than per-request errors).
PUBLISHED_FIDELITY = (
    {"simulator": "Vidur", "figure": "request-level latency error", "value": 0.09, "bound": "under",
     "source": "Agrawal et al., Vidur, MLSys 2024 (arXiv:2405.05465), abstract"},
    {"simulator": "BLIS (evolved latency model)", "figure": "end-to-end latency MAPE, 38 experiments",
     "value": 0.1179, "bound": "", "source": "inference-sim/inference-sim pull request 944 (simulator comparison, 2026)"},
    {"simulator": "BLIS (evolved latency model)", "figure": "TTFT MAPE, 38 experiments", "value": 0.2281,
     "bound": "", "source": "inference-sim/inference-sim pull request 944 (simulator comparison, 2026)"},
)


# --- like for like, the runs' own steps, and the second case ------------------------------------
def anwg_from_counterpart(counterpart: pd.DataFrame) -> pd.DataFrame:
    """Real and simulated ANWG per run (every request weighs 1: the share of the window's requests
    finished by their deadline), from :func:`counterpart_requests`."""
    c = counterpart.assign(met_real=counterpart["finish_s"] <= counterpart["deadline_s"],
                           met_sim=counterpart["finish_s_sim"] <= counterpart["deadline_s"])
    return (c.groupby(["source", *RUN_KEYS, "host_flagged"])[["met_real", "met_sim"]].mean()
            .rename(columns={"met_real": "anwg_real", "met_sim": "anwg_sim"}).reset_index())


def _boot(values_by_window: dict, stat, *, n_resamples: int, seed: int) -> tuple[float, float, float]:
    """``stat`` over the windows' rows and its 95% percentile bootstrap interval (windows drawn
    with replacement)."""
    keys = list(values_by_window)
    point = stat([values_by_window[k] for k in keys])
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_resamples):
        pick = rng.integers(0, len(keys), len(keys))
        draws.append(stat([values_by_window[keys[i]] for i in pick]))
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    lo, hi = (np.percentile(draws, [2.5, 97.5]) if len(draws) else (np.nan, np.nan))
    return float(point), float(lo), float(hi)


def like_for_like(anwg: pd.DataFrame, *, n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Within each (source, policy), over the same windows: real repetition 0 against 1 and the
    model against each real repetition (pairs pooled), as mean |ΔANWG| and Kendall τ_b, each with
    a 95% bootstrap interval by window. ``anwg``: :func:`anwg_from_counterpart`."""
    rows = []
    for (src, pol), g in anwg.groupby(["source", "policy"]):
        wide = g.pivot_table(index="window_id", columns="repetition", values=["anwg_real", "anwg_sim"])
        if not {0, 1} <= set(wide["anwg_real"].columns):
            continue
        wide = wide.dropna()
        pairs = {
            "real vs real": {w: [(r[("anwg_real", 0)], r[("anwg_real", 1)])] for w, r in wide.iterrows()},
            "model vs real": {w: [(r[("anwg_sim", 0)], r[("anwg_real", 0)]), (r[("anwg_sim", 1)], r[("anwg_real", 1)])]
                              for w, r in wide.iterrows()},
        }
        for name, by_w in pairs.items():
            def mean_abs(rows_):
                flat = [p for r in rows_ for p in r]
                return float(np.mean([abs(a - b) for a, b in flat]))

            def tau(rows_):
                flat = [p for r in rows_ for p in r]
                a, b = np.array(flat).T
                return stats.kendall_tau_b(a, b)

            m = _boot(by_w, mean_abs, n_resamples=n_resamples, seed=seed)
            t = _boot(by_w, tau, n_resamples=n_resamples, seed=seed)
            rows.append({"source": src, "policy": pol, "comparison": name, "windows": len(by_w),
                         "mean_abs_delta": m[0], "mean_abs_lo": m[1], "mean_abs_hi": m[2],
                         "tau_b": t[0], "tau_lo": t[1], "tau_hi": t[2]})
    return pd.DataFrame(rows)


def own_step_speed(steps: pd.DataFrame, *, tolerance: float = 0.15) -> pd.DataFrame:
    """Judge each run by its own steps: its **decode speed** is the median, over its decode-only
    steps, of the step time ÷ the case's in-sample :class:`ShapedStepCost` time for the same batch,
    set against the median of that over the case's runs (``speed_vs_case``, 1 = the case's usual
    speed). ``step_flagged``: more than ``tolerance`` slower or faster than the case."""
    steps = run_steps(steps)
    cost = ShapedStepCost.fit(steps)
    dec = steps[steps["shape"] == "decode only"]
    ratio = dec["duration_s"] / cost.predict(dec["prefill_tokens"], dec["decode_seqs"], dec["context_tokens"])
    per_run = dec.assign(ratio=ratio).groupby(RUN_KEYS)["ratio"].median().rename("decode_ratio").reset_index()
    per_run["speed_vs_case"] = per_run["decode_ratio"] / per_run["decode_ratio"].median()
    per_run["step_flagged"] = (per_run["speed_vs_case"] - 1).abs() > tolerance
    return per_run


def conclusions_by_rule(anwg: pd.DataFrame, errors: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """The case's conclusions under three rules for keeping runs: every run, the runs the probe
    guard accepted, and the runs whose own decode steps ran at the case's speed
    (:func:`own_step_speed`). Per rule: runs kept, median e2e error of the model, mean |ΔANWG|, and
    the real ANWG of ``slai_faithful`` − ``vllm_faithful`` per source (mean over kept runs)."""
    a = anwg.merge(speed[RUN_KEYS + ["step_flagged"]], on=RUN_KEYS, how="left")
    e = errors[errors["measure"] == "end-to-end"].merge(speed[RUN_KEYS + ["step_flagged"]], on=RUN_KEYS, how="left")
    rules = {"every run": lambda f: np.ones(len(f), dtype=bool),
             "probe guard accepted": lambda f: ~f["host_flagged"].astype(bool).to_numpy(),
             "own steps at the case's speed": lambda f: ~f["step_flagged"].fillna(True).astype(bool).to_numpy()}
    rows = []
    for name, keep in rules.items():
        ka, ke = a[keep(a)], e[keep(e)]
        row = {"rule": name, "runs": len(ka), "e2e median error": float(ke["rel_error"].median()),
               "mean |ΔANWG|": float((ka["anwg_sim"] - ka["anwg_real"]).abs().mean())}
        means = ka.groupby(["source", "policy"])["anwg_real"].mean()
        for src in sorted(set(a["source"])):
            try:
                row[f"slai − vllm, {src}"] = float(means[(src, "slai_faithful")] - means[(src, "vllm_faithful")])
            except KeyError:
                row[f"slai − vllm, {src}"] = np.nan
        rows.append(row)
    return pd.DataFrame(rows).set_index("rule")
