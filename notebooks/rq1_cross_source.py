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
# **Question.** If a scheduling policy ranks above another on one trace, does it on another trace at
# the same relative load? **Method.** In each operating region, the policies of the panel are ranked
# by their mean metric over each source's windows, and every two sources' rankings are compared with
# Kendall's $\tau_b$ (window bootstrap for its interval); Kendall's $W$ and a Friedman test ask how
# concordant all sources are and whether the policies differ at all.

# %% tags=["parameters"]
results_path = ""          # campaign table to read (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model whose campaign is analysed
n_resamples = 2000         # bootstrap resamples (and permutations, up to 2,000)
seed = 0                   # seed of every bootstrap and permutation
output_dir = "book/figures"  # where figures are written
metric = "anwg"            # metric that ranks the policies
panel = "primary"          # policies ranked: primary (the study's 11), study (its 13) or comma-separated ids
confidence_level = 0.95    # level of the bootstrap intervals of τ_b
fdr_q = 0.05               # Benjamini–Hochberg level over the source pairs of a region
posthoc_region = "HIGH_PRESSURE"  # region of the Nemenyi post-hoc comparison

# %% [markdown]
# ## Method in detail
#
# The interval of $\tau_b$ comes from a bootstrap that resamples windows independently within each
# source; we report the percentile interval and the BCa interval (the percentile interval of a
# re-ranked resampled mean is biased toward 0). The Kendall $p$-values of a region's source pairs are
# adjusted with Benjamini–Hochberg. Kendall's $W$ measures the concordance of all sources (permutation
# $p$), and a Friedman test with the windows of all sources as blocks asks whether the policies differ
# at all, followed by Nemenyi's post-hoc comparison in one region.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import present, stats
from portbench.book import engine_description, pair_label, source_label
from portbench.chapters import open_chapter

chapter = open_chapter(engine_model, results_path, output_dir, metric=metric, panel=panel,
                       named_regions=(posthoc_region,))
table, policies, regions, sources = chapter.table, chapter.policies, chapter.regions, chapter.sources
glue("rq1_engine", engine_model, display=False)
glue("rq1_engine_description", engine_description(engine_model), display=False)
glue("rq1_metric", present.label(metric), display=False)
glue("rq1_n_policies", len(policies), display=False)
glue("rq1_panel", panel if panel in ("primary", "study") else "custom", display=False)
glue("rq1_sources", ", ".join(source_label(s) for s in sources), display=False)
glue("rq1_n_regions", len(regions), display=False)
glue("rq1_fdr_q", fdr_q, display=False)
print(f"{len(table)} cells; engine model {engine_model}; metric {metric}; {len(policies)} policies; "
      f"{n_resamples} resamples; seed {seed}")

# %% [markdown]
# ## Policy means per source and region
#
# The table behind every ranking of this chapter (folded: open it to read the means).

# %% tags=["hide-output"]
means = stats.condition_means(table, metric, policies=policies).means
present.table(means.T, digits=3)

# %% [markdown]
# ## Cross-source Kendall $\tau_b$

# %%
tau = stats.cross_source_table(table, metrics=(metric,), regions=regions, n_resamples=n_resamples,
                               seed=seed, policies=policies, confidence_level=confidence_level,
                               fdr_q=fdr_q)
tau["pair"] = [pair_label(a, b) for a, b in zip(tau["source_a"], tau["source_b"])]
grid = tau.pivot(index="region", columns="pair", values="tau_b").reindex(regions)
fig, ax = plt.subplots(figsize=(6, 4))
im = ax.imshow(grid.to_numpy(dtype=float), vmin=-1, vmax=1, cmap="RdBu", aspect="auto")
ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=20, ha="right", fontsize=9)
ax.set_yticks(range(grid.shape[0]), grid.index)
for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
    ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=9)
fig.colorbar(im, ax=ax, label="Kendall τ_b")
ax.set_title(f"Cross-source τ_b of {present.label(metric)} rankings ({engine_model})")
fig.tight_layout()
present.figure("rq1_tau_heatmap", fig, output_dir, f"rq1_tau_heatmap_{metric}.png")

