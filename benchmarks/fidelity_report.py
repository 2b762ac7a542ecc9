"""Fidelity of the vllm_v1 model against the committed real-engine runs (no engine is run):

    python benchmarks/fidelity_report.py [--tag vllm_cpu_guarded] [--rq7-tag vllm_cpu_rq7] [--write]
    python benchmarks/fidelity_report.py --tag vllm_cpu_equal     # the equal-limits case
    python benchmarks/fidelity_report.py --tag vllm_cpu_equal_fixed   # ... re-run with the port fixed

``--tag`` names the case (default the first guarded case; ``vllm_cpu_equal`` or
``vllm_cpu_equal_case``: the same RQ6 case with max_model_len 2,560 for both policies, each step's
batch and each request's submission logged; ``vllm_cpu_equal_fixed``: that case re-run with the
two port rules its replay named fixed, the chapter's headline). Every run is replayed as it ran (its
max_model_len);
where the case logged each step's batch, each step's exact set of requests and tokens is compared
as well as the counts, the race class is read from each request's ``submit_step``, and a second
replay gives each request the arrival that makes the model first see it at its real submission step.

Prints the replayed-cost schedule agreement (steps and requests, each disagreement's class), the
step cost's error cross-validated by window (linear, per-shape, rich and its robust fit alone), the
per-request latency errors with the cross-validated rich cost (and, apart, at each run's own speed, and
under each of the cost's fitting choices), the like-for-like comparison, the conclusions under each
rule for keeping runs and the RQ7 runs' mean |ΔANWG|. ``--write`` stores each run's simulated
counterpart per request (``<tag>_case_sim_requests.parquet``).
"""

import argparse
import time

import pandas as pd

from portbench import fidelity, results, store


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=fidelity.GUARDED_TAG, help="the real-engine case (default: the guarded one)")
    ap.add_argument("--rq7-tag", default="vllm_cpu_rq7")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--n-resamples", type=int, default=2000)
    ap.add_argument("--write", action="store_true", help="store the counterparts beside the case")
    args = ap.parse_args()
    pd.set_option("display.width", 200)
    t0 = time.perf_counter()
    case = fidelity.load_case(args.tag)
    args.tag = case["tag"]
    runs, requests, steps, windows = case["runs"], case["requests"], case["steps"], case["windows"]
    profile_cost = case["profile_cost"]
    mml = runs.groupby("policy")["max_model_len"].agg(lambda v: sorted(set(v.dropna().astype(int))))
    print(f"case {args.tag}: {len(runs)} runs; max_model_len by policy {mml.to_dict()}; fallback step cost "
          f"from {case['cost_tag']}_cost.json")

    replays = [("fixed", "trace"), ("measured", "trace")]
    if "submit_step" in requests:
        replays.append(("measured", "submitted"))
    for clock, arrivals in replays:
        st, rq, _ = fidelity.replayed_cost_comparison(runs, requests, steps, windows, profile_cost,
                                                      slai_clock=clock, arrivals=arrivals)
        print(f"1. replayed-cost schedule agreement, slai_faithful's Θ clock {clock!r}, arrivals {arrivals!r} "
              "(share of steps / of served requests identical; classes as shares of all rows)")
        print("steps:\n" + fidelity.agreement_table(st).round(4).to_string(index=False))
        print("requests:\n" + fidelity.agreement_table(rq).round(4).to_string(index=False))
        print("classes (episodes of consecutive disagreeing steps, their steps, the requests they name):\n"
              + fidelity.class_counts(st, rq).to_string())

    print(f"\n2. step cost, cross-validated by window ({args.folds} folds): relative error")
    for kind in ("linear", "shaped", "rich_median", "rich"):
        err = fidelity.cross_validated_step_error(steps, runs, k=args.folds, kind=kind)
        print(f"{kind}:\n" + fidelity.step_error_table(err).round(3).to_string())
    every = fidelity.run_steps(steps)
    for policy, g in every.groupby("policy"):
        print(f"rich cost fitted on every step of {policy} (ms per unit):\n"
              + (fidelity.RichStepCost.fit(g).table() * 1e3).to_string(float_format="%.6f"))

    cp = fidelity.counterpart_requests(runs, requests, steps, windows, k=args.folds, kind="rich")
    errors = fidelity.latency_errors(cp)
    speed = fidelity.own_step_speed(steps)
    own_ok = errors.merge(speed[fidelity.RUN_KEYS + ["step_flagged"]], on=fidelity.RUN_KEYS, how="left")
    own_ok = ~own_ok["step_flagged"].fillna(True).astype(bool).to_numpy()
    print("\n3. per-request relative error, cross-validated rich cost (the headline)")
    for label, e in (("every run", errors), ("probe guard accepted", errors[~errors["host_flagged"]]),
                     ("own steps at the case's speed", errors[own_ok])):
        print(f"{label}:\n" + fidelity.latency_error_table(e).round(3).to_string())
    print(fidelity.latency_error_table(errors, "source").round(3).to_string())
    print(fidelity.latency_error_table(errors, "policy").round(3).to_string())
    known = fidelity.latency_errors(fidelity.counterpart_requests(runs, requests, steps, windows, k=args.folds,
                                                                  kind="rich", speed_known=True))
    print("separate reading, NOT a prediction: each run's cost scaled by its own measured decode speed "
          "(host drift taken out)")
    print(fidelity.latency_error_table(known).round(3).to_string())
    print(fidelity.latency_error_table(known, "source").round(3).to_string())
    print("how the rich cost's fitting choices move the per-request errors:")
    print(fidelity.cost_choice_errors(runs, requests, steps, windows, k=args.folds).round(3).to_string())
    print("published, for scale:")
    print(pd.DataFrame(fidelity.PUBLISHED_FIDELITY).to_string(index=False))

    anwg = fidelity.anwg_from_counterpart(cp)
    print("\n4. like for like (mean |ΔANWG| and τ_b over the same windows, 95% bootstrap by window)")
    print(fidelity.like_for_like(anwg, n_resamples=args.n_resamples).round(3).to_string(index=False))
    print("conclusions by the rule that keeps runs:")
    print(fidelity.conclusions_by_rule(anwg, errors, speed).round(3).to_string())

    rq7 = results.case_of(args.rq7_tag)
    if rq7.has("runs"):
        r7, r7_req = rq7.runs, rq7.requests
        r7_win = {w.window_id: w for w in store.load_windows(window_ids=sorted(set(r7["window_id"])))}
        _, per_run, summary = fidelity.sim_vs_real(r7, r7_req, r7_win, profile_cost)
        print(f"\nRQ7 runs ({args.rq7_tag}, {summary['n_runs']} runs, profile cost): mean |ΔANWG| "
              f"{summary['mean_abs_anwg_error']:.3f}, τ_b {summary['tau_b_anwg']:.2f}")
    if args.write:
        print(f"\nwrote {fidelity.write_counterparts(args.tag, k=args.folds)}")
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
