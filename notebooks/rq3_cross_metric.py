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
# :::{admonition} Finding
# :class: tip pb-finding
# {glue:text}`rq3_verdict` With ties as ties and duplicate policies counted once, two metrics
# crown a common best policy in {glue:text}`rq3_top1_agreement_ties_lssp` of comparisons under the study's
# rules (`lssp`) and {glue:text}`rq3_top1_agreement_ties_vllm_v1` under vLLM's (`vllm_v1`). The study's
# counting, which breaks a tie for the top by policy name, gives {glue:text}`rq3_top1_agreement_study_lssp`
# and {glue:text}`rq3_top1_agreement_study_vllm_v1`: {glue:text}`rq3_n_tied_lssp` of its
# {glue:text}`rq3_n_comparisons_lssp` comparisons have a tied top-1. The whole rankings of two metrics
# agree at a median τ_b of {glue:text}`rq3_median_tau_text` (engine model {glue:text}`rq3_engine`).
# :::
#
# **Question.** Would a paper that reports mean latency crown the same scheduler as one that reports
# goodput or SLO violations? **Method.** Within each (source, region) condition the policies of the
# panel are ranked under each metric (lower-is-better metrics negated first), and every two metrics'
# rankings are compared with Kendall's $\tau_b$ (paired window bootstrap) and by whether they crown
# the same policy (**top-1 agreement**).

# %% tags=["parameters"]
results_path = ""          # campaign table to read (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model whose campaign is analysed
n_resamples = 2000         # bootstrap resamples
seed = 0                   # seed of every bootstrap
output_dir = "book/figures"  # where figures are written
panel = "primary"          # policies ranked: primary (the study's 11), study (its 13) or comma-separated ids
confidence_level = 0.95    # level of the bootstrap intervals of τ_b

# %% [markdown]
# ## Method in detail
#
# We summarise the median $\tau_b$, the share of negative $\tau_b$ and the top-1 agreement. Ties for
# the top go to the alphabetically first policy id (the original's rule), and we report how many
# top-1s were tied — with every request completing, completion fraction ties all policies at 1.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import present, stats
from portbench.book import source_label
from portbench.chapters import open_chapter
from portbench.metrics import METRICS

chapter = open_chapter(engine_model, results_path, output_dir, panel=panel)
table, policies, regions, sources = chapter.table, chapter.policies, chapter.regions, chapter.sources
glue("rq3_engine", engine_model, display=False)
glue("rq3_n_policies", len(policies), display=False)
glue("rq3_n_metrics", len(METRICS), display=False)
glue("rq3_n_conditions", len(sources) * len(regions), display=False)

# %%
results = {(s, r): stats.cross_metric(table, s, r, n_resamples=n_resamples, seed=seed,
                                      policies=policies, confidence_level=confidence_level)
           for s in sources for r in regions}
pairs = pd.concat([res.pairs for res in results.values()], ignore_index=True)
overall = stats.cross_metric_summary(pairs)
glue("rq3_median_tau", overall["median_tau"], display=False)
glue("rq3_median_tau_text", present.num(overall["median_tau"], 2), display=False)
glue("rq3_share_negative", overall["share_negative"], display=False)
glue("rq3_top1_agreement", overall["top1_agreement"], display=False)
glue("rq3_n_defined", overall["n_defined"], display=False)
n_tied = int((pairs["top1_tied_a"] | pairs["top1_tied_b"]).sum())
glue("rq3_n_top1_tied", n_tied, display=False)
print(f"engine model {engine_model}: over {overall['n_defined']} defined (condition, metric pair) "
      f"comparisons: median τ_b {overall['median_tau']:.3f}, {overall['share_negative']:.1%} negative, "
      f"top-1 agreement {overall['top1_agreement']:.1%} ({n_tied} comparisons had a tied top-1)")

# %% [markdown]
# Per (source, region) condition (folded):

# %% tags=["hide-output"]
summary = pd.DataFrame([{"source": s, "region": r, "median_tau": res.median_tau,
                         "share_negative": res.share_negative, "top1_agreement": res.top1_agreement,
                         "defined": res.n_defined} for (s, r), res in results.items()])
present.table(summary, digits=3)

# %% [markdown]
# ## Which metrics agree? Median $\tau_b$ over all conditions

