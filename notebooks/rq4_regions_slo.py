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
# :::{admonition} Finding
# :class: tip pb-finding
# {glue:text}`rq4_verdict` With ties as ties and duplicate policies counted once, redefining the
# SLO as {glue:text}`rq4_slo_variants` the base budget changes the best policy in
# {glue:text}`rq4_slo_top1_changes_ties_lssp` of {glue:text}`rq4_slo_conditions:d` conditions under the
# study's rules (`lssp`) and {glue:text}`rq4_slo_top1_changes_ties_vllm_v1` under vLLM's (`vllm_v1`); the
# study's counting, which breaks ties by name, gives {glue:text}`rq4_slo_top1_changes_study_lssp` and
# {glue:text}`rq4_slo_top1_changes_study_vllm_v1`. The rest of the ranking moves more with the load than
# with the SLO: τ_b with the KNEE ranking falls to {glue:text}`rq4_region_tau_min` across regions
# (engine model {glue:text}`rq4_engine`).
# :::
#
# **Question.** Does a policy keep its place when the load changes, or when the deadlines are defined
# tighter or looser? **Method.** Each policy's rank is followed across the six operating regions
# (multiples of each window's own λ_ref) within a source; and the same cells, re-simulated with
# deadlines at other multiples of the base budget, are ranked and compared with the base ranking
# (Kendall $\tau_b$, paired window bootstrap; top-1 change).

# %% tags=["parameters"]
results_path = ""          # campaign table to read (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model whose campaign is analysed
n_resamples = 2000         # bootstrap resamples
seed = 0                   # seed of every bootstrap
output_dir = "book/figures"  # where figures are written
metric = "anwg"            # metric that ranks the policies
panel = "primary"          # policies ranked: primary (the study's 11), study (its 13) or comma-separated ids
confidence_level = 0.95    # level of the bootstrap intervals of τ_b
slo_variants = [10.0, 40.0]  # SLO multipliers compared with the base (20×); the campaign must hold them

# %% [markdown]
# ## Method in detail
#
# **Load**: each window is compressed to six multiples of its own λ_ref (LOW 0.5 … HIGH_PRESSURE
# 1.5). **SLO definition**: the SLO variants are simulated at the *same* load factors as the base (as
# the study did: λ_ref is not re-calibrated), and each variant's ranking is compared with the base
# one. LOW is left out of the SLO comparison, as in the study.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import present, stats
from portbench.book import source_label
from portbench.chapters import open_chapter
from portbench.metrics import METRICS

chapter = open_chapter(engine_model, results_path, output_dir, metric=metric, panel=panel)
table, policies, regions, sources = chapter.table, chapter.policies, chapter.regions, chapter.sources
glue("rq4_engine", engine_model, display=False)
glue("rq4_metric", present.label(metric), display=False)
glue("rq4_n_policies", len(policies), display=False)

# %% [markdown]
# ## Rank flow across operating regions

# %%
means = stats.condition_means(table, metric, policies=policies).means
sign = 1 if METRICS[metric] else -1
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p", "8")
fig, axes = plt.subplots(1, len(sources), figsize=(5 * len(sources), 5.4), sharey=True)
n_tied_lines = 0
for ax, source in zip(np.atleast_1d(axes), sources):
    cols = [(source, r) for r in regions if (source, r) in means.columns]
    ranks = (-sign * means[cols]).rank(method="min")      # as the headline figure: ties share the best rank
    # Tied policies share a rank: draw them side by side (a small vertical offset) so none hides another.
    offset = pd.DataFrame(0.0, index=ranks.index, columns=ranks.columns)
    for col in ranks.columns:
        for _, tied in ranks[col].groupby(ranks[col]):
            if len(tied) > 1:
                offset.loc[tied.index, col] = (np.arange(len(tied)) - (len(tied) - 1) / 2) * 0.16
    n_tied_lines += int((offset != 0).any(axis=1).sum())
    for k, policy in enumerate(ranks.index):
        ax.plot(range(len(cols)), (ranks.loc[policy] + offset.loc[policy]).to_numpy(),
                marker=MARKERS[k % len(MARKERS)], ms=5, lw=1.3, alpha=0.9,
                color=plt.cm.tab20(k / max(1, len(ranks.index) - 1)), label=policy)
    ax.set_xticks(range(len(cols)), [c[1] for c in cols], rotation=45, fontsize=8)
    ax.set_title(f"{source_label(source)} ({engine_model})")
    ax.invert_yaxis()
np.atleast_1d(axes)[0].set_ylabel(f"rank by mean {present.label(metric)} (1 = best)")
fig.legend(*np.atleast_1d(axes)[0].get_legend_handles_labels(), fontsize=8, loc="lower center",
           ncol=min(6, len(policies)), frameon=False)
fig.tight_layout(rect=(0, 0.12, 1, 1))
present.figure("rq4_rank_flow", fig, output_dir, f"rq4_rank_flow_{metric}.png")

# %% [markdown]
# :::{glue:figure} rq4_rank_flow
# :name: fig-rq4-rank-flow
# :figclass: pb-wide
# :alt: Three line charts, one per source, of each policy's rank (1 at the top) across the six operating regions from LOW to HIGH_PRESSURE; each policy has its own colour and marker.
#
# **How ranks move with load.** Each line follows one policy's rank by mean {glue:text}`rq4_metric`
# (1 = best; tied policies share the best rank, as in the headline figure) from light to heavy load,
# one panel per source. Crossing lines are rank changes caused by load alone. Policies tied at a rank
# are drawn slightly apart, so that every line stays visible.
# :::

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
off_knee = region_tau.drop(index="KNEE", errors="ignore")
glue("rq4_region_tau_min", present.num(off_knee.min().min(), 2), display=False)
where = off_knee.stack().idxmin()
glue("rq4_region_tau_min_where", f"{source_label(where[1])} at {where[0]}", display=False)
present.table(region_tau.rename(columns=present.label), digits=3)

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
                            seed=seed, policies=policies, confidence_level=confidence_level)
