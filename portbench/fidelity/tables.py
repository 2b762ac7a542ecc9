"""The fidelity chapter's heavy computations, one function each, every one a stored result under
``data/results/fidelity/`` (:func:`portbench.stored.stored`: recomputed only when a real-engine case's
files, the campaign table, the windows or the code behind it (:data:`RESULT_CODE`) change).

Each function takes a case's tag (``<tag>_case_*`` under ``data/results/realengine/``), or a campaign
table's path, and the parameters the result depends on, and returns its tables (part → DataFrame):
the calibrated model against the real runs under the profile-fitted cost (:func:`profile_comparison`),
a case replayed with its own step times (:func:`replay_agreement`), the step cost cross-validated by
window (:func:`step_errors`), each run's simulated counterpart (:func:`counterpart`) and what is read
from it (:func:`cost_choices`, :func:`run_speed_latency`, :func:`like_for_like`, :func:`noise`,
:func:`admission_order`), each run judged by its own steps (:func:`own_step_speed`, :func:`run_speed`),
the head-of-line ablation (:func:`hol`) and the headline numbers (:func:`headline`). :func:`refresh`
brings the book's set up to date: ``python -m portbench.fidelity.tables [--force]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .. import results
from ..stored import frame_values, stored as _stored, values_frame

#: Package modules (files or folders under ``portbench/``) whose source decides these results.
RESULT_CODE = ("fidelity", "engine", "policies", "workload.py", "metrics.py", "stats", "regions.py",
               "repeatability.py", "store.py", "results.py", "stored.py", "realengine/__init__.py",
               "realengine/vllm_settings.py")
#: The folder under ``data/results/`` that holds them.
FOLDER = "fidelity"

#: The tags and engine models the book's fidelity chapter reads by default (its parameters cell).
BOOK_CASES = {"real_engine_tag": "vllm_cpu_guarded", "rq7_tag": "vllm_cpu_rq7", "equal_tag": "vllm_cpu_equal",
              "fixed_tag": "vllm_cpu_equal_fixed", "unguarded_tag": "vllm_cpu", "choice_tag": "vllm_cpu_choice"}
BOOK_ENGINES = {"engine_model": "lssp", "calibrated_engine_model": "vllm_v1"}


def stored(name: str, compute, **kwargs) -> dict:
    """:func:`portbench.stored.stored` in :data:`FOLDER`, keyed by the source of :data:`RESULT_CODE`."""
    from ..stored import source_fingerprint

    return _stored(FOLDER, name, compute, code=source_fingerprint(RESULT_CODE), **kwargs)


# --- a real-engine case's files -------------------------------------------------------------------
def case_paths(tag: str, data_dir=None) -> dict:
    """The case's runs, requests and steps files (those that exist), by name."""
    case = results.setup_case(tag, data_dir)
    return {name: case.path(name) for name in ("runs", "requests", "steps") if case.has(name)}


def cost_path(tag: str, data_dir=None):
    """``<tag>_cost.json``: the step cost fitted to the case's step profile."""
    return results.setup_case(tag, data_dir).path("cost")


def profile_cost(tag: str, data_dir=None):
    """The :class:`~portbench.engine.StepCost` of ``<tag>_cost.json``."""
    from ..engine import StepCost

    return StepCost(**json.loads(cost_path(tag, data_dir).read_text())["cost"])


def load(tag: str, data_dir=None) -> dict:
    """A case's ``runs``, ``requests``, ``steps`` (empty when it logged none) and ``windows``
    (window_id → Window)."""
    from .. import store

    paths = case_paths(tag, data_dir)
    case = {name: results.recorded_labels(pd.read_parquet(p)) for name, p in paths.items()}
    case.setdefault("steps", pd.DataFrame())
    case["windows"] = {w.window_id: w for w in store.load_windows(
        data_dir, window_ids=sorted(set(case["runs"]["window_id"])))}
    return case


def case_windows(tag: str, data_dir=None) -> list:
    return sorted(set(pd.read_parquet(case_paths(tag, data_dir)["runs"], columns=["window_id"])["window_id"]))


