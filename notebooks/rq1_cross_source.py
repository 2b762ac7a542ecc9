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
# :::{admonition} Finding
# :class: tip pb-finding
# {glue:text}`rq1_verdict`
# Under the study's rules (`lssp`), with ties as ties and duplicate policies counted once, τ_b
# between two sources' rankings spans {glue:text}`rq1_tau_span_robust_lssp`; under vLLM's rules
# (`vllm_v1`), {glue:text}`rq1_tau_span_robust_vllm_v1`. {glue:text}`rq1_attainable_sentence`
# The study's counting (ties broken by name) gives a lowest τ_b of {glue:text}`rq1_tau_min_lssp`
# under `lssp` and {glue:text}`rq1_tau_min_vllm_v1` under `vllm_v1`.
# :::
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
# ## The headline three ways: the study's counting, ties as ties, both engine models
#
# The same comparison read on the committed tables of both engine models, once as the study counts
# (ties broken by policy name, every policy counted) and once robustly (ties as ties, duplicate
# policies once; the rule of {doc}`rq8_open_questions`), and at the *attainable knee*: λ_ref found
# with the requests that no scheduler can meet at a load left out of its miss count (see
# {doc}`workload`), which moves BurstGPT's knee and so its regions.

# %%
from portbench.chapters import engine_tables, headlines

tables = engine_tables(engine_model, table)
knee_tables = engine_tables(engine_model, table, knee="attainable")
three = headlines.by_engine(headlines.rq1, tables, policies, regions)
at_knee = headlines.by_engine(headlines.rq1, knee_tables, policies, regions)
span = lambda r, lo, hi: f"{present.num(r[lo], 2)} to {present.num(r[hi], 2)}"
for e in headlines.HEADLINE_ENGINES:
    glue(f"rq1_tau_min_{e}", headlines.value(three, e, "tau_min", lambda v: present.num(v, 2)), display=False)
    glue(f"rq1_tau_span_robust_{e}", "not computed" if three[e] is None else
         span(three[e], "tau_min_robust", "tau_max_robust"), display=False)
    glue(f"rq1_tau_min_attainable_knee_{e}", headlines.value(at_knee, e, "tau_min", lambda v: present.num(v, 2)),
         display=False)
main = engine_model if engine_model in at_knee else headlines.HEADLINE_ENGINES[0]
glue("rq1_tau_min_attainable_knee", headlines.value(at_knee, main, "tau_min", lambda v: present.num(v, 2)),
     display=False)
base, knee = three.get(main), at_knee.get(main)
if base is None or knee is None:
    attainable_sentence = "The attainable-knee campaign is not on disk (portbench campaign --knee attainable)."
else:
    attainable_sentence = (
        f"At the attainable knee ({main}, ties as ties), the pairs with BurstGPT reach at most "
        f"{present.num(knee['tau_burstgpt_max_robust'], 2)} (study's knee "
        f"{present.num(base['tau_burstgpt_max_robust'], 2)}) and the other pairs fall to "
        f"{present.num(knee['tau_others_min_robust'], 2)} ({present.num(base['tau_others_min_robust'], 2)}): "
        + ("BurstGPT stays apart at a knee set by queueing alone" if headlines.burstgpt_apart(knee) else
           "BurstGPT is not apart from the other sources in every region at a knee set by queueing alone")
        + f" ({headlines.knee_clause(tables[main], knee_tables[main], main)}).")
glue("rq1_attainable_sentence", attainable_sentence, display=False)
apart = {e: r is not None and headlines.burstgpt_apart(r) for e, r in three.items()}
if all(apart.values()):
    verdict = ("Azure and Bailian rank the policies more alike than either does with BurstGPT, in every region "
               "and under both engine models.")
elif apart.get("lssp"):
    verdict = ("Under the study's rules, Azure and Bailian rank the policies more alike than either does with "
               "BurstGPT; under vLLM's rules that split does not hold in every region.")
else:
    verdict = "Agreement between sources does not split by source: no pair stays apart in every region."
glue("rq1_verdict", verdict, display=False)
# the introduction's "what holds" row: BurstGPT ranks the policies apart from the other two sources
claim = lambda r, suffix: (f"with BurstGPT ≤ {present.num(r['tau_burstgpt_max' + suffix], 2)}, "
                           f"others ≥ {present.num(r['tau_others_min' + suffix], 2)}")
for k, v in headlines.claim_cells(three, ("tau_min", lambda v: claim(three["lssp"], "")),
                                  ("tau_min", lambda v: claim(three["lssp"], "_robust")),
                                  headlines.burstgpt_apart).items():
    glue(f"rq1_{k}", v, display=False)
for e in headlines.HEADLINE_ENGINES:
    glue(f"rq1_tau_min_robust_{e}", headlines.value(three, e, "tau_min_robust", lambda v: present.num(v, 2)),
         display=False)
rows = []
for label, readings in (("study's knee", three), ("attainable knee", at_knee)):
    for e, r in readings.items():
        if r is not None:
            rows.append({"calibration": label, "engine model": e,
                         "τ_b range, study's counting": span(r, "tau_min", "tau_max"),
                         "τ_b range, ties as ties": span(r, "tau_min_robust", "tau_max_robust"),
                         "highest with BurstGPT (ties as ties)": present.num(r["tau_burstgpt_max_robust"], 2),
                         "lowest without BurstGPT (ties as ties)": present.num(r["tau_others_min_robust"], 2)})
present.table(pd.DataFrame(rows))

# %% [markdown]
# ## In detail
#
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
