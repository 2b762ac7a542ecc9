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
# # RQ9 — Do rankings port when the engine caches prefixes?
#
# :::{admonition} Finding
# :class: tip pb-finding
# At the study's SLO (×20) most policies meet nearly every deadline, so the cache can hardly reorder
# them (median τ_b {glue:text}`rq9_tau_cache_on_vs_off:.2f` between cache off and on). Where they can
# differ, at SLO ×{glue:text}`rq9_tight_slo:s` with cache off and on at the same load, the median τ_b is
# {glue:text}`rq9_tau_same_load:s`, with {glue:text}`rq9_supported_same_load:d` supported reversals; the
# best cache-aware order less its cache-blind twin is {glue:text}`rq9_cache_aware_vs_blind:s`. One GPU's
# cache ({glue:text}`rq9_capacity`), starting empty, serves {glue:text}`rq9_hit_rate` of the looked-up
# tokens, little of a multi-turn trace's reuse (no offload tier or warm start here; see Limits).
# The model's cache decides as vLLM's own scheduler does in
# {glue:text}`rq9_native_identical_runs_share:.1%` of {glue:text}`rq9_native_runs:d` runs.
# :::
#
# **Question.** The study ran its real engine with prefix caching off, and its three traces carry no
# prompt contents. Production engines cache prompt prefixes by default (vLLM v1's automatic prefix
# caching), and their newest schedulers order the queue by what is cached (SGLang's `lpm` and
# `dfs-weight`). Does a scheduler ranking survive the cache, and does a prefix-heavy, long-prompt
# workload rank the schedulers as the study's three sources do? **Method.** A fourth source,
# Mooncake's conversation trace (40 windows of 200 requests, each request with its chained 512-token
# prefix hashes), runs under the `vllm_v1` engine model with vLLM's prefix cache off and on, and on
# at three KV capacities; the panel is the study's 13 policies, vLLM's priority scheduling and three
# cache-aware key policies (`lpm`, SGLang's longest prefix match with its FCFS fallback above 128
# waiting requests; `dfs_weight`, SGLang's heaviest-subtree-first walk of the cached prefixes;
# `cache_aware_sjf`, shortest job first on uncached prompt plus predicted output). Each
# configuration is calibrated at its own knee, as the study calibrates each engine. Rankings are
# compared with the study's statistics: $\tau_b$ of the policies' mean ANWG (paired over windows
# for cache off against on) and the RQ2 reversal classifier.

# %% tags=["parameters"]
results_path = ""          # the study's vllm_v1 campaign table compared against (empty: data/results/campaign_vllm_v1.parquet)
engine_model = "lssp"      # not used: the prefix cache is an option of vllm_v1, which this chapter always runs
n_resamples = 2000         # bootstrap resamples
seed = 0                   # seed of every bootstrap
output_dir = "book/figures"  # where figures are written
metric = "anwg"            # metric that ranks the policies
capacity = 131072          # KV capacity (tokens) of the cache-on configuration compared with cache off
focus_region = "OVERLOAD"  # region of the hit-rate figure

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import present, results, rq9, stats
from portbench.book import source_label
from portbench.campaign import load_results
from portbench.chapters import check_metric, check_region
from portbench.chapters import rq9 as reading
from portbench.regions import REGIONS
from portbench.store import SOURCES_OF_THE_STUDY

check_metric(metric)
check_region(focus_region)
if capacity not in rq9.CAPACITIES:
    raise ValueError(f"capacity={capacity!r}: the campaigns have {', '.join(map(str, rq9.CAPACITIES))}")
off = rq9.load("off")
on_by_capacity = {kv: rq9.load(f"on_{kv}") for kv in rq9.CAPACITIES}
on = on_by_capacity[capacity]
regions = [r for r in REGIONS if r in set(off["region"])]
PANEL = [p for p in rq9.PANEL if p in set(off["policy"])]
glue("rq9_n_windows", off["window_id"].nunique(), display=False)
glue("rq9_n_policies", len(PANEL), display=False)
glue("rq9_capacity", reading.capacity_label(capacity), display=False)
glue("rq9_capacities", present.join([reading.capacity_label(kv) for kv in rq9.CAPACITIES]), display=False)

# %% [markdown]
# ## How much the cache can serve
#
# Within a window, a prompt block can hit only if an earlier request of the same window has the same
# prefix up to it (the windows are 200 consecutive requests, about a minute of the trace). The hit
# rate is the share of the tokens looked up at admission that the cache served, pooled over windows.

# %%
lam_off = pd.read_csv(results.lambda_ref_path(f"{rq9.ENGINE}_{rq9.TAGS['off']}")).set_index("window_id")["lambda_ref"]
knee = pd.DataFrame({reading.capacity_label(kv): pd.read_csv(results.lambda_ref_path(
    f"{rq9.ENGINE}_{rq9.TAGS[f'on_{kv}']}")).set_index("window_id")["lambda_ref"] / lam_off
    for kv in rq9.CAPACITIES})