# %% [markdown]
# :::{glue:figure} rq1_tau_heatmap
# :name: fig-rq1-tau-heatmap
# :alt: Heat map of Kendall tau-b, one row per operating region and one column per source pair, values written in the cells on a red-to-blue scale from -1 to 1.
#
# **How far two sources agree, per region.** Each cell is Kendall $\tau_b$ between two sources'
# rankings of the policies by mean {glue:text}`rq1_metric` in one region (1: the same order, 0: unrelated,
# −1: reversed). Read down a column to see whether agreement survives rising load, and across a row to
# see which source pair disagrees most.
# :::

# %% [markdown]
# Every comparison with its percentile and BCa intervals at the chosen confidence level, its Kendall
# $p$-value and its Benjamini–Hochberg $q$ (folded):

# %% tags=["hide-output"]
cols = ["region", "pair", "tau_b", "ci_low", "ci_high", "bca_low", "bca_high", "pvalue", "q"]
present.table(tau[[c for c in cols if c in tau.columns]], digits=3)

# %%
finite = tau["tau_b"].dropna()
by_pair = tau.groupby("pair")["tau_b"]
best_pair = by_pair.median().idxmax()
is_best = tau["pair"] == best_pair
glue("rq1_tau_min", float(finite.min()), display=False)
glue("rq1_tau_max", float(finite.max()), display=False)
glue("rq1_best_pair", best_pair, display=False)
glue("rq1_other_pairs", ", ".join(p for p in by_pair.groups if p != best_pair), display=False)
glue("rq1_tau_best_min", float(tau.loc[is_best, "tau_b"].min()), display=False)
glue("rq1_tau_best_max", float(tau.loc[is_best, "tau_b"].max()), display=False)
glue("rq1_tau_other_min", float(tau.loc[~is_best, "tau_b"].min()), display=False)
glue("rq1_tau_other_max", float(tau.loc[~is_best, "tau_b"].max()), display=False)
for key, value in (("min", finite.min()), ("max", finite.max()), ("best_min", tau.loc[is_best, "tau_b"].min()),
                   ("best_max", tau.loc[is_best, "tau_b"].max()), ("other_min", tau.loc[~is_best, "tau_b"].min()),
                   ("other_max", tau.loc[~is_best, "tau_b"].max())):
    glue(f"rq1_tau_{key}_text", present.num(value, 2), display=False)   # true minus sign in prose
glue("rq1_n_undefined", int(tau["tau_b"].isna().sum()), display=False)
glue("rq1_n_comparisons", int(len(tau)), display=False)
glue("rq1_bh_significant", int(tau["bh"].sum()), display=False)
worst = tau.loc[finite.idxmin()]
glue("rq1_worst_pair", worst["pair"], display=False)
glue("rq1_worst_region", worst["region"], display=False)

# %% [markdown]
# ## Concordance of all sources (Kendall's $W$) and leave-one-source-out

# %%
w_rows = []
for region in regions:
    w = stats.source_concordance(table, metric, region, policies=policies,
                                 n_permutations=min(n_resamples, 2000), seed=seed)
    w_rows.append({"region": region, "W": w.statistic, "permutation_p": w.pvalue,
                   "chi2_p": w.chi2_pvalue, "policies": w.n_items})
w_table = pd.DataFrame(w_rows)
glue("rq1_w_min", float(w_table["W"].min()), display=False)
glue("rq1_w_max", float(w_table["W"].max()), display=False)
present.table(w_table, digits={"W": 3, None: 4})

# %% tags=["hide-output"]
loso = pd.concat([stats.leave_one_source_out(table, metric, r, policies=policies,
                                             n_permutations=min(n_resamples, 2000), seed=seed)
                  .assign(region=r) for r in regions], ignore_index=True)
present.table(loso, digits=3)

# %% [markdown]
# ## Do the policies differ at all? Friedman test, windows of all sources as blocks

# %%
fr_rows = []
for region in regions:
    fr = stats.friedman(table, metric, region, policies=policies)
    fr_rows.append({"region": region, "chi2": fr.statistic, "p": fr.pvalue, "blocks": fr.n_blocks,
                    "policies": fr.n_policies, "dropped": ", ".join(fr.dropped_policies),
                    "best_mean_rank": fr.mean_ranks.idxmin() if len(fr.mean_ranks) else None})
