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
real_engine_runs = ["vllm_cpu_guarded_case", "vllm_cpu_equal_case", "vllm_cpu_study_case",
                    "vllm_cpu_case"]  # real-engine case runs to read, headline first
equal_limits_run = "vllm_cpu_equal_case"  # of those, the run with the same max_model_len for both policies ("": none)
study_config_run = "vllm_cpu_study_case"  # of those, the run with the study's real-system configuration ("": none)
exclude_host_flagged = False  # leave out runs whose host probes drifted on every attempt (see the fidelity chapter)
gpu_run = "h200_study"     # the GPU run's file prefix in data/results/realengine ("": none)
gpu_budget_s = 900         # the device time a GPU run is lent (s): what the plain verdict measures against
gpu_windows_per_source = 8  # windows per source the GPU case is planned for (the device-time estimate)
gpu_repetitions = 2        # repetitions of each window and policy it is planned for (likewise)

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
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display
from myst_nb import glue

from portbench import fidelity, present, realconfig, stats, store
from portbench.book import pair_label, source_label
from portbench.campaign import load_results
from portbench.realengine import study
from portbench.realengine.study import CASE_POLICIES, CASE_REGION, CASE_SOURCES, realengine_dir, run_case

Path(output_dir).mkdir(parents=True, exist_ok=True)
if rerun_backend:
    run_case(rerun_backend, n_per_source=int(rerun_windows_per_source), tag=f"{rerun_backend}_rerun")
sim_table = pd.read_parquet(results_path) if results_path else load_results(engine_model)
wanted = list(real_engine_runs) + ([f"{rerun_backend}_rerun"] if rerun_backend else [])
for name, tag in (("equal_limits_run", equal_limits_run), ("study_config_run", study_config_run)):
    if tag and tag not in wanted:
        raise ValueError(f"{name}: {tag!r} is not among real_engine_runs ({', '.join(wanted)}); name one "
                         f"of them, or set {name} to empty")
run_files = [realengine_dir() / f"{tag}_runs.parquet" for tag in wanted]
missing = [f.name for f in run_files if not f.exists()]
if missing:
    raise FileNotFoundError(f"real_engine_runs: no {', '.join(missing)} in {realengine_dir()}; there are "
                            f"{sorted(f.name.removesuffix('_runs.parquet') for f in realengine_dir().glob('*_runs.parquet'))}")
policy_a, policy_b = CASE_POLICIES
glue("rq6_engine", engine_model, display=False)
glue("rq6_case_pair", pair_label(*case_sources), display=False)
glue("rq6_control_pair", pair_label(*control_sources), display=False)
glue("rq6_region", CASE_REGION, display=False)
glue("rq6_policies", f"{policy_a} − {policy_b}", display=False)


def case_runs(path: Path) -> pd.DataFrame:
    """A case's runs; without the host-flagged ones if ``exclude_host_flagged`` (repetitions of a
    window are averaged by the statistics downstream)."""
    runs = pd.read_parquet(path)
    if exclude_host_flagged and "host_flagged" in runs:
        runs = runs[~runs["host_flagged"].astype(bool)]
    return runs

# %% [markdown]
# ## The committed real-engine runs
#
# Each run's provenance, read from its JSON file beside the results:

# %%
def provenance(tag: str) -> str:
    path = realengine_dir() / f"{tag}.json"
    if not path.exists():
        return f"- **{tag}**: no provenance file"
    meta = json.loads(path.read_text())
    env, case = meta.get("environment", {}), meta.get("case", {})
    shape = env.get("model_shape", {})
    model = (f"a random-weight {shape.get('n_layers')}-layer, {shape.get('hidden_size')}-wide Llama "
             f"({shape.get('dtype')})" if shape else "model not recorded")
    return (f"- **{tag}**: {env.get('engine', meta.get('backend', '?'))} {env.get('engine_version', '')} "
            f"on {env.get('device', '?')}, {model}; {case.get('n_per_source', '?')} windows per source "
            f"({', '.join(source_label(s) for s in case.get('sources', []))}) at {case.get('region', '?')}; "
            f"λ_ref from a {case.get('bisection_steps', '?')}-step bisection; run {env.get('date', '?')[:10]}; "
            + guard_summary(tag, case))


def guard_summary(tag: str, case: dict) -> str:
    runs = pd.read_parquet(realengine_dir() / f"{tag}_runs.parquet")
    if "host_flagged" not in runs:
        return f"{len(runs)} runs, no host guard (timings carry whatever else ran on the machine)."
    flagged = int(runs["host_flagged"].sum())
    return (f"{len(runs)} runs ({case.get('repetitions', '?')} repetitions of each window and policy), "
            f"each between two host probes; {flagged} flagged (probes off by more than "
            f"{case.get('drift_tolerance', float('nan')):.0%} on every attempt)"
            + (", left out below." if exclude_host_flagged and flagged else ", kept below (their own steps: "
               "see the fidelity chapter)." if flagged else "."))


