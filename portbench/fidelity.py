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
#: off (it refuses requests that do not fit, which ``oversize="reject"`` mirrors), and SLAI with a
#: 512-token budget and 128 sequences.
REAL_COUNTERPARTS = {
    "vllm_faithful": {"budget": 2560, "seqs": 256, "params": {"oversize": "reject"}},
    "slai_faithful": {"budget": 512, "seqs": 128, "params": {}},
}


def sim_vs_real(runs: pd.DataFrame, requests: pd.DataFrame, windows: dict, cost, *,
                kv_tokens: int = 500_000) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Replay the real engine's runs in the calibrated ``vllm_v1`` model and compare.

    ``windows``: window_id → Window; ``cost``: a :class:`portbench.engine_v1.StepCost` fitted to
    the real engine's step profile. Returns per-request errors (simulated − real TTFT and latency,
    s), per-run ANWG (real and simulated) and a summary: median absolute errors, the ANWG error and
    Kendall τ_b between real and simulated ANWG over all runs.
    """
    from .engine_v1 import VllmV1Model

    per_request, per_run = [], []
    for _, run in runs.iterrows():
        spec = REAL_COUNTERPARTS.get(run["policy"])
        if spec is None:
            continue
        w = scale(windows[run["window_id"]], run["load_factor"])
        model = VllmV1Model(max_num_batched_tokens=spec["budget"], max_active_sequences=spec["seqs"],
                            max_kv_tokens=kv_tokens, cost=cost)
        result = sim.simulate(w, make_policy(run["policy"], **spec["params"]), model)
        real = requests[(requests["window_id"] == run["window_id"]) & (requests["policy"] == run["policy"])]
        real = real.sort_values("request_index")
        ttft_sim = result.first_token_s - result.arrival_s
        ttft_real = real["first_token_s"].to_numpy() - real["arrival_s"].to_numpy()
        lat_sim = result.finish_s - result.arrival_s
        lat_real = real["finish_s"].to_numpy() - real["arrival_s"].to_numpy()
        per_request.append(pd.DataFrame({"window_id": run["window_id"], "policy": run["policy"],
                                         "source": run["source"], "ttft_error_s": ttft_sim - ttft_real,
                                         "latency_error_s": lat_sim - lat_real,
                                         "latency_real_s": lat_real}))
        per_run.append({"source": run["source"], "window_id": run["window_id"], "policy": run["policy"],
                        "anwg_real": run["anwg"], "anwg_sim": cell_metrics(result)["anwg"]})
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
        }
    return req, run_frame, summary
