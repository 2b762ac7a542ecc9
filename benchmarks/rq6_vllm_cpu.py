"""The study's RQ6 case on vLLM on this machine's CPU, guarded against a noisy host (run with the
vLLM environment, `.venv-vllm`, on a quiet machine):

    .venv-vllm/bin/python benchmarks/rq6_vllm_cpu.py            # plan, profile, refit, case
    .venv-vllm/bin/python benchmarks/rq6_vllm_cpu.py --dry-run  # only the plan and its estimate
    .venv-vllm/bin/python benchmarks/rq6_vllm_cpu.py --config equal   # both policies at max_model_len 2,560
    .venv-vllm/bin/python benchmarks/rq6_vllm_cpu.py --config study   # the study's real-system settings

``--config`` (each has its own default ``--tag``, so its results go to their own files; see
:data:`CONFIGS`): ``policy`` (``vllm_cpu_guarded``, the default) runs each policy on its own engine
settings (:data:`portbench.realengine.vllm_backend.POLICIES`: ``vllm_faithful`` at
``max_model_len`` 2,560, ``slai_faithful`` at 32,768); ``equal`` (``vllm_cpu_equal``) gives both the
same admission limit, 2,560 (:data:`~portbench.realengine.vllm_backend.EQUAL_ADMISSION`, which says
why), at the committed case's λ_ref (``--lambda-refs-from``), so that only the limit changes;
``study`` (``vllm_cpu_study``) runs the study's real-system configuration as far as it carries to a
tiny model on a CPU (:data:`~portbench.realengine.vllm_backend.STUDY_ENGINE`: both policies without
chunked prefill at a 32,768-token budget and ``max_model_len``, 256 sequences, at most 32 requests
in flight, λ_ref searched on ``vllm_faithful``). ``equal`` and ``study`` reuse the committed case's
step profile and speed ratio (``--profile-from``) and skip the refit. ``--windows-per-source`` and
``--repetitions`` shrink a case. ``choice`` (``vllm_cpu_choice``) is the ``equal`` case with the
engine's sequence cap lowered to 8 (:data:`~portbench.realengine.vllm_backend.CHOICE_ENGINE`): the
same λ_ref and load, requests queue inside the engine, so that most steps leave visible work
unscheduled and a schedule comparison has choices to check.

1. **Plan**: prints the number of runs (windows × policies × repetitions, λ_ref searches, host
   probes) and an estimated duration, before any engine is built.
2. **Profile**: vLLM's step time over the case's ranges (prefill up to the 2,560-token budget, up to
   128 decoding sequences, up to ~300k context tokens), with the inter-step gap and the scheduler's
   time; saved as ``<tag>_step_profile.parquet``. The speed ratio that brackets the real-engine
   λ_ref search comes from its decode steps (``--speed-ratio`` overrides it).
3. **Case**: :func:`portbench.realengine.study.run_case` — ≥ 8 windows per source, both policies,
   two repetitions, a host probe before and after every run with re-runs when the host drifted,
   every engine step logged; results in ``data/results/realengine/<tag>_case_*``
   (:func:`portbench.results.setup_case`).
4. **Refit**: :meth:`portbench.engine.StepCost.fit` on the clean profile rows (gap = median
   observed gap); the coefficients and overall error go to ``<tag>_cost.json``, the error by
   prefill/decode range to ``<tag>_fit_by_range.parquet``. It comes last because
   ``portbench.engine`` loads numba, and vLLM 0.32 cannot build an engine in a process where
   llvmlite is loaded (its Triton-override scan of ``sys.modules`` trips on an llvmlite object).

Restarting with the same ``--tag`` resumes: a finished profile and refit are reused and the case
skips the runs (and λ_ref searches) it already has. ``--fresh`` starts over.
"""

import argparse
import dataclasses
import time

import numpy as np
import pandas as pd

from portbench import results, store
from portbench.realengine import ModelShape
from portbench.realengine import vllm_backend as backend
from portbench.realengine.study import (CASE_POLICIES, CASE_SOURCES, CaseConfig, reusable_lambda_refs, run_case,
                                      scheduler_time)

