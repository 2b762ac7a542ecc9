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
# # RQ6 — Does the simulated reversal hold on a real engine?
#
# :::{admonition} Finding
# :class: tip pb-finding
# {glue:text}`rq6_verdict:s` The simulator (`vllm_v1`) in the same configuration predicts
# {glue:text}`rq6_study_sim_signs_agree:s` of the settled signs as measured. Configurations that do
# not compare with the study's (other admission limits) are read apart, below.
# :::
#
# **Question.** Does the study's largest simulated reversal — `slai_faithful` against `vllm_faithful`
# on ANWG at HIGH_PRESSURE — also appear when the same windows are replayed on a real serving engine?
# **Method.** The real-engine results committed in `data/results/realengine/` (λ_ref re-found per
# window on that engine, windows replayed in real time under both policies) are set beside the
# simulator's prediction for the same windows and the original study's GPU result, and the RQ2
# reversal classifier is applied to a case source pair and a control pair.

# %% tags=["parameters"]
results_path = ""          # simulator campaign table (empty: data/results/campaign_<engine_model>.parquet)
engine_model = "lssp"      # engine model of the simulator's prediction
n_resamples = 2000         # bootstrap resamples
seed = 0                   # seed of every bootstrap
output_dir = "book/figures"  # where figures are written
case_sources = ["azure_llm_2024", "burstgpt"]       # the case: the source pair where the reversal is expected
control_sources = ["azure_llm_2024", "bailian_qwen"]  # the control: a source pair expected to be stable
margin = 0.10              # practical-margin threshold of the reversal classifier (as in RQ2)
confidence_level = 0.95    # level of the classifier's per-source bootstrap intervals
rerun_backend = ""         # "vllm" or "transformers": replay the case now (needs that engine)
rerun_windows_per_source = 2  # windows per source of such a replay
real_engine_runs = ["vllm_cpu_study_case", "vllm_cpu_equal_case", "vllm_cpu_guarded_case",
                    "vllm_cpu_case"]  # real-engine case runs to read, headline first (the study's configuration)
equal_limits_run = "vllm_cpu_equal_case"  # of those, the run with the same max_model_len for both policies ("": none)
study_config_run = "vllm_cpu_study_case"  # of those, the run with the study's real-system configuration ("": none)
study_rehost_run = "vllm_cpu_study_azure_h2_case"  # that configuration rerun on a second host, λ_ref searched there ("": none)
exclude_host_flagged = False  # leave out runs whose host probes drifted on every attempt (see the fidelity chapter)
gpu_run = "h200_study"     # the GPU run's file prefix in data/results/realengine ("": none)
gpu_budget_s = 900         # the device time a GPU run is lent (s): what the plain verdict measures against
gpu_windows_per_source = 8  # windows per source the GPU case is planned for (the device-time estimate)
gpu_repetitions = 2        # repetitions of each window and policy it is planned for (likewise)
primary_repetitions = 8    # the study case's fixed-size reading: its first N repetitions of every window

# %% [markdown]
# ## Method in detail
#
# The study's pre-registered case is `slai_faithful` vs `vllm_faithful` on ANWG at HIGH_PRESSURE,
# Azure vs BurstGPT, with Azure vs Bailian as a stable control; this build's case and control pairs
# are the `case_sources` and `control_sources` parameters. On a real engine, λ_ref is re-found per
# window (FIFO's 0.5% violation knee on that engine), and each window is compressed to 1.5 × λ_ref and
# replayed in real time under both policies. No engine is needed to build the book: this chapter
# re-analyses whatever runs are committed.
#
# The case is run in three engine configurations (`benchmarks/rq6_vllm_cpu.py --config`), because
# vLLM v1 without chunked prefill caps `max_model_len` at the token budget and so refuses long
# requests under `vllm_faithful` (2,560-token budget) that `slai_faithful` accepts:
#
# - `vllm_cpu_guarded_case` (`--config policy`): each policy with its own limit, `vllm_faithful`
#   2,560 and `slai_faithful` 32,768, so the two refuse different requests;
# - `vllm_cpu_equal_case` (`--config equal`): the same windows and λ_ref, with 2,560 for both, so
#   both refuse the same requests and only scheduling differs;
# - `vllm_cpu_study_case` (`--config study`): the study's real-system configuration as far as it
#   carries to a CPU host and a tiny model — both policies at `max_model_len` 32,768 with chunked
#   prefill off (vLLM then raises the token budget to 32,768), at most 32 requests in flight (its
#   load generator's 32 client threads), λ_ref searched with `vllm_faithful` as the study did (its
#   repository's `configs/real_vllm/` manifest and `scripts/real_vllm/` run scripts); its windows and
#   runs are counted in the conclusion below.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display
from myst_nb import glue