pooled = pd.DataFrame({reading.capacity_label(kv): t.groupby("region")["prefix_hit_tokens"].sum()
                       / t.groupby("region")["prefix_queried_tokens"].sum()
                       for kv, t in on_by_capacity.items()}).reindex(regions)
glue("rq9_hit_rate", present.pct(pooled.loc[focus_region, reading.capacity_label(capacity)], 1), display=False)
glue("rq9_knee_gain", f"{knee[reading.capacity_label(capacity)].median() - 1:+.1%}", display=False)
present.table(pooled.rename_axis("region (hit rate, all policies)"), digits=3)

# %% [markdown]
# With the cache on at {glue:text}`rq9_capacity`, the engine serves {glue:text}`rq9_hit_rate` of the
# looked-up tokens from the cache at {glue:text}`rq9_focus_region:s`, and the knee (λ_ref, the load at
# which FIFO starts to miss deadlines) changes by {glue:text}`rq9_knee_gain` at the median window.

# %%
glue("rq9_focus_region", focus_region, display=False)

# %% [markdown]
# ## Rankings with the cache on against off

# %%
cmp = reading.on_vs_off(off, on, metric, policies=PANEL, regions=regions, n_resamples=n_resamples, seed=seed)
tau_median = float(cmp["tau_b"].median())
glue("rq9_tau_cache_on_vs_off", tau_median, display=False)
glue("rq9_tau_min", present.num(cmp["tau_b"].min(), 2), display=False)
glue("rq9_tau_min_region", cmp.loc[cmp["tau_b"].idxmin(), "region"], display=False)
glue("rq9_supported", int(cmp["supported"].sum()), display=False)
glue("rq9_reversals", int(cmp["reversals"].sum()), display=False)
glue("rq9_best_changed", present.count(int((cmp["best_off"] != cmp["best_on"]).sum()), "region"), display=False)

fig, ax = plt.subplots(figsize=(7.5, 3.6))
x = np.arange(len(cmp))
ax.errorbar(x, cmp["tau_b"], yerr=[cmp["tau_b"] - cmp["bca_low"], cmp["bca_high"] - cmp["tau_b"]],
            fmt="o", capsize=4, color="tab:blue", label="τ_b (95% BCa, windows resampled paired)")
for xi, (_, row) in zip(x, cmp.iterrows()):
    ax.annotate(f"{row['supported']} supported\n{row['reversals']} reversed", (xi, row["bca_low"]),
                textcoords="offset points", xytext=(0, -26), ha="center", fontsize=7)
ax.set_xticks(x, cmp["region"], rotation=20, fontsize=8)
ax.set_ylim(min(-0.05, cmp["bca_low"].min() - 0.35), 1.05)
ax.axhline(1, color="grey", lw=0.6)
ax.set_ylabel(f"τ_b, cache off vs on ({present.label(metric)})")
ax.set_title(f"{len(PANEL)} policies, {source_label(rq9.SOURCE)}, vllm_v1, cache at {reading.capacity_label(capacity)}",
             fontsize=9)
ax.legend(fontsize=8, loc="lower left")
fig.tight_layout()
present.figure("rq9_on_vs_off", fig, output_dir, "rq9_on_vs_off.png")

# %% [markdown]
# :::{glue:figure} rq9_on_vs_off
# :name: fig-rq9-on-vs-off
# :alt: Kendall tau-b between the policy rankings with the prefix cache off and on, one point per operating region, with confidence intervals and the count of reversed policy pairs under each.
#
# **Does the ranking survive the cache?** Kendall $\tau_b$ between the policies' mean ANWG with the
# cache off and on, per region, over the same {glue:text}`rq9_n_windows:d` windows (95% BCa interval,
# windows resampled paired). Under each point: the policy pairs that reverse, and those whose
# reversal the RQ2 classifier supports (a practical margin in both configurations and a bootstrap
# interval that excludes zero in both).
# :::
#
# The median $\tau_b$ over the regions is {glue:text}`rq9_tau_cache_on_vs_off:.2f` (lowest
# {glue:text}`rq9_tau_min:s`, at {glue:text}`rq9_tau_min_region:s`); {glue:text}`rq9_reversals:d`
# policy pairs reverse in some region, {glue:text}`rq9_supported:d` of them supported; the best
# policy changes in {glue:text}`rq9_best_changed:s`.

# %%
present.table(cmp.rename(columns={"bca_low": "τ_b low", "bca_high": "τ_b high", "best_off": "best, off",
                                  "best_on": "best, on"}).set_index("region"), digits=3)

# %% [markdown]
# ## The cache-aware policies' advantage, by capacity and load
#
# Each cache-aware policy's mean ANWG less FIFO's (vLLM's default order), over the same windows with
# the cache on, at each KV capacity and region (95% percentile interval, windows resampled).

