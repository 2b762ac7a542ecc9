"""The fidelity chapter's sections on the first guarded case: each section's glued numbers, tables
and figures, read from the real-engine files and the stored results (:mod:`portbench.fidelity.tables`).

A section is a :class:`Section` — ``numbers`` (glue name → value), ``figures`` (glue key → figure) and
``shown`` (what the cell displays, in order) — built by one function from a :class:`Chapter` (the
notebook's parameters, and the case files and stored results it has read so far). This module holds
the sections on the guarded case (the profile-fitted cost, the calibrated model against the real
runs, the three parts simulator builders report, RQ7's runs); :mod:`.fidelity_cases` the later cases,
the engine's repeatability, the head-of-line ablation and the headline numbers.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from .. import present, results, stats
from ..fidelity import (DISAGREEMENT_CLASSES, PUBLISHED_FIDELITY, SHAPES, anwg_from_counterpart, conclusions_by_rule,
                        latency_error_table, latency_errors, predicted_step_s, tables)
from . import fidelity_figures as figures


@dataclasses.dataclass
class Section:
    """What one cell of the chapter glues, draws and shows."""

    numbers: dict = dataclasses.field(default_factory=dict)
    figures: dict = dataclasses.field(default_factory=dict)
    shown: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class Chapter:
    """The fidelity chapter's parameters (its notebook's), and what its sections read."""

    engine_model: str = "lssp"
    calibrated_engine_model: str = "vllm_v1"
    results_path: str = ""
    real_engine_tag: str = "vllm_cpu_guarded"
    rq7_tag: str = "vllm_cpu_rq7"
    equal_tag: str = "vllm_cpu_equal"
    fixed_tag: str = "vllm_cpu_equal_fixed"
    unguarded_tag: str = "vllm_cpu"
    choice_tag: str = "vllm_cpu_choice"
    n_resamples: int = 2000
    seed: int = 0
    slow_step_ratio: float = 1.8
    data_dir: Path | None = None

    def case(self, tag: str) -> results.Case:
        """The real-engine case of set-up ``tag`` (its files named by :mod:`portbench.results`)."""
        return results.setup_case(tag, self.data_dir)

    def has_case(self, tag: str) -> bool:
        return bool(tag) and self.case(tag).has("runs")

    @property
    def boot(self) -> dict:
        return {"n_resamples": self.n_resamples, "seed": self.seed}

    @property
    def base_path(self) -> Path:
        from ..campaign import results_path

        return Path(self.results_path) if self.results_path else results_path(self.engine_model, self.data_dir)

    @property
    def calibrated_path(self) -> Path:
        from ..campaign import results_path

        return results_path(self.calibrated_engine_model, self.data_dir)

    @cached_property
    def cost(self):
        """The guarded case's profile-fitted cost (None before it is fitted)."""
        if self.case(self.real_engine_tag).has("cost", "profile"):
            return tables.profile_cost(self.real_engine_tag, self.data_dir)
        return None

    @cached_property
    def steps(self) -> pd.DataFrame:
        steps = self.case(self.real_engine_tag).steps
        return steps if steps is not None else pd.DataFrame()

    @cached_property
    def runs(self) -> pd.DataFrame:
        return self.case(self.real_engine_tag).runs

    @cached_property
    def run_err(self) -> pd.DataFrame:
        """The guarded case's runs against the model (:func:`.tables.profile_comparison`), with
        ``abs_error`` and ``host`` (accepted or flagged); empty without a cost or runs."""
        if self.cost is None or not self.has_case(self.real_engine_tag):
            return pd.DataFrame()
        run_err = self.profile(self.real_engine_tag)["runs"]
        run_err["abs_error"] = (run_err["anwg_sim"] - run_err["anwg_real"]).abs()
        run_err["host"] = np.where(run_err["host_flagged"], "flagged", "accepted")
        return run_err

    def profile(self, tag: str) -> dict:
        return tables.profile_comparison(tag, self.real_engine_tag, data_dir=self.data_dir)

    @cached_property
    def counterpart(self) -> pd.DataFrame:
        return tables.counterpart(self.real_engine_tag, data_dir=self.data_dir)

    @cached_property
    def latency(self) -> pd.DataFrame:

        return latency_errors(self.counterpart)