friedman_table = pd.DataFrame(fr_rows)
friedman_table["q"] = stats.benjamini_hochberg(friedman_table["p"])
glue("rq1_friedman_max_p", float(friedman_table["p"].max()), display=False)
glue("rq1_friedman_max_p_text", present.sci(friedman_table["p"].max(), 1), display=False)
glue("rq1_friedman_rejected", int((friedman_table["q"] <= fdr_q).sum()), display=False)
present.table(friedman_table, digits={"chi2": 1, None: 4})

# %% [markdown]
# Post-hoc in the region chosen by the `posthoc_region` parameter (Nemenyi, unadjusted $p$-values;
# rank 1 = best):

# %%
fr = stats.friedman(table, metric, posthoc_region, policies=policies)
fig, ax = plt.subplots(figsize=(7, 6))
p = fr.nemenyi.to_numpy(dtype=float)
im = ax.imshow(np.log10(np.clip(p, 1e-12, 1)), cmap="viridis_r", vmin=-6, vmax=0)
ax.set_xticks(range(len(fr.nemenyi.columns)), fr.nemenyi.columns, rotation=90, fontsize=8)
ax.set_yticks(range(len(fr.nemenyi.index)), fr.nemenyi.index, fontsize=8)
fig.colorbar(im, ax=ax, label="log10 Nemenyi p")
ax.set_title(f"{posthoc_region}: pairwise Nemenyi p-values ({present.label(metric)}, {engine_model})")
fig.tight_layout()
present.figure("rq1_nemenyi", fig, output_dir, f"rq1_nemenyi_{metric}.png")
glue("rq1_posthoc_region", posthoc_region, display=False)
glue("rq1_posthoc_best", fr.mean_ranks.idxmin() if len(fr.mean_ranks) else "none", display=False)
present.table(fr.mean_ranks.sort_values().to_frame("mean rank"), digits=2)

# %% [markdown]
# :::{glue:figure} rq1_nemenyi
# :name: fig-rq1-nemenyi
# :alt: Square heat map of policy against policy coloured by the base-10 logarithm of the Nemenyi p-value, dark where two policies differ clearly.
#
# **Which policies the windows tell apart** in {glue:text}`rq1_posthoc_region` (Nemenyi post-hoc test
# after Friedman, unadjusted $p$ on a log scale). Dark cells: the two policies' ranks differ clearly
# over the windows; light cells: the windows cannot separate them, so their order in a ranking is not
# evidence of a difference.
# :::

# %% [markdown]
# :::{admonition} Finding
# :class: tip pb-finding
# Under engine model {glue:text}`rq1_engine` and metric {glue:text}`rq1_metric`, the
# {glue:text}`rq1_n_policies:d` policies' rankings agree across sources only in part: over
# {glue:text}`rq1_n_comparisons:d` (region, source pair) comparisons, Kendall $\tau_b$ ranges from
# {glue:text}`rq1_tau_min_text` to {glue:text}`rq1_tau_max_text`. The most similar pair,
# {glue:text}`rq1_best_pair`, stays between {glue:text}`rq1_tau_best_min_text` and
# {glue:text}`rq1_tau_best_max_text`; the other pairs ({glue:text}`rq1_other_pairs`) between
# {glue:text}`rq1_tau_other_min_text` and {glue:text}`rq1_tau_other_max_text` (lowest:
# {glue:text}`rq1_worst_pair` at {glue:text}`rq1_worst_region`). Kendall's $W$ over all sources lies
# between {glue:text}`rq1_w_min:.2f` and {glue:text}`rq1_w_max:.2f`, and the Friedman test finds that
# the policies differ in {glue:text}`rq1_friedman_rejected:d` of {glue:text}`rq1_n_regions:d` regions
# (Benjamini–Hochberg at $q$ = {glue:text}`rq1_fdr_q:.2f`; largest $p$
# {glue:text}`rq1_friedman_max_p_text`).
# :::