# %%
adv = reading.advantage(on_by_capacity, metric, regions=regions, n_resamples=n_resamples, seed=seed)
best = reading.best_cache_aware(adv, metric)
glue("rq9_best_cache_aware_policy", best, display=False)
top = adv[adv["policy"] == best]
peak = top.loc[top["difference"].abs().idxmax()]
glue("rq9_best_peak", present.signed(peak["difference"], 3), display=False)
glue("rq9_best_peak_where", f"{peak['region']}, {reading.capacity_label(int(peak['capacity']))}", display=False)
# the same order without the cache: the study's shortest-service-estimate-first
means = {kv: t.groupby(["region", "policy"])[metric].mean().unstack() for kv, t in on_by_capacity.items()}
sjf_gap = max(float((m["cache_aware_sjf"] - m["estimated_service_time_first"]).abs().max()) for m in means.values())
lpm_gap = max(float((m[p] - m["fifo"]).abs().max()) for m in means.values() for p in ("lpm", "dfs_weight"))
glue("rq9_sjf_vs_est", present.num(sjf_gap, 3), display=False)
glue("rq9_lpm_vs_fifo", present.num(lpm_gap, 3), display=False)
glue("rq9_preemptions_by_capacity", present.join(
    [f"{present.num(t['n_preemptions'].mean(), 1)} at {reading.capacity_label(kv)}" for kv, t in on_by_capacity.items()]),
    display=False)

fig, axes = plt.subplots(1, len(rq9.CACHE_AWARE), figsize=(4.2 * len(rq9.CACHE_AWARE), 3.5), sharey=True)
for ax, policy in zip(np.atleast_1d(axes), rq9.CACHE_AWARE):
    for k, kv in enumerate(rq9.CAPACITIES):
        d = adv[(adv["policy"] == policy) & (adv["capacity"] == kv)].set_index("region").reindex(regions)
        xs = np.arange(len(regions)) + (k - 1) * 0.12
        ax.errorbar(xs, d["difference"], yerr=[d["difference"] - d["ci_low"], d["ci_high"] - d["difference"]],
                    fmt="o-", ms=4, lw=1, capsize=3, label=reading.capacity_label(kv))
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xticks(range(len(regions)), regions, rotation=30, fontsize=7)
    ax.set_title(policy, fontsize=9)
np.atleast_1d(axes)[0].set_ylabel(f"{present.label(metric)} − FIFO's")
np.atleast_1d(axes)[0].legend(fontsize=7, title="KV capacity", title_fontsize=7)
fig.tight_layout()
present.figure("rq9_advantage", fig, output_dir, "rq9_advantage.png")

# %% [markdown]
# :::{glue:figure} rq9_advantage
# :name: fig-rq9-advantage
# :figclass: pb-wide
# :alt: Three panels, one per cache-aware policy, each the policy's mean ANWG less FIFO's per operating region, one line per KV capacity, with confidence intervals.
#
# **What ordering by the cache buys.** Each panel is a cache-aware policy; each line a KV capacity
# ({glue:text}`rq9_capacities:s`); a point is its mean ANWG less FIFO's over the windows in a region.
# :::
#
# Over every capacity and region, {glue:text}`rq9_best_cache_aware_policy:s` does best of the three
# (its largest difference from FIFO is {glue:text}`rq9_best_peak:s`, at {glue:text}`rq9_best_peak_where:s`).
# Its advantage is shortest-job-first's, not the cache's: `estimated_service_time_first`, which
# orders by the study's service estimate and never looks at the cache, has the same mean ANWG to
# within {glue:text}`rq9_sjf_vs_est:s` in every region and capacity. The two orders by the cache
# itself, `lpm` and `dfs_weight`, stay within {glue:text}`rq9_lpm_vs_fifo:s` of FIFO: with a few
# percent of the looked-up tokens in the cache, ordering by the cached prefix changes little. A
# larger capacity hardly changes either, since what limits the hits here is what the windows share,
# not what the cache can hold: the hit rate is even a little lower with more capacity (table above),
# where fewer preemptions (per cell, over all policies and regions:
# {glue:text}`rq9_preemptions_by_capacity:s`) leave fewer requests to find their own blocks again.

# %% [markdown]
# ## Hit rate beside rank
#
# A policy's hit rate is what its order lets the cache serve; beside its ANWG it shows whether a
# policy ranks where it does because of the cache.

# %%
hits = reading.hit_rates(on, metric, policies=PANEL)
hits_focus = hits[hits["region"] == focus_region].set_index("policy").sort_values(metric)
fig, (ax_m, ax_h) = plt.subplots(1, 2, figsize=(9, 0.32 * len(hits_focus) + 1.2), sharey=True)
y = np.arange(len(hits_focus))
colours = ["tab:red" if p in rq9.CACHE_AWARE else "tab:blue" for p in hits_focus.index]
ax_m.scatter(hits_focus[metric], y, c=colours, s=22)
ax_h.barh(y, hits_focus["hit_rate"], color=colours, alpha=0.8)
ax_m.set_yticks(y, hits_focus.index, fontsize=8)
ax_m.set_xlabel(f"mean {present.label(metric)}")
ax_h.set_xlabel("hit rate (tokens served / looked up)")
for ax in (ax_m, ax_h):
    ax.grid(axis="x", lw=0.4, alpha=0.5)