display(Markdown("\n".join(provenance(f.name.removesuffix("_runs.parquet")) for f in run_files)
                 or "No real-engine results yet."))

# %% [markdown]
# `vllm_cpu_case` (the first real-engine run) had no host guard, and other jobs shared the 2-core
# machine during parts of it; the fidelity chapter shows how much of its error that explains. The
# guarded runs put a fixed probe before and after every run and re-ran those whose probes drifted.
#
# The original study's reported GPU result (vLLM 0.27.1, Qwen2.5-0.5B, one A100; mean SLAI − vLLM
# ANWG per source over 40 windows) — typed from the study, for comparison only:

# %%
original = pd.DataFrame({"source": ["azure_llm_2024", "burstgpt", "bailian_qwen"],
                         "delta": [-0.024, -0.200, -0.026],
                         "engine": "original: vLLM 0.27.1 on A100"})
present.table(original[["source", "delta"]], digits=3)

# %% [markdown]
# ## Mean SLAI − vLLM difference per source: real engine, simulator, original study

# %%
def case_deltas(runs: pd.DataFrame, label: str) -> pd.DataFrame:
    return study.case_deltas(runs, label, n_resamples=n_resamples, seed=seed)

frames = []
for f in run_files:
    runs = case_runs(f)
    tag = f.name.removesuffix("_runs.parquet")
    frames.append(case_deltas(runs, tag))
    # the simulator's prediction for the very same windows
    same = sim_table[(sim_table["window_id"].isin(runs["window_id"])) & (sim_table["region"] == CASE_REGION)
                     & (sim_table["policy"].isin(CASE_POLICIES)) & (sim_table["slo_multiplier"] == 20.0)]
    frames.append(case_deltas(same, f"simulator ({engine_model}) on the windows of {tag}"))
all_sim = sim_table[(sim_table["region"] == CASE_REGION) & (sim_table["policy"].isin(CASE_POLICIES))
                    & (sim_table["slo_multiplier"] == 20.0)]
frames.append(case_deltas(all_sim, f"simulator ({engine_model}), all windows"))
deltas = pd.concat(frames + [original], ignore_index=True)
for _, r in deltas.iterrows():
    label = r["engine"].split(" ")[0] if r["engine"].startswith("simulator") else r["engine"]
    if r["engine"].startswith("simulator") and "all windows" not in r["engine"]:
        continue
    key = "sim" if label == "simulator" else ("original" if label.startswith("original") else label)
    glue(f"rq6_{key}_{r['source']}", present.signed(r["delta"], 3), display=False)   # true minus sign
    if run_files and r["engine"] == run_files[0].name.removesuffix("_runs.parquet"):
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
    ax.bar(x, d["delta"], width, yerr=err, capsize=2, label=label)
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
# ## The reversal classifier on each engine
#
# The RQ2 classifier applied to the two case policies (a supported reversal needs a sign change with
# a margin above `margin` in both sources and both per-source CIs excluding 0), on the case pair and
# the control pair:

# %%
verdicts = []
for f in run_files:
    runs = case_runs(f)
    if "slo_multiplier" not in runs:
        runs = runs.assign(slo_multiplier=20.0)
    run_sources = sorted(set(runs["source"]))
    if len(run_sources) < 2:
        continue
    rev = stats.reversals(runs, "anwg", CASE_REGION, sources=run_sources, policies=CASE_POLICIES,
                          n_resamples=n_resamples, seed=seed, margin=margin,
                          confidence_level=confidence_level)
    verdicts.append(rev.assign(engine=f.name.removesuffix("_runs.parquet")))
sim_rev = stats.reversals(sim_table, "anwg", CASE_REGION, policies=CASE_POLICIES, n_resamples=n_resamples,
                          seed=seed, margin=margin, confidence_level=confidence_level)
verdicts.append(sim_rev.assign(engine=f"simulator ({engine_model})"))
verdict = pd.concat(verdicts, ignore_index=True)
glue("rq6_n_real_engines", len(run_files), display=False)


def pick(g: pd.DataFrame, pair) -> pd.DataFrame:
    """The classifier's row for a source pair, in either order (Δ of the first source first)."""
    a, b = pair
    fwd = g[(g["source_x"] == a) & (g["source_y"] == b)]
    if len(fwd):
        return fwd.assign(first=a, second=b, d_first=fwd["delta_x"], d_second=fwd["delta_y"])
    rev_ = g[(g["source_x"] == b) & (g["source_y"] == a)]
    return rev_.assign(first=a, second=b, d_first=rev_["delta_y"], d_second=rev_["delta_x"])


