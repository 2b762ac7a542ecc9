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
# :::{admonition} Finding
# :class: tip pb-finding
# The chapter's policy ranks between {glue:text}`custom_best_rank:d` and
# {glue:text}`custom_worst_rank:d` of the {glue:text}`custom_n_panel:d` policies across sources and
# regions ({glue:text}`custom_engine`); with it in the panel, the lowest cross-source τ_b at
# {glue:text}`custom_region` is {glue:text}`custom_tau_min`. The same class runs on vLLM's own
# scheduler with the same ANWG as `vllm_v1` in {glue:text}`custom_engines_identical` of
# {glue:text}`custom_engines_n_cells` cells. Change the file, rerun this page (`portbench book
# --skip-campaign --notebooks add_your_scheduler -p policy_module=my_policy.py`), and read the same
# tables for your own scheduler.
# :::
#
# **Question.** Does *your* scheduler's ranking port across sources and regions, and across engines?
# **Method.** A new policy written in a few lines (a key policy, in a file of its own), checked
# against the engine's contract with `portbench.testing.check_policy`, run through the study's
# campaign at the base SLO, and placed in the RQ1 ranking beside the study's eleven; then the same
# file runs on three engine models — the study's `lssp`, `vllm_v1`, and vLLM's own scheduler — and
# on the real vLLM engine. The page is executed with the book, so its code works with the package as
# it is: the policy is shown below; the rest of the code is behind the toggles.

# %% tags=["parameters"]
results_path = ""          # campaign table of the study's policies (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model the new policy is simulated on and compared under
n_resamples = 2000         # bootstrap resamples of the cross-source τ_b
seed = 0                   # seed of every bootstrap
output_dir = "book/figures"  # where figures and the new policy's campaign table are written
region = "KNEE"            # operating region of the RQ1 comparison with the new policy in the panel
check_examples = 40        # random windows per engine model that check_policy replays
policy_module = ""         # your policy's file (empty: portbench/examples/shortest_predicted_remaining_first.py)
real_case = "vllm_cpu_custom_case"  # the real-engine replay of the policy (data/results/realengine/<real_case>*)

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
# The policy is a file (shown here as it runs), loaded by path as `portbench campaign --policy-module`
# and `portbench realengine replay --policy-module` load it; -p policy_module=FILE runs your own.
import hashlib
from pathlib import Path

from IPython.display import Markdown, display

import portbench
from portbench.commands import import_policy_modules
from portbench.policies import make_policy

policy_path = Path(policy_module) if policy_module else \
    Path(portbench.__file__).parent / "examples" / "shortest_predicted_remaining_first.py"
POLICY_SOURCE = policy_path.read_text()
policy_sha256 = hashlib.sha256(policy_path.read_bytes()).hexdigest()
names = import_policy_modules([policy_path])
if len(names) != 1:
    raise ValueError(f"policy_module {policy_path}: expected one @register'ed policy, found {names or 'none'}")
policy_name = names[0]
Policy = type(make_policy(policy_name))
display(Markdown(f"`{policy_path.name}`:\n\n```python\n{POLICY_SOURCE.strip()}\n```"))

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
check_policy(Policy, max_examples=check_examples)
display(Markdown(f"`check_policy` passed: {check_examples} random windows and 2 shipped windows at high load "
                 f"per engine model, fast engine and step-by-step loop identical request by request "
                 f"({time.perf_counter() - t:.0f} s)."))

# %% [markdown]
# ## Through the campaign
#
# The same campaign as the study's: each window's λ_ref is FIFO's knee, and the new policy runs in
# the six operating regions of all 120 windows at the base SLO. From the command line:
#
# ```bash
# portbench campaign --policy-module portbench/examples/shortest_predicted_remaining_first.py \
#     --policies shortest_predicted_remaining_first --slo-multipliers 20
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
# ## On three engines: the simulator, vLLM's scheduler and vLLM itself
#
# The class above is the whole port. The same definition runs, with no further code, on
#
# - the simulator's engine models, `lssp` (the study's) and `vllm_v1` (vLLM v1's rules);
# - **vLLM 0.32's own scheduler**, stepped in virtual time without a model (`vllm_native`): the key
#   adapter, `portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler`, puts vLLM's waiting queue
#   in the key's order before each `schedule()`, the key reading the same view fields on the same
#   clock; everything else (admission, KV blocks, chunking, preemption) is vLLM's code;
# - **the real vLLM engine** on this machine's CPU, with the same adapter as its `scheduler_cls`.
#
# Beside it run six policies that all three can run (vLLM's FCFS and priority forms, and key
# policies through the same adapter), on the first four windows of each source at three regions, each
# engine model at its own λ_ref (vLLM's scheduler at `vllm_v1`'s: the two run FIFO identically in
# every run of the equivalence check in the fidelity chapter). Both need vLLM, so this page reads
# their stored results; for your own policy:
#
# ```bash
# .venv-vllm/bin/python benchmarks/custom_policy_engines.py --policy-module FILE --policy NAME --save
# .venv-vllm/bin/portbench realengine replay --policy-module FILE --policies fifo sjf_aging NAME \
#     --windows-per-source 1 --repetitions 2 --tag vllm_cpu_custom_case
# ```