fig.suptitle(f"{focus_region}, cache at {reading.capacity_label(capacity)} (cache-aware policies in red)", fontsize=9)
fig.tight_layout()
present.figure("rq9_hits", fig, output_dir, "rq9_hits.png")
corr = float(hits_focus[["hit_rate", metric]].corr(method="kendall").iloc[0, 1])
pre = on[on["region"] == focus_region].groupby("policy")["n_preemptions"].mean()
glue("rq9_priority_preemptions", present.num(pre.get("vllm_v0_priority", np.nan), 0), display=False)
glue("rq9_fifo_preemptions", present.num(pre.get("fifo", np.nan), 0), display=False)
faithful = off[off["policy"] == "vllm_faithful"]
n_requests = faithful[["n_completed", "n_dropped", "n_unfinished"]].to_numpy().sum()
glue("rq9_faithful_completed", present.pct(faithful["n_completed"].sum() / n_requests, 1)
     if len(faithful) else "n/a", display=False)
glue("rq9_hit_rank_tau", present.num(corr, 2), display=False)
preempting = reading.preempting_cells(off, on, policies=PANEL)
stopped = preempting[preempting["drop"] >= 0.5]
glue("rq9_stop_preempting", present.join(
    [f"{p} ({present.pct(r.off, 0)} off, {present.pct(r.on, 0)} on)" for p, r in stopped.iterrows()],
    empty="no policy"), display=False)
glue("rq9_fifo_preempting", f"{present.pct(preempting.loc['fifo', 'off'], 0)} and "
     f"{present.pct(preempting.loc['fifo', 'on'], 0)}" if "fifo" in preempting.index else "n/a", display=False)

# %% [markdown]
# :::{glue:figure} rq9_hits
# :name: fig-rq9-hits
# :alt: Two panels sharing one row per policy, sorted by mean ANWG: the policy's mean ANWG on the left and its cache hit rate as a bar on the right, in one operating region, the cache-aware policies in red.
#
# **Hit rate and ANWG** per policy at {glue:text}`rq9_focus_region:s` (the cache-aware policies in
# red), policies sorted by ANWG. Kendall's $\tau$ between the two over the panel:
# {glue:text}`rq9_hit_rank_tau:s`.
# :::
#
# A request that is preempted and readmitted looks its blocks up again and finds its own if they are
# still cached, so a policy that preempts often has a higher hit rate without serving more shared
# prefixes: `vllm_v0_priority` preempts about {glue:text}`rq9_priority_preemptions` times per window at
# {glue:text}`rq9_focus_region:s`, FIFO {glue:text}`rq9_fifo_preemptions`.
#
# Some policies stop preempting once the cache is on. With the cache off, then on at
# {glue:text}`rq9_capacity:s`, the share of cells (window × region) in which the engine preempted
# at least once falls from most to almost none for {glue:text}`rq9_stop_preempting:s`; FIFO's is
# {glue:text}`rq9_fifo_preempting:s`.
# What these policies share: they book admissions on their own count of the KV cache (the study's
# rules: SLAI's prompt-only block count; the running requests' tokens, `kv_used`, that SCORPIO's
# guard and `vllm_style_token_budget` read), and that count holds a prefix that several running
# requests share once for each of them, while the engine's blocks hold it once. With the cache on,
# their count runs ahead of the engine's blocks, one way the blocks can stay short of full under
# them; the chapter does not separate this from the other effects of the cache. Their cache-on ranks
# are those of rules that do not see the sharing, as the study's rules were written; a policy that
# should see it reads `cached_prefix`.
#
# `vllm_faithful` (vLLM 0.1's FCFS, as the study ran it) serves almost nothing here: its rule closes
# admission for good once a prompt longer than its 2,560-token budget reaches the head of the queue,
# and most of this source's prompts are longer ({glue:text}`rq9_faithful_completed` of the requests
# complete). The study's windows rarely hold such a prompt.

# %%
present.table(hits_focus.rename_axis("policy"), digits=3)

# %% [markdown]
# ## Against the study's sources
#
# Does this prefix-heavy, long-prompt source rank the schedulers as the study's three do? $\tau_b$
# between its ranking (cache off, and on) and each study source's under the same engine model
# (`vllm_v1`, base SLO), on the policies both campaigns ran; the RQ1 comparison, with one more source.

# %%
study = pd.read_parquet(results_path) if results_path else load_results(rq9.ENGINE)
study = study[study["slo_multiplier"] == float(off["slo_multiplier"].iloc[0])]
common = [p for p in PANEL if p in set(study["policy"])]
vs = reading.versus_study({reading.OFF: off, reading.ON: on}, study, metric, policies=common,
                          regions=regions, study_sources=SOURCES_OF_THE_STUDY,
                          n_resamples=n_resamples, seed=seed)
