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
# # RQ3 — Does the ranking survive a change of metric?
#
# Within each (source, region) condition — 18 of them — the 11 primary policies are ranked under each
# of the 11 metrics (lower-is-better metrics negated first) and every pair of metrics is compared with
# Kendall's $\tau_b$ (55 pairs; paired window bootstrap). We summarise the median $\tau_b$, the share
# of negative $\tau_b$ and the **top-1 agreement**: how often two metrics crown the same policy. Ties
# for the top go to the alphabetically first policy id (the original's rule), and we report how many
# top-1s were tied — with every request completing, completion fraction ties all policies at 1.

# %% tags=["parameters"]
results_path = ""
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

from portbench import stats
from portbench.campaign import load_results
from portbench.metrics import METRICS
from portbench.policies import PRIMARY_PANEL
from portbench.regions import REGIONS

Path(output_dir).mkdir(parents=True, exist_ok=True)
table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
regions = [r for r in REGIONS if r in set(table["region"])]
sources = sorted(set(table["source"]))

# %%
results = {(s, r): stats.cross_metric(table, s, r, n_resamples=n_resamples, seed=seed,
                                      policies=PRIMARY_PANEL)
           for s in sources for r in regions}
pairs = pd.concat([res.pairs for res in results.values()], ignore_index=True)
overall = stats.cross_metric_summary(pairs)
glue("rq3_median_tau", overall["median_tau"], display=False)
glue("rq3_share_negative", overall["share_negative"], display=False)
glue("rq3_top1_agreement", overall["top1_agreement"], display=False)
glue("rq3_n_defined", overall["n_defined"], display=False)
n_tied = int((pairs["top1_tied_a"] | pairs["top1_tied_b"]).sum())
glue("rq3_n_top1_tied", n_tied, display=False)
print(f"over {overall['n_defined']} defined (condition, metric pair) comparisons: median τ_b "
      f"{overall['median_tau']:.3f}, {overall['share_negative']:.1%} negative, top-1 agreement "
      f"{overall['top1_agreement']:.1%} ({n_tied} comparisons had a tied top-1)")

# %%
summary = pd.DataFrame([{"source": s, "region": r, "median_tau": res.median_tau,
                         "share_negative": res.share_negative, "top1_agreement": res.top1_agreement,
                         "defined": res.n_defined} for (s, r), res in results.items()])
summary.round(3)

# %% [markdown]
# ## Which metrics agree? Median $\tau_b$ over the 18 conditions

# %%
metrics = sorted(METRICS)
med = pairs.groupby(["metric_a", "metric_b"])["tau_b"].median()
m = pd.DataFrame(np.eye(len(metrics)), index=metrics, columns=metrics)
for (a, b), v in med.items():
    m.loc[a, b] = m.loc[b, a] = v
fig, ax = plt.subplots(figsize=(8, 7))
im = ax.imshow(m.to_numpy(dtype=float), vmin=-1, vmax=1, cmap="RdBu")
ax.set_xticks(range(len(metrics)), metrics, rotation=90, fontsize=8)
ax.set_yticks(range(len(metrics)), metrics, fontsize=8)
for (i, j), v in np.ndenumerate(m.to_numpy(dtype=float)):
    if i != j and np.isfinite(v):
        ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=7)
fig.colorbar(im, ax=ax, label="median Kendall τ_b")
ax.set_title("Cross-metric agreement (median over sources × regions)")
fig.tight_layout()
fig.savefig(Path(output_dir) / "rq3_metric_tau.png", dpi=120)

# %% [markdown]
# ## Who wins under each metric?

# %%
best = []
for (s, r), res in results.items():
    p = res.pairs
    for metric in metrics:
        row = p[p["metric_a"] == metric].head(1)
        top = row["top1_a"].iloc[0] if len(row) else p[p["metric_b"] == metric]["top1_b"].iloc[0]
        best.append({"source": s, "region": r, "metric": metric, "top1": top})
best = pd.DataFrame(best)
best.pivot_table(index="metric", columns="top1", values="region", aggfunc="count", fill_value=0)