# %%
from portbench import results
from portbench.stats.rank import kendall_tau_b

ENGINES = ("lssp", "vllm_v1", "vllm_native")
engines_path = results.custom_engines_path()
eng = pd.read_csv(engines_path) if engines_path.exists() else None
engines_current = (eng is not None and policy_name in set(eng["policy"])
                   and bool((eng.loc[eng["policy"] == policy_name, "policy_sha256"] == policy_sha256).all()))
if not engines_current:
    why = ("no stored results" if eng is None else
           f"the stored results are of {', '.join(sorted(set(eng['policy_file'])))} as it was when they were made, "
           f"not of {policy_path.name} as shown")
    display(Markdown(f"*Not shown: {why}. Run the first command above.*"))
    for k in ("custom_engines_identical", "custom_engines_tau_native", "custom_engines_tau_lssp",
              "custom_engines_n_cells", "custom_engines_region", "custom_engines_reading"):
        glue(k, "n/a", display=False)
else:
    eng_region = region if region in set(eng["region"]) else sorted(set(eng["region"]))[0]
    by = eng.groupby(["engine_model", "region", "policy"])["anwg"].mean()
    at = by.xs(eng_region, level="region").unstack("engine_model")[list(ENGINES)]
    ranked = at.rank(ascending=False, method="min").astype(int)
    shown = at.apply(lambda col: [f"{v:.3f} ({r})" for v, r in zip(col, ranked[col.name])])
    present.table(shown.sort_values("vllm_native", key=lambda c: ranked["vllm_native"]))
    # rankings per (source, region), engine against engine
    per = eng.groupby(["engine_model", "source", "region", "policy"])["anwg"].mean()
    taus = []
    for (src, reg), _ in eng.groupby(["source", "region"]):
        for a, b in (("lssp", "vllm_v1"), ("vllm_v1", "vllm_native"), ("lssp", "vllm_native")):
            xa, xb = per.loc[(a, src, reg)], per.loc[(b, src, reg)]
            taus.append({"pair": f"{a} vs {b}", "source": src, "region": reg,
                         "tau_b": kendall_tau_b(xa.to_numpy(), xb.loc[xa.index].to_numpy())})
    taus = pd.DataFrame(taus)
    tau_table = taus.pivot_table(index="pair", columns="region", values="tau_b", aggfunc="min")
    tau_table = tau_table[[r for r in REGIONS if r in tau_table.columns]]
    present.table(tau_table, digits=2)
    cells = eng.pivot_table(index=["window_id", "region", "policy"], columns="engine_model", values="anwg")
    identical = float((cells["vllm_v1"] == cells["vllm_native"]).mean())
    glue("custom_engines_identical", present.pct(identical), display=False)
    glue("custom_engines_tau_native", present.num(taus.loc[taus["pair"] == "vllm_v1 vs vllm_native", "tau_b"].min(), 2),
         display=False)
    glue("custom_engines_tau_lssp", present.num(taus.loc[taus["pair"] == "lssp vs vllm_v1", "tau_b"].min(), 2),
         display=False)
    glue("custom_engines_n_cells", f"{len(cells):,}", display=False)
    glue("custom_engines_region", eng_region, display=False)
    tau_native = taus.loc[taus["pair"] == "vllm_v1 vs vllm_native", "tau_b"].min()
    tau_lssp = taus.loc[taus["pair"] == "lssp vs vllm_v1", "tau_b"].min()
    glue("custom_engines_reading",
         "where the rankings part, it is the engine model's rules (lssp's against vLLM's), not vLLM's code"
         if identical >= 0.99 and tau_lssp < tau_native else
         "vLLM's code itself moves the ranking in places (see the equivalence check in the fidelity chapter)",
         display=False)

    fig, axes = plt.subplots(1, len(set(eng["region"])), figsize=(8, 2.8), sharey=True)
    regs = [r for r in REGIONS if r in set(eng["region"])]
    order = by.xs(("vllm_native", regs[0]), level=("engine_model", "region")).sort_values().index
    for ax, reg in zip(np.atleast_1d(axes), regs):
        for k, (engine, marker) in enumerate(zip(ENGINES, ("o", "s", "x"))):
            v = by.xs((engine, reg), level=("engine_model", "region")).loc[order]
            ax.plot(v.to_numpy(), np.arange(len(order)) + (k - 1) * 0.15, marker, label=engine, ms=5)
        ax.set_title(reg, fontsize=9)
        ax.set_xlabel("mean ANWG", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    np.atleast_1d(axes)[0].set_yticks(range(len(order)), order, fontsize=8)
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    present.figure("custom_three_engines", fig, output_dir, "custom_three_engines.png")

# %% [markdown]
# The first table gives each policy's mean ANWG over the windows at the chapter's region, with its
# rank (1 = best) on each engine model; the second, the lowest $\tau_b$ over the three sources
# between two engine models' rankings of the seven policies, per region.
#
# :::{glue:figure} custom_three_engines
# :name: fig-custom-three-engines
# :alt: Three panels, one per operating region; in each, one row per policy and three markers for its mean ANWG on the lssp, vllm_v1 and vllm_native engine models.
#
# **One definition, three engine models.** Each policy's mean ANWG over the twelve windows, per
# region, on `lssp` (circles), `vllm_v1` (squares) and vLLM's own scheduler (crosses). Where a cross
# sits on its square, vLLM's code made the model's decisions.
# :::

# %% [markdown]
# ### On the real engine
#
# The replay runs the policy, FIFO and `sjf_aging` on vLLM's CPU build (a tiny random-weight model)
# on one window per source at HIGH_PRESSURE, at the real engine's own λ_ref (FIFO's knee searched on
# this machine for the RQ6 case), twice each, each run guarded by host probes. It is a small check
# that the class runs on the real engine and of the order it gives there, not a ranking: two runs of
# three windows carry the engine's run-to-run noise (the RQ6 chapter measures it over hundreds).

# %%
real_runs = results.Case(real_case).runs if results.Case(real_case).has("runs") else None
real_ok = real_runs is not None and policy_name in set(real_runs["policy"])
if not real_ok:
    display(Markdown(f"*Not shown: no real-engine replay of {policy_name} ({real_case}); run the second "
                     "command above.*"))
    for k in ("custom_real_n_runs", "custom_real_agree", "custom_real_spread", "custom_real_spread_max",
              "custom_real_windows"):
        glue(k, "n/a", display=False)
else:
    real = real_runs.groupby(["source", "window_id", "policy"])["anwg"].agg(["mean", "min", "max", "count"])
    pols = list(dict.fromkeys(real_runs["policy"]))
    rows, agree = [], {e: 0 for e in ENGINES}
    sim_cells = (eng[eng["region"] == "HIGH_PRESSURE"].set_index(["engine_model", "window_id", "policy"])["anwg"]
                 if engines_current else None)
    for (src, wid), g in real.groupby(level=["source", "window_id"]):
        m = g["mean"].droplevel(["source", "window_id"]).loc[pols]
        row = {"source": source_label(src), **{f"{p} (real)": f"{m[p]:.3f} ±{(g.loc[(src, wid, p), 'max'] - g.loc[(src, wid, p), 'min']) / 2:.3f}"
                                              for p in pols}}
        if sim_cells is not None:
            for e in ENGINES:
                if all((e, wid, p) in sim_cells.index for p in pols):
                    sim = pd.Series([sim_cells.loc[(e, wid, p)] for p in pols], index=pols)
                    best_real, best_sim = set(m.index[m == m.max()]), set(sim.index[sim == sim.max()])
                    agree[e] += int(bool(best_real & best_sim))     # ties: a best shared by both
        rows.append(row)
    present.table(pd.DataFrame(rows).set_index("source"))
    spread = float((real["max"] - real["min"]).median() / 2)
    spread_max = float((real["max"] - real["min"]).max() / 2)
    n_win = real.index.get_level_values("window_id").nunique()
    glue("custom_real_n_runs", len(real_runs), display=False)
    glue("custom_real_windows", n_win, display=False)
    glue("custom_real_spread", present.num(spread, 3), display=False)
    glue("custom_real_spread_max", present.num(spread_max, 3), display=False)
    glue("custom_real_agree", present.join([f"{agree[e]} of {n_win} on {e}" for e in ENGINES]), display=False)

# %% [markdown]
# Each cell: the real engine's mean ANWG over the two runs ± half their difference. The real engine
# ran {glue:text}`custom_real_n_runs` guarded runs on {glue:text}`custom_real_windows` windows; half the
# difference between a run and its repetition is {glue:text}`custom_real_spread` at the median and
# {glue:text}`custom_real_spread_max` at most. The best policy on the real engine (ties
# included) is among an engine model's best at HIGH_PRESSURE for {glue:text}`custom_real_agree`
# windows.

# %% [markdown]
# ## In detail
#
# The chapter's policy ranks between {glue:text}`custom_best_rank:d` and
# {glue:text}`custom_worst_rank:d` of the {glue:text}`custom_n_panel:d` policies across sources and
# regions ({glue:text}`custom_engine`); with it in the panel, the lowest cross-source $\tau_b$ at
# {glue:text}`custom_region` is {glue:text}`custom_tau_min`. One class runs on three engine models: vLLM's
# own scheduler gives the same ANWG as `vllm_v1` in {glue:text}`custom_engines_identical` of
# {glue:text}`custom_engines_n_cells` cells (lowest $\tau_b$ between their rankings
# {glue:text}`custom_engines_tau_native`), while `lssp` and `vllm_v1` rank the seven policies with a
# lowest $\tau_b$ of {glue:text}`custom_engines_tau_lssp`: {glue:text}`custom_engines_reading`.
# Change the file, rerun this page (`portbench book --skip-campaign --notebooks add_your_scheduler
# -p policy_module=my_policy.py -p region=OVERLOAD`), and read the same tables for your own
# scheduler.