from portbench import present
from portbench.book import pair_label, source_label
from portbench.campaign import load_results
from portbench.chapters import rq6 as reading
from portbench.realengine.study import CASE_POLICIES, CASE_REGION, CaseConfig, run_case

Path(output_dir).mkdir(parents=True, exist_ok=True)
if rerun_backend:
    run_case(CaseConfig(rerun_backend, n_per_source=int(rerun_windows_per_source), tag=f"{rerun_backend}_rerun"))
sim_table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
wanted = list(real_engine_runs) + ([f"{rerun_backend}_rerun"] if rerun_backend else [])
cases = reading.open_cases(wanted, exclude_host_flagged=exclude_host_flagged,
                           equal_limits_run=equal_limits_run, study_config_run=study_config_run)
policy_a, policy_b = CASE_POLICIES
glue("rq6_engine", engine_model, display=False)
glue("rq6_case_pair", pair_label(*case_sources), display=False)
glue("rq6_control_pair", pair_label(*control_sources), display=False)
glue("rq6_region", CASE_REGION, display=False)
glue("rq6_policies", f"{policy_a} − {policy_b}", display=False)

# %% [markdown]
# ## The committed real-engine runs
#
# Each run's provenance, read from its JSON file beside the results:

# %%
display(Markdown("\n".join(reading.provenance_line(cases, tag) for tag in cases.tags)
                 or "No real-engine results yet."))

# %% [markdown]
# `vllm_cpu_case` (the first real-engine run) had no host guard, and other jobs shared the 2-core
# machine during parts of it; the fidelity chapter shows how much of its error that explains. The
# guarded runs put a fixed probe before and after every run and re-ran those whose probes drifted.
#
# The original study's reported GPU result (vLLM 0.27.1, Qwen2.5-0.5B, one A100; mean SLAI − vLLM
# ANWG per source over 40 windows) — typed from the study, for comparison only:

# %%
original = reading.original_result()
present.table(original[["source", "delta"]], digits=3)

# %% [markdown]
# ## The study's configuration: the simulator in it, and how settled the real result is
#
# This is the configuration the study's A100 result was measured in, so the chapter's verdict reads
# it. The campaign's simulator figures (in the next section) come from the study's *simulated*
# configuration (its load calibration, budget and SLO). The real runs of `study_config_run` ran in another: both
# policies at a 32,768-token budget and `max_model_len`, at most 32 requests in flight. Here the
# simulator is run in exactly that configuration, per window: the `vllm_v1` engine model, the
# step cost cross-validated by window on the case's own steps (one per policy, fitted on as many
# repetitions of every window as the fewest has, so that repetitions added to one source do not
# weigh its steps more in the others' cost), each window at the
# real run's load, and the client's in-flight cap (`portbench.realconfig`; written by
# `python benchmarks/predict_real_config.py`). The real result's interval here resamples the windows
# *and* each window's repetitions, so it carries the run-to-run noise as well. A repetition is a pair:
# the case runs the two policies of a window's repetition back to back, so both meet the host's speed
# of the same minutes, and that speed sets the load they see. Their ANWG move together from one
# repetition to the next (correlation {glue:text}`rq6_study_pair_corr:s`, each window's own mean
# taken out), so the pairs are drawn whole. Drawn apart, as if the two runs of a repetition had
# nothing in common (the unpaired reading), the host's swings count as a
# difference between the policies and the intervals widen:
# {glue:text}`rq6_study_unpaired_reading:s`.