lines = []
for engine, g in verdict.groupby("engine", sort=False):
    case, control = pick(g, case_sources), pick(g, control_sources)
    if case.empty:
        continue
    c = case.iloc[0]
    sentence = (f"**{engine}**: {policy_a} − {policy_b} ANWG is {present.signed(c['d_first'], 3)} on "
                f"{source_label(c['first'])} and {present.signed(c['d_second'], 3)} on "
                f"{source_label(c['second'])}; the classifier calls the case ({pair_label(*case_sources)}) "
                f"**{present.label(c['cls'])}**")
    if not control.empty:
        sentence += f", the control ({pair_label(*control_sources)}) **{present.label(control.iloc[0]['cls'])}**"
    lines.append("- " + sentence + ".")
display(Markdown("\n".join(lines) or "No real-engine results yet."))

# %% tags=["hide-output"]
present.table(verdict[["engine", "source_x", "source_y", "delta_x", "delta_y", "ci_low_x", "ci_high_x",
                       "ci_low_y", "ci_high_y", "cls"]], digits=3)

# %%
real = [f.name.removesuffix("_runs.parquet") for f in run_files]
first_real = real[0] if real else None
summary = {f"{who}_{what}_class": "n/a" for who in ("real", "sim") for what in ("case", "control")}
summary.update({f"{who}_case_delta_{end}": "n/a" for who in ("real", "sim") for end in ("first", "second")})
for engine, g in verdict.groupby("engine", sort=False):
    who = "sim" if engine.startswith("simulator") else ("real" if engine == first_real else None)
    if who is None:
        continue
    case, control = pick(g, case_sources), pick(g, control_sources)
    if len(case):
        summary[f"{who}_case_class"] = present.label(case.iloc[0]["cls"])
        summary[f"{who}_case_delta_first"] = present.signed(case.iloc[0]["d_first"], 3)
        summary[f"{who}_case_delta_second"] = present.signed(case.iloc[0]["d_second"], 3)
    if len(control):
        summary[f"{who}_control_class"] = present.label(control.iloc[0]["cls"])
for k, v in summary.items():
    glue(f"rq6_{k}", v, display=False)
glue("rq6_first_real", first_real or "none", display=False)
glue("rq6_case_first", source_label(case_sources[0]), display=False)
glue("rq6_case_second", source_label(case_sources[1]), display=False)

# %% [markdown]
# ## Refusals and each policy's ANWG on the real engine
#
# vLLM v1 requires `max_model_len` to be at most the token budget when chunked prefill is off, so the
# real engine runs `vllm_faithful` (2,560-token budget, chunked prefill off) with a smaller
# `max_model_len` than `slai_faithful`, and refuses every request whose prompt and output exceed it.
# A refused request is never completed, so it lowers that policy's ANWG whatever the scheduler does.
# Per source and policy, on the headline run (means over its runs, of
# {glue:text}`rq6_requests_per_run:s` requests each; *not refused*: the share of the requests the
# engine accepted):

# %%
head_tag = run_files[0].name.removesuffix("_runs.parquet")
head = case_runs(run_files[0])
head_keys = [k for k in ("window_id", "policy", "repetition") if k in head]
head_requests = realengine_dir() / f"{head_tag}_requests.parquet"
if head_requests.exists():
    sizes = pd.read_parquet(head_requests).groupby(head_keys).size().rename("n_requests").reset_index()
    head = head.merge(sizes, on=head_keys, how="left")
for col in ("max_model_len", "n_refused", "n_requests"):
    if col not in head:
        head[col] = np.nan
per_policy = (head.groupby(["source", "policy"])
              .agg(runs=("anwg", "size"), max_model_len=("max_model_len", "first"),
                   refused=("n_refused", "mean"), requests=("n_requests", "mean"),
                   completion_fraction=("completion_fraction", "mean"), anwg=("anwg", "mean"))
              .reset_index())
per_policy["not_refused"] = 1 - per_policy["refused"] / per_policy["requests"]
order = list(dict.fromkeys(list(case_sources) + list(control_sources)))
order = [s for s in order if s in set(per_policy["source"])]
per_policy["source"] = pd.Categorical(per_policy["source"], categories=order, ordered=True)
per_policy = per_policy.sort_values(["source", "policy"])
glue("rq6_requests_per_run", present.num(per_policy["requests"].median(), 0), display=False)
present.table(per_policy.drop(columns=["runs", "requests"]).rename(columns={"refused": "refused per run",
                                                                          "not_refused": "not refused"}),
              digits={"max_model_len": 0, "refused per run": 2, None: 3})

# %%
pp = per_policy.set_index(["source", "policy"])


