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
# # Add your own scheduler
#
# **Question.** Does *your* scheduler's ranking port across sources and regions? **Method.** A new
# policy written in a few lines (a key policy), checked against the engine's contract with
# `portbench.testing.check_policy`, run through the study's campaign at the base SLO, and placed in
# the RQ1 ranking beside the study's eleven. The page is executed with the book, so its code works
# with the package as it is: the policy is shown below; the rest of the code is behind the toggles.

# %% tags=["parameters"]
results_path = ""          # campaign table of the study's policies (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model the new policy is simulated on and compared under
n_resamples = 2000         # bootstrap resamples of the cross-source τ_b
seed = 0                   # seed of every bootstrap
output_dir = "book/figures"  # where figures and the new policy's campaign table are written
region = "KNEE"            # operating region of the RQ1 comparison with the new policy in the panel
check_examples = 40        # random windows per engine model that check_policy replays

# %% [markdown]
# ## The policy
#
# Most schedulers are an order of the waiting queue, so most policies are a **key policy**: a class
# with a `name` and a `key(view, ids)` that gives each waiting request its key (lower is served
# first; ties keep the queue's arrival order). The view is read-only: the clock (`now`), each
# request's arrival, deadline, prompt and *predicted* output length, and how many tokens each has
# produced (`decoded`). The engine owns every rule — it walks the proposed order and admits a request
# only if the engine model's sequence slots, token budget and KV cache allow; what happens to one that
# does not fit is the engine model's rule too (skipped under `lssp`, head-of-line under `vllm_v1`).
#
# Ours: **shortest predicted remaining first** — the waiting request with the fewest predicted
# tokens still to produce goes first (a request preempted by the engine has produced some already).
# A key policy only admits, from the view alone, so the engine asks it only at steps where some
# waiting request could be admitted. A policy whose rule is more than an order writes its own
# `schedule(view)` and, to be fast, declares when its decision can change (`event_driven`, with
# timers); the methods chapter shows how.

# %%
# The policy's source is kept as text so that the page shows exactly the code that runs (the code
# cells of this book are folded; this one's output is the policy).
from IPython.display import Markdown, display

POLICY_SOURCE = '''
from portbench.policies import register
from portbench.queue import KeyPolicy


@register
class ShortestPredictedRemainingFirst(KeyPolicy):
    """Predicted output tokens still to produce, fewest first (ties: arrival order)."""

    name = "shortest_predicted_remaining_first"

    def key(self, view, ids):
        return view.predicted_output_tokens[ids] - view.decoded[ids]
'''
exec(POLICY_SOURCE)
display(Markdown(f"```python\n{POLICY_SOURCE.strip()}\n```"))
policy_name = ShortestPredictedRemainingFirst.name

# %% [markdown]
# ## Does it keep the contract?
#
# The engine jumps over steps in which nothing can change and asks a key policy only when an
# admission is possible. `check_policy` replays random small windows and two shipped windows at high
# load under both engine models, fast and step by step, and requires the same result request by
# request; it also checks that the engine honoured every decision and that a second run is
# identical. A policy that, say,
# forgets a timer is named with the first request and step where the two runs part.

# %%
import time

from portbench.testing import check_policy

t = time.perf_counter()
check_policy(ShortestPredictedRemainingFirst, max_examples=check_examples)
display(Markdown(f"`check_policy` passed: {check_examples} random windows and 2 shipped windows at high load "
                 f"per engine model, fast engine and step-by-step loop identical request by request "
                 f"({time.perf_counter() - t:.0f} s)."))

# %% [markdown]
# ## Through the campaign
#
# The same campaign as the study's: each window's λ_ref is FIFO's knee, and the new policy runs in
# the six operating regions of all 120 windows at the base SLO. From the command line, with the
# class saved in a module of `portbench/policies/` (found automatically):
#
# ```bash
# portbench campaign --policies shortest_predicted_remaining_first --slo-multipliers 20
# ```

# %%
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm in a notebook without widgets
from portbench import present
from portbench.book import pair_label, source_label
from portbench.campaign import CampaignConfig, run_campaign
from portbench.chapters import open_chapter
from portbench.policies import PRIMARY_PANEL

chapter = open_chapter(engine_model, results_path, output_dir, named_regions=(region,))
study = chapter.table[chapter.table["slo_multiplier"] == 20.0]
out = Path(output_dir) / f"campaign_{engine_model}_{policy_name}.parquet"
summary = run_campaign(CampaignConfig(engine_model=engine_model, policies=(policy_name,),
                                      slo_multipliers=(20.0,)), output=out, progress=False)