# %%
if study_config_run:
    rows = reading.study_configuration(
        cases, study_config_run, {"lssp": sim_table if engine_model == "lssp" else load_results("lssp"),
                                  "vllm_v1": load_results("vllm_v1")}, n_resamples=n_resamples, seed=seed)
    configured = pd.concat({k: v.set_index("source")[["delta", "ci_low", "ci_high"]] for k, v in rows.items()},
                           names=["prediction or measurement", "source"]).reset_index()
    real_row = rows[reading.REAL_PAIRED].set_index("source")
    unpaired_row = rows[reading.REAL_UNPAIRED].set_index("source")
    pred_row = rows["simulator, same configuration (vllm_v1)"].set_index("source")
    camp_rows = {k: v.set_index("source") for k, v in rows.items() if "campaign" in k}
    for src in real_row.index:
        glue(f"rq6_study_sim_delta_{src}", present.signed(pred_row.loc[src, "delta"], 3), display=False)
        glue(f"rq6_study_sim_ci_{src}", f"{present.signed(pred_row.loc[src, 'ci_low'], 3)} to "
                                        f"{present.signed(pred_row.loc[src, 'ci_high'], 3)}", display=False)
        glue(f"rq6_study_real_delta_{src}", present.signed(real_row.loc[src, "delta"], 3), display=False)
        glue(f"rq6_study_real_ci_{src}", f"{present.signed(real_row.loc[src, 'ci_low'], 3)} to "
                                         f"{present.signed(real_row.loc[src, 'ci_high'], 3)}", display=False)
        glue(f"rq6_study_real_verdict_{src}", reading.settled(real_row.loc[src]), display=False)
    glue("rq6_study_pair_corr", present.join(
        [f"{real_row.loc[s_, 'pair_corr']:.2f} on {source_label(s_)}" for s_ in real_row.index]), display=False)
    glue("rq6_study_unpaired_reading", reading.interval_reading(unpaired_row, real_row.index), display=False)
    # signs compared only where the measured sign is settled: an unsettled one is noise
    real_signs = reading.signs(real_row, real_row.index)
    settled_src = [s_ for s_ in real_row.index if reading.settled(real_row.loc[s_]) == "sign settled"]
    agree = {name: sum(reading.signs(t, real_row.index)[s_] == real_signs[s_] for s_ in settled_src)
             for name, t in [("configured", pred_row)] + list(camp_rows.items())}
    glue("rq6_study_sim_signs_agree", f"{agree['configured']} of {len(settled_src)}", display=False)
    glue("rq6_study_runs_to_settle", reading.runs_to_settle(real_row, cases.runs(study_config_run)),
         display=False)
    # the robust reading: without the runs during which the host slowed down (their own steps say so)
    from portbench.realconfig import repetition_resampled_delta

    steady = reading.host_steady_runs(cases[study_config_run])
    if cases.exclude_host_flagged:
        steady = steady[~steady["host_flagged"].astype(bool)]
    steady_row = repetition_resampled_delta(steady[~steady["speed_off"]], n_resamples=n_resamples,
                                            seed=seed).set_index("source")
    glue("rq6_study_steady_excluded", f"{int(steady['speed_off'].sum())} of {len(steady)}", display=False)
    glue("rq6_study_steady_reading", reading.interval_reading(steady_row, real_row.index), display=False)
    rehost_row = None
    if study_rehost_run:
        rehost = reading.open_cases([study_rehost_run], exclude_host_flagged=exclude_host_flagged)
        rehost_rows = reading.study_configuration(rehost, study_rehost_run, {}, n_resamples=n_resamples, seed=seed)
        rehost_row = rehost_rows[reading.REAL_PAIRED].set_index("source")
        rehost_pred = rehost_rows["simulator, same configuration (vllm_v1)"].set_index("source")
        # the provenance bullet as plain text (a glued value is not parsed as markdown)
        glue("rq6_study_rehost_provenance",
             reading.provenance_line(rehost, study_rehost_run).removeprefix("- ").replace("**", "")
             .replace(f" (`{study_rehost_run}`)", ""), display=False)
        glue("rq6_study_rehost_reading", reading.interval_reading(rehost_row, rehost_row.index), display=False)
        glue("rq6_study_rehost_sim", reading.interval_reading(rehost_pred, rehost_pred.index, verdict=False),
             display=False)
        glue("rq6_study_rehost_probe", present.join(
            [f"{present.num(v['wall_s'] * 1e3, 0)} ms for {k}" for k, v in
             rehost[study_rehost_run].meta["probe_reference"].items()]), display=False)
        glue("rq6_study_first_probe", present.join(
            [f"{present.num(v['wall_s'] * 1e3, 0)} ms" for v in
             cases[study_config_run].meta["probe_reference"].values()]), display=False)
    display(present.table(configured, digits=3))
    display(present.table(real_row.reset_index()[["source", "n_windows", "repetitions", "delta", "ci_low",
                                                  "ci_high", "half_width", "pair_corr"]], digits=4))
    # the fixed-size reading beside the sequential one (repetitions added per source until settled)
    primary_row = reading.primary_reading(cases.runs(study_config_run), primary_repetitions,
                                          n_resamples=n_resamples, seed=seed)
    glue("rq6_verdict", reading.verdict(real_row, rehost_row, primary_row), display=False)
    for src in real_row.index:
        glue(f"rq6_primary_delta_{src}", reading.interval_reading(primary_row, [src]) if src in primary_row.index
             else "n/a (fewer repetitions)", display=False)
        glue(f"rq6_study_delta_{src}", reading.interval_reading(real_row, [src]), display=False)
    glue("rq6_primary_n", str(primary_repetitions), display=False)
    reps_by_source = cases.runs(study_config_run).groupby("source")["repetition"].nunique()
    glue("rq6_study_repetitions", present.join([f"{source_label(s_)} {n}" for s_, n in reps_by_source.items()]),
         display=False)
    moved = reading.primary_disagrees(primary_row, real_row)
    glue("rq6_primary_agrees", "gives every source the same verdict as the final reading" if not moved else
         "differs from the final reading on " + present.join(
             [f"{name} ({first} with the first {primary_repetitions}, {final} with all)" for name, first, final in moved]),
         display=False)
    display(present.table(pd.concat({"first repetitions (fixed size)": primary_row, "all repetitions": real_row})
                          .reset_index(names=["reading", "source"])[["reading", "source", "n_windows", "repetitions",
                                                                     "delta", "ci_low", "ci_high"]], digits=4))
    # the introduction's "what holds" row: slai_faithful scores below vllm_faithful (the A100's sign)
    order_src = [s_ for s_ in ("azure_llm_2024", "burstgpt", "bailian_qwen") if s_ in real_row.index]
    triple = lambda t: " / ".join(present.signed(t.loc[s_, "delta"], 3) for s_ in order_src)
    glue("rq6_claim_sources", " / ".join(source_label(s_) for s_ in order_src), display=False)
    glue("rq6_claim_study", "A100: " + " / ".join(present.signed(reading.ORIGINAL[s_], 3) for s_ in order_src),
         display=False)
    glue("rq6_claim_lssp", "campaign: " + triple(camp_rows["simulator, campaign configuration (lssp)"]),
         display=False)
    glue("rq6_claim_vllm_v1", "same configuration: " + triple(pred_row), display=False)
    glue("rq6_claim_real", reading.verdict_brief(real_row, rehost_row), display=False)
    short = reading.short_finding(real_row, pred_row, camp_rows, agree, steady_row, rehost_row)
    glue("rq6_short_finding", short, display=False)
    glue("rq6_short_finding_words", len(short.split()), display=False)
