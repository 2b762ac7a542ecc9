"""How much of the study's map is the simulator's? Headline numbers per engine model, and the
head-of-line ablation of ``vllm_faithful``.
"""

from __future__ import annotations


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
                         max_model_len=None):
    """The ``vllm_v1`` counterpart of a real run of ``policy`` on ``window`` (already scaled), with the
    real engine's refusal rule: the requests of :func:`real_refused` are taken out of the window
    before simulating and come back as never served (NaN times). ``max_model_len``: the real run's
    (default: :data:`REAL_COUNTERPARTS`). Returns ``(RunResult, refused mask)``.
    """
    import dataclasses

    from .engine_v1 import VllmV1Model

    spec = REAL_COUNTERPARTS[policy]
    if max_model_len is None or not np.isfinite(max_model_len):
        max_model_len = spec["max_model_len"]
    refused = real_refused(window, max_model_len)
    model = VllmV1Model(max_num_batched_tokens=spec["budget"], max_active_sequences=spec["seqs"],
                        max_kv_tokens=kv_tokens, cost=cost)
    if not refused.any():
        return sim.simulate(window, make_policy(policy, **spec["params"]), model), refused
    keep = ~refused
    sub = dataclasses.replace(window, **{f: getattr(window, f)[keep] for f in (
        "arrival_s", "input_tokens", "output_tokens", "predicted_output_tokens", "deadline_s")})
    r = sim.simulate(sub, make_policy(policy, **spec["params"]), model)

    def full(values):
        out = np.full(len(window), np.nan)
        out[keep] = values
        return out

    result = sim.RunResult(window.window_id, r.policy, r.engine_model, window.arrival_s,
                           window.deadline_s, window.input_tokens, window.output_tokens,
                           np.ones(len(window)), admit_s=full(r.admit_s),
                           first_token_s=full(r.first_token_s), finish_s=full(r.finish_s),
                           duration_s=r.duration_s, n_steps=r.n_steps, n_preemptions=r.n_preemptions)
    return result, refused


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
