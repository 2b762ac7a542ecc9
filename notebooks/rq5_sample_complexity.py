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
# # RQ5 — How many windows does a ranking need?
#
# For each source and region, $n$ of the 40 windows are drawn without replacement (500 draws per
# $n$), and we ask how often the ranking of the $n$-window means equals the ranking over all 40
# windows — fully, and at the top-1. A benchmark that evaluates schedulers on a handful of trace
# windows is, in effect, one such draw. We also show the original study's variant, which averages each
# window over all six regions before ranking.

# %% tags=["parameters"]
results_path = ""
engine_model = "lssp"
n_resamples = 2000
seed = 12345
output_dir = "book/figures"
metric = "anwg"
n_draws = 500
sizes = [5, 10, 20, 30, 40]

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import stats
from portbench.campaign import load_results
from portbench.metrics import METRICS
from portbench.policies import PRIMARY_PANEL
from portbench.regions import REGIONS

if metric not in METRICS:
    raise ValueError(f"unknown metric {metric!r}; metrics: {', '.join(METRICS)}")
if not sizes or min(sizes) < 1:
    raise ValueError(f"sizes must be positive window counts, got {sizes}")
Path(output_dir).mkdir(parents=True, exist_ok=True)
table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
regions = [r for r in REGIONS if r in set(table["region"])]
sources = sorted(set(table["source"]))

# %%
per_region = pd.concat([stats.sample_complexity(table, metric, s, sizes=tuple(sizes), n_draws=n_draws,
                                                seed=seed, policies=PRIMARY_PANEL).assign(source=s)
                        for s in sources], ignore_index=True)
pooled = pd.concat([stats.sample_complexity(table, metric, s, sizes=tuple(sizes), n_draws=n_draws,
                                            seed=seed, policies=PRIMARY_PANEL, pool_regions=True)
                    .assign(source=s) for s in sources], ignore_index=True)
per_region.pivot_table(index=["source", "region"], columns="n", values="p_top1").reindex(
    [(s, r) for s in sources for r in regions]).round(2)

# %%
fig, axes = plt.subplots(2, len(sources), figsize=(5 * len(sources), 7), sharex=True, sharey=True)
for j, source in enumerate(sources):
    d = per_region[per_region["source"] == source]
    for k, region in enumerate(regions):
        e = d[d["region"] == region]
        c = plt.cm.viridis(k / max(1, len(regions) - 1))
        axes[0, j].plot(e["n"], e["p_full"], marker="o", color=c, label=region)
        axes[1, j].plot(e["n"], e["p_top1"], marker="o", color=c, label=region)
    axes[0, j].set_title(source)
    axes[1, j].set_xlabel("windows drawn (n)")
axes[0, 0].set_ylabel("P(full ranking recovered)")
axes[1, 0].set_ylabel("P(top-1 recovered)")
for ax in axes.flat:
    ax.axhline(0.9, color="k", ls=":", lw=0.8)
axes[0, -1].legend(fontsize=7)
fig.tight_layout()
fig.savefig(Path(output_dir) / f"rq5_sample_complexity_{metric}.png", dpi=120)

# %% [markdown]
# Smallest $n$ at which the top-1 is recovered with probability ≥ 0.9, per source and region (NaN:
# not below 40):

# %%
def first_n(frame, column, threshold=0.9):
    ok = frame[frame[column] >= threshold]
    return ok["n"].min() if len(ok) else np.nan

need = (per_region.groupby(["source", "region"])
        .apply(lambda f: pd.Series({"top1": first_n(f, "p_top1"), "full": first_n(f, "p_full")}),
               include_groups=False).reset_index())
at10 = per_region[per_region["n"] == 10] if 10 in sizes else per_region.iloc[:0]
glue("rq5_n_conditions", int(len(at10)), display=False)
glue("rq5_unreliable_at_10", int((at10["p_top1"] < 0.9).sum()), display=False)
glue("rq5_min_p_top1_at_10", float(at10["p_top1"].min()) if len(at10) else float("nan"), display=False)
glue("rq5_unreliable_at_20", int((per_region[per_region["n"] == 20]["p_top1"] < 0.9).sum()), display=False)
print(f"n = 10: top-1 recovered with probability < 0.9 in {int((at10['p_top1'] < 0.9).sum())} of "
      f"{len(at10)} (source, region) conditions; lowest {at10['p_top1'].min():.2f}")
need.pivot(index="region", columns="source", values="top1").reindex(regions)

# %% [markdown]
# The original study's variant (each window averaged over all regions first):

# %%
pooled.pivot_table(index="source", columns="n", values=["p_full", "p_top1"]).round(2)