def per_source(column: str, policy: str, digits: int) -> str:
    return present.join([f"{present.num(pp.loc[(s, policy), column], digits)} on {source_label(s)}"
                         for s in order if (s, policy) in pp.index])


env = json.loads((realengine_dir() / f"{head_tag}.json").read_text()).get("environment", {}) \
    if (realengine_dir() / f"{head_tag}.json").exists() else {}
shape = env.get("model_shape", {})
device = str(env.get("device", ""))
on = (f"a CPU host ({device.removeprefix('cpu (').removesuffix(')')})" if device.startswith("cpu (")
      else (device or "a CPU host"))
host = (f"vLLM {env.get('engine_version', '')}'s CPU build on {on} serving a random-weight "
        f"{shape.get('n_layers', '?')}-layer, {shape.get('hidden_size', '?')}-wide Llama"
        if env else "vLLM's CPU build on a CPU host serving a tiny random-weight model")
deltas_text = present.join([f"{present.signed(deltas.loc[(deltas['engine'] == head_tag) & (deltas['source'] == s), 'delta'].iloc[0], 3)} "
                            f"on {source_label(s)}" for s in order
                            if ((deltas["engine"] == head_tag) & (deltas["source"] == s)).any()])
sentence = (f"On the real engine — the {head_tag} runs, {host} — {policy_a} − {policy_b} mean ANWG at "
            f"{CASE_REGION} is {deltas_text}; the reversal classifier's verdict on the case "
            f"({pair_label(*case_sources)}) is {summary['real_case_class']}, on the control "
            f"({pair_label(*control_sources)}) {summary['real_control_class']}. Per policy, mean ANWG is "
            f"{per_source('anwg', policy_a, 3)} for {policy_a} and {per_source('anwg', policy_b, 3)} for "
            f"{policy_b}.")
mml = pp["max_model_len"].groupby(level="policy").first()
if mml.notna().all() and mml.nunique() > 1:
    refusals = []
    for pol in (policy_b, policy_a):
        total = pp.xs(pol, level="policy")["refused"]
        what = ("refused none" if (total == 0).all() else
                f"refused on average, of {present.num(pp['requests'].median(), 0)} requests per run, "
                f"{per_source('refused', pol, 2)}")
        refusals.append(f"{pol}, with max_model_len {present.num(mml[pol], 0)}, {what}")
    sentence += " The two policies ran with different admission limits: " + "; ".join(refusals) + "."
    worst = pp.xs(policy_b, level="policy")["refused"].idxmax()
    row = pp.loc[(worst, policy_b)]
    if row["refused"] > 0 and abs(row["anwg"] - row["not_refused"]) < 0.005:
        sentence += (f" On {source_label(worst)}, {policy_b}'s ANWG ({present.num(row['anwg'], 3)}) equals "
                     f"its share of requests not refused ({present.num(row['not_refused'], 3)}): every request "
                     f"it lost there was refused, not scheduled late, so this verdict does not separate "
                     f"scheduling from refusal.")


def case_file(tag: str) -> dict:
    path = realengine_dir() / f"{tag}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def limits_reading(tag: str, what: str) -> str:
    """One sentence on run ``tag`` (``what``: how its limits were set): its per-source difference,
    the classifier's verdict on the case and the control, what it refused, and its host against the
    headline run's."""
    if not tag:
        return ""
    runs = case_runs(realengine_dir() / f"{tag}_runs.parquet")
    d = deltas[deltas["engine"] == tag].set_index("source")
    g = verdict[verdict["engine"] == tag]
    case, control = pick(g, case_sources), pick(g, control_sources)
    refused = runs.groupby("source")["n_refused"].mean()
    same_refusals = runs.groupby(["window_id", "repetition"])["n_refused"].nunique().eq(1).all()
    n_requests = pd.read_parquet(realengine_dir() / f"{tag}_requests.parquet").groupby(
        [k for k in ("window_id", "policy", "repetition") if k in runs]).size().median()
    refusals = ("nothing refused" if not refused.any() else
                ("both refusing the same requests: " if same_refusals else "refusing ")
                + present.join([f"{present.num(refused[s_], 1)} on {source_label(s_)}" for s_ in order
                                if s_ in refused.index])
                + f" per run of {present.num(n_requests, 0)}")
    device = case_file(tag).get("environment", {}).get("device", "")
    head_device = case_file(head_tag).get("environment", {}).get("device", "")
    host = ""
    if device and device != head_device:
        ratio = runs["probe_ref_s"].median() / head["probe_ref_s"].median()
        host = (f"; on another host, {device.removeprefix('cpu (').removesuffix(')')}, whose fixed probe "
                f"took {present.num(ratio, 2)}× the headline host's")
    text = (f" {what} ({tag}: {runs['window_id'].nunique()} windows, {len(runs)} runs, {refusals}{host}), "
            f"{policy_a} − {policy_b} is "
            + present.join([f"{present.signed(d.loc[s_, 'delta'], 3)} on {source_label(s_)}"
                            for s_ in order if s_ in d.index])
            + (f"; the classifier calls the case {present.label(case.iloc[0]['cls'])}" if len(case) else "")
            + (f" and the control {present.label(control.iloc[0]['cls'])}" if len(control) else "")
            + ".")
    return text