def _case_result(name: str, tag: str, compute, *, cost_tag=None, params=None, data_dir=None, refresh=False):
    """Result ``<tag>.<name>`` of a case: its files (and ``cost_tag``'s cost) and windows in the key."""
    inputs = list(case_paths(tag, data_dir).values()) + ([cost_path(cost_tag, data_dir)] if cost_tag else [])
    return stored(f"{tag}.{name}", compute, params={"tag": tag, "cost_tag": cost_tag, **(params or {})},
                  inputs=inputs, window_ids=case_windows(tag, data_dir), data_dir=data_dir, refresh=refresh)


# --- the calibrated model against the real runs ---------------------------------------------------
def profile_comparison(tag: str, cost_tag: str, *, data_dir=None, refresh=False) -> dict:
    """The case's runs against ``vllm_v1`` with ``cost_tag``'s profile-fitted cost
    (:func:`portbench.fidelity.sim_vs_real`): ``runs`` (per run, with the runs' host flags, drift and
    pinned λ, and each run's step ratio where the case logged steps), ``all`` and ``clean`` (the
    summaries over every run and over the runs the host guard accepted, :func:`values_frame`)."""
    from . import sim_vs_real, step_ratios

    def compute():
        case, cost = load(tag, data_dir), profile_cost(cost_tag, data_dir)
        runs = case["runs"]
        _, run_err, summary_all = sim_vs_real(runs, case["requests"], case["windows"], cost)
        _, _, summary_clean = sim_vs_real(runs, case["requests"], case["windows"], cost, exclude_host_flagged=True)
        keys = ["window_id", "policy", "repetition"]
        extra = [c for c in ("host_flagged", "drift", "lambda_pinned") if c in runs]
        if set(keys) <= set(run_err.columns):
            run_err = run_err.merge(runs[keys + extra], on=keys)
            steps = case["steps"]
            if len(steps):
                run_err = run_err.merge(step_ratios(steps[steps["kept"]], cost), on=keys, how="left")
            else:
                run_err["step_ratio"] = np.nan
        return {"runs": run_err, "all": values_frame(summary_all), "clean": values_frame(summary_clean)}

    return _case_result("profile_comparison", tag, compute, cost_tag=cost_tag, data_dir=data_dir, refresh=refresh)


# --- the schedule replayed with the real step times -----------------------------------------------
def replay_agreement(tag: str, cost_tag: str, *, slai_clock: str = "measured", arrivals: str = "trace",
                     data_dir=None, refresh=False) -> dict:
    """The case replayed with its own step times (:func:`portbench.fidelity.replayed_cost_comparison`,
    ``cost_tag``'s cost past a run's last step): ``steps`` and ``requests`` (the agreement tables by
    policy), ``classes`` (the disagreement classes counted), ``choice`` (agreement on the steps where
    the engine had a choice, where the step log tells), ``hol`` (agreement on the steps at which
    ``vllm_faithful``'s head-of-line rule fired, where the step log has its batches), ``means`` (the
    share of agreeing steps and requests)."""
    from .. import repeatability
    from . import agreement_table, class_counts, replayed_cost_comparison

    def compute():
        case = load(tag, data_dir)
        st, rq, _ = replayed_cost_comparison(case["runs"], case["requests"], case["steps"], case["windows"],
                                             profile_cost(cost_tag, data_dir), slai_clock=slai_clock,
                                             arrivals=arrivals)
        out = {"steps": agreement_table(st), "requests": agreement_table(rq), "classes": class_counts(st, rq),
               "means": values_frame({"steps": float(st["agree"].mean()), "requests": float(rq["agree"].mean())})}
        if {"running_before", "waiting_before"} <= set(case["steps"].columns):
            out["choice"] = repeatability.agreement_on_choice_steps(st, case["steps"])
        if "scheduled" in case["steps"] and "submit_step" in case["requests"]:
            out["hol"] = repeatability.agreement_on_hol_steps(st, repeatability.head_of_line_steps(
                case["steps"], case["requests"], case["runs"]))
        return out

    return _case_result(f"replay_{slai_clock}_{arrivals}", tag, compute, cost_tag=cost_tag,
                        params={"slai_clock": slai_clock, "arrivals": arrivals}, data_dir=data_dir, refresh=refresh)


