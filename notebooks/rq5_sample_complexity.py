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
# :::{admonition} Finding
# :class: tip pb-finding
# {glue:text}`rq5_verdict` With ties as ties and duplicate policies counted once, 10 windows
# drawn from a source recover the all-window best policy with probability at least
# {glue:text}`rq5_min_p_top1_at_10_ties_lssp` in every (source, region) condition under the study's rules
# (`lssp`) and {glue:text}`rq5_min_p_top1_at_10_ties_vllm_v1` under vLLM's (`vllm_v1`). The study's
# counting, which breaks ties by name, gives lowest {glue:text}`rq5_min_p_top1_at_10_study_lssp` and
# {glue:text}`rq5_min_p_top1_at_10_study_vllm_v1`: what 10 windows fail to recover is mostly which of
# several tied policies comes first alphabetically.
# :::
#
# **Question.** A benchmark that evaluates schedulers on a handful of trace windows is, in effect, one
# random draw of windows: how often does such a draw recover the ranking that all of a source's
# windows give? **Method.** For each source and region, $n$ windows are drawn without replacement
# many times per $n$, and we count how often the ranking of the $n$-window means equals the
# all-window ranking — fully, and at the top-1.

# %% tags=["parameters"]
results_path = ""          # campaign table to read (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model whose campaign is analysed
n_resamples = 2000         # bootstrap resamples (unused here: draws are set by n_draws)
seed = 12345               # seed of the window draws
output_dir = "book/figures"  # where figures are written
metric = "anwg"            # metric that ranks the policies
panel = "primary"          # policies ranked: primary (the study's 11), study (its 13) or comma-separated ids
n_draws = 500              # draws of n windows per (source, region, n)
sizes = [5, 10, 20, 30, 40]  # window counts n drawn
recovery_threshold = 0.9   # a ranking is "reliably recovered" with at least this probability

# %% [markdown]
# ## Method in detail
#
# Top-1 ties go to the alphabetically first policy id. We also show the original study's variant,
# which averages each window over all six regions before ranking.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import present, stats
from portbench.book import source_label
from portbench.chapters import open_chapter

if not sizes or min(sizes) < 1:
    raise ValueError(f"sizes must be positive window counts, got {sizes}")
chapter = open_chapter(engine_model, results_path, output_dir, metric=metric, panel=panel)
table, policies, regions, sources = chapter.table, chapter.policies, chapter.regions, chapter.sources
windows_per_source = table.groupby("source")["window_id"].nunique()
glue("rq5_engine", engine_model, display=False)
glue("rq5_metric", present.label(metric), display=False)
glue("rq5_n_policies", len(policies), display=False)
glue("rq5_windows_per_source", ", ".join(f"{source_label(s)} {n}" for s, n in windows_per_source.items()),
     display=False)
glue("rq5_threshold", recovery_threshold, display=False)
glue("rq5_n_draws", n_draws, display=False)

# %% [markdown]
# Probability that $n$ windows recover the all-window top-1 (folded; the figure below shows it):

# %% tags=["hide-output"]
per_region = pd.concat([stats.sample_complexity(table, metric, s, sizes=tuple(sizes), n_draws=n_draws,
                                                seed=seed, policies=policies).assign(source=s)
                        for s in sources], ignore_index=True)
pooled = pd.concat([stats.sample_complexity(table, metric, s, sizes=tuple(sizes), n_draws=n_draws,
                                            seed=seed, policies=policies, pool_regions=True)
                    .assign(source=s) for s in sources], ignore_index=True)
present.table(per_region.pivot_table(index=["source", "region"], columns="n", values="p_top1").reindex(
    [(s, r) for s in sources for r in regions]).rename(columns=lambda n: f"n = {n}"), digits=2)

# %%
fig, axes = plt.subplots(2, len(sources), figsize=(5 * len(sources), 7), sharex=True, sharey=True)
for j, source in enumerate(sources):
    d = per_region[per_region["source"] == source]
    for k, region in enumerate(regions):
        e = d[d["region"] == region]
        c = plt.cm.viridis(k / max(1, len(regions) - 1))
        axes[0, j].plot(e["n"], e["p_full"], marker="o", color=c, label=region)
        axes[1, j].plot(e["n"], e["p_top1"], marker="o", color=c, label=region)
    axes[0, j].set_title(f"{source_label(source)} ({engine_model})")
    axes[1, j].set_xlabel("windows drawn (n)")
axes[0, 0].set_ylabel("P(full ranking recovered)")
axes[1, 0].set_ylabel("P(top-1 recovered)")
for ax in axes.flat:
    ax.axhline(recovery_threshold, color="k", ls=":", lw=0.8)
fig.legend(*axes[0, 0].get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=len(regions),
           frameon=False)
fig.tight_layout(rect=(0, 0.05, 1, 1))
present.figure("rq5_sample_complexity", fig, output_dir, f"rq5_sample_complexity_{metric}.png")

# %% [markdown]
# :::{glue:figure} rq5_sample_complexity
# :name: fig-rq5-sample-complexity
# :figclass: pb-wide
# :alt: Two rows of line charts, one column per source: the probability that n drawn windows recover the full ranking (top) and the top-1 policy (bottom), against n, one line per operating region, with a dotted threshold line.
#
# **How many windows a ranking needs.** For $n$ windows drawn from a source (without replacement,
# {glue:text}`rq5_n_draws:d` draws), the probability that their ranking by mean {glue:text}`rq5_metric`
# equals the all-window ranking — in full (top row) or at the top-1 (bottom row) — one line per region.
# Where a line stays under the dotted threshold ({glue:text}`rq5_threshold:.2f`), a study with that many
# windows would often name another winner.
# :::

