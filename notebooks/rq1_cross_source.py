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
# # RQ1 — Do rankings port across traffic sources?
#
# For each operating region, the 11 primary policies are ranked by their mean metric over a source's
# 40 windows, and the rankings of two sources are compared with Kendall's $\tau_b$. The 95% interval
# comes from a bootstrap that resamples windows independently within each source; we report the
# percentile interval and the BCa interval (the percentile interval of a re-ranked resampled mean is
# biased toward 0). Kendall's $W$ measures the concordance of all three sources, and a Friedman test
# (windows as blocks) asks whether the policies differ at all.

# %% tags=["parameters"]
results_path = ""
engine_model = "lssp"
n_resamples = 2000
seed = 0
output_dir = "book/figures"
metric = "anwg"

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
Path(output_dir).mkdir(parents=True, exist_ok=True)
table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
regions = [r for r in REGIONS if r in set(table["region"])]
print(f"{len(table)} cells; metric {metric}; {n_resamples} resamples; seed {seed}")

# %% [markdown]
# ## Policy means per source and region

# %%
means = stats.condition_means(table, metric, policies=PRIMARY_PANEL).means
means.round(3)

# %% [markdown]
# ## Cross-source Kendall $\tau_b$

# %%
tau = stats.cross_source_table(table, metrics=(metric,), regions=regions, n_resamples=n_resamples,
                               seed=seed, policies=PRIMARY_PANEL)
tau["pair"] = tau["source_a"].str.split("_").str[0] + "–" + tau["source_b"].str.split("_").str[0]
cols = ["region", "pair", "tau_b", "ci_low", "ci_high", "bca_low", "bca_high",
        "pvalue", "q"]
tau[[c for c in cols if c in tau.columns]].round(3)

# %%
grid = tau.pivot(index="region", columns="pair", values="tau_b").reindex(regions)
fig, ax = plt.subplots(figsize=(6, 4))
im = ax.imshow(grid.to_numpy(dtype=float), vmin=-1, vmax=1, cmap="RdBu", aspect="auto")
ax.set_xticks(range(grid.shape[1]), grid.columns)
ax.set_yticks(range(grid.shape[0]), grid.index)
for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
    ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=9)
fig.colorbar(im, ax=ax, label="Kendall τ_b")
ax.set_title(f"Cross-source τ_b of {metric} rankings")
fig.tight_layout()
fig.savefig(Path(output_dir) / f"rq1_tau_heatmap_{metric}.png", dpi=120)

# %%
finite = tau["tau_b"].dropna()
is_ab = tau["pair"] == "azure–bailian"
glue("rq1_tau_min", float(finite.min()), display=False)
glue("rq1_tau_max", float(finite.max()), display=False)
glue("rq1_tau_ab_min", float(tau.loc[is_ab, "tau_b"].min()), display=False)
glue("rq1_tau_ab_max", float(tau.loc[is_ab, "tau_b"].max()), display=False)
glue("rq1_tau_burst_min", float(tau.loc[~is_ab, "tau_b"].min()), display=False)
glue("rq1_tau_burst_max", float(tau.loc[~is_ab, "tau_b"].max()), display=False)
glue("rq1_n_undefined", int(tau["tau_b"].isna().sum()), display=False)
print(f"τ_b over {len(finite)} defined comparisons: {finite.min():.2f} … {finite.max():.2f}; "
      f"Azure–Bailian {tau.loc[is_ab, 'tau_b'].min():.2f} … {tau.loc[is_ab, 'tau_b'].max():.2f}; "
      f"pairs with BurstGPT {tau.loc[~is_ab, 'tau_b'].min():.2f} … {tau.loc[~is_ab, 'tau_b'].max():.2f}")

# %% [markdown]
# ## Concordance of the three sources (Kendall's $W$) and leave-one-source-out

# %%
w_rows = []
for region in regions:
    w = stats.source_concordance(table, metric, region, policies=PRIMARY_PANEL,
                                 n_permutations=min(n_resamples, 2000), seed=seed)
    w_rows.append({"region": region, "W": w.statistic, "permutation_p": w.pvalue,
                   "chi2_p": w.chi2_pvalue, "policies": w.n_items})
pd.DataFrame(w_rows).round(4)

# %%
loso = pd.concat([stats.leave_one_source_out(table, metric, r, policies=PRIMARY_PANEL,
                                             n_permutations=min(n_resamples, 2000), seed=seed)
                  .assign(region=r) for r in regions], ignore_index=True)
loso.round(3)

# %% [markdown]
# ## Do the policies differ at all? Friedman test, windows of all sources as blocks

# %%
fr_rows = []
for region in regions:
    fr = stats.friedman(table, metric, region, policies=PRIMARY_PANEL)
    fr_rows.append({"region": region, "chi2": fr.statistic, "p": fr.pvalue, "blocks": fr.n_blocks,
                    "policies": fr.n_policies, "dropped": ", ".join(fr.dropped_policies),
                    "best_mean_rank": fr.mean_ranks.idxmin() if len(fr.mean_ranks) else None})
friedman_table = pd.DataFrame(fr_rows)
friedman_table["q"] = stats.benjamini_hochberg(friedman_table["p"])
glue("rq1_friedman_max_p", float(friedman_table["p"].max()), display=False)
friedman_table.round(4)

# %% [markdown]
# Post-hoc at HIGH_PRESSURE (Nemenyi, unadjusted p-values; rank 1 = best):

# %%
fr = stats.friedman(table, metric, "HIGH_PRESSURE", policies=PRIMARY_PANEL)
fig, ax = plt.subplots(figsize=(7, 6))
p = fr.nemenyi.to_numpy(dtype=float)
im = ax.imshow(np.log10(np.clip(p, 1e-12, 1)), cmap="viridis_r", vmin=-6, vmax=0)
ax.set_xticks(range(len(fr.nemenyi.columns)), fr.nemenyi.columns, rotation=90, fontsize=8)
ax.set_yticks(range(len(fr.nemenyi.index)), fr.nemenyi.index, fontsize=8)
fig.colorbar(im, ax=ax, label="log10 Nemenyi p")
ax.set_title("HIGH_PRESSURE: pairwise Nemenyi p-values")
fig.tight_layout()
fig.savefig(Path(output_dir) / f"rq1_nemenyi_{metric}.png", dpi=120)
fr.mean_ranks.sort_values().round(2).to_frame("mean rank")
