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
# # Workload characterisation
#
# :::{admonition} Finding
# :class: tip pb-finding
# A load level's name does not mean the same load on every source. On
# {glue:text}`wl_intrinsic_source`, {glue:text}`wl_intrinsic_n:d` of {glue:text}`wl_intrinsic_of:d`
# windows' knees are set by a single request whose compressed SLO slack is shorter than its own decode
# time, a deadline no scheduler can meet; elsewhere the knee comes from queueing
# ({glue:text}`wl_queueing_others`). Calibrated without such requests (the *attainable knee*),
# {glue:text}`wl_attainable_sentence` The campaign's λ_ref {glue:text}`lambda_agreement`.
# :::
#
# **Question.** How do the traffic sources behind the study's frozen windows differ — in duration,
# burstiness and prompt and response lengths — and what sets each window's reference load λ_ref:
# queueing for capacity, or one request's own slack-to-length ratio? **Method.** Per-window
# descriptors from the window store, the campaign's λ_ref beside the study's, and, for every window,
# the first deadline FIFO misses just above the study's λ_ref, classified by whether that request ever
# waited.

# %% tags=["parameters"]
results_path = ""          # campaign table whose λ_ref is compared (empty: the engine model's campaign)
engine_model = "lssp"      # engine model whose campaign's λ_ref is compared with the study's
n_resamples = 2000         # bootstrap resamples (unused here: no interval in this chapter)
seed = 0                   # seed (unused here)
output_dir = "book/figures"  # where figures are written

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from portbench import characterise, present, store
from portbench.book import source_label
from portbench.chapters import open_chapter

chapter = open_chapter(engine_model, results_path, output_dir)
windows = store.load_windows()
sources = sorted({w.source for w in windows})
desc = characterise.window_descriptors(windows)
glue("wl_n_windows", len(windows), display=False)
glue("wl_n_sources", len(sources), display=False)
glue("wl_engine", engine_model, display=False)
per_source_windows = desc.groupby("source")["window_id"].count()
glue("wl_sources_desc", "; ".join(f"{source_label(s)} ({n} windows)" for s, n in per_source_windows.items()),
     display=False)
sizes = sorted(set(desc["n_requests"]))
glue("wl_requests_per_window", f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}", display=False)
summary = desc.groupby("source").agg(
    windows=("window_id", "count"), duration_s=("duration_s", "median"), rate_rps=("rate_rps", "median"),
    gap_cv=("gap_cv", "median"), input_mean=("input_mean", "mean"), input_max=("input_max", "max"),
    output_mean=("output_mean", "mean"), prompts_over_2560=("prompts_over_vllm_budget", "sum"),
    lambda_ref_min=("paper_lambda_ref", "min"), lambda_ref_max=("paper_lambda_ref", "max"))
present.table(summary.rename(index=present.label), digits={"gap_cv": 2, "input_mean": 0, "output_mean": 0, "duration_s": 0, "rate_rps": 2, None: 3})

# %% [markdown]
# Medians over windows for duration, rate and inter-arrival CV; means of the per-window token means;
# the largest prompt of any window; how many prompts exceed the 2,560-token per-step budget of the
# vLLM v0.1.0 policy (the head-of-line hypothesis of the study); the range of the study's λ_ref.

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
colors = {s: f"C{k}" for k, s in enumerate(sources)}
tokens = {s: (np.concatenate([w.input_tokens for w in windows if w.source == s]),
              np.concatenate([w.output_tokens for w in windows if w.source == s])) for s in colors}
for s, (inp, out) in tokens.items():
    axes[0].hist(np.log10(inp), bins=40, histtype="step", color=colors[s], label=source_label(s), density=True)
    axes[1].hist(np.log10(out), bins=40, histtype="step", color=colors[s], label=source_label(s), density=True)
axes[0].axvline(np.log10(2560), color="k", ls=":", lw=1)
axes[0].set_xlabel("log10 prompt tokens (dotted: 2,560)")
axes[1].set_xlabel("log10 response tokens")
for s, c in colors.items():
    d = desc[desc.source == s]
    axes[2].scatter(d["rate_rps"], d["paper_lambda_ref"], color=c, s=14, label=source_label(s))
