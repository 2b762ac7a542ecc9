"""RQ7 on vLLM on this machine's CPU: ``sjf_aging`` and ``vllm_v1_priority`` against vLLM's FCFS, guarded
against a noisy host (run with the vLLM environment, `.venv-vllm`, on a quiet machine):

    .venv-vllm/bin/python benchmarks/rq7_vllm_cpu.py            # plan, speed ratio, case
    .venv-vllm/bin/python benchmarks/rq7_vllm_cpu.py --dry-run  # only the plan and its estimate

1. **Plan**: prints the number of runs (windows × policies × repetitions, λ_ref searches, host
   probes) and an estimated duration, before any engine is built.
2. **Speed ratio** (brackets the real-engine λ_ref search): ``--speed-ratio``, else this case's own
   ``<tag>_tuning.json`` from an earlier session, else the RQ6 case's (same model shape and engine),
   else a small step profile of vLLM's decode steps; the one used is kept in ``<tag>_tuning.json``.
3. **Case**: :func:`portbench.realengine.study.run_case` at HIGH_PRESSURE — 5 windows per source,
   three policies, two repetitions, a host probe before and after every run with re-runs when the
   host drifted, every engine step logged; results in ``data/results/realengine/<tag>_case_*``
   (:func:`portbench.results.setup_case`).
   Then mean ANWG per source and policy, and each new policy's paired difference from FCFS.

**The FCFS baseline is ``fifo``, not ``vllm_faithful``.** In the simulator, RQ7's new policies and
``fifo`` are all admission-order policies on one engine model (same token budget, chunked prefill,
sequence cap, KV rule): comparing them isolates the order. On vLLM the same holds for ``fifo``:
vLLM's FCFS with exactly the engine settings of ``sjf_aging`` and ``vllm_v1_priority`` (2,048-token
budget, chunked prefill, 256 sequences, the model's full ``max_model_len``), so a difference between
them is the scheduling order and nothing else. ``vllm_faithful`` would change three things at once
(2,560-token budget, chunked prefill off, requests over 2,560 tokens refused); it stands for the
study's vLLM v0.1.0 engine, the RQ6 case's baseline.

The policies on vLLM (:data:`portbench.realengine.vllm_backend.POLICIES`): ``vllm_v1_priority`` is
vLLM's own ``priority`` scheduling with priority = SLO deadline (no waiting-triggered preemption;
the simulator's ``edf`` on vLLM's rules; the committed runs recorded it as ``vllm_priority``); ``sjf_aging`` runs through the key adapter,
:class:`~portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler`, which puts vLLM's waiting
queue in the simulator policy's own key order before every step (its gaps are in that module and in
each run's ``scheduler_gaps``; the committed runs were taken with an earlier port of sjf_aging alone,
the same order on the real clock).

**λ_ref is shared with the RQ6 case** (``--lambda-refs-from``, default its guarded case): the
real-engine λ_ref search replays FIFO on the same engine (same model shape, default settings) with
the same bracket and bisection, so a window the RQ6 case has already searched is not searched again
(~1 h saved on this machine); the entries keep ``from`` = that case. ``--lambda-refs-from none``
searches every window here.

Restarting with the same ``--tag`` resumes: the speed ratio is reused and the case skips the runs
(and λ_ref searches) it already has. ``--fresh`` starts over. ``--budget-s`` stops resumably; the
case checks it before each run, so it can overrun by one run and its λ_ref search.
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rq6_vllm_cpu import SHAPE, SMALL_PROFILE, case_arguments, done_line, progress_on_disk  # noqa: E402  (the RQ6 case's model: the same engine)

from portbench import results, store  # noqa: E402
from portbench.realengine.study import (CASE_SOURCES, CaseConfig, case_deltas, reusable_lambda_refs,  # noqa: E402
                                      run_case)

POLICIES = ("fifo", "sjf_aging", "vllm_v1_priority")
BASELINE = "fifo"
REGION = "HIGH_PRESSURE"
#: Set-ups of the RQ6 case on this machine whose speed ratio is reused when this case has none (same SHAPE).
RQ6_TUNINGS = ("vllm_cpu_guarded", "vllm_cpu")
#: Earlier FCFS runs on disk that give a run's duration for the estimate, after this case's own:
#: (case, part of it).
RQ6_RUNS = (("vllm_cpu_guarded_case", "attempts"), ("vllm_cpu_case", "runs"))
RQ6_FCFS = ("fifo", "vllm_faithful")
#: The case whose real-engine λ_ref searches this one reuses (``--lambda-refs-from``).
RQ6_CASE = "vllm_cpu_guarded_case"

#: Fallbacks for the estimate (the vLLM-CPU RQ6 case of 2026-11-30: vllm_faithful ~11 s a run at
#: HIGH_PRESSURE; a host probe ~0.25 s; the small profile ~1 min).
DEFAULT_RUN_S, PROBE_S, PROFILE_S = 11.0, 0.25, 60.0


def case_windows(args) -> list[str]:
    return [wid for s in args.sources
            for wid in store.list_windows(args.data_dir, s)["window_id"][:args.windows_per_source]]


def find_tuning(case: results.Case, fresh: bool):
    """``(tuning, path)`` of the speed ratio to reuse, or ``(None, None)``: ``case``'s own (unless
    starting fresh), else the RQ6 case's."""
    setups = ([] if fresh else [case]) + [results.setup_case(t, case.data_dir) for t in RQ6_TUNINGS]
    for setup in setups:
        tuning = setup.tuning
        if tuning is not None and tuning.get("shape") == dataclasses.asdict(SHAPE) and tuning.get("speed_ratio"):
            return tuning, setup.path("tuning")
    return None, None