# --- how the sections read ------------------------------------------------------------------------
#: What a reader reads for the keys of fidelity.sim_vs_real's summary.
SUMMARY_LABELS = {"n_runs": "runs", "median_abs_ttft_error_s": "median |TTFT error| (s)",
                  "median_abs_latency_error_s": "median |end-to-end latency error| (s)",
                  "median_relative_latency_error": "median relative latency error",
                  "mean_abs_anwg_error": "mean |ΔANWG|", "max_abs_anwg_error": "largest |ΔANWG|",
                  "tau_b_anwg": "τ_b between real and model ANWG",
                  "n_refused_sim": "requests the model refused",
                  "n_refused_mismatch": "requests refused on one side only",
                  "runs": "runs", "mean_abs_error": "mean |ΔANWG|", "share_of_error": "share of summed |ΔANWG|",
                  "median_step_ratio": "median step ratio", "host": "host guard",
                  "abs_error": "|ΔANWG|", "mean_abs_delta": "mean |ΔANWG|"}


def summary_table(columns: dict):
    """Summaries (name → dict of sim_vs_real's summary keys) side by side, one row per measure,
    counts as whole numbers and the rest to three decimals."""
    keys = list(dict.fromkeys(k for col in columns.values() for k in col))
    rows = []
    for key in keys:
        row = {"measure": SUMMARY_LABELS.get(key, key)}
        for name, col in columns.items():
            value = col.get(key, float("nan"))
            row[name] = present.num(value, 0 if key.startswith("n_") or key == "runs" else 3)
        rows.append(row)
    return present.table(pd.DataFrame(rows))


def percent_table(frame):
    """A table of shares shown as percentages, one decimal."""
    return present.table((frame * 100).rename(columns=lambda c: f"{c} (%)"), digits=1)