display(Markdown(
    f"The campaign ran {present.count(summary.n_cells, 'cell')} of the new policy over {summary.n_windows} windows "
    + (f"({summary.n_cells_reused:,} of them reused from the cache of an earlier build)."
       if summary.n_cells_reused else "(all simulated in this build).")))
ours = summary.table
# λ_ref is FIFO's knee on each window: the new cells sit at exactly the study's load factors
lam = study.groupby("window_id")["lambda_ref"].first()
assert np.array_equal(ours.groupby("window_id")["lambda_ref"].first().loc[lam.index], lam)
table = pd.concat([study, ours], ignore_index=True)

# %% [markdown]
# ## Where it ranks, per source and region

# %%
from myst_nb import glue

from portbench import stats
from portbench.regions import REGIONS

panel = tuple(PRIMARY_PANEL) + (policy_name,)
means = stats.condition_means(table, "anwg", policies=panel).means     # policies x (source, region)
rank = means.rank(axis=0, ascending=False, method="min").astype(int)
rank_of_ours = rank.loc[policy_name].unstack("region")[[r for r in REGIONS if r in set(table["region"])]]
present.table(rank_of_ours.rename(index=source_label))

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 2.4))
im = ax.imshow(rank_of_ours.to_numpy(), cmap="viridis_r", vmin=1, vmax=len(panel))
ax.set_xticks(range(rank_of_ours.shape[1]), rank_of_ours.columns, fontsize=8)
ax.set_yticks(range(rank_of_ours.shape[0]), [source_label(s) for s in rank_of_ours.index], fontsize=8)
for (r, c), v in np.ndenumerate(rank_of_ours.to_numpy()):
    ax.text(c, r, str(v), ha="center", va="center", color="white" if v > len(panel) / 2 else "black")
ax.set_title(f"rank of {policy_name} among {len(panel)} policies (ANWG, 1 = best)", fontsize=9)
fig.colorbar(im, ax=ax, fraction=0.03, label="rank (1 = best)")
fig.tight_layout()
present.figure("custom_policy_rank", fig, output_dir, "custom_policy_rank.png")

# %% [markdown]
# :::{glue:figure} custom_policy_rank
# :name: fig-custom-policy-rank
# :alt: Heat map with one row per source and one column per operating region, each cell the new policy's rank among the study's policies plus itself, written in the cell.
#
# **Where the new policy ranks.** Its rank by mean ANWG among the study's primary panel plus itself
# (1 = best, ties share the best rank), per source (rows) and region (columns). A row that keeps its
# colour is a policy whose standing ports across load; rows that differ show it does not port across
# sources.
# :::

# %% [markdown]
# ## Does its ranking port? RQ1 with the new policy in the panel

# %%
sources = sorted(set(table["source"]))
rows = []
for a in range(len(sources)):
    for b in range(a + 1, len(sources)):
        for panel_name, pols in (("study's 11", tuple(PRIMARY_PANEL)), ("with ours", panel)):
            res = stats.cross_source_tau(table, "anwg", region, sources[a], sources[b], policies=pols,
                                         n_resamples=n_resamples, seed=seed)
            rows.append({"pair": pair_label(sources[a], sources[b]), "panel": panel_name,
                         "tau_b": res.statistic})
tau = pd.DataFrame(rows).pivot(index="pair", columns="panel", values="tau_b")
glue("custom_tau_min", present.num(tau["with ours"].min(), 2), display=False)
glue("custom_best_rank", int(rank_of_ours.to_numpy().min()), display=False)
glue("custom_worst_rank", int(rank_of_ours.to_numpy().max()), display=False)
glue("custom_n_panel", len(panel), display=False)
glue("custom_engine", engine_model, display=False)
glue("custom_region", region, display=False)
present.table(tau, digits=3)

# %% [markdown]
# :::{admonition} Finding
# :class: tip pb-finding
# Shortest predicted remaining first ranks between {glue:text}`custom_best_rank:d` and
# {glue:text}`custom_worst_rank:d` of the {glue:text}`custom_n_panel:d` policies across sources and
# regions ({glue:text}`custom_engine`); with it in the panel, the lowest cross-source $\tau_b$ at
# {glue:text}`custom_region` is {glue:text}`custom_tau_min`. Change the class above, rerun this page
# (`portbench book --skip-campaign --notebooks add_your_scheduler -p region=OVERLOAD`), and read the same tables for
# your own scheduler.
# :::
