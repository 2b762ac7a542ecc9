"""Each real run's simulated counterpart: the ``vllm_v1`` model on the same window, load and refusal
rule, request by request (the stored ``sim_requests`` of a case), its per-request latency errors,
and the like-for-like reading of ANWG against the real engine's own repetitions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from .. import stats
from ..engine import RunResult, simulate
from ..engine.vllm_v1 import VllmV1Model
from ..metrics import cell_metrics
from ..policies import make_policy
from ..workload import scale
from .cases import GUARDED_TAG, RUN_KEYS, run_rows, run_steps
from ..engine.stepcost import ScaledStepCost, ShapedStepCost, cross_validated_costs, run_speed_factors


#: How each policy of the real-engine case is modelled in the ``vllm_v1`` engine model, so that the
#: simulator sees what the real engine ran: vLLM's FCFS with a 2,560-token budget and chunked prefill
#: off, and SLAI with a 512-token budget and 128 sequences. ``max_model_len`` is the real engine's
#: (vLLM requires it ≤ the budget when chunked prefill is off): the real replay refuses every request
#: with prompt + output > max_model_len (:data:`portbench.realengine.vllm_backend.REFUSAL_RULE`), and
#: the simulated counterpart refuses the same requests (:func:`real_refused`) — not the
#: ``oversize="reject"`` rule of the study's policy (prompt > budget), which serves requests whose
#: prompt fits but whose output would run past max_model_len. ``None``: the run's own
#: ``max_model_len`` column decides (no refusal without one). RQ7's vLLM case (``fifo``,
#: ``sjf_aging``, ``vllm_v1_priority``) runs vLLM's defaults: a 2,048-token budget, chunked prefill,
#: 256 sequences (:data:`portbench.realengine.vllm_backend.POLICIES`). ``vllm_v1_priority`` is vLLM v1's
#: priority scheduling on the deadline, simulated as ``edf`` (its alias), not as ``vllm_v0_priority``
#: (v0's waiting eviction, which v1 dropped); :func:`sim_vs_real` reports each counterpart's
#: preemptions (``preemptions_sim``).
REAL_COUNTERPARTS = {
    "vllm_faithful": {"budget": 2560, "seqs": 256, "params": {"oversize": "reject"}, "max_model_len": 2560},
    "slai_faithful": {"budget": 512, "seqs": 128, "params": {}, "max_model_len": None},
    "fifo": {"budget": 2048, "seqs": 256, "params": {}, "max_model_len": None},
    "sjf_aging": {"budget": 2048, "seqs": 256, "params": {}, "max_model_len": None},
    "vllm_v1_priority": {"budget": 2048, "seqs": 256, "params": {}, "max_model_len": None},
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


def run_limits(run) -> dict:
    """The admission limits a real run ran under, as :func:`simulate_counterpart` takes them: its
    ``max_model_len`` and ``max_num_seqs`` columns (None where the runs table lacks one or has NaN:
    the policy's default of :data:`REAL_COUNTERPARTS`)."""
    out = {}
    for key in ("max_model_len", "max_num_seqs"):
        value = run.get(key, None)
        out[key] = None if value is None or pd.isna(value) else float(value)
    return out


def simulate_counterpart(window, policy: str, cost, *, kv_tokens: int = 500_000,
                         max_model_len=None, max_num_seqs=None, policy_obj=None, on_engine=None):
    """The ``vllm_v1`` counterpart of a real run of ``policy`` on ``window`` (already scaled), with the
    real engine's refusal rule: the requests of :func:`real_refused` are taken out of the window
    before simulating and come back as never served (NaN times). ``max_model_len``: the real run's
    (default: :data:`REAL_COUNTERPARTS`); ``max_num_seqs``: the real engine's sequence cap where the
    run set one below the policy's own (:data:`REAL_COUNTERPARTS`' ``seqs``); ``policy_obj``: a policy object to run in place of
    ``make_policy(policy, ...)`` (the same policy, instrumented: :class:`MeasuredClockSlai`);
    ``on_engine(engine, index)``: called with the engine before it runs and ``index`` (the engine's
    request id → the window's request index), as :class:`ReplayedStepTimes` needs to log batches
    (the run is :func:`portbench.simulate`'s, step for step).
    Returns ``(RunResult, refused mask)``.
    """

    spec = REAL_COUNTERPARTS[policy]
    if max_model_len is None or not np.isfinite(max_model_len):
        max_model_len = spec["max_model_len"]
    refused = real_refused(window, max_model_len)
    seqs = spec["seqs"] if max_num_seqs is None or not np.isfinite(max_num_seqs) else min(spec["seqs"],
                                                                                         int(max_num_seqs))
    model = VllmV1Model(max_num_batched_tokens=spec["budget"], max_active_sequences=seqs,
                        max_kv_tokens=kv_tokens, cost=cost)
    if policy_obj is None:
        policy_obj = make_policy(policy, **spec["params"])

    def run(win, index):
        if on_engine is None:
            return simulate(win, policy_obj, model)
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
    hashes = window.block_hashes
    return dataclasses.replace(window, **{f: getattr(window, f)[keep] for f in (
        "arrival_s", "input_tokens", "output_tokens", "predicted_output_tokens", "deadline_s")},
        block_hashes=None if hashes is None else tuple(h for h, k in zip(hashes, keep) if k))


def on_full_window(window, result, refused):
    """A run of :func:`served_part` as a run of the whole ``window``: the refused requests come back
    never served (NaN times), the others with their times."""
    keep = ~np.asarray(refused, dtype=bool)

    def full(values):
        out = np.full(len(window), np.nan)
        out[keep] = values
        return out

    return RunResult(window.window_id, result.policy, result.engine_model, window.arrival_s,
                         window.deadline_s, window.input_tokens, window.output_tokens,
                         np.ones(len(window)), admit_s=full(result.admit_s),
                         first_token_s=full(result.first_token_s), finish_s=full(result.finish_s),
                         duration_s=result.duration_s, n_steps=result.n_steps,
                         n_preemptions=result.n_preemptions)


def sim_vs_real(runs: pd.DataFrame, requests: pd.DataFrame, windows: dict, cost, *,
                kv_tokens: int = 500_000, exclude_host_flagged: bool = False
                ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Replay the real engine's runs in the calibrated ``vllm_v1`` model and compare.

    ``windows``: window_id → Window; ``cost``: a :class:`portbench.engine.StepCost` fitted to
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
        limits = run_limits(run)
        key = (run["window_id"], run["policy"], float(run["load_factor"]), *limits.values())
        if key not in cache:
            w = scale(windows[run["window_id"]], run["load_factor"])
            cache[key] = simulate_counterpart(w, run["policy"], cost, kv_tokens=kv_tokens, **limits)
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
        limits = run_limits(run)
        factor = factors.get(tuple(run[c] for c in RUN_KEYS), 1.0) if speed_known else 1.0
        if not np.isfinite(factor):
            factor = 1.0
        key = (run["window_id"], run["policy"], float(run["load_factor"]), *limits.values(), factor)
        if key not in cache:
            w = scale(windows[run["window_id"]], run["load_factor"])
            cost = costs[(fold, run["policy"])]
            cost = cost if factor == 1.0 else ScaledStepCost(cost, factor)
            cache[key] = simulate_counterpart(w, run["policy"], cost, kv_tokens=kv_tokens, **limits)
        result, refused = cache[key]
        real = run_rows(requests, run).sort_values("request_index")
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


def latency_values(counterpart: pd.DataFrame, keys) -> pd.DataFrame:
    """Each measure (:data:`LATENCY_MEASURES`) of each request finished on both sides, real and
    simulated: long format (the columns ``keys``, ``measure``, ``real``, ``sim``; TBT is NaN for a
    one-token request)."""
    c = counterpart[counterpart["finish_s"].notna() & counterpart["finish_s_sim"].notna()]
    gaps = np.maximum(c["output_tokens"].to_numpy(dtype=float) - 1, 0)
    gaps = np.where(gaps > 0, gaps, np.nan)
    values = {
        "end-to-end": (c["finish_s"] - c["arrival_s"], c["finish_s_sim"] - c["arrival_s"]),
        "TTFT": (c["first_token_s"] - c["arrival_s"], c["first_token_s_sim"] - c["arrival_s"]),
        "TBT": ((c["finish_s"] - c["first_token_s"]) / gaps, (c["finish_s_sim"] - c["first_token_s_sim"]) / gaps),
    }
    rows = c[list(keys)].reset_index(drop=True)
    return pd.concat([rows.assign(measure=m, real=np.asarray(r, dtype=float), sim=np.asarray(s, dtype=float))
                      for m, (r, s) in values.items()], ignore_index=True)


def latency_errors(counterpart: pd.DataFrame) -> pd.DataFrame:
    """Relative error |sim − real| ÷ real of each measure (:data:`LATENCY_MEASURES`) per request
    finished on both sides: long format (the run's keys, ``source``, ``host_flagged``, ``measure``,
    ``rel_error``)."""
    v = latency_values(counterpart, ["source", *RUN_KEYS, "host_flagged"])
    ok = np.isfinite(v["real"]) & np.isfinite(v["sim"]) & (v["real"] > 0)
    v = v[ok].reset_index(drop=True)
    return v.assign(rel_error=(v["sim"] - v["real"]).abs() / v["real"]).drop(columns=["real", "sim"])


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
    (:func:`counterpart_requests`) as the case's ``sim_requests`` (:class:`portbench.results.Case`);
    the separate reading at the run's own speed level (``speed_known``) sits beside it as
    ``admit_s_sim_run_speed``, ``first_token_s_sim_run_speed``, ``finish_s_sim_run_speed`` with the
    run's ``speed_factor``. Returns the path."""
    from .. import results
    from .. import store as _store

    case = results.load_case(results.case_of(tag).tag, data_dir)
    runs, requests, steps = case.runs, case.requests, case.steps
    windows = {w.window_id: w for w in _store.load_windows(window_ids=sorted(set(runs["window_id"])))}
    frame = counterpart_requests(runs, requests, steps, windows, k=k, kind=kind).drop(columns="speed_factor")
    known = counterpart_requests(runs, requests, steps, windows, k=k, kind=kind, speed_known=True)
    for c in ("admit_s_sim", "first_token_s_sim", "finish_s_sim"):
        frame[f"{c}_run_speed"] = known[c].to_numpy()
    frame["speed_factor"] = known["speed_factor"].to_numpy()
    frame = frame.assign(cost_kind=kind)
    case.write(sim_requests=frame)
    return case.path("sim_requests")


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