def engine_setting(tag: str, key: str):
    return case_file(tag).get("engine_kwargs", {}).get(key) if tag else None


equal_mml = engine_setting(equal_limits_run, "max_model_len")
sentence += limits_reading(equal_limits_run, f"With the same admission limit for both, max_model_len "
                                             f"{present.num(float(equal_mml), 0) if equal_mml else '?'}")
study_mml = engine_setting(study_config_run, "max_model_len")
study_inflight = engine_setting(study_config_run, "max_in_flight")
if study_config_run:
    sentence += limits_reading(study_config_run,
                               f"In the study's real-system configuration, max_model_len "
                               f"{present.num(float(study_mml), 0) if study_mml else '?'} and whole-prompt "
                               f"admission for both and at most {study_inflight or '?'} requests in flight "
                               f"as its load generator had")
    longest = max(int((w.input_tokens + w.output_tokens).max()) for w in store.load_windows())
    sentence += (f" The study's own A100 verdict was measured in that configuration: both policies at the "
                 f"same limit, {present.num(float(study_mml), 0) if study_mml else '?'} tokens, which no request "
                 f"of the {len(store.load_windows())} windows exceeds (the longest has "
                 f"{present.num(longest, 0)}), so nothing was refused for its length.")
sentence += (" Every verdict here rests on a CPU host and a tiny random-weight model, not on the GPU and "
             "model of the original study.")
glue("rq6_conclusion", sentence, display=False)

# %% [markdown]
# ## The study's configuration: the simulator in it, and how settled the real result is
#
# The simulator's figures above come from a campaign in the study's *simulated* configuration (its
# load calibration, budget and SLO). The real runs of `study_config_run` ran in another: both
# policies at a 32,768-token budget and `max_model_len`, at most 32 requests in flight. Here the
# simulator is run in exactly that configuration, per window: the `vllm_v1` engine model, the
# step cost cross-validated by window on the case's own steps (one per policy), each window at the
# real run's load, and the client's in-flight cap (`portbench.realconfig`; written by
# `python benchmarks/predict_real_config.py`). The real result's interval here resamples the windows
# *and* each window's repetitions, so it carries the run-to-run noise as well.