else:
    glue("rq6_short_finding", "No real run in the study's configuration is committed.", display=False)
    glue("rq6_verdict", "No real run in the study's configuration is committed.", display=False)
    glue("rq6_study_repetitions", "n/a", display=False)
    glue("rq6_primary_agrees", "n/a", display=False)
    glue("rq6_primary_n", str(primary_repetitions), display=False)
    for src in reading.CASE_SOURCES:
        glue(f"rq6_primary_delta_{src}", "n/a (no such case)", display=False)
        glue(f"rq6_study_delta_{src}", "n/a (no such case)", display=False)
    for k in ("sources", "study", "lssp", "vllm_v1", "real"):
        glue(f"rq6_claim_{k}", "not computed", display=False)
    glue("rq6_study_sim_signs_agree", "n/a", display=False)
    glue("rq6_study_runs_to_settle", "n/a (no such case)", display=False)
    glue("rq6_study_steady_excluded", "n/a", display=False)
    glue("rq6_study_steady_reading", "n/a", display=False)
    glue("rq6_study_pair_corr", "n/a", display=False)
    glue("rq6_study_unpaired_reading", "n/a", display=False)
if not (study_config_run and study_rehost_run):
    for name in ("provenance", "reading", "sim", "probe"):
        glue(f"rq6_study_rehost_{name}", "n/a (no such case)", display=False)
    glue("rq6_study_first_probe", "n/a", display=False)

