"""How much of the study's map is the simulator's: headline numbers per engine model, and the
head-of-line ablation of ``vllm_faithful``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import stats
from ..engine import LsspModel, simulate
from ..metrics import cell_metrics
from ..policies import PRIMARY_PANEL, make_policy
from ..regions import REGIONS
from ..workload import scale


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
    model = model or LsspModel()
    rows = []
    for w in windows:
        scaled = scale(w, REGIONS[region] * lambda_refs[w.window_id])
        runs = [("slai_faithful", make_policy("slai_faithful"))]
        runs += [(f"vllm_faithful[{v}]", make_policy("vllm_faithful", oversize=v)) for v in variants]
        for label, policy in runs:
            m = cell_metrics(simulate(scaled, policy, model))
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
