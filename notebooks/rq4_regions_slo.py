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
# # RQ4 — Does the ranking survive a change of load or of SLO definition?
#
# **Load**: each window is compressed to six multiples of its own λ_ref (LOW 0.5 … HIGH_PRESSURE
# 1.5); we follow each policy's rank across regions within a source. **SLO definition**: the same
# cells re-simulated with deadlines at 10× and 40× the base budget (20×), at the *same* load factors
# (as the study did: λ_ref is not re-calibrated), and each variant's ANWG ranking compared with the
# base one (Kendall $\tau_b$, paired window bootstrap; top-1 change). LOW is left out of the SLO
# comparison, as in the study.

# %% tags=["parameters"]
results_path = ""
engine_model = "lssp"
n_resamples = 2000
seed = 0
output_dir = "book/figures"
metric = "anwg"
slo_variants = [10.0, 40.0]

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
sources = sorted(set(table["source"]))

# %% [markdown]
# ## Rank flow across operating regions

# %%
means = stats.condition_means(table, metric, policies=PRIMARY_PANEL).means
sign = 1 if METRICS[metric] else -1
fig, axes = plt.subplots(1, len(sources), figsize=(5 * len(sources), 5), sharey=True)
for ax, source in zip(np.atleast_1d(axes), sources):
    cols = [(source, r) for r in regions if (source, r) in means.columns]
    ranks = (-sign * means[cols]).rank(method="average")
    for k, policy in enumerate(ranks.index):
        ax.plot(range(len(cols)), ranks.loc[policy].to_numpy(), marker="o", lw=1.5,
                color=plt.cm.tab20(k / max(1, len(ranks.index) - 1)), label=policy)
    ax.set_xticks(range(len(cols)), [c[1] for c in cols], rotation=45, fontsize=8)
    ax.set_title(source)
    ax.invert_yaxis()
np.atleast_1d(axes)[0].set_ylabel(f"rank by mean {metric} (1 = best)")
np.atleast_1d(axes)[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
fig.tight_layout()
fig.savefig(Path(output_dir) / f"rq4_rank_flow_{metric}.png", dpi=120)

# %% [markdown]
# Kendall $\tau_b$ between each region's ranking and the KNEE ranking, per source:

# %%
rows = []
for source in sources:
    base = means.get((source, "KNEE"))
    for region in regions:
        if base is None or (source, region) not in means.columns:
            continue
        rows.append({"source": source, "region": region,
                     "tau_vs_knee": stats.kendall_tau_b(base.to_numpy(), means[(source, region)].to_numpy())})
region_tau = pd.DataFrame(rows).pivot(index="region", columns="source", values="tau_vs_knee").reindex(regions)
region_tau.round(3)

# %% [markdown]
# ## SLO-definition sensitivity

# %%
available = sorted(set(table["slo_multiplier"]))
variants = [v for v in slo_variants if v in available]
if not variants:
    raise ValueError(f"the results table has no SLO variant among {slo_variants} (it has {available}); "
                     "run `portbench campaign --slo-multipliers 10 20 40`")
slo = stats.slo_sensitivity(table, metric=metric, variants=tuple(variants),
                            regions=[r for r in regions if r != "LOW"], n_resamples=n_resamples,
                            seed=seed, policies=PRIMARY_PANEL)
glue("rq4_slo_median_tau", float(slo["tau_b"].median()), display=False)
glue("rq4_slo_top1_changes", int(slo["top1_changed"].sum()), display=False)
glue("rq4_slo_conditions", int(len(slo)), display=False)
print(f"median τ_b {slo['tau_b'].median():.3f}; top-1 changes in {int(slo['top1_changed'].sum())} "
      f"of {len(slo)} conditions")
slo[["source", "region", "variant", "tau_b", "ci_low", "ci_high", "bca_low", "bca_high", "top1_a",
     "top1_b", "top1_changed"]].round(3)

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
for k, v in enumerate(variants):
    d = slo[slo["variant"] == v]
    x = np.arange(len(d)) + 0.15 * (k - 0.5)
    ax.errorbar(x, d["tau_b"], yerr=[d["tau_b"] - d["bca_low"], d["bca_high"] - d["tau_b"]],
                fmt="o", capsize=2, label=f"{v:g}× vs 20×")
labels = slo[slo["variant"] == variants[0]].apply(lambda r: f"{r['source'][:5]} {r['region']}", axis=1)
ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
ax.set_ylabel("Kendall τ_b (BCa 95%)")
ax.axhline(0, color="k", lw=0.5)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(Path(output_dir) / "rq4_slo_tau.png", dpi=120)