# %%
metrics = sorted(METRICS)
med = pairs.groupby(["metric_a", "metric_b"])["tau_b"].median()
m = pd.DataFrame(np.eye(len(metrics)), index=metrics, columns=metrics)
for (a, b), v in med.items():
    m.loc[a, b] = m.loc[b, a] = v
fig, ax = plt.subplots(figsize=(8, 7))
im = ax.imshow(m.to_numpy(dtype=float), vmin=-1, vmax=1, cmap="RdBu")
ax.set_xticks(range(len(metrics)), [present.label(m) for m in metrics], rotation=90, fontsize=8)
ax.set_yticks(range(len(metrics)), [present.label(m) for m in metrics], fontsize=8)
for (i, j), v in np.ndenumerate(m.to_numpy(dtype=float)):
    if i != j and np.isfinite(v):
        ax.text(j, i, present.num(v, 1), ha="center", va="center", fontsize=7)
fig.colorbar(im, ax=ax, label="median Kendall τ_b")
ax.set_title(f"Cross-metric agreement (median over sources × regions; {engine_model})")
fig.tight_layout()
present.figure("rq3_metric_tau", fig, output_dir, "rq3_metric_tau.png")
finite_med = med.dropna()
if len(finite_med):
    best, worst = finite_med.idxmax(), finite_med.idxmin()
    glue("rq3_best_metric_pair", f"{present.label(best[0])} and {present.label(best[1])}", display=False)
    glue("rq3_best_metric_pair_tau", present.num(finite_med.max(), 2), display=False)
    glue("rq3_worst_metric_pair", f"{present.label(worst[0])} and {present.label(worst[1])}", display=False)
    glue("rq3_worst_metric_pair_tau", present.num(finite_med.min(), 2), display=False)
else:
    for key in ("rq3_best_metric_pair", "rq3_worst_metric_pair"):
        glue(key, "none", display=False)
        glue(f"{key}_tau", "n/a", display=False)

# %% [markdown]
# :::{glue:figure} rq3_metric_tau
# :name: fig-rq3-metric-tau
# :alt: Symmetric heat map of metric against metric, each cell the median Kendall tau-b between the two metrics' rankings, written in the cell, on a red-to-blue scale from -1 to 1.
#
# **Which metrics rank the policies alike.** Each cell is the median, over sources and regions, of
# Kendall $\tau_b$ between the rankings that two metrics give the same policies. Blue pairs agree;
# red pairs order the policies in opposite ways, so a claim made with one of them does not carry over
# to the other.
# :::

# %% [markdown]
# ## Who wins under each metric?
#
# How many of the (source, region) conditions each policy tops, metric by metric:

# %%
best = []
for (s, r), res in results.items():
    p = res.pairs
    for metric in metrics:
        row = p[p["metric_a"] == metric].head(1)
        top = row["top1_a"].iloc[0] if len(row) else p[p["metric_b"] == metric]["top1_b"].iloc[0]
        best.append({"source": s, "region": r, "metric": metric, "top1": top})
best = pd.DataFrame(best)
wins = best.pivot_table(index="metric", columns="top1", values="region", aggfunc="count", fill_value=0)
fig, ax = plt.subplots(figsize=(1.0 + 0.55 * wins.shape[1], 0.38 * wins.shape[0] + 2.6))
im = ax.imshow(wins.to_numpy(), cmap="Blues", aspect="auto")
ax.set_xticks(range(wins.shape[1]), wins.columns, rotation=90, fontsize=8)
ax.set_yticks(range(wins.shape[0]), [present.label(m) for m in wins.index], fontsize=8)
for (i, j), v in np.ndenumerate(wins.to_numpy()):
    if v:
        ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                color="white" if v > wins.to_numpy().max() / 2 else "black")
ax.set_title(f"Top-1 policy per metric (conditions won; {engine_model})", fontsize=10)
fig.tight_layout()
present.figure("rq3_top1_by_metric", fig, output_dir, "rq3_top1_by_metric.png")
n_winners = best.groupby(["source", "region"])["top1"].nunique()
glue("rq3_max_distinct_winners", int(n_winners.max()), display=False)
worst_condition = n_winners.idxmax()
glue("rq3_max_distinct_winners_where",
     f"{source_label(worst_condition[0])} at {worst_condition[1]}", display=False)