grid = vs.pivot_table(index=["configuration", "source"], columns="region", values="tau_b")[regions]
glue("rq9_vs_study_median_off", present.num(vs[vs["configuration"] == reading.OFF]["tau_b"].median(), 2),
     display=False)
glue("rq9_vs_study_median_on", present.num(vs[vs["configuration"] == reading.ON]["tau_b"].median(), 2),
     display=False)
glue("rq9_vs_study_supported", int(vs["supported"].sum()), display=False)
# the study's sources among themselves, on the same policies and engine model (RQ1's comparison)
among = stats.cross_source_table(study, regions=regions, sources=SOURCES_OF_THE_STUDY, policies=common,
                                 n_resamples=n_resamples, seed=seed)
glue("rq9_study_among_median", present.num(among["tau_b"].median(), 2), display=False)
glue("rq9_n_common", len(common), display=False)
present.table(grid.rename(index=lambda s: source_label(s) if s in SOURCES_OF_THE_STUDY else s), digits=2)

# %% [markdown]
# On the {glue:text}`rq9_n_common:d` policies both campaigns ran, the median $\tau_b$ against the
# study's sources is {glue:text}`rq9_vs_study_median_off:s` with the cache off and
# {glue:text}`rq9_vs_study_median_on:s` with it on, with {glue:text}`rq9_vs_study_supported:d`
# supported reversals in all; the study's three sources among themselves, same policies and engine
# model, have a median of {glue:text}`rq9_study_among_median:s`. The cache moves this source's
# ranking far less than changing the workload does.

# %% [markdown]
# ## The model against vLLM's own scheduler, with the cache on
#
# The prefix cache of the `vllm_v1` engine model follows vLLM 0.32's rules (block pool, hits,
# references, eviction). vLLM's own scheduler and KV-cache manager, stepped in virtual time on the
# same windows with token ids generated from the trace's hashes (the `vllm_native` engine model),
# is the reference: `benchmarks/native_vs_model.py --configs campaign_cache --source mooncake_conversation --save`.

# %%
native_path = results.native_prefix_check_path()
native = pd.read_csv(native_path) if native_path.exists() else None
if native is not None and len(native):
    share = float(native["identical"].mean())
    glue("rq9_native_identical_runs_share", share, display=False)
    glue("rq9_native_runs", len(native), display=False)
    classes = native.loc[~native["identical"], "class"].value_counts()
    glue("rq9_native_classes", present.join([f"{c} ({n})" for c, n in classes.items()]) if len(classes)
         else "none", display=False)
else:
    glue("rq9_native_identical_runs_share", float("nan"), display=False)
    glue("rq9_native_runs", 0, display=False)
    glue("rq9_native_classes", "not run (no vLLM environment)", display=False)

# %% [markdown]
# Of {glue:text}`rq9_native_runs:d` runs, {glue:text}`rq9_native_identical_runs_share:.1%` are
# identical to the picosecond on both schedulers; the first differing step of the others is classed:
# {glue:text}`rq9_native_classes:s`.
#
# ## On the real engine
#
# A small replay on vLLM itself (CPU build, a tiny random-weight Llama; `benchmarks/rq9_vllm_cpu.py`):
# the first 50 requests of the {glue:text}`rq9_real_n_blocks:d` windows whose prompts share the most
# (requests above 16,384 tokens refused by both engines), FIFO, the same arrivals with vLLM's prefix
# cache off and on, two repetitions each between host probes, and the `vllm_v1` model's prediction
# with the engine's KV blocks ({glue:text}`rq9_real_block_size:d` tokens on the CPU build) and a step
# cost fitted on the other windows' real steps. The arrivals come within a few seconds and the
# engine works through them for about a minute: a saturated engine, where the cache's savings show
# in full. Per-request errors are beside the real engine against itself (repetition 0 against 1, the
# same requests).