def shared_lambda_refs(args) -> dict:
    """The real-engine λ_ref entries of case ``--lambda-refs-from`` that this case may reuse: only if
    that case searched on the same backend, engine settings, bracket and bisection (else ``{}``,
    with the reason printed)."""
    if args.lambda_refs_from in (None, "", "none"):
        return {}
    return reusable_lambda_refs(results.Case(args.lambda_refs_from, args.data_dir), case_windows(args),
                                backend="vllm", engine_kwargs={"shape": repr(SHAPE)},
                                bracket_factor=args.bracket_factor, bisection_steps=args.bisection_steps)


def plan(args, case: results.Case, shared: dict):
    """Runs to do and an estimated duration (s), from earlier runs on disk where there are any;
    ``shared``: the λ_ref entries reused from another case (:func:`shared_lambda_refs`)."""
    windows = case_windows(args)
    n_runs = len(windows) * len(POLICIES) * args.repetitions
    done, cal_done = progress_on_disk(case, args.fresh)
    walls, walls_from = [], "default"
    tag = args.tag
    for earlier, part in [(case, "attempts")] + [(results.Case(c, args.data_dir), p) for c, p in RQ6_RUNS]:
        path = earlier.path(part)
        if path.exists() and not (args.fresh and path.name.startswith(tag)):
            df = getattr(earlier, part)
            if not path.name.startswith(tag):
                df = df[df["policy"].isin(RQ6_FCFS)]
                ours = df[df["window_id"].isin(windows)]
                df = ours if len(ours) else df
            walls = df["wall_s"].dropna().tolist()
            if walls:
                walls_from = path.name
                break
    run_s = float(np.mean(walls)) if walls else DEFAULT_RUN_S
    todo = max(0, n_runs - done)
    searches = max(0, len(windows) - max(cal_done, len(shared)))
    retry = 1.2                                  # expected attempts per run (some re-runs)
    calib_replays = searches * (2 + args.bisection_steps)          # bracket, bisection
    # A replay lasts about its arrival span, ∝ 1/λ: the bracket's low end (λ_ref / bracket_factor)
    # lasts ~1.5 x bracket_factor runs (a run is at 1.5 λ_ref), the high end ~1, a bisection ~1.5.
    calib_runs = searches * (1.5 * args.bracket_factor + 1 + 1.5 * args.bisection_steps)
    probes = 2 * todo * retry + 3 * len(POLICIES) if todo else 0
    tuning, _ = find_tuning(case, args.fresh)
    profile_s = 0.0 if (args.speed_ratio or tuning) else PROFILE_S
    est = {"windows": len(windows), "runs_total": n_runs, "runs_done": done, "runs_to_do": todo,
           "lambda_searches": searches, "calibration_replays_est": calib_replays,
           "host_probes_est": int(probes), "run_s_est": run_s, "run_s_from": walls_from,
           "profile_s_est": profile_s,
           "case_s_est": todo * retry * run_s + calib_runs * run_s + probes * PROBE_S
           + args.retry_wait_s * todo * (retry - 1)}
    est["total_s_est"] = est["profile_s_est"] + est["case_s_est"]
    return est