# %%
study_pred = pd.DataFrame()
if study_config_run:
    pred_path = realengine_dir() / f"{study_config_run}_sim_config.parquet"
    if not pred_path.exists():
        raise FileNotFoundError(f"no {pred_path.name}: run `python benchmarks/predict_real_config.py --tag "
                                f"{study_config_run}` to simulate the case in its configuration")
    study_pred = pd.read_parquet(pred_path)
    study_runs = case_runs(realengine_dir() / f"{study_config_run}_runs.parquet")
    same_windows = set(study_runs["window_id"])
    sim_vllm_v1 = load_results("vllm_v1")
    rows = {
        "real engine (windows and repetitions resampled)": realconfig.repetition_resampled_delta(
            study_runs, n_resamples=n_resamples, seed=seed),
        "simulator, same configuration (vllm_v1)": study.case_deltas(study_pred, "", n_resamples=n_resamples, seed=seed),
    }
    for engine_name, table in (("lssp", sim_table if engine_model == "lssp" else load_results("lssp")),
                               ("vllm_v1", sim_vllm_v1)):
        same = table[table["window_id"].isin(same_windows) & (table["region"] == CASE_REGION)
                     & table["policy"].isin(CASE_POLICIES) & (table["slo_multiplier"] == 20.0)]
        rows[f"simulator, campaign configuration ({engine_name})"] = study.case_deltas(
            same, "", n_resamples=n_resamples, seed=seed)
    configured = pd.concat({k: v.set_index("source")[["delta", "ci_low", "ci_high"]] for k, v in rows.items()},
                           names=["prediction or measurement", "source"]).reset_index()
    real_row = rows["real engine (windows and repetitions resampled)"].set_index("source")
    pred_row = rows["simulator, same configuration (vllm_v1)"].set_index("source")
    camp_rows = {k: v.set_index("source") for k, v in rows.items() if "campaign" in k}

    def verdict_of(r) -> str:
        if r["ci_low"] > 0 or r["ci_high"] < 0:
            return "sign settled"
        if r["half_width"] <= 0.005:
            return "no difference beyond ±0.005"
        return "not settled"

    for src in real_row.index:
        glue(f"rq6_study_sim_delta_{src}", present.signed(pred_row.loc[src, "delta"], 3), display=False)
        glue(f"rq6_study_sim_ci_{src}", f"{present.signed(pred_row.loc[src, 'ci_low'], 3)} to "
                                        f"{present.signed(pred_row.loc[src, 'ci_high'], 3)}", display=False)
        glue(f"rq6_study_real_delta_{src}", present.signed(real_row.loc[src, "delta"], 3), display=False)
        glue(f"rq6_study_real_ci_{src}", f"{present.signed(real_row.loc[src, 'ci_low'], 3)} to "
                                         f"{present.signed(real_row.loc[src, 'ci_high'], 3)}", display=False)
        glue(f"rq6_study_real_verdict_{src}", verdict_of(real_row.loc[src]), display=False)
    signs = lambda table: {s_: np.sign(round(table.loc[s_, "delta"], 3)) for s_ in real_row.index}  # noqa: E731
    real_signs = signs(real_row)
    agree = {name: sum(signs(t)[s_] == real_signs[s_] for s_ in real_row.index)
             for name, t in [("configured", pred_row)] + list(camp_rows.items())}
    glue("rq6_study_sim_signs_agree", f"{agree['configured']} of {len(real_row)}", display=False)
    display(present.table(configured, digits=3))
    display(present.table(real_row.reset_index()[["source", "n_windows", "repetitions", "delta", "ci_low",
                                                  "ci_high", "half_width"]], digits=4))

    order_src = [s_ for s_ in ("azure_llm_2024", "burstgpt", "bailian_qwen") if s_ in real_row.index]

    def triple(table) -> str:
        return " / ".join(present.signed(table.loc[s_, "delta"], 3) for s_ in order_src)

    campaign_v1 = camp_rows["simulator, campaign configuration (vllm_v1)"]
    campaign_lssp = camp_rows["simulator, campaign configuration (lssp)"]
    cause = ("because of the configuration, not the model: vllm_v1 in the campaign's configuration gives "
             f"{triple(campaign_v1)}"
             if agree["configured"] > agree["simulator, campaign configuration (vllm_v1)"]
             else "not through the configuration alone: vllm_v1 in the campaign's configuration gives "
                  f"{triple(campaign_v1)}")
    settled = {s_: verdict_of(real_row.loc[s_]) for s_ in order_src}
    real_text = present.join([f"{present.signed(real_row.loc[s_, 'delta'], 3)} on {source_label(s_)} "
                              f"[{present.signed(real_row.loc[s_, 'ci_low'], 3)}, "
                              f"{present.signed(real_row.loc[s_, 'ci_high'], 3)}]" for s_ in order_src])
    reps = int(real_row["repetitions"].min())
    short = (f"In the study's real-system configuration — vLLM's CPU build, a tiny random-weight model, "
             f"{int(real_row['n_windows'].min())} windows per source, {present.count(reps, 'repetition')} — "
             f"{policy_a} − {policy_b} mean ANWG at {CASE_REGION} is {real_text} (95% CI, windows and "
             f"repetitions resampled): "
             + present.join([f"{source_label(s_)} {settled[s_]}"
                             + (f" (±{present.num(real_row.loc[s_, 'half_width'], 3)})"
                                if settled[s_] == "not settled" else "") for s_ in order_src]) + ". "
             f"The simulator in the same configuration predicts {triple(pred_row)} "
             f"({agree['configured']} of {len(order_src)} signs as measured). The lssp campaign's "
             f"{triple(campaign_lssp)} differs {cause}. The A100 measured "
             + " / ".join(present.signed(d, 3) for d in original.set_index("source").loc[order_src, "delta"])
             + f" ({' / '.join(source_label(s_) for s_ in order_src)}).")
    n_words = len(short.split())
    assert n_words <= 150, f"the short RQ6 finding has {n_words} words (at most 150)"
    glue("rq6_short_finding", short, display=False)
    glue("rq6_short_finding_words", n_words, display=False)
else:
    glue("rq6_short_finding", "No real run in the study's configuration is committed.", display=False)

# %% [markdown]
# The other cases ran in other configurations, and their simulated counterparts (request by request,
# in the fidelity chapter: the same windows, load, limits and refusals, the cost cross-validated by
# window) are that case's simulator in its own configuration. Per case and source, the real and
# simulated SLAI − vLLM ANWG (95% CI over windows) and whether the signs agree:

# %%
own_config = []
for f in run_files:
    tag = f.name.removesuffix("_runs.parquet")
    counterpart_path = realengine_dir() / f"{tag}_sim_requests.parquet"
    if not counterpart_path.exists():
        continue
    anwg = fidelity.anwg_from_counterpart(pd.read_parquet(counterpart_path))
    real_d = study.case_deltas(anwg.rename(columns={"anwg_real": "anwg"}), "real", n_resamples=n_resamples, seed=seed)
    sim_d = study.case_deltas(anwg.rename(columns={"anwg_sim": "anwg"}), "sim", n_resamples=n_resamples, seed=seed)
    both = real_d.merge(sim_d, on="source", suffixes=("_real", "_sim"))
    both["signs agree"] = np.sign(both["delta_real"].round(3)) == np.sign(both["delta_sim"].round(3))
    own_config.append(both.assign(case=tag))
if own_config:
    own = pd.concat(own_config, ignore_index=True)
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
# ## The GPU run: the study's configuration on an H200
#
# The same prepared script (`portbench realengine gpu --config study`, the transformers
# continuous-batching engine serving a random-weight model of Qwen2.5-0.5B's shape in bf16) was run on
# a lent H200, in the study's real-system configuration: both policies at a 32,768-token budget and
# `max_model_len`, whole-prompt admission, 256 sequences, at most 32 requests in flight, λ_ref searched
# on `vllm_faithful`. What it measured, read from its files (`data/results/realengine/<gpu_run>_*`):

# %%
gpu = {}
if gpu_run:
    names = {"tuning": f"{gpu_run}_tuning.json", "profile": f"{gpu_run}_step_profile.parquet",
             "cost": f"{gpu_run}_cost.json", "case": f"{gpu_run}_case.json", "runs": f"{gpu_run}_case_runs.parquet",
             "steps": f"{gpu_run}_case_steps.parquet", "calibration": f"{gpu_run}_case_calibration.parquet"}
    absent = [n for n in names.values() if not (realengine_dir() / n).exists()]
    if absent:
        raise FileNotFoundError(f"gpu_run={gpu_run!r}: no {', '.join(absent)} in {realengine_dir()}; "
                                f"set gpu_run to empty to leave the GPU run out")
    for key, name in names.items():
        path = realengine_dir() / name
        gpu[key] = json.loads(path.read_text()) if name.endswith(".json") else pd.read_parquet(path)
    tuning_rows = pd.DataFrame(gpu["tuning"]["tuning"])
    tuning_rows["CUDA graphs (prefill, decode)"] = tuning_rows["extra"].map(
        lambda e: str(json.loads(e).get("use_cuda_graph")))
    best_graphs = str(gpu["tuning"]["best_config"]["extra"].get("use_cuda_graph"))
    tuning_rows["chosen"] = (tuning_rows["CUDA graphs (prefill, decode)"] == best_graphs.replace("(", "[")
                             .replace(")", "]")) | (tuning_rows["CUDA graphs (prefill, decode)"] == best_graphs)
    display(Markdown(f"**Provenance**: {gpu['case']['environment'].get('gpu') or 'no GPU named'}, "
                     f"{gpu['case']['environment']['engine']} {gpu['case']['environment']['engine_version']}, "
                     f"{gpu['case']['environment']['date'][:10]}. **What the tuning chose** (a {len(tuning_rows)}-"
                     f"configuration tuning burst, {gpu['tuning']['tuning'][0].get('n_steps', '?')} steps each; the "
                     f"configuration whose replay, set-up included, took the least wall time):"))
    present.table(tuning_rows[["CUDA graphs (prefill, decode)", "setup_s", "wall_s", "tokens_per_s", "chosen"]],
                  digits={"setup_s": 2, "wall_s": 2, "tokens_per_s": 0})