axes[2].set_xscale("log"); axes[2].set_yscale("log")
axes[2].set_xlabel("window arrival rate (req/s, trace time)"); axes[2].set_ylabel("study's λ_ref")
axes[0].legend(fontsize=8)
fig.tight_layout()
present.figure("workload_tokens", fig, output_dir, "workload_tokens.png")

# %% [markdown]
# :::{glue:figure} workload_tokens
# :name: fig-workload-tokens
# :figclass: pb-wide
# :alt: Three panels: histograms of log10 prompt tokens and of log10 response tokens per source, and a log-log scatter of each window's arrival rate against the study's lambda_ref, coloured by source.
#
# **The three sources differ in kind, not only in rate.** Left and middle: the distribution of prompt
# and response lengths per source (log scale; the dotted line is the 2,560-token budget that a longer
# prompt exceeds under the vLLM v0.1.0 policy). Right: each window's arrival rate in trace time against
# the study's λ_ref — the compression at which FIFO starts to miss deadlines; windows far apart on this
# plot are "the same load" only after each is scaled by its own λ_ref.
# :::

# %% [markdown]
# ## The campaign's λ_ref beside the study's
#
# Each window's λ_ref in the campaign table of this build's engine model (bisection on FIFO's 0.5%
# violation knee), beside the study's own:

# %%
table = chapter.table
manifest = store.list_windows().set_index("window_id")
lam = table.groupby("window_id", sort=True).agg(source=("source", "first"), lambda_ref=("lambda_ref", "first"))
lam["paper_lambda_ref"] = manifest.loc[lam.index, "paper_lambda_ref"]
lam["relative_difference"] = (lam["lambda_ref"] / lam["paper_lambda_ref"] - 1).abs()
glue("lambda_max_rel_diff", float(lam["relative_difference"].max()), display=False)
glue("lambda_n_windows", int(len(lam)), display=False)
largest = float(lam["relative_difference"].max())
glue("lambda_agreement", (f"equals the study's on all {len(lam)} windows" if largest == 0 else
                          f"differs from the study's by at most {present.sci(largest, 1)} (relative) over "
                          f"{len(lam)} windows"), display=False)
present.table(lam.groupby("source")[["lambda_ref", "paper_lambda_ref", "relative_difference"]]
              .agg(["min", "max"]).rename(index=present.label), digits=4)

# %% [markdown]
# ## What sets λ_ref?
#
# Just above λ_ref, FIFO misses exactly one deadline. If that request was admitted the moment it
# became visible, the miss is *intrinsic*: compressed by λ, its SLO slack (built from its *predicted*
# output length at 0.4 s per predicted token before compression) is shorter than its own decode time
# (1 ms per true token) — no scheduler could have met it. Otherwise it waited in the queue. (This
# classification uses the study's λ_ref and the study's simulator, `lssp`, whatever the engine model
# of this build.)

# %%
causes = pd.DataFrame([characterise.knee_cause(w, w.meta["paper_lambda_ref"]) for w in windows])
causes["source"] = [w.source for w in windows]
table_causes = causes.groupby(["source", "cause"]).size().unstack(fill_value=0)
for cause in ("intrinsic", "queueing"):
    if cause not in table_causes:
        table_causes[cause] = 0
present.table(table_causes.rename(index=present.label))

# %%
per_source = causes.groupby("source").size()
intrinsic = table_causes["intrinsic"].reindex(sources, fill_value=0)
queueing = table_causes["queueing"].reindex(sources, fill_value=0)
glue("burstgpt_intrinsic_knees", int(intrinsic.get("burstgpt", 0)), display=False)
glue("azure_queueing_knees", int(queueing.get("azure_llm_2024", 0)), display=False)
most = intrinsic.idxmax()
glue("wl_intrinsic_source", source_label(most), display=False)
glue("wl_intrinsic_n", int(intrinsic[most]), display=False)
glue("wl_intrinsic_of", int(per_source[most]), display=False)
others = [s for s in sources if s != most]
glue("wl_queueing_others", "; ".join(f"{source_label(s)} {int(queueing[s])} of {int(per_source[s])}"
                                     for s in others), display=False)
ratio = causes[causes.cause == "intrinsic"].eval("slack_s / service_s")
glue("wl_intrinsic_ratio_median", float(ratio.median()) if len(ratio) else float("nan"), display=False)
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.barh([source_label(s) for s in sources], queueing.to_numpy(), color="C0", label="queueing knee")
ax.barh([source_label(s) for s in sources], intrinsic.to_numpy(), left=queueing.to_numpy(), color="C3",
        label="intrinsic knee (one request's own slack)")
