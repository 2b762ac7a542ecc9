# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # RQ6 — Does the simulated reversal hold on a real engine?
#
# The study's pre-registered case is its largest simulated reversal: `slai_faithful` vs
# `vllm_faithful` on ANWG at HIGH_PRESSURE, Azure vs BurstGPT, with Azure vs Bailian as a stable
# control. On a real engine, λ_ref is re-found per window (FIFO's 0.5% violation knee on that
# engine), each window is compressed to 1.5 × λ_ref and replayed in real time under both policies.
# This chapter re-analyses whatever real-engine results are committed in `data/results/realengine/`
# (no engine is needed to build the book) and sets them beside the simulator's prediction for the
# same windows and the original study's GPU result. The same reversal classifier as RQ2 is applied.

# %% tags=["parameters"]
results_path = ""
engine_model = "lssp"
n_resamples = 2000
seed = 0
output_dir = "book/figures"
rerun_backend = ""         # "vllm" or "transformers": replay the case now (needs that engine)
rerun_windows_per_source = 2

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import stats
from portbench.campaign import load_results
from portbench.realengine import study
from portbench.realengine.study import CASE_POLICIES, CASE_REGION, realengine_dir, run_case

Path(output_dir).mkdir(parents=True, exist_ok=True)
if rerun_backend:
    run_case(rerun_backend, n_per_source=int(rerun_windows_per_source), tag=f"{rerun_backend}_rerun")
sim_table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
run_files = sorted(realengine_dir().glob("*_runs.parquet"))
print("real-engine results:", [f.name for f in run_files] or "none yet")

# %% [markdown]
# The committed vLLM run (`vllm_cpu_case`) used vLLM's CPU build with a 2-layer, 128-wide random-weight
# Llama on this project's 2-core development machine, with 10 windows per source, λ_ref from a 3-step
# bisection bracketed around the simulator's λ_ref × the engine's measured speed ratio. Other jobs
# shared the machine during parts of the run, so its timings carry that noise; its provenance is in
# `data/results/realengine/vllm_cpu_case.json`.
#
# The original study's reported GPU result (vLLM 0.27.1, Qwen2.5-0.5B, one A100; mean SLAI − vLLM
# ANWG per source over 40 windows) — typed from the study, for comparison only:

# %%
original = pd.DataFrame({"source": ["azure_llm_2024", "burstgpt", "bailian_qwen"],
                         "delta_slai_minus_vllm": [-0.024, -0.200, -0.026],
                         "engine": "original: vLLM 0.27.1 on A100"})
original

# %%
def case_deltas(runs: pd.DataFrame, label: str) -> pd.DataFrame:
    return study.case_deltas(runs, label, n_resamples=n_resamples, seed=seed)

frames = []
for f in run_files:
    runs = pd.read_parquet(f)
    tag = f.name.removesuffix("_runs.parquet")
    frames.append(case_deltas(runs, tag))
    # the simulator's prediction for the very same windows
    same = sim_table[(sim_table["window_id"].isin(runs["window_id"])) & (sim_table["region"] == CASE_REGION)
                     & (sim_table["policy"].isin(CASE_POLICIES)) & (sim_table["slo_multiplier"] == 20.0)]
    frames.append(case_deltas(same, f"simulator ({engine_model}) on the windows of {tag}"))
all_sim = sim_table[(sim_table["region"] == CASE_REGION) & (sim_table["policy"].isin(CASE_POLICIES))
                    & (sim_table["slo_multiplier"] == 20.0)]
frames.append(case_deltas(all_sim, f"simulator ({engine_model}), all 40 windows"))
deltas = pd.concat(frames + [original], ignore_index=True)
for _, r in deltas.iterrows():
    label = r["engine"].split(" ")[0] if r["engine"].startswith("simulator") else r["engine"]
    if r["engine"].startswith("simulator") and "all 40" not in r["engine"]:
        continue
    key = "sim" if label == "simulator" else ("original" if label.startswith("original") else label)
    glue(f"rq6_{key}_{r['source']}", float(r["delta_slai_minus_vllm"]), display=False)
deltas.round(3)

# %%
fig, ax = plt.subplots(figsize=(8, 4))
labels = list(dict.fromkeys(deltas["engine"]))
sources = ["azure_llm_2024", "bailian_qwen", "burstgpt"]
width = 0.8 / max(1, len(labels))
for k, label in enumerate(labels):
    d = deltas[deltas["engine"] == label].set_index("source").reindex(sources)
    x = np.arange(len(sources)) + (k - (len(labels) - 1) / 2) * width
    err = None
    if {"ci_low", "ci_high"} <= set(d.columns) and d["ci_low"].notna().any():
        err = [d["delta_slai_minus_vllm"] - d["ci_low"], d["ci_high"] - d["delta_slai_minus_vllm"]]
    ax.bar(x, d["delta_slai_minus_vllm"], width, yerr=err, capsize=2, label=label)
ax.axhline(0, color="k", lw=0.6)
ax.set_xticks(range(len(sources)), sources)
ax.set_ylabel("mean ANWG, SLAI − vLLM (95% CI)")
ax.legend(fontsize=7, loc="best")
fig.tight_layout()
fig.savefig(Path(output_dir) / "rq6_case.png", dpi=120)

# %% [markdown]
# ## The reversal classifier on each engine
#
# The RQ2 classifier applied to the two case policies (a supported reversal needs a sign change with
# a margin above 10% in both sources and both per-source CIs excluding 0):

# %%
verdicts = []
for f in run_files:
    runs = pd.read_parquet(f)
    if "slo_multiplier" not in runs:
        runs = runs.assign(slo_multiplier=20.0)
    present = sorted(set(runs["source"]))
    if len(present) < 2:
        continue
    rev = stats.reversals(runs, "anwg", CASE_REGION, sources=present, policies=CASE_POLICIES,
                          n_resamples=n_resamples, seed=seed)
    verdicts.append(rev.assign(engine=f.name.removesuffix("_runs.parquet")))
sim_rev = stats.reversals(sim_table, "anwg", CASE_REGION, policies=CASE_POLICIES, n_resamples=n_resamples,
                          seed=seed)
verdicts.append(sim_rev.assign(engine=f"simulator ({engine_model})"))
verdict = pd.concat(verdicts, ignore_index=True)
glue("rq6_n_real_engines", len(run_files), display=False)

from IPython.display import Markdown, display

lines = []
for engine, g in verdict.groupby("engine", sort=False):
    case = g[(g["source_x"] == "azure_llm_2024") & (g["source_y"] == "burstgpt")]
    control = g[(g["source_x"] == "azure_llm_2024") & (g["source_y"] == "bailian_qwen")]
    if case.empty:
        continue
    c = case.iloc[0]
    sentence = (f"**{engine}**: SLAI − vLLM ANWG is {c['delta_x']:+.3f} on Azure and {c['delta_y']:+.3f} on "
                f"BurstGPT; the classifier calls the case **{c['cls']}**")
    if not control.empty:
        sentence += f", the Azure–Bailian control **{control.iloc[0]['cls']}**"
    lines.append("- " + sentence + ".")
display(Markdown("\n".join(lines) or "No real-engine results yet."))
verdict[["engine", "source_x", "source_y", "delta_x", "delta_y", "ci_low_x", "ci_high_x", "ci_low_y",
         "ci_high_y", "cls"]].round(3)