# --- the step cost, cross-validated by window -----------------------------------------------------
def step_errors(tag: str, kinds=("linear", "shaped", "rich_median", "rich"), *, data_dir=None, refresh=False) -> dict:
    """Per cost model kind, the step-time error cross-validated by window
    (:func:`portbench.fidelity.step_error_table`; columns ``<kind>|n``, ``<kind>|median``,
    ``<kind>|p90``), and ``coefficients``: the rich cost's terms fitted on every step of each policy."""
    from . import RichStepCost, cross_validated_step_error, run_steps, step_error_table

    def compute():
        case = load(tag, data_dir)
        errors = pd.concat({kind: step_error_table(cross_validated_step_error(case["steps"], case["runs"], kind=kind))
                            for kind in kinds}, axis=1)
        errors.columns = [f"{kind}|{m}" for kind, m in errors.columns]
        coefficients = pd.concat({policy: RichStepCost.fit(g).table()
                                  for policy, g in run_steps(case["steps"]).groupby("policy")}, names=["policy"])
        return {"errors": errors, "coefficients": coefficients}

    return _case_result("step_errors", tag, compute, params={"kinds": list(kinds)}, data_dir=data_dir,
                        refresh=refresh)


def step_error_columns(errors: pd.DataFrame) -> pd.DataFrame:
    """:func:`step_errors`' table with its (kind, measure) columns again."""
    out = errors.copy()
    out.columns = pd.MultiIndex.from_tuples([tuple(c.split("|")) for c in errors.columns])
    return out


