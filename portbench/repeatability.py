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
- :func:`admission_order_agreement`: the free-running simulation's admission order against the
  real run's, beside two real runs' against each other;
- :func:`choice_steps`: the steps at which the real engine left visible work unscheduled — the only
  steps at which a schedule comparison can tell two rules apart.

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
