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
# # Workload characterisation
#
# The three sources of the study's 120 frozen windows, side by side: how long a window lasts, how
# bursty it is, how long its prompts and responses are, and — the question the rest of the book leans
# on — **what sets each window's λ_ref**: queueing for capacity, or one request's own slack-to-length
# ratio.

# %% tags=["parameters"]
results_path = ""          # campaign table (unused here; every notebook takes the same parameters)
engine_model = "lssp"
n_resamples = 2000
seed = 0
output_dir = "book/figures"

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import characterise, store

Path(output_dir).mkdir(parents=True, exist_ok=True)
windows = store.load_windows()
desc = characterise.window_descriptors(windows)
summary = desc.groupby("source").agg(
    windows=("window_id", "count"), duration_s=("duration_s", "median"), rate_rps=("rate_rps", "median"),
    gap_cv=("gap_cv", "median"), input_mean=("input_mean", "mean"), input_max=("input_max", "max"),
    output_mean=("output_mean", "mean"), prompts_over_2560=("prompts_over_vllm_budget", "sum"),
    lambda_ref_min=("paper_lambda_ref", "min"), lambda_ref_max=("paper_lambda_ref", "max"))
summary.round(2)

# %% [markdown]
# The study's λ_ref beside portbench's (bisection on FIFO's 0.5% violation knee, written by the
# campaign to `data/results/lambda_ref_<engine>.csv`):

# %%
from portbench.campaign import results_dir

lam = pd.read_csv(results_dir() / f"lambda_ref_{engine_model}.csv")
glue("lambda_max_rel_diff", float(lam["relative_difference"].max()), display=False)
glue("lambda_n_windows", int(len(lam)), display=False)
print(f"{len(lam)} windows; largest relative difference to the study's λ_ref: "
      f"{lam['relative_difference'].max():.3g}")
lam.groupby("source")[["lambda_ref", "paper_lambda_ref", "relative_difference"]].agg(["min", "max"])

# %% [markdown]
# Medians over windows for duration, rate and inter-arrival CV; means of the per-window token means;
# the largest prompt of any window; how many prompts exceed the 2,560-token per-step budget of the
# vLLM v0.1.0 policy (the head-of-line hypothesis of the study); the range of the study's λ_ref.

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
colors = {"azure_llm_2024": "C0", "bailian_qwen": "C1", "burstgpt": "C2"}
tokens = {s: (np.concatenate([w.input_tokens for w in windows if w.source == s]),
              np.concatenate([w.output_tokens for w in windows if w.source == s])) for s in colors}
for s, (inp, out) in tokens.items():
    axes[0].hist(np.log10(inp), bins=40, histtype="step", color=colors[s], label=s, density=True)
    axes[1].hist(np.log10(out), bins=40, histtype="step", color=colors[s], label=s, density=True)
axes[0].axvline(np.log10(2560), color="k", ls=":", lw=1)
axes[0].set_xlabel("log10 prompt tokens (dotted: 2,560)")
axes[1].set_xlabel("log10 response tokens")
for s, c in colors.items():
    d = desc[desc.source == s]
    axes[2].scatter(d["rate_rps"], d["paper_lambda_ref"], color=c, s=14, label=s)
axes[2].set_xscale("log"); axes[2].set_yscale("log")
axes[2].set_xlabel("window arrival rate (req/s, trace time)"); axes[2].set_ylabel("study's λ_ref")
axes[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(Path(output_dir) / "workload_tokens.png", dpi=120)

# %% [markdown]
# ## What sets λ_ref?
#
# Just above λ_ref, FIFO misses exactly one deadline. If that request was admitted the moment it
# became visible, the miss is *intrinsic*: compressed by λ, its SLO slack (built from its *predicted*
# output length at 0.4 s per predicted token before compression) is shorter than its own decode time
# (1 ms per true token) — no scheduler could have met it. Otherwise it waited in the queue.

# %%
causes = pd.DataFrame([characterise.knee_cause(w, w.meta["paper_lambda_ref"]) for w in windows])
causes["source"] = [w.source for w in windows]
table = causes.groupby(["source", "cause"]).size().unstack(fill_value=0)
table

# %%
n_intrinsic_burst = int(table.loc["burstgpt"].get("intrinsic", 0))
glue("burstgpt_intrinsic_knees", n_intrinsic_burst, display=False)
glue("azure_queueing_knees", int(table.loc["azure_llm_2024"].get("queueing", 0)), display=False)
ratio = causes[causes.cause == "intrinsic"].eval("slack_s / service_s")
print(f"BurstGPT: {n_intrinsic_burst}/40 knees are intrinsic — the first miss is a request whose "
      f"compressed slack is just below its own decode time (slack/service at the knee: "
      f"median {ratio.median():.3f}).")

# %% [markdown]
# So "HIGH_PRESSURE" does not mean the same thing across sources. On Azure and Bailian, λ_ref is a
# queueing knee: the engine is saturated and requests wait. On BurstGPT (short prompts, many
# 7-token responses whose prediction can fall below the true length) λ_ref is set by a single request
# whose prediction undershoots its true length: at 1.5 × λ_ref the engine may still be lightly loaded,
# while every request with predicted < true output is doomed whatever the policy does.