#: A tiny random Llama: a window replays in seconds on two CPU cores.
SHAPE = ModelShape(n_layers=2, hidden_size=128, n_heads=4, n_kv_heads=4, intermediate_size=256)

#: The wide step-profile grid: the case's ranges (vllm_faithful's 2,560-token budget, SLAI's 128
#: sequences; 128 decoders × 2,400 tokens ≈ 307k context tokens).
PROFILE = dict(prefill_tokens=(0, 16, 64, 256, 512, 1024, 2048, 2560), decode_seqs=(0, 1, 8, 32, 64, 128),
               context_tokens=(16, 256, 1024, 2400), repeats=3, max_num_batched_tokens=2560 + 128,
               max_num_seqs=256, kv_cache_gib=1.5)

#: A small grid for a smoke test of this script (``--small-profile``).
SMALL_PROFILE = dict(prefill_tokens=(0, 64, 512), decode_seqs=(0, 4), context_tokens=(32,), repeats=2,
                     max_num_batched_tokens=2048, max_num_seqs=256, kv_cache_gib=1.0)

#: The case's engine configurations (``--config``): default tag, engine settings passed to every
#: replay and probe (the model shape comes on top), the policy the λ_ref search replays, and the
#: defaults of ``--lambda-refs-from`` and ``--profile-from``.
CONFIGS = {
    "policy": {"tag": "vllm_cpu_guarded", "engine": {}, "lambda_policy": "fifo",
               "lambda_refs_from": None, "profile_from": None},
    "equal": {"tag": "vllm_cpu_equal", "engine": dict(backend.EQUAL_ADMISSION), "lambda_policy": "fifo",
              "lambda_refs_from": "vllm_cpu_guarded_case", "profile_from": "vllm_cpu_guarded"},
    "study": {"tag": "vllm_cpu_study",
              "engine": dict(backend.STUDY_ENGINE, kv_cache_gib=backend.STUDY_KV_CACHE_GIB),
              "lambda_policy": backend.STUDY_LAMBDA_POLICY, "lambda_refs_from": None,
              "profile_from": "vllm_cpu_guarded"},
    "choice": {"tag": "vllm_cpu_choice", "engine": dict(backend.CHOICE_ENGINE), "lambda_policy": "fifo",
               "lambda_refs_from": "vllm_cpu_guarded_case", "profile_from": "vllm_cpu_guarded"},
}

#: Fallbacks for the estimate when no earlier run of the case is on disk (the vLLM-CPU case of
#: 2026-11-30: 21.9 s a run on average; a host probe ~0.2 s; decoder prefill ~50k tokens/s).
DEFAULT_RUN_S, PROBE_S, PREFILL_TOKENS_PER_S, STEP_S = 21.9, 0.25, 50_000.0, 0.05


def progress_on_disk(case: results.Case, fresh: bool, windows=None, repetitions=None) -> tuple[int, int]:
    """(runs done, real-engine λ_ref searches done) of ``case`` (0, 0 when starting fresh), counting
    only the runs of ``windows`` below ``repetitions`` when given."""
    if fresh:
        return 0, 0
    runs = case.runs if case.runs is not None else pd.DataFrame(columns=["window_id", "repetition"])
    if windows is not None:
        runs = runs[runs["window_id"].isin(windows)]
    if repetitions is not None:
        runs = runs[runs["repetition"] < repetitions]
    lambdas = case.provenance.get("lambda_ref_real", {})
    return len(runs), len(lambdas if windows is None else [w for w in lambdas if w in windows])


def case_windows(args) -> list[str]:
    """The case's window ids, ``--windows-per-source`` of each source, in manifest order."""
    return [wid for s in args.sources
            for wid in store.list_windows(args.data_dir, s)["window_id"][:args.windows_per_source]]


def shared_lambda_refs(args) -> dict:
    """The real-engine λ_ref entries of case ``--lambda-refs-from`` for this case's windows (``{}``
    when none is named, it is not on disk, or it searched with another backend, bracket, bisection
    or λ policy). Its engine settings may differ from this case's: ``--config equal`` reuses the
    committed case's λ_ref on purpose, so that only the admission limit changes."""
    if args.lambda_refs_from in (None, "", "none"):
        return {}
    return reusable_lambda_refs(results.Case(args.lambda_refs_from, args.data_dir), case_windows(args),
                                backend="vllm", bracket_factor=args.bracket_factor,
                                bisection_steps=args.bisection_steps, lambda_policy=args.lambda_policy)