# %% [markdown]
# **How many repetitions, and why.** No sample size was fixed before the case ran. It grew in sessions:
# every source together to 1, 2, 4 and then 8 repetitions of each of its 8 windows; from there,
# repetitions were added only to the sources whose interval had not settled (the rule below), checked
# after each session, until it did: {glue:text}`rq6_study_repetitions:s` repetitions in the end. Such a
# sequential rule looks at its interval many times, and the final intervals are not corrected for
# those looks. The fixed-size reading, the first {glue:text}`rq6_primary_n:s` repetitions of every window of
# every source (the design all sources reached before any was extended), does not depend on the rule:
# {glue:text}`rq6_primary_delta_burstgpt:s`; {glue:text}`rq6_primary_delta_bailian_qwen:s`;
# {glue:text}`rq6_primary_delta_azure_llm_2024:s`. It {glue:text}`rq6_primary_agrees:s`. A further 256
# Azure runs were made on a host about 1.8 times faster and set aside unread: the case's λ_ref, searched
# on the slower host, is a lighter load there (the guard now flags such runs); they were not kept, so
# no reading of them can be shown.
#
# A source is settled when its interval excludes 0 or is at most ±0.005 wide ("no difference beyond
# ±0.005"). Runs still needed where neither holds, at the spread measured so far:
# {glue:text}`rq6_study_runs_to_settle:s` (`.venv-vllm/bin/python benchmarks/rq6_vllm_cpu.py --config
# study --windows-per-source 8 --repetitions N` resumes the case and adds repetitions up to N;
# `--sources` limits it to the sources not yet settled). Only on a host as fast as the case's: its
# λ_ref was searched on that host and is a lighter load on a faster one, so the guard keeps the case's
# first reference probe and flags the runs of a host of another speed.
#
# **A robust reading.** The host probes before and after a run do not see a host that slows down
# while the run goes on; the run's own steps do. A run's step ratio is the median of its real step
# times over the profiled cost of the same batches; leaving out the
# {glue:text}`rq6_study_steady_excluded:s` runs whose step ratio is more than 15% (the guard's
# tolerance) off the median of the same window and policy, SLAI − vLLM is
# {glue:text}`rq6_study_steady_reading:s`.
#
# **A second host.** The first case can only be resumed on a host of its own speed: on a faster one
# its λ_ref is a lighter load, and its guard flags every run. The host at hand ran vLLM faster (its
# reference probe took {glue:text}`rq6_study_rehost_probe:s`; the first case's took
# {glue:text}`rq6_study_first_probe:s`), so the case was run again there, for the source it left
# unsettled, as a case of its own (`study_rehost_run`): the same configuration, windows, policies
# and guard, with λ_ref searched anew on that host, as the study's method does on any engine, so
# that its region is a load that host finds heavy. vLLM ran pinned to one core
# (`VLLM_CPU_OMP_THREADS_BIND=0 taskset -c 0`; the probe ran as fast on one core as on two with this
# model). Its runs are not pooled with the first case's: they ran at other loads.
#
# The case: {glue:text}`rq6_study_rehost_provenance:s`
#
# SLAI − vLLM there (paired, as above): {glue:text}`rq6_study_rehost_reading:s`; the simulator in
# its configuration (its own λ_ref and cost): {glue:text}`rq6_study_rehost_sim:s`.