def speed_ratio_of(args, case: results.Case) -> tuple[float, str]:
    """The speed ratio and where it came from; written to the case's tuning."""
    path = case.path("tuning")
    if args.speed_ratio:
        tuning = {"shape": dataclasses.asdict(SHAPE), "speed_ratio": float(args.speed_ratio),
                  "from": "--speed-ratio"}
    else:
        tuning, found = find_tuning(case, args.fresh)
        if tuning is not None:
            tuning = dict(tuning, **({} if found == path else {"from": found.name}))
        else:
            from portbench.realengine import vllm_backend as mod
            t0 = time.perf_counter()
            profile = mod.step_profile(shape=SHAPE, **SMALL_PROFILE)
            clean = profile[profile["clean"]]
            decode = clean[(clean["prefill_tokens"] == 0) & (clean["decode_seqs"] > 0)]
            decode_step_s = float(decode["step_s"].median())
            tuning = {"shape": dataclasses.asdict(SHAPE), "profile_grid": SMALL_PROFILE,
                      "profile_rows": len(profile), "profile_s": time.perf_counter() - t0,
                      "decode_step_s": decode_step_s, "speed_ratio": 0.001 / decode_step_s,
                      "from": "small step profile"}
    case.write(tuning=tuning)
    return float(tuning["speed_ratio"]), tuning.get("from", path.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    case_arguments(ap, windows_per_source=5, tag="vllm_cpu_rq7")
    ap.add_argument("--sources", nargs="+", default=list(CASE_SOURCES), choices=list(CASE_SOURCES))
    ap.add_argument("--lambda-refs-from", default=RQ6_CASE,
                    help="reuse the real-engine λ_ref searches of this case (its tag; 'none': search here)")
    args = ap.parse_args()

    tag = args.tag
    case = results.setup_case(tag, args.data_dir)
    shared = shared_lambda_refs(args)
    est = plan(args, case, shared)
    print(f"plan [{tag}]: {len(args.sources)} sources x {args.windows_per_source} windows x "
          f"{len(POLICIES)} policies ({', '.join(POLICIES)}; FCFS = {BASELINE}) x {args.repetitions} "
          f"repetitions at {REGION} = {est['runs_total']} runs ({est['runs_done']} done, "
          f"{est['runs_to_do']} to do); {est['lambda_searches']} λ_ref searches "
          f"(~{est['calibration_replays_est']} replays); ~{est['host_probes_est']} host probes", flush=True)
    print(f"estimate: speed ratio ~{est['profile_s_est'] / 60:.0f} min + case ~{est['case_s_est'] / 60:.0f} "
          f"min = ~{est['total_s_est'] / 3600:.1f} h (a run ~{est['run_s_est']:.0f} s, from "
          f"{est['run_s_from']}; more if the host is noisy: each rejected run is repeated up to "
          f"{args.max_retries} times)", flush=True)
    if args.dry_run:
        return

    case.folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    speed_ratio, source = speed_ratio_of(args, case)
    print(f"speed ratio {speed_ratio:.3g} ({source})", flush=True)
    budget = None if args.budget_s is None else max(0.0, args.budget_s - (time.perf_counter() - t0))
    runs = run_case(CaseConfig("vllm", n_per_source=args.windows_per_source, sources=tuple(args.sources),
                               policies=POLICIES, region=REGION, speed_ratio=speed_ratio,
                               bisection_steps=args.bisection_steps, bracket_factor=args.bracket_factor,
                               repetitions=args.repetitions, drift_tolerance=args.drift_tolerance,
                               max_retries=args.max_retries, retry_wait_s=args.retry_wait_s,
                               tag=case.tag, data_dir=args.data_dir, lambda_refs=shared,
                               engine_kwargs={"shape": SHAPE}),
                    resume=not args.fresh, time_budget_s=budget)
    if len(runs):
        print("mean ANWG by source and policy:", flush=True)
        print(runs.pivot_table(index="source", columns="policy", values="anwg").to_string(), flush=True)
        for policy in POLICIES[1:]:
            d = case_deltas(runs, "vllm", policies=(policy, BASELINE))
            if len(d):
                d = d.rename(columns={"delta": f"delta_{policy}_minus_{BASELINE}"})
                print(d.to_string(index=False), flush=True)
    print(done_line(runs, est["runs_total"], time.perf_counter() - t0), flush=True)


if __name__ == "__main__":
    main()