# %% [markdown]
# :::{glue:figure} rq3_top1_by_metric
# :name: fig-rq3-top1-by-metric
# :alt: Grid of metric against winning policy; each cell counts the source and region conditions in which that policy ranks first by that metric.
#
# **Who wins depends on the metric.** Each row is a metric, each column a policy that ranks first
# somewhere; a cell counts the (source, region) conditions that policy tops by that metric (ties go to
# the alphabetically first policy). A row spread over many columns means the metric's winner changes
# with the condition; columns that differ between rows mean the metrics crown different policies.
# :::

# %% tags=["hide-output"]
present.table(wins.rename(index=present.label))

# %% [markdown]
# ## The headline three ways: the study's counting, ties as ties, both engine models
#
# Top-1 agreement between two metrics on the committed tables of both engine models: the study's
# (one top-1 per metric, ties to the alphabetically first id) and the robust one (the top-1 *set* holds
# every policy tied with the best; two metrics agree when their sets share a policy; duplicate policies
# once; the rule of {doc}`rq8_open_questions`).

# %%
from portbench.chapters import engine_tables, headlines

tables = engine_tables(engine_model, table)
three = headlines.by_engine(headlines.rq3, tables, policies, sources, regions)
pct1 = lambda v: present.pct(v, 1)
for e in headlines.HEADLINE_ENGINES:
    glue(f"rq3_top1_agreement_ties_{e}", headlines.value(three, e, "agreement_robust", pct1), display=False)
    glue(f"rq3_top1_agreement_study_{e}", headlines.value(three, e, "agreement", pct1), display=False)
    glue(f"rq3_n_tied_{e}", headlines.value(three, e, "n_tied", lambda v: f"{v:,}"), display=False)
    glue(f"rq3_n_comparisons_{e}", headlines.value(three, e, "n", lambda v: f"{v:,}"), display=False)
glue("rq3_top1_agreement_ties", headlines.value(three, engine_model, "agreement_robust", pct1),
     display=False)
robust_agree = [r["agreement_robust"] for r in three.values() if r is not None]
# the introduction's "what holds" row: the best policy changes with the metric (in most comparisons)
changes = lambda v: f"changes in {pct1(1 - v)}"
for k, v in headlines.claim_cells(three, ("agreement", changes), ("agreement_robust", changes),
                                  lambda r: r["agreement_robust"] < 0.5).items():
    glue(f"rq3_{k}", v, display=False)
glue("rq3_verdict", ("The best policy usually changes with the metric, under both engine models."
                     if max(robust_agree) < 0.5 else
                     "Most pairs of metrics agree on a best policy once ties count as ties; the study's "
                     "\"the best policy changes with the metric\" is mostly ties broken by name."
                     if min(robust_agree) >= 0.5 else
                     "Whether two metrics agree on the best policy depends on the engine model."), display=False)
present.table(pd.DataFrame([{"engine model": e, "comparisons": r["n"], "tied top-1": r["n_tied"],
                             "top-1 agreement, study's counting": pct1(r["agreement"]),
                             "top-1 agreement, ties as ties": pct1(r["agreement_robust"])}
                            for e, r in three.items() if r is not None]))

# %% [markdown]
# ## In detail
#
# Over {glue:text}`rq3_n_defined:d` defined (condition,
# metric pair) comparisons of the {glue:text}`rq3_n_policies:d` policies' rankings (engine model
# {glue:text}`rq3_engine`, {glue:text}`rq3_n_metrics:d` metrics, {glue:text}`rq3_n_conditions:d`
# (source, region) conditions), the median Kendall $\tau_b$ between two metrics' rankings is
# {glue:text}`rq3_median_tau_text`, {glue:text}`rq3_share_negative:.1%` of them are negative, and two
# metrics crown the same policy in {glue:text}`rq3_top1_agreement:.1%` of comparisons
# ({glue:text}`rq3_n_top1_tied:d` of them with a tied top-1). The closest metrics are
# {glue:text}`rq3_best_metric_pair` (median $\tau_b$ {glue:text}`rq3_best_metric_pair_tau`), the
# farthest {glue:text}`rq3_worst_metric_pair` ({glue:text}`rq3_worst_metric_pair_tau`); in one
# condition ({glue:text}`rq3_max_distinct_winners_where`) the metrics crown
# {glue:text}`rq3_max_distinct_winners:d` different policies.