# %%
real_path = results.rq9_real_check_path()
real = pd.read_csv(real_path) if real_path.exists() else None
if real is not None and len(real):
    cell = real.set_index(["cache", "measure"])
    on_case = results.Case("vllm_cpu_rq9_cache_on_case")
    glue("rq9_real_n_blocks", int(on_case.runs["window_id"].nunique()), display=False)
    glue("rq9_real_block_size", int(on_case.provenance.get("engine_info", {}).get("block_size", 0)), display=False)
    glue("rq9_real_hits_real", present.pct(cell.loc[("on", "prompt tokens from the cache"), "real_vs_real"], 1),
         display=False)
    glue("rq9_real_hits_model", present.pct(cell.loc[("on", "prompt tokens from the cache"), "sim_vs_real"], 1),
         display=False)
    for m in ("e2e", "ttft"):
        row = cell.loc[("on vs off", f"mean {m} change")]
        glue(f"rq9_real_{m}_change_real", f"{row['real_vs_real']:+.1%}", display=False)
        glue(f"rq9_real_{m}_change_real_reps",
             present.join([f"{float(x):+.1%}" for x in str(row["real_by_repetition"]).split(";")]), display=False)
        glue(f"rq9_real_{m}_change_model", f"{row['sim_vs_real']:+.1%}", display=False)
        reps = [float(x) for x in str(row["real_by_repetition"]).split(";")]
        gap = max(min(reps) - row["sim_vs_real"], row["sim_vs_real"] - max(reps), 0.0)
        glue(f"rq9_real_{m}_agreement", "between the repetitions' own" if gap == 0 else
             f"{100 * gap:.1f} points outside the repetitions' range", display=False)
    for c in ("off", "on"):
        row = cell.loc[(c, "e2e error median")]
        glue(f"rq9_real_e2e_err_{c}", present.pct(row["sim_vs_real"], 1), display=False)
        glue(f"rq9_real_e2e_floor_{c}", present.pct(row["real_vs_real"], 1), display=False)
        glue(f"rq9_real_e2e_ratio_{c}", present.num(row["ratio"], 1), display=False)
    shown = real.drop(columns=["real_by_repetition"], errors="ignore").rename(columns={
        "sim_vs_real": "model (or model vs real)", "real_vs_real": "real (or real vs real)",
        "ratio": "ratio"})
else:
    for k in ("n_blocks", "block_size"):
        glue(f"rq9_real_{k}", 0, display=False)
    for k in ("hits_real", "hits_model", "e2e_change_real", "e2e_change_real_reps", "e2e_change_model",
              "ttft_change_real", "ttft_change_real_reps", "ttft_change_model", "e2e_err_off",
              "e2e_floor_off", "e2e_err_on", "e2e_floor_on", "e2e_ratio_off", "e2e_ratio_on",
              "e2e_agreement", "ttft_agreement"):
        glue(f"rq9_real_{k}", "not run", display=False)
    shown = pd.DataFrame()
fig, ax = plt.subplots(figsize=(6, 2.6))
if len(shown):
    for k, m in enumerate(("e2e", "ttft")):
        row = cell.loc[("on vs off", f"mean {m} change")]
        reps = [float(x) for x in str(row["real_by_repetition"]).split(";")]
        xs = k + 0.15 * (np.arange(len(reps)) - len(reps))      # the repetitions, then the model at k
        ax.bar(xs, reps, width=0.14, color="tab:blue", label="vLLM, a repetition" if k == 0 else None)
        ax.bar(k, row["sim_vs_real"], width=0.14, color="tab:orange",
               label="vllm_v1 model" if k == 0 else None)
    ax.set_xticks([-0.15, 0.85], ["mean E2E", "mean TTFT"])
    ax.axhline(0, color="k", lw=0.6)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:+.0%}"))
    ax.set_ylabel("cache on vs off")
    ax.legend(fontsize=8, frameon=False)
else:
    ax.text(0.5, 0.5, "no real-engine runs (benchmarks/rq9_vllm_cpu.py)", ha="center", va="center")
    ax.set_axis_off()
fig.tight_layout()
present.figure("rq9_real_effect", fig, output_dir, "rq9_real_effect.png")
present.table(shown, digits=3) if len(shown) else None

# %% [markdown]
# :::{glue:figure} rq9_real_effect
# :name: fig-rq9-real-effect
# :alt: Bars of the change in mean E2E latency and mean TTFT when vLLM's prefix cache is turned on: one bar per real repetition and one for the engine model's prediction, all negative.
#
# **The cache's effect on the real engine and in the model**: mean E2E and TTFT with the cache on
# relative to off, over the same requests, for each real repetition (blue) and the `vllm_v1`
# model's prediction (orange).
# :::
#
# vLLM serves {glue:text}`rq9_real_hits_real:s` of the served prompt tokens from its cache (at each
# request's first scheduling); the model's cache, {glue:text}`rq9_real_hits_model:s` (over its
# admissions). With the cache on, the mean E2E changes by {glue:text}`rq9_real_e2e_change_real:s` on
# the real engine (per repetition {glue:text}`rq9_real_e2e_change_real_reps:s`) and by
# {glue:text}`rq9_real_e2e_change_model:s` in the model; the mean TTFT by
# {glue:text}`rq9_real_ttft_change_real:s` (per repetition {glue:text}`rq9_real_ttft_change_real_reps:s`)
# against {glue:text}`rq9_real_ttft_change_model:s`. The model's median per-request E2E error is
# {glue:text}`rq9_real_e2e_err_off:s` with the cache off and {glue:text}`rq9_real_e2e_err_on:s` with it
# on, against the real engine's own {glue:text}`rq9_real_e2e_floor_off:s` and
# {glue:text}`rq9_real_e2e_floor_on:s` (ratios {glue:text}`rq9_real_e2e_ratio_off:s` and
# {glue:text}`rq9_real_e2e_ratio_on:s`). The cache's mechanics carry over: vLLM and the model serve
# about the same share of the prompts from the cache, and the model's E2E saving is
# {glue:text}`rq9_real_e2e_agreement:s` (TTFT: {glue:text}`rq9_real_ttft_agreement:s`). The timing
# of single requests carries over less well: on these long prompts (up to 16,384 tokens) the model's
# per-request error is above the real engine's run-to-run difference, where on the study's short
# prompts it was at that floor (the fidelity chapter); its step cost, linear in the context and
# fitted on two other windows, does not follow attention over long contexts on this CPU closely.
#
# ## Limits
#
# - **One CPU host, a model.** The rankings are the `vllm_v1` engine model's, with its step cost;
#   the cache's speed-up is what the model charges (hit tokens cost no prefill, but their context is
#   read). The real-engine replay above is small (FIFO only, a few 50-request windows, one load):
#   it checks the cache's mechanics and size of effect, not the rankings.
# - **512-token hashes.** The trace says which 512-token blocks two prompts share, not which tokens:
#   prompts are synthetic token ids that share exactly those blocks, so the sharing inside a 512-token
#   block that differs (a common start of a new turn) is not seen, and hits are a lower bound.
# - **Windows of 200 requests.** A prefix is shared only within a window (about a minute of trace),
#   so the hit rates are a window's, not the trace hour's.
# - **A single instance.** No routing: llm-d's prefix-aware routing across replicas is out of scope.