glue("rq4_slo_median_tau", float(slo["tau_b"].median()), display=False)
glue("rq4_slo_median_tau_text", present.num(slo["tau_b"].median(), 2), display=False)
glue("rq4_slo_top1_changes", int(slo["top1_changed"].sum()), display=False)
glue("rq4_slo_conditions", int(len(slo)), display=False)
glue("rq4_slo_variants", " and ".join(f"{v:g}×" for v in variants), display=False)
glue("rq4_slo_min_tau", present.num(slo["tau_b"].min(), 2), display=False)

# %% [markdown]
# Every (source, region, variant) comparison (folded):

# %% tags=["hide-output"]
present.table(slo[["source", "region", "variant", "tau_b", "ci_low", "ci_high", "bca_low", "bca_high",
                   "top1_a", "top1_b", "top1_changed"]], digits={"variant": 0, None: 3})

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
for k, v in enumerate(variants):
    d = slo[slo["variant"] == v]
    x = np.arange(len(d)) + 0.15 * (k - 0.5)
    ax.errorbar(x, d["tau_b"], yerr=[d["tau_b"] - d["bca_low"], d["bca_high"] - d["tau_b"]],
                fmt="o", capsize=2, label=f"{v:g}× vs 20×")
labels = slo[slo["variant"] == variants[0]].apply(lambda r: f"{source_label(r['source'])} {r['region']}", axis=1)
ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
ax.set_ylabel(f"Kendall τ_b (BCa {confidence_level:.0%})")
ax.set_title(f"SLO definition vs the base ranking ({present.label(metric)}, {engine_model})", fontsize=10)
ax.axhline(0, color="k", lw=0.5)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
fig.tight_layout()
present.figure("rq4_slo_tau", fig, output_dir, "rq4_slo_tau.png")

# %% [markdown]
# :::{glue:figure} rq4_slo_tau
# :name: fig-rq4-slo-tau
# :alt: Dot plot with error bars of Kendall tau-b between each SLO variant's ranking and the base ranking, one pair of dots per source and region.
#
# **Does a tighter or looser SLO change the ranking?** Kendall $\tau_b$ (with its BCa interval)
# between the ranking under each SLO variant and under the base SLO (20×), at the same loads, for every
# source and region. Dots near 1 mean the SLO definition hardly matters there; dots far below 1, or
# intervals reaching 0, mean the ranking depends on how the SLO is defined.
# :::

# %% [markdown]
# ## The headline three ways: the study's counting, ties as ties, both engine models
#
# The top-1 changes with the SLO multiplier on the committed tables of both engine models: the
# study's (one top-1 per condition, ties to the alphabetically first id) and the robust one (a change
# only when the two top-1 *sets*, every policy tied with the best, share no policy; duplicate policies
# once; {doc}`rq8_open_questions`). At SLO ×20 most policies complete nearly every request by its
# deadline, so many of the study's top-1s are ties decided by name.

# %%
from portbench.chapters import engine_tables, headlines

tables = engine_tables(engine_model, table)
slo_regions = [r for r in regions if r != "LOW"]
three = headlines.by_engine(headlines.rq4, tables, policies, slo_regions, tuple(variants))
for e in headlines.HEADLINE_ENGINES:
    glue(f"rq4_slo_top1_changes_ties_{e}", headlines.value(three, e, "changes_robust", str), display=False)
    glue(f"rq4_slo_top1_changes_study_{e}", headlines.value(three, e, "changes", str), display=False)
glue("rq4_slo_top1_changes_ties", headlines.value(three, engine_model, "changes_robust", str), display=False)
changes = [r["changes_robust"] for r in three.values() if r is not None]
# the introduction's "what holds" row: a tighter or looser SLO changes the best policy
of_n = lambda v: f"{v} of {three['lssp']['n']}"
for k, v in headlines.claim_cells(three, ("changes", of_n), ("changes_robust", of_n),
                                  lambda r: r["changes_robust"] > 0).items():
    glue(f"rq4_{k}", v, display=False)
glue("rq4_verdict", ("A tighter or looser SLO does not change the best policy once ties count as ties, "
                     "under both engine models." if max(changes) == 0 else
                     "A tighter or looser SLO changes the best policy in some conditions even with ties "
                     "as ties."), display=False)
present.table(pd.DataFrame([{"engine model": e, "conditions": r["n"],
                             "top-1 changes, study's counting": r["changes"],
                             "top-1 changes, ties as ties": r["changes_robust"]}
                            for e, r in three.items() if r is not None]))

# %% [markdown]
# ## In detail
#
# Within a source, Kendall $\tau_b$ between the KNEE ranking of the {glue:text}`rq4_n_policies:d`
# policies and another region's {glue:text}`rq4_metric` ranking falls as low as
# {glue:text}`rq4_region_tau_min` ({glue:text}`rq4_region_tau_min_where`; engine model
# {glue:text}`rq4_engine`). Redefining the SLO as {glue:text}`rq4_slo_variants` the base budget (at the
# same loads) leaves a median $\tau_b$ of {glue:text}`rq4_slo_median_tau_text` with the base ranking
# (lowest {glue:text}`rq4_slo_min_tau`) and changes the top-1 policy in
# {glue:text}`rq4_slo_top1_changes:d` of {glue:text}`rq4_slo_conditions:d` conditions.