ax.set_xlabel("windows")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
ax.set_title("What sets each window's λ_ref")
fig.tight_layout()
present.figure("workload_knee_causes", fig, output_dir, "workload_knee_causes.png")

# %% [markdown]
# :::{glue:figure} workload_knee_causes
# :name: fig-workload-knee-causes
# :alt: Stacked horizontal bars, one per source, counting windows whose lambda_ref is a queueing knee and windows whose knee is set by one request's own too-short slack.
#
# **What sets each window's λ_ref.** Per source, the windows whose first missed deadline just above
# λ_ref is a queueing effect (blue) and those where it belongs to a request that could not have met
# its deadline under any scheduler (red). The more red, the less "high pressure" means a saturated
# engine on that source.
# :::

# %% [markdown]
# So "HIGH_PRESSURE" does not mean the same thing across sources. Where λ_ref is a queueing knee, the
# engine is saturated and requests wait. Where it is intrinsic (short prompts, many 7-token responses
# whose prediction can fall below the true length), λ_ref is set by a single request whose prediction
# undershoots its true length: at 1.5 × λ_ref the engine may still be lightly loaded, while every
# request with predicted < true output is doomed whatever the policy does.

# %% [markdown]
# ## The attainable knee
#
# λ_ref found as above, but with the requests that no scheduler can meet at a probed load left out of
# its miss count: a request is unattainable at a load when the earliest an idle engine could start it
# plus its service time alone on that engine is past its compressed deadline
# (`portbench.regions.attainable`; `portbench campaign --knee attainable`). The search walks up from
# the study's knee by doublings, then bisects. The table gives, per source, the attainable knee as a
# multiple of the study's (the campaign at that knee: {doc}`rq1_cross_source` and {doc}`rq2_reversals`).

# %%
from portbench.chapters import headlines

knee_table = headlines.headline_table(engine_model, knee="attainable") if not results_path else None
if knee_table is None:
    glue("wl_attainable_sentence", "the campaign at that knee is not on disk "
         "(portbench campaign --knee attainable).", display=False)
else:
    lam_knee = knee_table.groupby("window_id").agg(source=("source", "first"), lambda_ref=("lambda_ref", "first"))
    ratio = (lam_knee["lambda_ref"] / lam.loc[lam_knee.index, "lambda_ref"]).rename("ratio")
    by_source = ratio.groupby(lam_knee["source"]).agg(["median", "min", "max"])
    moved = ratio.groupby(lam_knee["source"]).apply(lambda r: int((r > 1.01).sum()))
    by_source["windows moved more than 1%"] = moved
    ratio_of = lambda s: f"{present.num(by_source.loc[s, 'median'], 2)}×"
    moved_most = by_source["median"].idxmax()
    others = [s for s in by_source.index if s != moved_most]
    glue("wl_attainable_sentence", f"{source_label(moved_most)}'s median λ_ref is {ratio_of(moved_most)} the "
         f"study's knee (" + ", ".join(f"{source_label(s)} {ratio_of(s)}" for s in others)
         + f"; engine model {engine_model}).", display=False)
    for s in by_source.index:
        glue(f"wl_attainable_ratio_{s}", present.num(by_source.loc[s, "median"], 2), display=False)
    present.table(by_source.rename(index=present.label), digits=2)

# %% [markdown]
# ## In detail
#
# On {glue:text}`wl_intrinsic_source`, {glue:text}`wl_intrinsic_n:d` of {glue:text}`wl_intrinsic_of:d`
# windows have an *intrinsic* knee: the first deadline FIFO misses just above λ_ref belongs to a
# request whose compressed slack is just below its own decode time (median slack ÷ service
# {glue:text}`wl_intrinsic_ratio_median:.3f`), not to queueing. Queueing knees elsewhere:
# {glue:text}`wl_queueing_others`. The same name for a load level ("HIGH_PRESSURE") therefore means a
# saturated engine on some sources and a lightly loaded one on others. The campaign's λ_ref (engine
# model {glue:text}`wl_engine`) {glue:text}`lambda_agreement`.