# %%
if gpu:
    prof = gpu["profile"]
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

    runs_gpu, cal = gpu["runs"], gpu["calibration"]
    steps_gpu = gpu["steps"][gpu["steps"]["kept"].astype(bool)]
    per_run_s = float(runs_gpu["wall_s"].mean())
    probe_s = float(runs_gpu[["probe_before_s", "probe_after_s"]].mean().sum())
    repetitions = int(gpu_repetitions)
    need_runs = len(gpu["case"]["case"]["sources"]) * gpu_windows_per_source * len(CASE_POLICIES) * repetitions
    searches = len(gpu["case"]["case"]["sources"]) * gpu_windows_per_source
    per_search = float(cal.groupby("window_id").size().mean()) if len(cal) else 4.0
    need_s = need_runs * (per_run_s + probe_s) + searches * per_search * per_run_s
    cost = gpu["cost"]
    both = runs_gpu.groupby("window_id")["policy"].nunique().eq(2).sum()
    pinned = [w for w, e in gpu["case"]["lambda_ref_real"].items() if e.get("pinned")]
    glue("rq6_gpu_runs", len(runs_gpu), display=False)
    glue("rq6_gpu_step_ms", present.num(steps_gpu["duration_s"].median() * 1e3, 0), display=False)
    glue("rq6_gpu_run_s", present.num(per_run_s, 0), display=False)
    glue("rq6_gpu_need_min", present.num(need_s / 60, 0), display=False)
    glue("rq6_gpu_cost_error", present.pct(cost["case_steps"]["median_abs_rel_error"], 1), display=False)
    verdict_gpu = (
        f"On the {gpu['case']['environment'].get('gpu') or 'GPU'}, {present.count(len(runs_gpu), 'run')} of the case "
        f"{'was' if len(runs_gpu) == 1 else 'were'} made "
        f"({present.count(int(runs_gpu['window_id'].nunique()), 'window')}, "
        f"{present.join(sorted(set(runs_gpu['policy'])))}); {present.count(int(both), 'window')} ran under both "
        f"policies, so no SLAI − vLLM difference on this GPU can be estimated, and nothing here confirms or "
        f"contradicts the A100's "
        + " / ".join(present.signed(d, 3) for d in original.set_index("source").loc[list(CASE_SOURCES), "delta"])
        + f" ({' / '.join(source_label(s_) for s_ in CASE_SOURCES)}). "
        + (f"The λ_ref search of {present.join(pinned)} ended pinned at its low bound (the knee lies below "
           f"λ = {present.num(min(gpu['case']['lambda_ref_real'][w]['lambda'] for w in pinned), 2)}), so that run "
           f"is above HIGH_PRESSURE, not at it. " if pinned else "")
        + f"Why so few: this engine takes a median {present.num(steps_gpu['duration_s'].median() * 1e3, 0)} ms a "
        f"step on the real window (a median {present.num(steps_gpu['decode_seqs'].median(), 0)} decodes over "
        f"{present.num(steps_gpu['context_tokens'].median() / 1e3, 0)}k "
        f"context tokens; its paged attention grows with the context, see the profile), so one window replays in "
        f"about {present.num(per_run_s, 0)} s; the case at {gpu_windows_per_source} windows per source, "
        f"{present.count(repetitions, 'repetition')} and a λ_ref "
        f"search of {present.num(per_search, 0)} replays a window (the shortened search made here) needs at least "
        f"{present.num(need_s / 60, 0)} "
        f"device-minutes, against the {present.num(gpu_budget_s / 60, 0)} a lease gives.")
    glue("rq6_gpu_verdict", verdict_gpu, display=False)
    display(Markdown(
        f"The step cost refitted on this profile (relative least squares): "
        f"{present.num(cost['cost']['fixed_s'] * 1e3, 1)} ms + {present.num(cost['cost']['per_prefill_token_s'] * 1e6, 2)} µs "
        f"per prefill token + {present.num(cost['cost']['per_decode_seq_s'] * 1e6, 1)} µs per decoding sequence + "
        f"{present.num(cost['cost']['per_context_token_s'] * 1e9, 0)} ns per context token, "
        f"{present.pct(cost['fit_median_rel_error'], 1)} median error on the profile's {cost['profile_rows']} steps and "
        f"{present.pct(cost['case_steps']['median_abs_rel_error'], 1)} on the case run's "
        f"{present.num(cost['case_steps']['n'], 0)} steps (out of sample; contexts up to "
        f"{present.num(cost['case_steps']['max_context_tokens'], 0)} tokens, the profile's up to "
        f"{present.num(cost['case_steps']['max_profile_context_tokens'], 0)}), whose total it puts at "
        f"{present.pct(cost['case_steps']['sum_predicted_over_measured'], 0)} of the measured."))
    present.table(runs_gpu[["window_id", "policy", "lambda_ref_real", "lambda_pinned", "load_factor", "wall_s",
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
# :::{admonition} Finding
# :class: tip pb-finding
# {glue:text}`rq6_short_finding:s`
#
# In detail, over every committed configuration: {glue:text}`rq6_conclusion:s`
#
# Against the simulator: where the real engine has {glue:text}`rq6_real_case_delta_first` on
# {glue:text}`rq6_case_first` and {glue:text}`rq6_real_case_delta_second` on
# {glue:text}`rq6_case_second`, the simulator (engine model {glue:text}`rq6_engine`, all windows)
# has {glue:text}`rq6_sim_case_delta_first` and {glue:text}`rq6_sim_case_delta_second`. The
# reversal classifier calls the case ({glue:text}`rq6_case_pair`)
# **{glue:text}`rq6_real_case_class`** on the real engine and **{glue:text}`rq6_sim_case_class`** in
# the simulator, and the control ({glue:text}`rq6_control_pair`)
# **{glue:text}`rq6_real_control_class`** and **{glue:text}`rq6_sim_control_class`**.
# :::