# %% [markdown]
# ## Where the rankings can differ: a tighter SLO, and cache off and on at the same load
#
# At the base SLO (×20) most policies meet nearly every deadline in every region, so a ranking is
# mostly ties and a reversal with a 10% margin can hardly happen. The campaigns also ran at a
# tighter SLO, ×{glue:text}`rq9_tight_slo:s`: the study's budget without its multiplier (0.4 ms a prompt
# token and 20 ms an output token), the loosest of the multipliers tried at which fewer than half of
# the (policy, region) cells have a mean ANWG of 0.95 or more (`portbench.rq9.TIGHT_SLO` records the
# pilot). And each configuration above is calibrated at its own knee, which folds the cache's gain
# into the load; here the cache also runs at the cache-off knee, so that both meet the same absolute
# loads (the `_same_load` campaigns). The same windows, policies and regions throughout.

# %%
import IPython.display

tight = rq9.TIGHT_SLO
off_t = rq9.load("off", slo=tight)
same_base = rq9.load(f"on_{capacity}_same_load") if f"on_{capacity}_same_load" in rq9.TAGS else None
same_t = rq9.load(f"on_{capacity}_same_load", slo=tight) if same_base is not None else None
on_t = rq9.load(f"on_{capacity}", slo=tight)
glue("rq9_tight_slo", f"{tight:g}", display=False)
sat = {("base", "cache off"): reading.saturated_share(off, metric, policies=PANEL),
       ("tight", "cache off"): reading.saturated_share(off_t, metric, policies=PANEL),
       ("tight", "cache on"): reading.saturated_share(on_t, metric, policies=PANEL)}
glue("rq9_saturated_share", present.pct(sat[("tight", "cache off")], 0), display=False)
glue("rq9_saturated_share_base", present.pct(sat[("base", "cache off")], 0), display=False)
readings_t = {f"own knee, ×{rq9.BASE_SLO_MULTIPLIER:g}": cmp,
              f"own knee, ×{tight:g}": reading.on_vs_off(off_t, on_t, metric, policies=PANEL, regions=regions,
                                                        n_resamples=n_resamples, seed=seed)}
if same_base is not None:
    readings_t[f"same load, ×{rq9.BASE_SLO_MULTIPLIER:g}"] = reading.on_vs_off(
        off, same_base, metric, policies=PANEL, regions=regions, n_resamples=n_resamples, seed=seed)
    readings_t[f"same load, ×{tight:g}"] = reading.on_vs_off(
        off_t, same_t, metric, policies=PANEL, regions=regions, n_resamples=n_resamples, seed=seed)
primary = readings_t.get(f"same load, ×{tight:g}", readings_t[f"own knee, ×{tight:g}"])
glue("rq9_tau_same_load", present.num(primary["tau_b"].median(), 2), display=False)
glue("rq9_tau_same_load_min", present.num(primary["tau_b"].min(), 2), display=False)
glue("rq9_supported_same_load", int(primary["supported"].sum()), display=False)
glue("rq9_best_changed_same_load", present.count(int((primary["best_off"] != primary["best_on"]).sum()), "region"),
     display=False)

fig, ax = plt.subplots(figsize=(7.5, 3.4))
for k, (label, t) in enumerate(readings_t.items()):
    ax.plot(np.arange(len(t)) + 0.06 * (k - 1.5), t["tau_b"], "o-" if "same" in label else "o--", label=label)
ax.set_xticks(range(len(regions)), regions, rotation=20, fontsize=8)
ax.axhline(1, color="grey", lw=0.6)
ax.set_ylabel(f"τ_b, cache off vs on ({present.label(metric)})")
ax.set_title(f"{source_label(rq9.SOURCE)}, cache at {reading.capacity_label(capacity)}: SLO and load", fontsize=9)
ax.legend(fontsize=7, loc="lower left")
fig.tight_layout()
present.figure("rq9_tight_same_load", fig, output_dir, "rq9_tight_same_load.png")