# --- each run's simulated counterpart, and what is read from it -----------------------------------
def _case_table(name: str, tag: str, table, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """A one-table result of a case: ``table(runs, requests, steps, windows)``, stored."""
    def compute():
        case = load(tag, data_dir)
        return {"table": table(case["runs"], case["requests"], case["steps"], case["windows"])}

    return _case_result(name, tag, compute, data_dir=data_dir, refresh=refresh)["table"]


def counterpart(tag: str, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """Each real run's counterpart per request with the cross-validated rich cost, one per policy
    (:func:`portbench.fidelity.counterpart_requests`)."""
    from . import counterpart_requests

    return _case_table("counterpart", tag, counterpart_requests, data_dir=data_dir, refresh=refresh)


def cost_choices(tag: str, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """The per-request errors under each of the rich cost's fitting choices
    (:func:`portbench.fidelity.cost_choice_errors`)."""
    from . import cost_choice_errors

    return _case_table("cost_choices", tag, cost_choice_errors, data_dir=data_dir, refresh=refresh)


def run_speed_latency(tag: str, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """The latency errors (:func:`portbench.fidelity.latency_error_table`) with each run's cost
    scaled to the run's own speed level: every run (``all``), then per source and per policy."""
    from . import counterpart_requests, latency_error_table, latency_errors

    def table(runs, requests, steps, windows):
        errors = latency_errors(counterpart_requests(runs, requests, steps, windows, speed_known=True))
        return pd.concat([latency_error_table(errors), latency_error_table(errors, "source"),
                          latency_error_table(errors, "policy")])

    return _case_table("run_speed_latency", tag, table, data_dir=data_dir, refresh=refresh)


def like_for_like(tag: str, *, n_resamples: int, seed: int, data_dir=None, refresh=False) -> pd.DataFrame:
    """Real against real and the model against real, within each (source, policy), with bootstrap
    intervals by window (:func:`portbench.fidelity.like_for_like` on :func:`counterpart`)."""
    from . import anwg_from_counterpart
    from . import like_for_like as compare

    def compute():
        anwg = anwg_from_counterpart(counterpart(tag, data_dir=data_dir))
        return {"table": compare(anwg, n_resamples=n_resamples, seed=seed)}

    return _case_result("like_for_like", tag, compute, params={"n_resamples": n_resamples, "seed": seed},
                        data_dir=data_dir, refresh=refresh)["table"]


def own_step_speed(tag: str, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """Each run judged by its own decode steps (:func:`portbench.fidelity.own_step_speed`)."""
    from . import own_step_speed as judge

    return _case_table("own_step_speed", tag, lambda runs, requests, steps, windows: judge(steps),
                       data_dir=data_dir, refresh=refresh)


def noise(tag: str, *, n_resamples: int, seed: int, data_dir=None, refresh=False) -> pd.DataFrame:
    """The model's per-request error beside the real engine's run-to-run difference
    (:func:`portbench.repeatability.noise_table` on :func:`counterpart`)."""
    from .. import repeatability

    def compute():
        paired = repeatability.paired_errors(counterpart(tag, data_dir=data_dir))
        return {"table": repeatability.noise_table(paired, n_resamples=n_resamples, seed=seed)}

    return _case_result("noise", tag, compute, params={"n_resamples": n_resamples, "seed": seed},
                        data_dir=data_dir, refresh=refresh)["table"]


def lifetime_speed_noise(tag: str, *, n_resamples: int, seed: int, data_dir=None, refresh=False) -> pd.DataFrame:
    """:func:`noise` once each request's simulated latencies are stretched by the host's measured
    speed over its life (:func:`portbench.repeatability.with_lifetime_speed`; the step cost
    cross-validated by window, as :func:`counterpart` fits it)."""
    from .. import repeatability
    from ..engine.stepcost import cross_validated_step_error

    def compute():
        case = load(tag, data_dir)
        c = counterpart(tag, data_dir=data_dir)
        speed = repeatability.lifetime_speed(c, cross_validated_step_error(case["steps"], case["runs"], kind="rich"))
        paired = repeatability.paired_errors(repeatability.with_lifetime_speed(c, speed))
        return {"table": repeatability.noise_table(paired, n_resamples=n_resamples, seed=seed)}

    return _case_result("lifetime_speed_noise", tag, compute, params={"n_resamples": n_resamples, "seed": seed},
                        data_dir=data_dir, refresh=refresh)["table"]


def run_speed(tag: str, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """Each run's speed factor (:func:`portbench.fidelity.run_speed_factors`)."""
    from . import run_speed_factors

    return _case_table("run_speed", tag, lambda runs, requests, steps, windows: run_speed_factors(steps, runs),
                       data_dir=data_dir, refresh=refresh)


def admission_order(tag: str, *, data_dir=None, refresh=False) -> pd.DataFrame:
    """Per run, the admission order of the model and of the other repetition against the run's
    (:func:`portbench.repeatability.admission_order_agreement` on :func:`counterpart`)."""
    from .. import repeatability

    return _case_result("admission_order", tag, lambda: {"runs": repeatability.admission_order_agreement(
        counterpart(tag, data_dir=data_dir))}, data_dir=data_dir, refresh=refresh)["runs"]


# --- the head-of-line ablation and the headline numbers -------------------------------------------
def hol(table_path, *, n_resamples: int, seed: int, data_dir=None, refresh=False) -> dict:
    """The head-of-line ablation at HIGH_PRESSURE on every window, at the λ_ref of the campaign table
    at ``table_path``: ``ablation`` (per window and policy) and ``reversals`` (the RQ2 classifier)."""
    from .. import store
    from . import hol_ablation, hol_reversals

    def compute():
        base = pd.read_parquet(table_path, columns=["window_id", "lambda_ref"])
        ablation = hol_ablation(store.load_windows(data_dir), base.groupby("window_id")["lambda_ref"].first().to_dict())
        return {"ablation": ablation, "reversals": hol_reversals(ablation, n_resamples=n_resamples, seed=seed)}

    return stored(f"hol.{_stem(table_path)}", compute, params={"n_resamples": n_resamples, "seed": seed},
                  inputs=[table_path], window_ids="all", data_dir=data_dir, refresh=refresh)


def headline(table_path, *, n_resamples: int, seed: int, data_dir=None, refresh=False) -> dict:
    """The RQ1–RQ5 headline numbers of the campaign table at ``table_path``
    (:func:`portbench.fidelity.headline_numbers`), as the dict it returns."""
    from . import headline_numbers

    def compute():
        return {"values": values_frame(headline_numbers(pd.read_parquet(table_path), n_resamples=n_resamples,
                                                        seed=seed))}

    return frame_values(stored(f"headline.{_stem(table_path)}", compute,
                               params={"n_resamples": n_resamples, "seed": seed}, inputs=[table_path],
                               data_dir=data_dir, refresh=refresh)["values"])


def _stem(path) -> str:
    return Path(path).stem


# --- the book's set -------------------------------------------------------------------------------
def refresh(*, n_resamples: int = 2000, seed: int = 0, force: bool = False, data_dir=None, progress=print) -> None:
    """Bring every stored result the fidelity chapter reads with these parameters (and its default
    cases and engine models) up to date; ``force`` recomputes even current ones."""
    from ..campaign import results_path

    t = BOOK_CASES
    guarded, equal, fixed, choice = t["real_engine_tag"], t["equal_tag"], t["fixed_tag"], t["choice_tag"]
    boot = {"n_resamples": n_resamples, "seed": seed}
    jobs = [
        lambda: profile_comparison(guarded, guarded, data_dir=data_dir, refresh=force),
        lambda: profile_comparison(t["unguarded_tag"], guarded, data_dir=data_dir, refresh=force),
        lambda: profile_comparison(t["rq7_tag"], guarded, data_dir=data_dir, refresh=force),
        lambda: replay_agreement(guarded, guarded, slai_clock="fixed", data_dir=data_dir, refresh=force),
        lambda: replay_agreement(guarded, guarded, data_dir=data_dir, refresh=force),
        lambda: step_errors(guarded, data_dir=data_dir, refresh=force),
        lambda: step_errors(equal, ("linear", "rich"), data_dir=data_dir, refresh=force),
        lambda: [counterpart(tag, data_dir=data_dir, refresh=force) for tag in (guarded, equal, fixed)],
        lambda: [cost_choices(tag, data_dir=data_dir, refresh=force) for tag in (guarded, equal)],
        lambda: run_speed_latency(guarded, data_dir=data_dir, refresh=force),
        lambda: [like_for_like(tag, **boot, data_dir=data_dir, refresh=force) for tag in (guarded, fixed)],
        lambda: own_step_speed(guarded, data_dir=data_dir, refresh=force),
        lambda: [replay_agreement(tag, guarded, arrivals=a, data_dir=data_dir, refresh=force)
                 for tag in (equal, fixed) for a in ("trace", "submitted")],
        lambda: noise(fixed, **boot, data_dir=data_dir, refresh=force),
        lambda: lifetime_speed_noise(fixed, **boot, data_dir=data_dir, refresh=force),
        lambda: run_speed(fixed, data_dir=data_dir, refresh=force),
        lambda: admission_order(fixed, data_dir=data_dir, refresh=force),
        lambda: results.setup_case(choice, data_dir).has("runs") and [
            replay_agreement(choice, guarded, arrivals="submitted", data_dir=data_dir, refresh=force),
            admission_order(choice, data_dir=data_dir, refresh=force),
            noise(choice, **boot, data_dir=data_dir, refresh=force)],
        lambda: hol(results_path(BOOK_ENGINES["engine_model"], data_dir), **boot, data_dir=data_dir, refresh=force),
        lambda: [headline(results_path(BOOK_ENGINES[e], data_dir), **boot, data_dir=data_dir, refresh=force)
                 for e in BOOK_ENGINES if results_path(BOOK_ENGINES[e], data_dir).exists()],
    ]
    import time

    t0 = time.perf_counter()
    for k, job in enumerate(jobs, 1):
        job()
        if progress:
            progress(f"[{k}/{len(jobs)}] {time.perf_counter() - t0:.1f} s")
    if progress:
        progress(f"the fidelity chapter's stored results are current ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Recompute the fidelity chapter's stored results where stale.")
    parser.add_argument("--force", action="store_true", help="recompute every result, current or not")
    args = parser.parse_args()
    refresh(force=args.force)