def plan(args, case: results.Case, grid, shared: dict | None = None):
    """Runs to do and an estimated duration (s), from earlier runs on disk where there are any;
    ``shared``: λ_ref entries reused from another case (:func:`shared_lambda_refs`)."""
    shared = shared or {}
    n_windows = len(args.sources) * args.windows_per_source
    n_runs = n_windows * len(CASE_POLICIES) * args.repetitions
    done, cal_done = progress_on_disk(case, args.fresh, case_windows(args), args.repetitions)
    walls, walls_from = [], "default"
    for earlier, part in ((case, "attempts"), (results.Case("vllm_cpu_guarded_case", args.data_dir), "attempts"),
                          (results.Case("vllm_cpu_case", args.data_dir), "runs")):
        if args.fresh and earlier.path(part).name.startswith(f"{args.tag}_"):
            continue
        table = getattr(earlier, part)
        if table is not None:
            walls = table["wall_s"].dropna().tolist()
            if walls:
                walls_from = earlier.path(part).name
                break
    run_s = float(np.mean(walls)) if walls else DEFAULT_RUN_S
    todo = max(0, n_runs - done)
    searches = max(0, n_windows - max(cal_done, len(shared)))
    retry = 1.2                                  # expected attempts per run (some re-runs)
    calib_replays = searches * (2 + args.bisection_steps)          # bracket, bisection
    # A replay lasts about its arrival span, ∝ 1/λ: the bracket's low end (λ_ref / bracket_factor)
    # lasts ~1.5 x bracket_factor runs (a run is at 1.5 λ_ref), the high end ~1, a bisection ~1.5.
    calib_runs = searches * (1.5 * args.bracket_factor + 1 + 1.5 * args.bisection_steps)
    probes = 2 * todo * retry + 3 * 3 * len(CASE_POLICIES) if todo else 0   # + up to 3 reference rounds
    profile_s = 0.0
    if not args.profile_from and (args.fresh or not case.has("profile")):
        g = grid
        prefill_tokens = sum(d * c for d in g["decode_seqs"] for c in g["context_tokens"])
        timed = len(g["prefill_tokens"]) * len(g["decode_seqs"]) * len(g["context_tokens"]) * g["repeats"]
        profile_s = prefill_tokens / PREFILL_TOKENS_PER_S + timed * STEP_S + 30
    est = {"runs_total": n_runs, "runs_done": done, "runs_to_do": todo, "lambda_searches": searches,
           "lambda_shared": len(shared), "calibration_replays_est": calib_replays,
           "host_probes_est": int(probes), "run_s_est": run_s, "run_s_from": walls_from,
           "profile_s_est": profile_s,
           "case_s_est": todo * retry * run_s + calib_runs * run_s + probes * PROBE_S
           + args.retry_wait_s * todo * (retry - 1)}
    est["total_s_est"] = est["profile_s_est"] + est["case_s_est"]
    return est


def case_arguments(ap, *, windows_per_source: int, tag: str) -> None:
    """The options every guarded real-engine case script shares (this one and ``rq7_vllm_cpu.py``)."""
    ap.add_argument("--windows-per-source", type=int, default=windows_per_source)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--bisection-steps", type=int, default=3)
    ap.add_argument("--bracket-factor", type=float, default=8.0)
    ap.add_argument("--drift-tolerance", type=float, default=0.15)
    ap.add_argument("--max-retries", type=int, default=2)
    ap.add_argument("--retry-wait-s", type=float, default=20.0,
                    help="pause before re-running a run the host guard rejected")
    ap.add_argument("--speed-ratio", type=float, default=None,
                    help="override the speed ratio that brackets the λ_ref search")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop (resumably) after about this many seconds; the case checks it before each "
                         "run, so it can overrun by one run and its λ_ref search; default: run to the end")
    ap.add_argument("--tag", default=tag)
    ap.add_argument("--fresh", action="store_true", help="start over instead of resuming")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its estimate only")
    ap.add_argument("--data-dir", default=None, help="the data folder (default: the repository's)")