def latency_groups(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 errors (``latency_error_table``) for every run, the runs the probe guard
    accepted, each source and each policy, one row each."""

    table = latency_error_table
    groups = pd.concat([table(errors).rename(index={"all": "every run"}),
                        table(errors[~errors["host_flagged"]]).rename(index={"all": "probe guard accepted"}),
                        table(errors, "source"), table(errors, "policy")])
    groups.index = [present.label(g) for g in groups.index]
    groups.index.name = "runs"
    return groups


def agreement_shown(tables_: dict, names: list[str]):
    """Agreement tables (name → step or request table) stacked, shares in % and the rows counted."""
    shown = pd.concat(tables_, names=names)
    shown = (shown.drop(columns="n") * 100).rename(columns=lambda c: f"{c} (%)").join(shown["n"].rename("rows"))
    return shown


# --- 1. the cost model, refitted to the real engine's step profile ----------------------------------
def opening(ch: Chapter) -> Section:
    return Section(numbers={"fid_base_engine": ch.engine_model, "fid_calibrated_engine": ch.calibrated_engine_model,
                            "fid_real_tag": present.label(ch.real_engine_tag),
                            "fid_calibrated_state": "present" if ch.calibrated_path.exists() else "not run yet"})


def cost_fit(ch: Chapter) -> Section:
    from IPython.display import Markdown


    case = ch.case(ch.real_engine_tag)
    if ch.cost is None:
        return Section(shown=[Markdown(f"No refitted cost ({case.path('cost').name}) yet.")])
    cost, fit = ch.cost, case.cost
    profile = case.profile
    profile = profile[profile["clean"]] if "clean" in profile else profile
    pred = predicted_step_s(cost, profile["prefill_tokens"], profile["decode_seqs"], profile["kv_context_tokens"])
    terms = pd.DataFrame({"term": ["fixed, per step", "per prefill token", "per decoding sequence",
                                   "per context token read", "gap between steps"],
                          "time (µs)": [cost.fixed_s * 1e6, cost.per_prefill_token_s * 1e6,
                                        cost.per_decode_seq_s * 1e6, cost.per_context_token_s * 1e6,
                                        cost.gap_s * 1e6]})
    return Section(numbers={"fid_fit_error": float(fit["fit_median_rel_error"]), "fid_gap_ms": cost.gap_s * 1e3,
                            "fid_fit_error_text": present.pct(fit["fit_median_rel_error"], 1),
                            "fid_profile_rows": present.count(fit["profile_rows"], "clean profile step")},
                   figures={"fidelity_step_fit": figures.step_fit(profile, pred)},
                   shown=[present.table(terms, digits=3)])


def fit_by_range(ch: Chapter) -> Section:
    by_range = ch.case(ch.real_engine_tag).fit_by_range
    if by_range is None:
        return Section()
    grid = by_range.pivot_table(index="prefill_bin", columns="decode_bin", values="median_rel_error",
                                sort=False) * 100
    grid = grid.loc[sorted(grid.index, key=lambda b: int(str(b).split("-")[0]))]
    grid.index = grid.index.astype(str).str.replace("-", "–").rename("prefill tokens")
    grid.columns = [f"{str(c).replace('-', '–')} decoding" for c in grid.columns]
    return Section(numbers={"fid_fit_error_worst": float(by_range["median_rel_error"].max())},
                   shown=[present.table(grid, digits=1)])


def scheduler_share(ch: Chapter) -> Section:
    from ..realengine.study import scheduler_time

    if not len(ch.steps):
        return Section()
    steps = ch.steps[ch.steps["kept"]]
    sched_grid = scheduler_time(steps).pivot_table(index="queue_bin", columns="policy", values="median_ms",
                                                   observed=True)
    sched_grid.index = sched_grid.index.astype(str).str.replace(">=", "≥ ").str.replace("-", "–")
    sched_grid.index.name = "waiting requests"
    sched_grid.columns = [f"{c}, median (ms)" for c in sched_grid.columns]
    share = (steps.groupby("policy")["schedule_s"].sum() / steps.groupby("policy")["duration_s"].sum())
    numbers = {f"fid_sched_share_{policy}": float(value) for policy, value in share.items()}
    numbers["fid_sched_share_text"] = present.join([f"{present.pct(v, 1)} of {p}'s" for p, v in share.items()]) \
        + " step time"
    return Section(numbers=numbers, shown=[present.table(sched_grid, digits=3)])


# --- 2. the calibrated model against the real engine ----------------------------------------------
def sim_vs_real(ch: Chapter) -> Section:
    from IPython.display import Markdown

    if not len(ch.run_err):
        return Section(shown=[Markdown("No real-engine case results to compare yet.")])
    result = ch.profile(ch.real_engine_tag)
    summary_all, summary_clean = tables.frame_values(result["all"]), tables.frame_values(result["clean"])
    numbers = {f"fid_{name}_{key}": value for name, summary in (("all", summary_all), ("clean", summary_clean))
               for key, value in summary.items()}
    runs = ch.runs
    case = ch.case(ch.real_engine_tag).provenance.get("case", {})
    planned = (case.get("n_per_source", 0) * len(case.get("sources", ())) * len(case.get("policies", ()))
               * case.get("repetitions", 1))
    goal = summary_clean.get("mean_abs_anwg_error", np.nan) <= 0.05 and summary_clean.get("tau_b_anwg", np.nan) >= 0.8
    numbers.update({"fid_n_pinned": int(runs.groupby("window_id")["lambda_pinned"].first().sum()),
                    "fid_n_windows": int(runs["window_id"].nunique()),
                    "fid_case_state": "the whole case" if len(runs) >= planned else f"so far, of {planned} planned",
                    "fid_n_flagged": int(runs["host_flagged"].sum()), "fid_goal": "met" if goal else "not met"})
    return Section(numbers=numbers, shown=[summary_table({"all runs": summary_all,
                                                          "host guard accepted": summary_clean})])


def error_sources(ch: Chapter) -> Section:
    run_err = ch.run_err
    if not len(run_err):
        return Section()
    decomposition = (run_err.groupby(["policy", "source", "host"])
                     .agg(runs=("abs_error", "size"), mean_abs_error=("abs_error", "mean"),
                          share_of_error=("abs_error", "sum"), median_step_ratio=("step_ratio", "median"))
                     .reset_index())
    decomposition["share_of_error"] /= run_err["abs_error"].sum()
    by_source = run_err.groupby("source")["abs_error"].sum() / run_err["abs_error"].sum()
    ratio_by_host = run_err.groupby("host")["step_ratio"].agg(["min", "median", "max"])
    numbers = {"fid_flagged_share": float(run_err.loc[run_err["host_flagged"], "abs_error"].sum()
                                          / run_err["abs_error"].sum()),
               "fid_worst_source": _source(by_source.idxmax()),
               "fid_worst_source_share": float(by_source.max())}
    for host, row in ratio_by_host.iterrows():
        numbers[f"fid_step_ratio_{host}"] = f"{row['min']:.2f}–{row['max']:.2f} (median {row['median']:.2f})"
    # how the step times of flagged runs compare with what their probes said (glued into the finding)
    med = ratio_by_host["median"]
    if {"flagged", "accepted"} <= set(med.index):
        slower = med["flagged"] / med["accepted"] - 1
        probe_drift = float(run_err.loc[run_err["host"] == "flagged", "drift"].median())
        if slower <= 0.05:
            reading = "their steps were no slower than the accepted runs': the probes drifted, the runs did not"
        elif slower < probe_drift / 2:
            reading = (f"the host was slower during them ({slower:.0%} by the median step), but by far less "
                       f"than their probes said (median drift {probe_drift:.0%})")
        else:
            reading = (f"the host was slower during them ({slower:.0%} by the median step), about as much as "
                       f"their probes said (median drift {probe_drift:.0%})")
    else:
        reading = "no run falls on both sides of the guard to compare"
    numbers["fid_flagged_reading"] = reading
    ratio_by_host.index.name = "host guard"
    return Section(numbers=numbers, shown=[
        present.table(ratio_by_host.rename(columns={"min": "lowest step ratio", "median": "median step ratio",
                                                    "max": "highest step ratio"}), digits=2),
        present.table(decomposition.rename(columns=SUMMARY_LABELS), digits=3)])


def _source(source) -> str:
    from ..book import source_label

    return source_label(str(source))


def noise_floor(ch: Chapter) -> Section:

    run_err = ch.run_err
    if not (len(run_err) and run_err["repetition"].nunique() > 1):
        return Section()
    reps = run_err.pivot_table(index=["window_id", "policy"], columns="repetition", values="anwg_real")
    noise = (reps[0] - reps[1]).abs()
    both = reps[[0, 1]].dropna()
    noise_tau = stats.kendall_tau_b(both[0].to_numpy(), both[1].to_numpy())
    numbers = {
        "fid_noise_floor": float(noise.mean()), "fid_noise_tau_b": float(noise_tau),
        "fid_noise_vs_goal": "a τ_b of 0.8 is more than two runs of the same engine reach on this machine"
        if noise_tau < 0.8 else "the engine reaches the 0.8 goal against itself, so the gap to it is the model's",
        "fid_noise_text": f"{present.num(noise.mean(), 3)} on average over "
                          f"{present.count(noise.notna().sum(), 'pair')} (largest {present.num(noise.max(), 3)}); "
                          f"τ_b between the two repetitions is {present.num(noise_tau, 2)}",
        "fid_step_ratio_range": f"{run_err['step_ratio'].min():.2f}–{run_err['step_ratio'].max():.2f}"}
    fig = figures.sim_vs_real(run_err, ch.calibrated_engine_model, ch.slow_step_ratio)
    return Section(numbers=numbers, figures={"fidelity_sim_vs_real": fig})


def slow_runs(ch: Chapter) -> Section:
    run_err = ch.run_err
    if not (len(run_err) and run_err["step_ratio"].notna().any()):
        return Section()
    slow = run_err["step_ratio"] >= ch.slow_step_ratio
    rest = run_err[~slow & ~run_err["host_flagged"]]
    rest_summary = {"runs": len(rest), "mean_abs_anwg_error": float(rest["abs_error"].mean()),
                    "tau_b_anwg": stats.kendall_tau_b(rest["anwg_real"].to_numpy(), rest["anwg_sim"].to_numpy())
                    if len(rest) > 2 else float("nan")}
    numbers = {"fid_n_slow": int(slow.sum()), "fid_n_slow_accepted": int((slow & ~run_err["host_flagged"]).sum()),
               **{f"fid_rest_{key}": value for key, value in rest_summary.items()}}
    return Section(numbers=numbers, shown=[summary_table({"accepted, step ratio below the threshold": rest_summary})])


def unguarded(ch: Chapter) -> Section:
    if ch.cost is None or not ch.has_case(ch.unguarded_tag):
        return Section()
    summary = tables.frame_values(ch.profile(ch.unguarded_tag)["all"])
    return Section(numbers={f"fid_unguarded_{key}": value for key, value in summary.items()},
                   shown=[summary_table({f"{ch.unguarded_tag} (unguarded)": summary})])


# --- the three parts simulator builders report, on the guarded case ------------------------------
def replay_guarded(ch: Chapter) -> Section:

    tag = ch.real_engine_tag
    fixed = tables.frame_values(tables.replay_agreement(tag, tag, slai_clock="fixed", data_dir=ch.data_dir)["means"])
    replay = tables.replay_agreement(tag, tag, data_dir=ch.data_dir)
    step_agreement, request_agreement = replay["steps"], replay["requests"]
    numbers = {"fid_replay_step_agreement_fixed_clock": fixed["steps"],
               "fid_replay_request_agreement_fixed_clock": fixed["requests"],
               "fid_guarded_replay_step_agreement": float(step_agreement.loc[0, "agree"]),
               "fid_guarded_replay_request_agreement": float(request_agreement.loc[0, "agree"])}
    for what, table in (("step", step_agreement), ("request", request_agreement)):
        for _, row in table.iloc[1:].iterrows():
            numbers[f"fid_guarded_replay_{what}_agreement_{row['group']}"] = float(row["agree"])
    agreement = agreement_shown({"steps": step_agreement.set_index("group"),
                                 "requests": request_agreement.set_index("group")}, ["compared", "policy"])
    return Section(numbers=numbers, shown=[
        present.table(agreement.rename(index={"all": "all policies"}), digits=2),
        present.table(pd.DataFrame({"class": list(DISAGREEMENT_CLASSES),
                                    "what the class means": list(DISAGREEMENT_CLASSES.values())}))])


def step_cost(ch: Chapter) -> Section:

    result = tables.step_errors(ch.real_engine_tag, data_dir=ch.data_dir)
    step_errors = tables.step_error_columns(result["errors"]).rename(columns={"rich_median": "rich, median"})
    small = [i for i in step_errors.index if i.startswith("small")][0]
    numbers = {"fid_cv_step_error_linear_small": float(step_errors.loc[small, ("linear", "median")]),
               "fid_cv_step_error_shaped_small": float(step_errors.loc[small, ("shaped", "median")]),
               "fid_cv_step_error_shaped_decode": float(step_errors.loc["decode only", ("shaped", "median")]),
               "fid_cv_step_error_rich_small": float(step_errors.loc[small, ("rich", "median")]),
               "fid_cv_step_error_rich_median_small": float(step_errors.loc[small, ("rich, median", "median")])}
    for shape in SHAPES:
        numbers[f"fid_cv_step_error_rich_{shape.replace(' ', '_')}"] = float(step_errors.loc[shape, ("rich", "median")])
    step_table = step_errors.drop(columns=[(k, "n") for k in ("shaped", "rich, median", "rich")])
    step_table = step_table.mul([1] + [100] * (len(step_table.columns) - 1))
    step_table.columns = ["steps" if m == "n" else f"{kind} {m} (%)" for kind, m in step_table.columns]
    step_table.index.name = "batch range"
    return Section(numbers=numbers, shown=[
        present.table(step_table, digits={"steps": 0, None: 1}),
        present.table(result["coefficients"].rename(columns=lambda c: f"{c} (µs per unit)") * 1e6, digits=4)])


def latency(ch: Chapter) -> Section:

    latency_ = ch.latency
    overall = latency_error_table(latency_).iloc[0]
    accepted = latency_error_table(latency_[~latency_["host_flagged"]]).iloc[0]
    return Section(numbers={
        "fid_guarded_e2e_median_rel_error": float(overall["end-to-end median"]),
        "fid_guarded_e2e_p90_rel_error": float(overall["end-to-end p90"]),
        "fid_guarded_ttft_median_rel_error": float(overall["TTFT median"]),
        "fid_guarded_tbt_median_rel_error": float(overall["TBT median"]),
        "fid_guarded_e2e_median_rel_error_accepted": float(accepted["end-to-end median"]),
        "fid_guarded_e2e_verdict": "it reproduces that case's per-request timing to the field's standard"
        if float(overall["end-to-end median"]) <= 0.10 else
        "it does not reproduce that case's per-request timing to the field's standard"},
        shown=[percent_table(latency_groups(latency_))])


def cost_choices(ch: Chapter) -> Section:
    return Section(shown=[percent_table(tables.cost_choices(ch.real_engine_tag, data_dir=ch.data_dir))])


def run_speed(ch: Chapter) -> Section:

    errors = tables.run_speed_latency(ch.real_engine_tag, data_dir=ch.data_dir)
    overall = errors.iloc[0]
    group = errors.rename(index={"all": "every run"})
    group.index = [present.label(g) for g in group.index]
    group.index.name = "runs, each at its own speed"
    published = pd.DataFrame(PUBLISHED_FIDELITY)
    published["value"] = [("under " if b == "under" else "") + present.pct(v, 1)
                          for b, v in zip(published["bound"], published["value"])]
    return Section(numbers={"fid_guarded_e2e_median_rel_error_run_speed": float(overall["end-to-end median"]),
                            "fid_guarded_e2e_p90_rel_error_run_speed": float(overall["end-to-end p90"])},
                   figures={"fidelity_e2e_error": figures.e2e_error(ch.latency)},
                   shown=[percent_table(group),
                          present.table(published[["simulator", "figure", "value", "source"]])])


def like_for_like(ch: Chapter) -> Section:

    like = tables.like_for_like(ch.real_engine_tag, **ch.boot, data_dir=ch.data_dir)
    like_shown = like[["source", "policy", "comparison", "windows"]].copy()
    like_shown["mean |ΔANWG| (95% CI)"] = [f"{present.num(m, 3)} ({present.num(lo, 3)}–{present.num(hi, 3)})"
                                           for m, lo, hi in zip(like["mean_abs_delta"], like["mean_abs_lo"],
                                                                like["mean_abs_hi"])]
    like_shown["τ_b (95% CI)"] = [f"{present.num(t, 2)} ({present.num(lo, 2)} to {present.num(hi, 2)})"
                                  for t, lo, hi in zip(like["tau_b"], like["tau_lo"], like["tau_hi"])]
    speed = tables.own_step_speed(ch.real_engine_tag, data_dir=ch.data_dir)
    by_rule = conclusions_by_rule(anwg_from_counterpart(ch.counterpart), ch.latency, speed)
    by_rule.columns = [f"real Δ, {_source(c.removeprefix('slai − vllm, '))}" if c.startswith("slai − vllm, ")
                       else c for c in by_rule.columns]
    return Section(numbers={"fid_n_step_flagged": int(speed["step_flagged"].sum())}, shown=[
        present.table(like_shown),
        present.table(by_rule.rename(columns={"e2e median error": "median end-to-end error"}), digits=3)])


def rq7(ch: Chapter) -> Section:
    if not ch.has_case(ch.rq7_tag):          # no RQ7 case: the finding's sentence reads "nan" and 0 runs
        return Section(numbers={"fid_rq7_mean_abs_anwg_error": float("nan"), "fid_rq7_tau_b": float("nan"),
                                "fid_rq7_n_runs": 0, "fid_rq7_n_flagged": 0, "fid_rq7_max_retries": -1,
                                "fid_rq7_noise_mean_abs_anwg": float("nan")})
    result = ch.profile(ch.rq7_tag)
    rq7_runs, rq7_err = ch.case(ch.rq7_tag).runs.copy(), result["runs"]
    summary = tables.frame_values(result["all"])
    meta = ch.case(ch.rq7_tag).provenance
    # the same figure between the real engine's two repetitions of each (window, policy)
    wide = rq7_runs.pivot_table(index=["window_id", "policy"], columns="repetition", values="anwg")
    rq7_err["abs_error"] = (rq7_err["anwg_sim"] - rq7_err["anwg_real"]).abs()
    grid = rq7_err.pivot_table(index="policy", columns="source", values="abs_error")
    grid.columns = [f"{_source(c)}, mean |ΔANWG|" for c in grid.columns]
    return Section(numbers={
        "fid_rq7_mean_abs_anwg_error": float(summary["mean_abs_anwg_error"]),
        "fid_rq7_tau_b": float(summary["tau_b_anwg"]), "fid_rq7_n_runs": int(summary["n_runs"]),
        "fid_rq7_n_flagged": int(rq7_runs["host_flagged"].sum()),
        "fid_rq7_max_retries": int(meta.get("case", {}).get("max_retries", -1)),
        "fid_rq7_noise_mean_abs_anwg": float((wide[0] - wide[1]).abs().mean())
        if {0, 1} <= set(wide.columns) else float("nan")}, shown=[present.table(grid, digits=3)])