# %% [markdown]
# The other cases ran in other configurations, and their simulated counterparts (request by request,
# in the fidelity chapter: the same windows, load, limits and refusals, the cost cross-validated by
# window) are that case's simulator in its own configuration. Per case and source, the real and
# simulated SLAI − vLLM ANWG (95% CI over windows) and whether the signs agree:

# %%
own = reading.own_configuration(cases, n_resamples=n_resamples, seed=seed)
if len(own):
    glue("rq6_own_config_signs", f"{int(own['signs agree'].sum())} of {len(own)}", display=False)
    display(present.table(own[["case", "source", "n_windows_real", "delta_real", "ci_low_real", "ci_high_real",
                               "delta_sim", "ci_low_sim", "ci_high_sim", "signs agree"]], digits=3))
else:
    glue("rq6_own_config_signs", "n/a", display=False)

# %% [markdown]
# In each case's own configuration, the simulated and the real signs agree in
# {glue:text}`rq6_own_config_signs:s` (case, source) pairs.

# %% [markdown]
# :::{admonition} The RQ6 finding, short
# :class: note
# {glue:text}`rq6_short_finding:s`
# :::

# %% [markdown]
# ## Configurations that do not compare with the study
#
# The figure and tables below set the study-configuration case (first) beside cases that ran the two
# policies under other admission limits: each under its own (`vllm_faithful` with a 2,560-token
# `max_model_len`, so that it refuses every longer request: a refusal, not a scheduling decision,
# lowers its ANWG), or both under the same 2,560-token limit. Neither is the configuration of the
# study's A100 result, and the first does not separate scheduling from refusal. They show how the sign
# depends on the configuration, not whether the A100's holds.

# %% [markdown]
# ### Mean SLAI − vLLM difference per source: real engine, simulator, original study

# %%
deltas = reading.deltas(cases, sim_table, engine_model, n_resamples=n_resamples, seed=seed)
for _, r in deltas.iterrows():
    label = r["engine"].split(" ")[0] if r["engine"].startswith("simulator") else r["engine"]
    if r["engine"].startswith("simulator") and "all windows" not in r["engine"]:
        continue
    key = "sim" if label == "simulator" else ("original" if label.startswith("original") else label)
    glue(f"rq6_{key}_{r['source']}", present.signed(r["delta"], 3), display=False)   # true minus sign
    if cases.tags and r["engine"] == cases.tags[0]:
        glue(f"rq6_real_{r['source']}", present.signed(r["delta"], 3), display=False)  # the headline run

fig, ax = plt.subplots(figsize=(8, 4))
labels = list(dict.fromkeys(deltas["engine"]))
sources = sorted(set(deltas["source"]))
width = 0.8 / max(1, len(labels))
for k, label in enumerate(labels):
    d = deltas[deltas["engine"] == label].set_index("source").reindex(sources)
    x = np.arange(len(sources)) + (k - (len(labels) - 1) / 2) * width
    err = None
    if {"ci_low", "ci_high"} <= set(d.columns) and d["ci_low"].notna().any():
        err = [d["delta"] - d["ci_low"], d["ci_high"] - d["delta"]]
    ax.bar(x, d["delta"], width, yerr=err, capsize=2, label=present.label(label))