def done_line(runs, expected: int, seconds: float) -> str:
    """The closing line of a guarded case script: runs done, host-flagged, whether to resume."""
    n_flag = int(runs["host_flagged"].sum()) if "host_flagged" in runs else 0
    return (f"{len(runs)}/{expected} runs ({n_flag} host-flagged) in {seconds:.0f} s"
            + ("" if len(runs) >= expected else " — restart the same command to resume"))


def load_profile(case: results.Case):
    """``(profile, tuning)`` of ``case``'s set-up on disk, or ``(None, None)``."""
    if case.has("profile", "tuning"):
        return case.profile, case.tuning
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    case_arguments(ap, windows_per_source=8, tag=None)
    ap.add_argument("--sources", nargs="+", choices=list(CASE_SOURCES), default=list(CASE_SOURCES),
                    help="run these sources only (e.g. more repetitions where a difference is not settled)")
    ap.add_argument("--config", choices=list(CONFIGS), default="policy",
                    help="engine configuration of both policies (default tag: "
                         + ", ".join(f"{k} -> {v['tag']}" for k, v in CONFIGS.items()) + ")")
    ap.add_argument("--lambda-refs-from", default="",
                    help="reuse the real-engine λ_ref searches of this case (its tag, e.g. "
                         "vllm_cpu_guarded_case; 'none': search here); default: the config's")
    ap.add_argument("--profile-from", default="",
                    help="reuse this tag's step profile and speed ratio (e.g. vllm_cpu_guarded) instead "
                         "of profiling, and skip the refit ('none': profile here); default: the config's")
    ap.add_argument("--small-profile", action="store_true", help="a small profile grid (smoke tests)")
    args = ap.parse_args()
    config = CONFIGS[args.config]
    args.tag = args.tag or config["tag"]
    args.lambda_policy = config["lambda_policy"]
    if args.lambda_refs_from == "":
        args.lambda_refs_from = config["lambda_refs_from"]
    if args.profile_from == "":
        args.profile_from = config["profile_from"]
    if args.profile_from in ("none", args.tag):
        args.profile_from = None

    tag = args.tag
    case = results.setup_case(tag, args.data_dir)
    case.folder.mkdir(parents=True, exist_ok=True)
    grid = SMALL_PROFILE if args.small_profile else PROFILE
    engine_kwargs = dict(config["engine"], shape=SHAPE)
    shared = shared_lambda_refs(args)
    est = plan(args, case, grid, shared)
    settings = ", ".join(f"{k}={v}" for k, v in config["engine"].items()) or "each policy's own"
    print(f"config [{args.config}]: engine settings {settings}; λ_ref searched on {args.lambda_policy}"
          + (f" ({est['lambda_shared']} reused from {args.lambda_refs_from})" if shared else "")
          + (f"; profile and speed ratio from {args.profile_from}" if args.profile_from else ""), flush=True)
    print(f"plan [{tag}]: {len(args.sources)} sources x {args.windows_per_source} windows x "
          f"{len(CASE_POLICIES)} policies x {args.repetitions} repetitions = {est['runs_total']} runs "
          f"({est['runs_done']} done, {est['runs_to_do']} to do); {est['lambda_searches']} λ_ref searches "
          f"(~{est['calibration_replays_est']} replays); ~{est['host_probes_est']} host probes", flush=True)
    print(f"estimate: profile ~{est['profile_s_est'] / 60:.0f} min + case ~{est['case_s_est'] / 60:.0f} min "
          f"= ~{est['total_s_est'] / 3600:.1f} h (a run ~{est['run_s_est']:.0f} s, from {est['run_s_from']}; "
          f"more if the host is noisy: each rejected run is repeated up to {args.max_retries} times)",
          flush=True)
    if args.dry_run:
        return

    t0 = time.perf_counter()
    source = results.setup_case(args.profile_from, args.data_dir) if args.profile_from else case
    profile, tuning = load_profile(source)
    if args.profile_from:
        if tuning is None:
            raise SystemExit(f"--profile-from {args.profile_from}: no {source.path('profile').name} "
                             f"and {source.path('tuning').name} in {case.folder}")
        if tuning.get("shape") != dataclasses.asdict(SHAPE):
            raise SystemExit(f"--profile-from {args.profile_from}: profiled another model shape")
        case.write(tuning=dict(tuning, **{"from": args.profile_from}))
        print(f"profile and speed ratio reused from {args.profile_from}", flush=True)
    elif profile is not None and not args.fresh:
        print(f"profile and refit reused from {case.path('profile').name}", flush=True)
    else:
        profile = backend.step_profile(shape=SHAPE, **grid)
        skipped = profile.attrs.get("skipped", [])
        case.write(profile=profile)
        clean = profile[profile["clean"]]
        decode = clean[(clean["prefill_tokens"] == 0) & (clean["decode_seqs"] > 0)]
        decode_step_s = float(decode["step_s"].median())
        tuning = {"shape": dataclasses.asdict(SHAPE), "profile_grid": grid, "profile_rows": len(profile),
                  "profile_clean_rows": int(len(clean)), "profile_skipped": skipped,
                  "profile_s": time.perf_counter() - t0, "decode_step_s": decode_step_s,
                  "speed_ratio": 0.001 / decode_step_s,
                  "median_gap_s": float(np.nanmedian(profile["gap_s"])),
                  "median_schedule_s": float(np.nanmedian(profile["schedule_s"]))}
        case.write(tuning=tuning)
        print(f"profile: {len(profile)} steps ({len(clean)} clean, {len(skipped)} grid points skipped) in "
              f"{tuning['profile_s']:.0f} s", flush=True)
    speed_ratio = args.speed_ratio or tuning["speed_ratio"]
    print(f"decode step {tuning['decode_step_s'] * 1e3:.2f} ms -> speed ratio {speed_ratio:.3g}", flush=True)

    budget = None if args.budget_s is None else max(0.0, args.budget_s - (time.perf_counter() - t0))
    runs = run_case(CaseConfig("vllm", n_per_source=args.windows_per_source, sources=tuple(args.sources),
                               speed_ratio=speed_ratio,
                               bisection_steps=args.bisection_steps, bracket_factor=args.bracket_factor,
                               repetitions=args.repetitions, drift_tolerance=args.drift_tolerance,
                               max_retries=args.max_retries, retry_wait_s=args.retry_wait_s,
                               tag=case.tag, data_dir=args.data_dir, lambda_refs=shared,
                               lambda_policy=args.lambda_policy, engine_kwargs=engine_kwargs),
                    resume=not args.fresh, time_budget_s=budget)
    steps = case.steps
    if steps is not None:
        steps = steps[steps["kept"]].sort_values(["window_id", "policy", "repetition", "step"])
        end = steps["start_s"] + steps["duration_s"]
        gap = steps["start_s"].shift(-1) - end
        same = (steps[["window_id", "policy", "repetition"]].shift(-1)
                == steps[["window_id", "policy", "repetition"]]).all(axis=1)
        busy = gap[same & (steps["running"] + steps["waiting"] > 0)]   # no wait for an arrival
        print(f"replay gap between busy steps: median {np.median(busy) * 1e3:.3f} ms"
              + (f" (profile: {tuning['median_gap_s'] * 1e3:.3f} ms)" if "median_gap_s" in tuning else "")
              if len(busy) else "", flush=True)
        sched = scheduler_time(steps)
        if len(sched):
            print("scheduler time per step (ms) by waiting-queue length:", flush=True)
            print(sched.to_string(index=False), flush=True)
    if not args.profile_from:
        # the refit, last (see the module's docstring: numba and vLLM do not share a process)
        from portbench.engine import StepCost

        clean = profile[profile["clean"]]
        cost, err, by_range = StepCost.fit(clean, by_range=True)
        case.write(fit_by_range=by_range, cost={"cost": dataclasses.asdict(cost), "fit_median_rel_error": err,
                                                "profile_rows": int(len(clean))})
        print(f"refit: {cost} (median error {err:.1%}); by range:", flush=True)
        print(by_range.to_string(index=False), flush=True)
    print(done_line(runs, est["runs_total"], time.perf_counter() - t0), flush=True)


if __name__ == "__main__":
    main()