# %% [markdown]
# Smallest $n$ at which the top-1 is recovered with probability at least `recovery_threshold`, per
# source and region (n/a: not even with the largest $n$):

# %%
def first_n(frame, column, threshold=recovery_threshold):
    ok = frame[frame[column] >= threshold]
    return ok["n"].min() if len(ok) else np.nan

need = (per_region.groupby(["source", "region"])
        .apply(lambda f: pd.Series({"top1": first_n(f, "p_top1"), "full": first_n(f, "p_full")}),
               include_groups=False).reset_index())
at10 = per_region[per_region["n"] == 10] if 10 in sizes else per_region.iloc[:0]
glue("rq5_n_conditions", int(len(at10)), display=False)
glue("rq5_unreliable_at_10", int((at10["p_top1"] < recovery_threshold).sum()), display=False)
glue("rq5_min_p_top1_at_10", float(at10["p_top1"].min()) if len(at10) else float("nan"), display=False)
glue("rq5_unreliable_at_20", int((per_region[per_region["n"] == 20]["p_top1"] < recovery_threshold).sum()),
     display=False)
worst = at10.loc[at10["p_top1"].idxmin()] if len(at10) else None
glue("rq5_min_p_top1_at_10_where",
     f"{source_label(worst['source'])} at {worst['region']}" if worst is not None else "none", display=False)
glue("rq5_max_n_needed", float(need["top1"].max()), display=False)
glue("rq5_median_n_needed", float(need["top1"].median()), display=False)
present.table(need.pivot(index="region", columns="source", values="top1").reindex(regions)
              .rename(columns=present.label), digits=0)

# %% [markdown]
# The original study's variant (each window averaged over all regions first):

# %%
present.table(pooled.pivot_table(index="source", columns="n", values=["p_full", "p_top1"])
              .rename(columns=lambda c: present.label(c) if isinstance(c, str) else f"n = {c}"), digits=2)

# %% [markdown]
# ## The headline three ways: the study's counting, ties as ties, both engine models
#
# Top-1 recovery with 10 windows on the committed tables of both engine models: the study's (the
# drawn windows' top-1 is the all-window top-1, ties to the alphabetically first id) and the robust one
# (the drawn windows' top-1 set shares a policy with the all-window top-1 set; duplicate policies once;
# {doc}`rq8_open_questions`). The same draws serve both.

# %%
from portbench.chapters import engine_tables, headlines

tables = engine_tables(engine_model, table)
three = headlines.by_engine(headlines.rq5, tables, policies, sources, metric=metric, n_draws=n_draws,
                            threshold=recovery_threshold)
p2 = lambda v: present.num(v, 2)
for e in headlines.HEADLINE_ENGINES:
    glue(f"rq5_min_p_top1_at_10_ties_{e}", headlines.value(three, e, "min_p_robust", p2), display=False)
    glue(f"rq5_min_p_top1_at_10_study_{e}", headlines.value(three, e, "min_p", p2), display=False)
glue("rq5_min_p_top1_at_10_ties", headlines.value(three, engine_model, "min_p_robust", p2), display=False)
lowest = min(r["min_p_robust"] for r in three.values() if r is not None)
# the introduction's "what holds" row: 10 windows do not reliably name the best policy
lowest_p = lambda v: f"lowest recovery {p2(v)}"
for k, v in headlines.claim_cells(three, ("min_p", lowest_p), ("min_p_robust", lowest_p),
                                  lambda r: r["min_p_robust"] < recovery_threshold).items():
    glue(f"rq5_{k}", v, display=False)
glue("rq5_verdict", ("Ten windows per source suffice to name the best policy, under both engine models."
                     if lowest >= recovery_threshold else
                     "Ten windows per source do not always suffice to name the best policy, even with ties "
                     "as ties."), display=False)
present.table(pd.DataFrame([{"engine model": e, "conditions": r["n"],
                             "lowest recovery, study's counting": p2(r["min_p"]),
                             "lowest recovery, ties as ties": p2(r["min_p_robust"]),
                             f"below {recovery_threshold:g}, study's counting": r["unreliable"],
                             f"below {recovery_threshold:g}, ties as ties": r["unreliable_robust"]}
                            for e, r in three.items() if r is not None]))

# %% [markdown]
# ## In detail
#
# With 10 windows drawn from a source's (windows per source:
# {glue:text}`rq5_windows_per_source`), the all-window top-1 policy by {glue:text}`rq5_metric`
# (engine model {glue:text}`rq5_engine`) is recovered with probability below
# {glue:text}`rq5_threshold:.2f` in {glue:text}`rq5_unreliable_at_10:d` of
# {glue:text}`rq5_n_conditions:d` (source, region) conditions — lowest
# {glue:text}`rq5_min_p_top1_at_10:.2f`, {glue:text}`rq5_min_p_top1_at_10_where` — and with 20
# windows still in {glue:text}`rq5_unreliable_at_20:d`. The smallest tested $n$ that reaches that
# probability is {glue:text}`rq5_median_n_needed:.0f` windows in the median condition and
# {glue:text}`rq5_max_n_needed:.0f` in the worst.
