"""The real engine's own repeatability: the floor every simulator-against-real figure is read against.

Two repetitions of one real run (same window, policy, load and engine settings, the host the only
difference) do not give the same per-request latencies. A simulator whose error equals that
difference is as close to the engine as the engine is to itself on this host, and no closer
claim can be checked here. Each figure below therefore comes in pairs over the *same* requests:

- :func:`paired_errors`: per request, the simulator's relative error against the real run
  (``sim``) and the other repetition's relative difference from it (``noise``), for the latency
  measures of :data:`portbench.fidelity.LATENCY_MEASURES`;
- :func:`noise_table`: their median and p90 per group and the ratio sim ÷ noise, with a 95%
  bootstrap interval over windows;
- :func:`run_offsets`: how much of either error is one offset per run (a run's host speed), and
  what is left once it is removed;
- :func:`lifetime_speed`, :func:`with_lifetime_speed`: how much of the model's error is the host's
  speed over each request's life (measured against the cost model on the real steps);
- :func:`admission_order_agreement`: the free-running simulation's admission order against the
  real run's, beside two real runs' against each other;
- :func:`choice_steps`: the steps at which the real engine left visible work unscheduled — the only
  steps at which a schedule comparison can tell two rules apart;
- :func:`head_of_line_steps`: the steps at which vLLM's head-of-line rule fired (whole-prompt
  admission stopped at a prompt that did not fit the budget left), and those at which it blocked a
  request that would have fit.

Input is a case's per-request counterpart (:func:`portbench.fidelity.counterpart_requests`, stored
as ``<tag>_sim_requests.parquet``) and its step log.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .fidelity import LATENCY_MEASURES as MEASURES
from .fidelity import latency_values

RUN_KEYS = ["window_id", "policy", "repetition"]
REQUEST_KEYS = ["source", "window_id", "policy", "repetition", "request_index"]
STATS = {"median": 0.5, "p90": 0.9}


def request_measures(counterpart: pd.DataFrame) -> pd.DataFrame:
    """Per request finished on both sides, each latency measure, real and simulated (long format:
    :data:`REQUEST_KEYS`, ``measure``, ``real``, ``sim``; :func:`portbench.fidelity.latency_values`)."""
    return latency_values(counterpart, REQUEST_KEYS)


def paired_errors(counterpart: pd.DataFrame) -> pd.DataFrame:
    """Per request and measure, the simulator's relative error against the real run and the other
    real repetition's relative difference from it, over the same requests.

    Each repetition ``r`` is paired with the next one (cyclically: with two repetitions, 0 with 1 and
    1 with 0), so that sim and noise are counted over the same (run, request) rows. Columns:
    :data:`REQUEST_KEYS`, ``measure``, ``real``, ``sim``, ``other`` (the partner repetition's real
    value), ``sim_signed`` = (sim − real) ÷ real, ``noise_signed`` = (other − real) ÷ real and their
    absolute values ``sim_error``, ``noise_error``. Rows without a finite positive real value, a
    simulated value or a partner are left out; a case with one repetition gives an empty frame."""
    m = request_measures(counterpart)
    reps = sorted(m["repetition"].unique())
    if len(reps) < 2:
        return m.iloc[0:0].assign(other=[], sim_signed=[], noise_signed=[], sim_error=[], noise_error=[])
    partner = {r: reps[(k + 1) % len(reps)] for k, r in enumerate(reps)}
    other = m[["window_id", "policy", "repetition", "request_index", "measure", "real"]].rename(
        columns={"real": "other", "repetition": "partner"})
    m = m.assign(partner=m["repetition"].map(partner)).merge(
        other, on=["window_id", "policy", "partner", "request_index", "measure"], how="inner")
    ok = np.isfinite(m["real"]) & (m["real"] > 0) & np.isfinite(m["sim"]) & np.isfinite(m["other"])
    m = m[ok].drop(columns="partner").reset_index(drop=True)
    m["sim_signed"] = (m["sim"] - m["real"]) / m["real"]
    m["noise_signed"] = (m["other"] - m["real"]) / m["real"]
    m["sim_error"] = m["sim_signed"].abs()
    m["noise_error"] = m["noise_signed"].abs()
    return m


def _stat_ratio_boot(frame: pd.DataFrame, sim: str, noise: str, q: float, *, n_resamples: int,
                     rng: np.random.Generator) -> tuple[float, float, float, float, float]:
    """Quantile ``q`` of ``sim`` and of ``noise`` over the rows, their ratio and its 95% percentile
    bootstrap interval (windows drawn with replacement, all of a window's rows with it)."""
    by_w = [(g[sim].to_numpy(), g[noise].to_numpy()) for _, g in frame.groupby("window_id")]
    s_all = np.concatenate([a for a, _ in by_w])
    n_all = np.concatenate([b for _, b in by_w])
    s_q, n_q = float(np.quantile(s_all, q)), float(np.quantile(n_all, q))
    ratios = np.empty(n_resamples)
    k = len(by_w)
    for i in range(n_resamples):
        pick = rng.integers(0, k, k)
        s = np.quantile(np.concatenate([by_w[j][0] for j in pick]), q)
        n = np.quantile(np.concatenate([by_w[j][1] for j in pick]), q)
        ratios[i] = s / n if n > 0 else np.nan
    ratios = ratios[np.isfinite(ratios)]
    lo, hi = np.percentile(ratios, [2.5, 97.5]) if len(ratios) else (np.nan, np.nan)
    return s_q, n_q, (s_q / n_q if n_q > 0 else np.nan), float(lo), float(hi)


def noise_table(paired: pd.DataFrame, *, by=("source", "policy"), measures=MEASURES, stats=("median", "p90"),
                sim: str = "sim_error", noise: str = "noise_error", n_resamples: int = 1000,
                seed: int = 0) -> pd.DataFrame:
    """The simulator's error beside the real engine's own repeatability, overall (``group`` "all")
    and per ``by`` group: one row per group, measure and statistic with ``sim``, ``noise``,
    ``ratio`` = sim ÷ noise, its 95% bootstrap interval by window (``ratio_lo``, ``ratio_hi``),
    ``requests`` and ``windows``. A ratio near 1 means the model is as close to the engine as the
    engine is to itself; a ratio whose interval lies above 1, a model error beyond the host's."""
    rng = np.random.default_rng(seed)
    by = list(by)
    groups = [("all", paired)] + ([(" / ".join(map(str, k if isinstance(k, tuple) else (k,))), g)
                                   for k, g in paired.groupby(by)] if by else [])
    rows = []
    for name, g in groups:
        for m in measures:
            gm = g[g["measure"] == m]
            if gm.empty:
                continue
            for st in stats:
                s_q, n_q, ratio, lo, hi = _stat_ratio_boot(gm, sim, noise, STATS[st], n_resamples=n_resamples, rng=rng)
                rows.append({"group": name, "measure": m, "stat": st, "sim": s_q, "noise": n_q, "ratio": ratio,
                             "ratio_lo": lo, "ratio_hi": hi, "requests": len(gm),
                             "windows": int(gm["window_id"].nunique())})
    return pd.DataFrame(rows)


def run_offsets(paired: pd.DataFrame, measure: str = "end-to-end") -> tuple[pd.DataFrame, pd.DataFrame]:
    """One offset per run: the median signed relative error of the simulator against the run
    (``sim_offset``) and of the partner repetition against it (``noise_offset``), for ``measure``.
    Returns (per run: :data:`RUN_KEYS`, ``source``, both offsets; per request: the paired rows of
    ``measure`` with ``sim_error_offset_removed`` and ``noise_error_offset_removed``, each error
    once its run's offset is divided out: |(1 + signed) ÷ (1 + offset) − 1|)."""
    p = paired[paired["measure"] == measure]
    offsets = (p.groupby(["source", *RUN_KEYS])[["sim_signed", "noise_signed"]].median()
               .rename(columns={"sim_signed": "sim_offset", "noise_signed": "noise_offset"}).reset_index())
    q = p.merge(offsets, on=["source", *RUN_KEYS])
    q["sim_error_offset_removed"] = ((1 + q["sim_signed"]) / (1 + q["sim_offset"]) - 1).abs()
    q["noise_error_offset_removed"] = ((1 + q["noise_signed"]) / (1 + q["noise_offset"]) - 1).abs()
    return offsets, q


def admission_order_agreement(counterpart: pd.DataFrame) -> pd.DataFrame:
    """Per run, the share of requests admitted at the same position of the admission order (ties by
    request index) by the free-running simulation and the real run (``sim``), and by the partner
    real repetition and the run (``noise``), over the requests admitted in all three. Columns:
    ``source``, :data:`RUN_KEYS`, ``requests``, ``sim``, ``noise`` (NaN without a partner)."""
    c = counterpart
    reps = sorted(c["repetition"].unique())
    partner = {r: reps[(k + 1) % len(reps)] for k, r in enumerate(reps)} if len(reps) > 1 else {}
    admit = c.set_index(["window_id", "policy", "repetition", "request_index"])["admit_s"]
    rows = []
    for (src, w, pol, rep), g in c.groupby(["source", *RUN_KEYS]):
        g = g.sort_values("request_index")
        idx = g["request_index"].to_numpy()
        real = g["admit_s"].to_numpy(dtype=float)
        sim = g["admit_s_sim"].to_numpy(dtype=float)
        other = (admit.reindex(pd.MultiIndex.from_arrays([[w] * len(idx), [pol] * len(idx),
                                                          [partner[rep]] * len(idx), idx])).to_numpy(dtype=float)
                 if rep in partner else np.full(len(idx), np.nan))
        ok = np.isfinite(real) & np.isfinite(sim) & (np.isfinite(other) if rep in partner else True)

        def position(t):
            order = np.lexsort((idx[ok], t[ok]))
            pos = np.empty(len(order), dtype=int)
            pos[order] = np.arange(len(order))
            return pos

        base = position(real)
        rows.append({"source": src, "window_id": w, "policy": pol, "repetition": rep, "requests": int(ok.sum()),
                     "sim": float(np.mean(position(sim) == base)) if ok.any() else np.nan,
                     "noise": float(np.mean(position(other) == base)) if ok.any() and rep in partner else np.nan})
    return pd.DataFrame(rows)


def choice_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The kept attempts' steps of a case's step log, each flagged ``choice``: the engine left
    visible work unscheduled (fewer requests scheduled than were running or waiting when it
    scheduled). Only at such a step do two scheduling rules have room to differ; where everything
    visible runs, any rule gives the same batch. Needs vLLM's step log (``running_before``,
    ``waiting_before``, ``scheduled_seqs``)."""
    need = {"running_before", "waiting_before", "scheduled_seqs"}
    if not need <= set(steps.columns):
        raise ValueError(f"choice_steps needs the step log's {', '.join(sorted(need))} (vLLM's step log); "
                         f"it has {', '.join(map(str, steps.columns))}")
    s = steps[steps["kept"].astype(bool)] if "kept" in steps else steps
    s = s[[*RUN_KEYS, "step", "running_before", "waiting_before", "scheduled_seqs"]].copy()
    s["choice"] = (s["running_before"] + s["waiting_before"]) > s["scheduled_seqs"]
    return s


def agreement_on_choice_steps(replay_steps: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """A replay's step agreement (:func:`portbench.fidelity.replayed_cost_comparison`'s step table)
    split by whether the real engine had a choice at that step (:func:`choice_steps`): per policy and
    overall, the steps, the share with a choice, and the agreement on all steps and on the choice
    steps alone."""
    flagged = replay_steps.merge(choice_steps(steps), on=[*RUN_KEYS, "step"], how="inner")
    rows = []
    for name, g in [("all", flagged)] + list(flagged.groupby("policy")):
        ch = g[g["choice"]]
        rows.append({"group": name, "steps": len(g), "choice_share": float(g["choice"].mean()),
                     "agree_all": float(g["agree"].mean()),
                     "agree_choice": float(ch["agree"].mean()) if len(ch) else np.nan,
                     "choice_steps": len(ch)})
    return pd.DataFrame(rows)


def head_of_line_steps(steps: pd.DataFrame, requests: pd.DataFrame, runs: pd.DataFrame, *,
                       policy: str = "vllm_faithful", budget: int | None = None) -> pd.DataFrame:
    """The steps of ``policy``'s kept runs at which vLLM's head-of-line rule fired: with chunked
    prefill off, the waiting queue's head (the earliest submitted request not yet admitted) did not
    fit the token budget left at that step, while the engine had a seat free (fewer scheduled than
    the run's ``max_num_seqs``, else the policy's), so admission stopped there. ``budget``: the
    per-step token budget (default: the policy's in :data:`portbench.fidelity.REAL_COUNTERPARTS`;
    ``vllm_faithful``: 2,560, chunked prefill off). Per step: :data:`RUN_KEYS`, ``step``,
    ``head`` (request index; -1 without a waiting request), ``head_tokens``, ``budget_left``,
    ``fired`` and ``blocked`` (it fired while a request behind the head would have fit: the steps
    at which the rule, not the budget alone, decided the batch; a skip-the-misfit rule would have
    admitted that request). Needs the step log's ``scheduled`` batches and the requests' ``submit_step``."""
    from .fidelity.cases import run_rows
    from .fidelity.counterpart import REAL_COUNTERPARTS
    from .fidelity.schedules import real_batches

    if "scheduled" not in steps or "submit_step" not in requests:
        raise ValueError("head_of_line_steps needs the step log's scheduled batches and the requests' submit_step")
    spec = REAL_COUNTERPARTS[policy]
    budget = spec["budget"] if budget is None else budget
    s = steps[steps["kept"].astype(bool)] if "kept" in steps else steps
    out = []
    for _, run in runs[runs["policy"] == policy].iterrows():
        key = tuple(run[k] for k in RUN_KEYS)
        rs = run_rows(s, run).sort_values("step")
        rq = run_rows(requests, run)
        if "attempt" in rq and "attempt" in rs and len(rs):
            rq = rq[rq["attempt"] == rs["attempt"].iloc[0]]
        if "refused" in rq:
            rq = rq[~rq["refused"].astype(bool)]
        seats = run.get("max_num_seqs", np.nan)
        seats = spec["seqs"] if pd.isna(seats) else int(seats)
        batches = real_batches(rs)
        first = {}
        for k, batch in zip(rs["step"].to_numpy(), batches):
            for rid in batch:
                first.setdefault(rid, k)
        order = rq.sort_values(["submit_step", "request_index"])
        idx = order["request_index"].to_numpy()
        sub = order["submit_step"].to_numpy()
        toks = order["input_tokens"].to_numpy()
        admit = np.array([first.get(int(i), np.iinfo(np.int64).max) for i in idx])
        for k, batch in zip(rs["step"].to_numpy(), batches):
            waiting = np.flatnonzero((sub <= k) & (admit > k))
            used = sum(batch.values())
            head = int(idx[waiting[0]]) if len(waiting) else -1
            head_tokens = int(toks[waiting[0]]) if len(waiting) else 0
            fired = bool(len(waiting) and len(batch) < seats and head_tokens > budget - used)
            blocked = bool(fired and (toks[waiting[1:]] <= budget - used).any())
            out.append((*key, int(k), head, head_tokens, budget - used, fired, blocked))
    return pd.DataFrame(out, columns=[*RUN_KEYS, "step", "head", "head_tokens", "budget_left", "fired", "blocked"])


def agreement_on_hol_steps(replay_steps: pd.DataFrame, hol: pd.DataFrame) -> pd.DataFrame:
    """A replay's step agreement (as :func:`agreement_on_choice_steps` takes it) on the steps of
    :func:`head_of_line_steps`: one row with the policy's steps, those at which the rule fired and
    blocked (count, share, windows) and the agreement on each."""
    m = replay_steps.merge(hol, on=[*RUN_KEYS, "step"], how="inner")
    fired, blocked = m[m["fired"]], m[m["blocked"]]
    return pd.DataFrame([{
        "policy": ", ".join(sorted(m["policy"].unique())), "steps": len(m),
        "fired_steps": len(fired), "fired_share": float(m["fired"].mean()) if len(m) else np.nan,
        "fired_windows": fired["window_id"].nunique(),
        "agree_fired": float(fired["agree"].mean()) if len(fired) else np.nan,
        "blocked_steps": len(blocked), "blocked_windows": blocked["window_id"].nunique(),
        "agree_blocked": float(blocked["agree"].mean()) if len(blocked) else np.nan}])


def lifetime_speed(counterpart: pd.DataFrame, predicted_steps: pd.DataFrame) -> pd.DataFrame:
    """Per request, the host's speed over its life in the real run: the measured duration of the
    real steps between its arrival and its finish ÷ the cost model's prediction for the same steps
    (``predicted_steps``: the step log with ``predicted_s``, e.g.
    :func:`portbench.engine.stepcost.cross_validated_step_error`). 1: the host ran as the cost model
    predicts; 1.2: 20% slower. What no model can know ahead of a run; it tells how much of the
    model's error is the host's timing. Columns: :data:`RUN_KEYS`, ``request_index``,
    ``lifetime_speed``."""
    frames = []
    by_run = {key: g for key, g in counterpart.groupby(RUN_KEYS)}
    for key, g in predicted_steps.groupby(RUN_KEYS):
        q = by_run.get(key)
        if q is None:
            continue
        g = g.sort_values("start_s")
        start = g["start_s"].to_numpy(dtype=float)
        measured = np.r_[0.0, np.cumsum(g["duration_s"].to_numpy(dtype=float))]
        predicted = np.r_[0.0, np.cumsum(g["predicted_s"].to_numpy(dtype=float))]
        a = np.searchsorted(start, q["arrival_s"].to_numpy(dtype=float))
        b = np.searchsorted(start, q["finish_s"].to_numpy(dtype=float))
        with np.errstate(invalid="ignore", divide="ignore"):
            factor = (measured[b] - measured[a]) / (predicted[b] - predicted[a])
        frames.append(pd.DataFrame({**dict(zip(RUN_KEYS, key)), "request_index": q["request_index"].to_numpy(),
                                    "lifetime_speed": factor}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[*RUN_KEYS, "request_index", "lifetime_speed"])


def with_lifetime_speed(counterpart: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """``counterpart`` with each request's simulated times stretched about its arrival by its
    :func:`lifetime_speed` (the model's latencies as they would be had it known the host's speed
    over each request's life); requests without a finite factor keep their times."""
    c = counterpart.merge(speed, on=[*RUN_KEYS, "request_index"], how="left")
    f = c.pop("lifetime_speed").to_numpy(dtype=float)
    f = np.where(np.isfinite(f) & (f > 0), f, 1.0)
    for col in ("admit_s_sim", "first_token_s_sim", "finish_s_sim"):
        if col in c:
            c[col] = c["arrival_s"] + (c[col] - c["arrival_s"]) * f
    return c