ax.axhline(0, color="k", lw=0.6)
ax.set_xticks(range(len(sources)), [source_label(s) for s in sources])
ax.set_ylabel(f"mean ANWG, {policy_a} − {policy_b} (95% CI)", fontsize=8)
ax.set_title(f"{CASE_REGION}: real engine, simulator ({engine_model}) and the original study", fontsize=10)
# the legend below the axes, where it cannot cover a bar
ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
fig.set_size_inches(8, 4 + 0.22 * ((len(labels) + 1) // 2))
fig.tight_layout()
present.figure("rq6_case", fig, output_dir, "rq6_case.png")

# %% [markdown]
# :::{glue:figure} rq6_case
# :name: fig-rq6-case
# :alt: Grouped bar chart, one group per source, of the mean ANWG difference between the two case policies on each real-engine run, in the simulator and in the original study, with 95% confidence intervals.
#
# **Does the simulated reversal hold on a real engine?** Per source, the mean {glue:text}`rq6_policies`
# difference in ANWG at {glue:text}`rq6_region` (bars below 0: the first policy is worse), with its
# 95% bootstrap interval, on each real-engine run, in the simulator on the same windows and on all
# windows, and as the original study measured it on an A100. A reversal is a bar that changes sign
# between two sources; compare the real-engine bars with the simulator's beside them.
# :::

# %% tags=["hide-output"]
present.table(deltas, digits=3)

# %% [markdown]
# ### The reversal classifier on each engine
#
# The RQ2 classifier applied to the two case policies (a supported reversal needs a sign change with
# a margin above `margin` in both sources and both per-source CIs excluding 0), on the case pair and
# the control pair:

# %%
verdict = reading.verdicts(cases, sim_table, engine_model, n_resamples=n_resamples, seed=seed, margin=margin,
                           confidence_level=confidence_level)
glue("rq6_n_real_engines", len(cases.tags), display=False)
display(Markdown("\n".join(reading.verdict_lines(verdict, case_sources, control_sources))
                 or "No real-engine results yet."))

# %% tags=["hide-output"]
present.table(verdict[["engine", "source_x", "source_y", "delta_x", "delta_y", "ci_low_x", "ci_high_x",
                       "ci_low_y", "ci_high_y", "cls"]], digits=3)

# %%
first_real = cases.tags[0] if cases.tags else None
summary = reading.classifier_summary(verdict, first_real, case_sources, control_sources)
for k, v in summary.items():
    glue(f"rq6_{k}", v, display=False)
glue("rq6_first_real", present.label(first_real) if first_real else "none", display=False)
glue("rq6_case_first", source_label(case_sources[0]), display=False)
glue("rq6_case_second", source_label(case_sources[1]), display=False)

# %% [markdown]
# ### Refusals and each policy's ANWG on the real engine
#
# vLLM v1 requires `max_model_len` to be at most the token budget when chunked prefill is off, so the
# real engine runs `vllm_faithful` (2,560-token budget, chunked prefill off) with a smaller
# `max_model_len` than `slai_faithful`, and refuses every request whose prompt and output exceed it.
# A refused request is never completed, so it lowers that policy's ANWG whatever the scheduler does.
# Per source and policy, on the headline run (means over its runs, of
# {glue:text}`rq6_requests_per_run:s` requests each; *not refused*: the share of the requests the
# engine accepted):

# %%
head_tag = cases.tags[0]
per_policy = reading.per_policy(cases, head_tag, list(case_sources) + list(control_sources))
order = list(per_policy["source"].cat.categories)
glue("rq6_requests_per_run", present.num(per_policy["requests"].median(), 0), display=False)
present.table(per_policy.drop(columns=["runs", "requests"]).rename(columns={"refused": "refused per run",
                                                                          "not_refused": "not refused"}),
              digits={"max_model_len": 0, "refused per run": 2, None: 3})

# %%
readings = reading.Readings(cases, head_tag, deltas, verdict, summary, order, tuple(case_sources),
                            tuple(control_sources))
glue("rq6_conclusion", reading.conclusion(readings, per_policy, equal_limits_run=equal_limits_run,
                                          study_config_run=study_config_run), display=False)

# %% [markdown]
# ## The GPU run: the study's configuration on an H200
#
# The same prepared script (`portbench realengine gpu --config study`, the transformers
# continuous-batching engine serving a random-weight model of Qwen2.5-0.5B's shape in bf16) was run on
# a lent H200, in the study's real-system configuration: both policies at a 32,768-token budget and
# `max_model_len`, whole-prompt admission, 256 sequences, at most 32 requests in flight, λ_ref searched
# on `vllm_faithful`. What it measured, read from its files (`data/results/realengine/<gpu_run>_*`):

# %%
gpu = reading.gpu_case(gpu_run) if gpu_run else None
if gpu is not None:
    tuning_rows = reading.gpu_tuning(gpu)
    display(Markdown(reading.gpu_provenance(gpu, len(tuning_rows))))
    # inside the if, so shown with display(): a bare expression there would not be
    display(present.table(tuning_rows[["CUDA graphs (prefill, decode)", "setup_s", "wall_s", "tokens_per_s",
                                       "chosen"]], digits={"setup_s": 2, "wall_s": 2, "tokens_per_s": 0}))

# %%
if gpu is not None:
    prof = gpu.profile
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    dec = prof[prof["prefill_tokens"] == 0].groupby(["context_tokens", "decode_seqs"])["step_s"].median().reset_index()
    for ctx, g in dec.groupby("context_tokens"):
        ax1.plot(g["decode_seqs"], g["step_s"] * 1e3, "o-", label=f"{ctx:,} context tokens each")
    ax1.set_xlabel("decoding sequences in the step")
    ax1.set_ylabel("step time (ms)")
    ax1.set_title("decode steps", fontsize=9)
    ax1.legend(fontsize=7)
    pre = prof[prof["decode_seqs"] == 0].groupby("prefill_tokens")["step_s"].median().reset_index()
    ax2.plot(pre["prefill_tokens"], pre["step_s"] * 1e3, "o-")
    ax2.set_xlabel("prefill tokens in the step (no decodes)")
    ax2.set_title("prefill steps", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    present.figure("rq6_gpu_profile", fig, output_dir, "rq6_gpu_profile.png")

    plan = dict(windows_per_source=gpu_windows_per_source, repetitions=int(gpu_repetitions))
    budget = reading.gpu_budget(gpu, **plan)
    glue("rq6_gpu_runs", len(budget.runs), display=False)
    glue("rq6_gpu_step_ms", present.num(budget.steps["duration_s"].median() * 1e3, 0), display=False)
    glue("rq6_gpu_run_s", present.num(budget.per_run_s, 0), display=False)
    glue("rq6_gpu_need_min", present.num(budget.need_s / 60, 0), display=False)
    glue("rq6_gpu_cost_error", present.pct(gpu.cost["case_steps"]["median_abs_rel_error"], 1), display=False)
    glue("rq6_gpu_verdict", reading.gpu_verdict(gpu, budget, budget_s=gpu_budget_s, **plan), display=False)
    display(Markdown(reading.gpu_cost(gpu)))
    present.table(budget.runs[["window_id", "policy", "lambda_ref_real", "lambda_pinned", "load_factor", "wall_s",
                               "n_steps", "anwg", "slo_violation_rate", "drift", "host_flagged"]],
                  digits={"lambda_ref_real": 2, "load_factor": 2, "wall_s": 1, "n_steps": 0, "anwg": 3,
                          "slo_violation_rate": 3, "drift": 2})

# %% [markdown]
# :::{glue:figure} rq6_gpu_profile
# :name: fig-rq6-gpu-profile
# :alt: Two line charts of the transformers engine's step time on the H200: decode steps against the number of decoding sequences for two context lengths, and prefill-only steps against prefill tokens.
#
# **The engine's step on the H200.** Left: a decode step's time grows with the context it reads
# (32 sequences of 2,048 tokens take about four times 32 of 256); right: a prefill-only step against
# its prompt tokens. Medians of the timed steps of the profile.
# :::
#
# :::{admonition} The GPU run, in plain words
# :class: warning
# {glue:text}`rq6_gpu_verdict:s`
# :::


# %% [markdown]
# ## In detail
#
# {glue:text}`rq6_short_finding:s`
#
# Over every committed configuration: {glue:text}`rq6_conclusion:s`
#
# Against the simulator: where the real engine has {glue:text}`rq6_real_case_delta_first` on
# {glue:text}`rq6_case_first` and {glue:text}`rq6_real_case_delta_second` on
# {glue:text}`rq6_case_second`, the simulator (engine model {glue:text}`rq6_engine`, all windows)
# has {glue:text}`rq6_sim_case_delta_first` and {glue:text}`rq6_sim_case_delta_second`. The
# reversal classifier calls the case ({glue:text}`rq6_case_pair`)
# **{glue:text}`rq6_real_case_class`** on the real engine and **{glue:text}`rq6_sim_case_class`** in
# the simulator, and the control ({glue:text}`rq6_control_pair`)
# **{glue:text}`rq6_real_control_class`** and **{glue:text}`rq6_sim_control_class`**.
