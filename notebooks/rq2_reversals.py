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
# # RQ2 — Where do pairwise rankings reverse between sources?
#
# For every pair of primary policies (55), every pair of sources (3) and every region (6) — 990 tests
# per metric — the mean paired difference $\Delta$ is computed in both sources. A test is classified,
# in this order: **UNDEFINED** (a mean is missing, or the loser's mean is 0), **STABLE** (no sign change),
# **MICROSCOPIC** (a sign change, but the margin $|\Delta|$ ÷ loser is ≤ 10% in one source),
# **SUPPORTED_PRACTICAL_REVERSAL** (both per-source 95% bootstrap CIs of the per-window paired
# difference exclude 0) or else **UNSUPPORTED_WIDE_CI**. Benjamini–Hochberg at q = 0.05 runs per
# (metric, region) on $p = \max(p_x, p_y)$, where each source's $p$ is the two-sided bootstrap
# share (our definition: the original's is not public).

# %% tags=["parameters"]
results_path = ""
engine_model = "lssp"
n_resamples = 2000
seed = 0
output_dir = "book/figures"
metric = "anwg"
absolute_floor = 0.01       # sensitivity: |Δ| must also exceed this in both sources

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import stats, store
from portbench.campaign import load_results
from portbench.metrics import METRICS
from portbench.policies import PRIMARY_PANEL
from portbench.regions import REGIONS

if metric not in METRICS:
    raise ValueError(f"unknown metric {metric!r}; metrics: {', '.join(METRICS)}")
Path(output_dir).mkdir(parents=True, exist_ok=True)
table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
regions = [r for r in REGIONS if r in set(table["region"])]

# %%
rev = stats.reversal_analysis(table, metrics=(metric,), regions=regions, n_resamples=n_resamples,
                              seed=seed, policies=PRIMARY_PANEL)
counts = stats.reversal_counts(rev)
for cls, n in counts.items():
    glue(f"rq2_{cls.lower()}", int(n), display=False)
glue("rq2_n_tests", int(len(rev)), display=False)
glue("rq2_supported_share", float(counts["SUPPORTED_PRACTICAL_REVERSAL"] / len(rev)), display=False)
counts.to_frame("tests")

# %%
by_region = stats.reversal_counts(rev, by="region").reindex(regions)
for region, n in by_region["SUPPORTED_PRACTICAL_REVERSAL"].items():
    glue(f"rq2_supported_{region.lower()}", int(n), display=False)
by_region

# %% [markdown]
# ## The supported reversals

# %%
sup = rev[rev["cls"] == "SUPPORTED_PRACTICAL_REVERSAL"]
glue("rq2_supported_bh", int(sup["bh"].sum()), display=False)
cols = ["region", "policy_a", "policy_b", "source_x", "source_y", "delta_x", "delta_y", "margin_x",
        "margin_y", "q", "bh"]
sup[cols].round(4)

# %%
pair_counts = sup.groupby(["policy_a", "policy_b"]).size().rename("supported").reset_index()
glue("rq2_supported_pairs", int(len(pair_counts)), display=False)
glue("rq2_supported_slai_vllm", int(pair_counts.set_index(["policy_a", "policy_b"])["supported"]
                                    .get(("slai_faithful", "vllm_faithful"), 0)), display=False)
glue("rq2_supported_policies", ", ".join(sorted(set(sup["policy_a"]) | set(sup["policy_b"]))),
     display=False)
with_burst = sup.apply(lambda r: "burstgpt" in (r["source_x"], r["source_y"]), axis=1)
glue("rq2_supported_with_burstgpt", int(with_burst.sum()), display=False)
pair_counts.sort_values("supported", ascending=False)

# %% [markdown]
# ### Reversal map: supported reversals per policy pair (all regions and source pairs)

# %%
pols = sorted(PRIMARY_PANEL)
mat = pd.DataFrame(0, index=pols, columns=pols)
for _, r in sup.iterrows():
    mat.loc[r["policy_a"], r["policy_b"]] += 1
    mat.loc[r["policy_b"], r["policy_a"]] += 1
fig, ax = plt.subplots(figsize=(7, 6))
im = ax.imshow(mat.to_numpy(), cmap="Reds")
ax.set_xticks(range(len(pols)), pols, rotation=90, fontsize=8)
ax.set_yticks(range(len(pols)), pols, fontsize=8)
for (i, j), v in np.ndenumerate(mat.to_numpy()):
    if v:
        ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
fig.colorbar(im, ax=ax, label="supported reversals")
ax.set_title(f"Supported reversals of {metric} (of 18 region × source-pair tests per pair)")
fig.tight_layout()
fig.savefig(Path(output_dir) / f"rq2_reversal_map_{metric}.png", dpi=120)

# %% [markdown]
# ## Sensitivity: an absolute-margin floor

# %%
rev_floor = stats.reversal_analysis(table, metrics=(metric,), regions=regions, n_resamples=n_resamples,
                                    seed=seed, policies=PRIMARY_PANEL, absolute_floor=absolute_floor)
floor_counts = stats.reversal_counts(rev_floor)
glue("rq2_supported_with_floor", int(floor_counts["SUPPORTED_PRACTICAL_REVERSAL"]), display=False)
pd.DataFrame({"relative margin only": counts, f"and |Δ| > {absolute_floor}": floor_counts})

# %% [markdown]
# ## Temporal shift within a source
#
# BurstGPT's windows sorted by their first timestamp in the trace and cut into terciles (13/13/14):
# does the ranking of early windows hold for late ones? (Bailian's windows carry no absolute time;
# Azure's span two weeks of one trace.)

# %%
manifest = store.list_windows()
rows = []
for source in sorted(set(table["source"])):
    m = manifest[manifest["source"] == source].sort_values(["arrival_time_s_min", "window_id"])
    groups = stats.chronological_groups(m["window_id"].tolist(), ("EARLY", "MIDDLE", "LATE"))
    for region in regions:
        res = stats.temporal_split(table, metric, region, source, groups, n_resamples=n_resamples,
                                   seed=seed, policies=PRIMARY_PANEL)
        rows.append(res.assign(source=source, region=region))
temporal = pd.concat(rows, ignore_index=True)
early_late = temporal[(temporal["group_a"] == "EARLY") & (temporal["group_b"] == "LATE")]
glue("rq2_temporal_min_tau", float(early_late["tau_b"].min()), display=False)
early_late[["source", "region", "tau_b", "ci_low", "ci_high", "bca_low", "bca_high", "top1_changed"]].round(3)