# the cache-aware orders against their cache-blind twins where the cache acts: tight SLO, same load
twins = reading.twin_differences(same_t if same_t is not None else on_t, metric, regions=regions,
                                 n_resamples=n_resamples, seed=seed)
at_focus = twins[twins["region"] == focus_region].set_index("policy")
best_twin = at_focus["difference"].idxmax()
row = at_focus.loc[best_twin]
glue("rq9_best_cache_aware_tight", best_twin, display=False)
glue("rq9_cache_aware_vs_blind", f"{present.signed(row['difference'], 3)} ({best_twin} − {row['twin']}, 95% CI "
     f"{present.signed(row['ci_low'], 3)} to {present.signed(row['ci_high'], 3)}, {focus_region})", display=False)
glue("rq9_cache_aware_settled", "its interval excludes zero" if row["ci_low"] > 0 or row["ci_high"] < 0
     else "its interval includes zero", display=False)
slo_label = {"base": f"×{rq9.BASE_SLO_MULTIPLIER:g}", "tight": f"×{tight:g}"}
IPython.display.display(present.table(pd.DataFrame(
    [{"SLO": slo_label[s_], "configuration": c, "cells with mean ANWG ≥ 0.95": present.pct(v, 0)}
     for (s_, c), v in sat.items()])))
present.table(twins, digits=3)

# %% [markdown]
# :::{glue:figure} rq9_tight_same_load
# :name: fig-rq9-tight-same-load
# :alt: Kendall tau-b between the rankings with the cache off and on, per operating region, at the base and the tighter SLO, each with the cache at its own knee and at the cache-off knee.
#
# **The cache where the rankings can differ.** Kendall $	au_b$ between the policies' mean ANWG with
# the cache off and on, per region: dashed lines with each configuration at its own knee (as above),
# solid lines with the cache on at the cache-off knee (the same absolute load), at the base SLO and
# at ×{glue:text}`rq9_tight_slo:s`. Lines well below 1 are rankings the cache reorders.
# :::
#
# At ×{glue:text}`rq9_tight_slo:s`, {glue:text}`rq9_saturated_share:s` of the (policy, region) cells
# with the cache off have a mean ANWG of 0.95 or more (×20: {glue:text}`rq9_saturated_share_base:s`).
# There, with cache off and on at the same load, the median $	au_b$ is
# {glue:text}`rq9_tau_same_load:s` (lowest {glue:text}`rq9_tau_same_load_min:s`),
# {glue:text}`rq9_supported_same_load:d` reversals are supported, and the best policy changes in
# {glue:text}`rq9_best_changed_same_load:s`. The best cache-aware order less its cache-blind twin:
# {glue:text}`rq9_cache_aware_vs_blind:s`; {glue:text}`rq9_cache_aware_settled:s`. The cache here is one
# GPU's (no offload tier, windows from an empty cache): the reuse a multi-turn trace offers over
# minutes is still out of its reach.

# %% [markdown]
# ## In detail
#
# **Rankings with the cache.** On {glue:text}`rq9_n_windows:d` prefix-hashed windows, turning vLLM's
# prefix cache on ({glue:text}`rq9_capacity`) leaves the ranking of {glue:text}`rq9_n_policies:d`
# policies at a median $\tau_b$ of {glue:text}`rq9_tau_cache_on_vs_off:.2f` against the cache off
# (lowest {glue:text}`rq9_tau_min:s`, at {glue:text}`rq9_tau_min_region:s`), with
# {glue:text}`rq9_supported:d` supported reversals; the cache serves {glue:text}`rq9_hit_rate` of the
# looked-up tokens at {glue:text}`rq9_focus_region:s`. **Cache-aware schedulers.** Of the three,
# {glue:text}`rq9_best_cache_aware_policy:s` does best against FIFO (at most
# {glue:text}`rq9_best_peak:s` ANWG, at {glue:text}`rq9_best_peak_where:s`), as much as the
# cache-blind `estimated_service_time_first` (within {glue:text}`rq9_sjf_vs_est:s`); `lpm` and
# `dfs_weight` stay within {glue:text}`rq9_lpm_vs_fifo:s` of FIFO. **Against the study's
# sources.** This source's ranking has a median $\tau_b$ of {glue:text}`rq9_vs_study_median_off:s`
# with each study source (cache off; {glue:text}`rq9_vs_study_median_on:s` cache on; the study's
# sources among themselves {glue:text}`rq9_study_among_median:s`), and `vllm_faithful` completes
# {glue:text}`rq9_faithful_completed` of its requests: its head-of-line rule does not survive long
# prompts. **The model.**
# With the cache on, {glue:text}`rq9_native_identical_runs_share:.1%` of
# {glue:text}`rq9_native_runs:d` runs are identical on vLLM's own scheduler.
