"""The prepared RQ6 run for a GPU (transformers continuous batching), sized for a short device lease.

``--config`` picks the engine settings (:data:`CONFIGS`): ``policy`` (each policy with the token
budget the tuning picks; SLAI chunks prompts) or ``study``, the study's real-system configuration
(both policies at a 32,768-token budget and ``max_model_len``, no chunked prefill, 256 sequences, at
most 32 requests in flight; :data:`portbench.realengine.vllm_backend.STUDY_ENGINE`). Phases:

1. **plan** (``study``, :mod:`portbench.realengine.gpu_plan`): the windows (the first
   ``--window-size`` requests of the first windows of every source), each one's load (1.5 × its knee
   in the simulator with the GPU's step cost) and the device time; a plan over ``--device-minutes``
   is refused before anything starts, and ``--plan`` prints it and stops;
2. **tune**: a fixed burst replayed under a few engine configurations (attention implementation,
   block size, CUDA graphs; under ``policy`` the token budget); the fastest that passes the replay
   check (:func:`tune`), its set-up included, is kept;
3. **profile**: the step time vs prefill tokens, decode sequences and context tokens, and the step
   cost refitted on it (:func:`refit`); under ``study`` the plan is made again with that cost and
   the time left, with fewer windows per source where it no longer fits;
4. **case** (:func:`portbench.realengine.study.run_case`): ``slai_faithful`` and ``vllm_faithful``
   at HIGH_PRESSURE, every run guarded by host probes, one repetition of every window first. Under
   ``study`` each window's λ_ref is the plan's; under ``policy`` a short bisection on the engine
   searches it around the simulator's λ_ref × the measured speed ratio.

Everything lands in ``data/results/realengine/<tag>_*`` (:func:`portbench.results.setup_case`); a
restart with the same ``--tag`` resumes the case. ``--tiny`` runs it all on a CPU (as the tests do).

    python -m portbench.realengine.gpu --config study --plan
    python -m portbench.realengine.gpu --device cuda --config study --tag h200_study
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

from .. import results
from ..workload import make_window
from . import PROBE_REPEATS, PROBE_WARMUP, ModelShape, gpu_name
from . import gpu_plan
from .study import CASE_POLICIES, CASE_REGION, CASE_SOURCES, CaseConfig, run_case

#: A 0.5B-class Llama shape (about Qwen2.5-0.5B's dimensions), random weights, bf16.
HALF_B = ModelShape(n_layers=24, hidden_size=896, n_heads=14, n_kv_heads=2, intermediate_size=4864,
                    vocab_size=151936, max_position_embeddings=32768, dtype="bfloat16")
TINY = ModelShape()

#: Engine configurations tried in the tuning phase (most promising first).
GPU_CONFIGS = [
    {"max_batch_tokens": 8192, "block_size": 256, "num_blocks": 4096, "extra": {"use_cuda_graph": True}},
    {"max_batch_tokens": 4096, "block_size": 256, "num_blocks": 4096, "extra": {"use_cuda_graph": True}},
    {"max_batch_tokens": 8192, "block_size": 128, "num_blocks": 8192,
     "extra": {"use_cuda_graph": True, "default_compile_level": 1}},
    {"max_batch_tokens": 2048, "block_size": 256, "num_blocks": 4096, "extra": {}},
]
CPU_CONFIGS = [
    {"max_batch_tokens": 512, "block_size": 32, "num_blocks": 2048, "extra": {}},
    {"max_batch_tokens": 1024, "block_size": 32, "num_blocks": 2048, "extra": {}},
]

#: The attention implementations transformers' continuous batching can run with torch alone (no
#: flash-attn, no hub kernels): its paged SDPA path (the engine's default), its paged eager path, and
#: flex attention, which 5.17 refuses for continuous batching ("paged|flex_attention" is not one of
#: its implementations): the tuning records the refusal where it is tried.
ATTENTION = ("paged|sdpa", "paged|eager", "flex_attention")

#: The study's real-system settings carried to this engine (the token budget is the policy's, so the
#: tuning varies only how the engine runs: the attention path, CUDA graphs). On the H200 (2026-12-04)
#: CUDA graphs on both paths replayed the burst in 4.1 s, on the decode path alone 4.6 s, off 10.8 s.
#: The cache: 1,024 blocks of 256 tokens hold the 32 largest requests of every planned window
#: (:func:`~portbench.realengine.gpu_plan.check_cache`), so nothing is evicted, and the paged SDPA and
#: eager paths' mask (budget × (cache + budget) entries) takes 19 GB; 4,096 blocks made it 66 GiB,
#: which an H100 cannot hold beside the cache. On a CPU (``--tiny``) a 2,048-token budget and a
#: smaller cache keep that mask small; the tiny windows' prompts never fill that budget.
STUDY_SETTINGS = {"max_batch_tokens": 32768, "max_in_flight": 32, "enable_chunked_prefill": False}
STUDY_EXTRA = {"max_requests_per_batch": 256}
STUDY_GPU_CONFIGS = [
    *({"attn_implementation": a, "block_size": 256, "num_blocks": 1024,
       "extra": {**STUDY_EXTRA, "use_cuda_graph": True}} for a in ATTENTION),
    {"attn_implementation": "paged|sdpa", "block_size": 256, "num_blocks": 1024,
     "extra": {**STUDY_EXTRA, "use_cuda_graph": (False, True)}},
]
STUDY_CPU_CONFIGS = [
    *({"attn_implementation": a, "max_batch_tokens": 2048, "block_size": 32, "num_blocks": 256,
       "extra": dict(STUDY_EXTRA)} for a in ATTENTION),
    {"attn_implementation": "paged|sdpa", "max_batch_tokens": 2048, "block_size": 64, "num_blocks": 128,
     "extra": dict(STUDY_EXTRA)},
]

#: ``--config``: engine settings common to every tuned configuration, the tuning's candidates
#: (GPU, CPU), the policy the tuning burst and the λ_ref search replay.
CONFIGS = {
    "policy": {"settings": {}, "gpu": GPU_CONFIGS, "cpu": CPU_CONFIGS, "lambda_policy": "fifo"},
    "study": {"settings": STUDY_SETTINGS, "gpu": STUDY_GPU_CONFIGS, "cpu": STUDY_CPU_CONFIGS,
              "lambda_policy": "vllm_faithful"},
}

#: Each configuration's defaults for the options left unset. ``study``: as the H200 run (one timed
#: probe replay before and after each run, two reference probes, a drifted run flagged rather than
#: re-run), one repetition, 25-request windows, as many per source as the plan fits, and the script's
#: own time box the plan's ceiling less the start-up allowance.
DEFAULTS = {
    "policy": {"windows_per_source": 8, "repetitions": 2, "budget_s": 480.0, "probe_warmup": PROBE_WARMUP,
               "probe_repeats": PROBE_REPEATS, "max_retries": 2, "reference_probes": 3},
    "study": {"windows_per_source": None, "repetitions": 1, "budget_s": None, "probe_warmup": 0,
              "probe_repeats": 1, "max_retries": 0, "reference_probes": 2, "window_size": 25},
}

#: The replay check a tuning candidate passes: both its replays finish every request with its
#: trace's output length (the backend refuses anything else), and at least this share of the burst's
#: requests get the same first token as under the first candidate that passed (greedy decoding of
#: the same weights: round-off flips a near-tie here and there; a wrong attention path nearly all).
MIN_TOKEN_AGREEMENT = 0.75


def tuning_burst(n: int, seed: int = 0, max_prompt: int = 2048, max_output: int = 128,
                 longest_prompt: int | None = None):
    """A simultaneous burst with the token-length mix of the windows (seeded); ``longest_prompt``:
    its first request's prompt instead (the case's longest, so that a configuration that cannot
    prefill it fails the tuning, not the case)."""
    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(max_prompt / 8), 1.0, n).astype(int), 8, max_prompt)
    outputs = np.clip(rng.lognormal(np.log(max_output / 4), 0.8, n).astype(int), 2, max_output)
    if longest_prompt is not None:
        inputs[0] = int(longest_prompt)
    return make_window("tuning_burst", "synthetic", np.zeros(n), inputs, outputs, outputs)


def tune(mod, shape, device, configs, burst, model, budget_s, policy="fifo"):
    """Replay ``burst`` under ``policy`` and each config (a warm-up, then a timed replay) while
    ``budget_s`` lasts (a config is not started when the slowest so far would overrun it); returns
    (best config, table). The best is the one whose timed replay took the least wall time, set-up
    included, among those that pass the replay check (:data:`MIN_TOKEN_AGREEMENT`); a config the
    engine refuses is recorded with its error. The model's attention path is restored after each."""
    rows, reference, t0 = [], None, time.perf_counter()
    original = str(model.config._attn_implementation)
    for k, cfg in enumerate(configs):
        slowest = max((r["replay_s"] for r in rows if np.isfinite(r.get("replay_s", np.nan))), default=0.0)
        if rows and time.perf_counter() - t0 + 2 * slowest > budget_s:
            break
        row = {"config": k, **{key: json.dumps(v) if isinstance(v, (dict, tuple)) else v for key, v in cfg.items()}}
        try:
            row.update(_tune_candidate(mod, burst, policy, reference,
                                       dict(shape=shape, device=device, model=model, timeout_s=60, **cfg)))
            if row["accepted"] and reference is None:
                reference = row["first_tokens"]
            row.pop("first_tokens")
        except Exception as exc:                 # a configuration this engine/device refuses
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            mod.use_attention(model, original)
        rows.append(row)
        print(f"tune {k}: {row}", flush=True)
    ok = [r for r in rows if r.get("accepted")]
    if not ok:
        raise RuntimeError(f"no engine configuration worked: {rows}")
    return configs[min(ok, key=lambda r: r["replay_s"])["config"]], rows


def _tune_candidate(mod, burst, policy, reference, kwargs) -> dict:
    """One tuning candidate's figures: a warm-up replay (a configuration that stalls is given up
    after a minute), a timed one, and the replay check against ``reference`` (first tokens)."""
    mod.replay(burst, policy, **kwargs)
    _, info = mod.replay(burst, policy, **kwargs)
    setup, wall = float(info.get("setup_s", 0.0)), float(info.get("wall_s", np.nan))
    tokens = [int(t) for t in info.get("first_tokens") or []]
    agreement = (float(np.mean(np.equal(tokens, reference))) if reference is not None
                 and len(tokens) == len(reference) else 1.0)
    return {"tokens_per_s": info.get("generated_tokens_per_s", np.nan), "wall_s": wall, "setup_s": setup,
            "replay_s": setup + wall, "n_steps": info.get("n_steps"), "token_agreement": agreement,
            "accepted": bool(np.isfinite(setup + wall) and agreement >= MIN_TOKEN_AGREEMENT),
            "first_tokens": tokens}


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=add_help)
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--config", default="policy", choices=sorted(CONFIGS),
                    help="engine settings: policy (each policy's own) or study (the study's real system)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (CPU end-to-end test)")
    ap.add_argument("--plan", action="store_true",
                    help="study: print the planned case and its predicted device time, and stop")
    ap.add_argument("--device-minutes", type=float, default=gpu_plan.DEVICE_MINUTES,
                    help="study: the plan's ceiling, start-up included (a larger plan is refused)")
    ap.add_argument("--startup-s", type=float, default=gpu_plan.ALLOWANCES_S["start-up"],
                    help="study: the plan's allowance for the machine's start, imports and the model build")
    ap.add_argument("--window-size", type=int, default=None,
                    help="study: requests per window, the first of each frozen window (default 25)")
    ap.add_argument("--cost", type=Path, default=None,
                    help="study: the step cost JSON to plan with (default: the tag's own, else h200_study's)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget for all phases (policy: 480; study: the plan's ceiling less --startup-s)")
    ap.add_argument("--windows-per-source", type=int, default=None,
                    help="policy: 8; study: as many as the plan fits (at most 10)")
    ap.add_argument("--bisection-steps", type=int, default=4)
    ap.add_argument("--burst", type=int, default=96, help="requests in the tuning burst")
    ap.add_argument("--repetitions", type=int, default=None, help="runs of each (window, policy) (policy: 2; study: 1)")
    ap.add_argument("--drift-tolerance", type=float, default=0.15,
                    help="host probe drift that makes a run be re-run")
    ap.add_argument("--max-retries", type=int, default=None,
                    help="re-runs of a run the host guard rejected (policy: 2; study: 0, flagged)")
    ap.add_argument("--reference-probes", type=int, default=None,
                    help="host probes that make each policy's reference at the start of the case (policy: 3; study: 2)")
    ap.add_argument("--max-widenings", type=int, default=3,
                    help="widenings of the λ_ref bracket when the knee is outside it")
    ap.add_argument("--bracket-factor", type=float, default=8.0,
                    help="the first λ_ref bracket of a source: guess / factor .. guess * factor")
    ap.add_argument("--adapt-bracket", type=float, default=2.0,
                    help="later windows of a source: bracket factor around its searched windows' ratio (0: off)")
    ap.add_argument("--probe-warmup", type=int, default=None,
                    help=f"untimed replays of each host probe (policy: {PROBE_WARMUP}; study: 0)")
    ap.add_argument("--probe-repeats", type=int, default=None,
                    help=f"timed replays of each host probe (policy: {PROBE_REPEATS}; study: 1)")
    ap.add_argument("--speed-ratio", type=float, default=None,
                    help="override the measured speed ratio (brackets the λ_ref search)")
    ap.add_argument("--tag", default=None, help="file prefix (default: transformers_<device>)")
    ap.add_argument("--refit-only", action="store_true",
                    help="only refit the step cost on a finished run's profile and steps (no engine)")
    ap.add_argument("--data-dir", type=Path, default=None)
    return ap


def main(argv=None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except gpu_plan.PlanError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


def refit(tag: str, data_dir: Path | None = None) -> dict:
    """The step cost (:class:`portbench.engine.StepCost`: fixed + per prefill token + per decoding
    sequence + per context token, gap = the profile's median gap) refitted on the run's step profile
    (``<tag>_step_profile.parquet``: each timed step's batch as the engine built it) by non-negative
    least squares on the *relative* error: the profile's steps span 12 ms to 300 ms, and an absolute
    fit lets a few long prefill steps set the short decode steps that make most of a real run. Writes
    ``<tag>_cost.json`` and the fit's error per profile grid point, ``<tag>_fit_by_range.parquet``.
    The fit is then checked out of sample on the case's own engine steps (``<tag>_case_steps``, where
    there are any: the steps whose duration is known), whose contexts reach beyond the profile's."""
    from scipy.optimize import nnls

    from ..engine.stepcost import StepCost, predicted_step_s

    case = results.setup_case(tag, data_dir)
    profile = case.profile
    if profile is None:
        raise FileNotFoundError(f"no {case.path('profile').name} in {case.folder}: nothing to refit")
    x = np.column_stack([np.ones(len(profile)), profile["batch_prefill_tokens"], profile["batch_decode_seqs"],
                         profile["batch_context_tokens"]]).astype(float)
    y = profile["step_s"].to_numpy(dtype=float)
    coef, _ = nnls(x / y[:, None], np.ones_like(y))
    gaps = profile["gap_s"].to_numpy(dtype=float)
    gaps = gaps[np.isfinite(gaps)]
    cost = StepCost(*map(float, coef), gap_s=float(max(0.0, np.median(gaps))) if gaps.size else 0.0)
    rel = (x @ coef - y) / y
    by_point = (profile.assign(rel_error=rel).groupby(["prefill_tokens", "decode_seqs", "context_tokens"])
                .agg(n=("rel_error", "size"), median_rel_error=("rel_error", "median"),
                     median_step_s=("step_s", "median")).reset_index())
    result = {"cost": dataclasses.asdict(cost), "fit_median_rel_error": float(np.median(np.abs(rel))),
              "profile_rows": int(len(profile)),
              "fitted_on": f"{case.path('profile').name} (batch_prefill_tokens, batch_decode_seqs, "
                           "batch_context_tokens -> step_s; relative least squares)"}
    steps = case.steps
    if steps is not None:
        if {"duration_s", "prefill_tokens", "decode_seqs", "context_tokens"} <= set(steps.columns):
            steps = steps.dropna(subset=["duration_s"])
            if "kept" in steps:
                steps = steps[steps["kept"].astype(bool)]
            pred = predicted_step_s(cost, steps["prefill_tokens"], steps["decode_seqs"],
                                    steps["context_tokens"]) + cost.gap_s
            err = (pred - steps["duration_s"].to_numpy()) / steps["duration_s"].to_numpy()
            result["case_steps"] = {
                "n": int(len(steps)), "median_abs_rel_error": float(np.median(np.abs(err))),
                "median_signed_rel_error": float(np.median(err)),
                "sum_predicted_over_measured": float(pred.sum() / steps["duration_s"].sum()),
                "max_context_tokens": int(steps["context_tokens"].max()),
                "max_profile_context_tokens": int(profile["batch_context_tokens"].max())}
    case.write(fit_by_range=by_point, cost=result)
    return result


def _resolved(args) -> argparse.Namespace:
    """``args`` with its configuration's defaults (:data:`DEFAULTS`) for the options left unset."""
    args = argparse.Namespace(**vars(args))
    if args.config != "study" and (args.plan or args.window_size is not None):
        raise gpu_plan.PlanError("--plan and --window-size are for --config study")
    for key, value in DEFAULTS[args.config].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.config == "study" and args.budget_s is None:
        args.budget_s = args.device_minutes * 60 - args.startup_s
        if args.budget_s <= 0:
            raise gpu_plan.PlanError(f"--device-minutes {args.device_minutes:g} leaves nothing after the "
                                     f"start-up allowance of {args.startup_s:g} s")
    return args


def run(args) -> int:
    """The phases, for parsed arguments (see :func:`build_parser`)."""
    args = _resolved(args)
    tag = args.tag or f"transformers_{args.device}" + ("" if args.config == "policy" else f"_{args.config}")
    if args.refit_only:
        print(json.dumps(refit(tag, args.data_dir), indent=1), flush=True)
        return 0
    if args.config == "study":
        return run_study(args, tag)

    from . import transformers_backend as mod

    t0 = time.perf_counter()
    shape, case_files, model = _start(args, tag, mod, t0)
    best, speed_ratio = _engine_setup(args, tag, mod, shape, model, case_files)
    case = CaseConfig("transformers", n_per_source=args.windows_per_source, speed_ratio=speed_ratio,
                      bisection_steps=args.bisection_steps, max_widenings=args.max_widenings,
                      bracket_factor=args.bracket_factor, adapt_bracket=args.adapt_bracket or None,
                      lambda_policy=CONFIGS[args.config]["lambda_policy"], tag=case_files.tag,
                      data_dir=args.data_dir, engine_kwargs=dict(shape=shape, device=args.device, model=model, **best),
                      **_guard(args))
    _finish(tag, args, _run_repetitions(case, args, t0, share=0.9), t0, case_files)
    return 0


def run_study(args, tag: str) -> int:
    """The study configuration: the plan (refused over its ceiling; ``--plan`` stops there), then the
    engine's tuning and profile, the plan again with the cost measured there, and the planned case."""
    t0 = time.perf_counter()
    # the windows the case may take: the plan's, or up to the most a faster engine could fit
    candidates = gpu_plan.study_windows(args.windows_per_source, args.window_size, sources=CASE_SOURCES,
                                        data_dir=args.data_dir)
    for cfg in CONFIGS["study"]["cpu" if args.device == "cpu" else "gpu"]:
        gpu_plan.check_cache([w for ws in candidates.values() for w in ws], cfg["block_size"],
                             cfg["num_blocks"], STUDY_SETTINGS["max_in_flight"])
    cost, source, cost_case = gpu_plan.load_cost(tag, args.data_dir, args.cost)
    plan = study_plan(args, candidates, cost, source, gpu_plan.measured_overheads(cost_case, cost),
                      fixed_s={**gpu_plan.ALLOWANCES_S, "start-up": args.startup_s},
                      budget_s=args.device_minutes * 60)
    print(plan.describe(), flush=True)
    plan.check()
    if args.plan:
        return 0

    from . import transformers_backend as mod

    shape, case_files, model = _start(args, tag, mod, t0)
    longest = max(int(w.input_tokens.max()) for ws in candidates.values() for w in ws)
    best, speed_ratio = _engine_setup(args, tag, mod, shape, model, case_files, longest_prompt=longest)
    engine = dict(shape=shape, device=args.device, model=model, **best)
    plan = _replan(args, tag, mod, engine, candidates, plan, t0)
    case_files.write(tuning={**case_files.tuning, "plan": plan.record()})
    case = CaseConfig("transformers", n_per_source=plan.n_per_source, windows=plan.case_windows(),
                      lambda_refs=plan.lambda_refs(), speed_ratio=speed_ratio,
                      lambda_policy=CONFIGS["study"]["lambda_policy"], tag=case_files.tag, data_dir=args.data_dir,
                      engine_kwargs=engine, **_guard(args))
    _finish(tag, args, _run_repetitions(case, args, t0, share=1.0), t0, case_files)
    return 0


def study_plan(args, windows: dict, cost, cost_source: str, overheads, *, fixed_s: dict,
               budget_s: float) -> gpu_plan.Plan:
    """The study case's plan for resolved ``args`` (windows per source, window size, repetitions,
    host guard) over ``windows`` (per source, :func:`~portbench.realengine.gpu_plan.study_windows`)
    with ``cost``: ``--windows-per-source`` of every source, or as many as fit ``budget_s``."""
    per_probe = args.probe_warmup + args.probe_repeats
    return gpu_plan.make_plan(
        windows, cost, cost_source=cost_source, overheads=overheads, budget_s=budget_s, fixed_s=fixed_s,
        n_per_source=args.windows_per_source, window_size=args.window_size, repetitions=args.repetitions,
        policies=CASE_POLICIES, region=CASE_REGION, lambda_policy=CONFIGS["study"]["lambda_policy"],
        probe_replays=2 * per_probe, reference_replays=len(CASE_POLICIES) * args.reference_probes * per_probe,
        max_retries=args.max_retries)


def _replan(args, tag: str, mod, engine: dict, windows: dict, plan, t0: float):
    """The plan made again on the engine itself: the step cost refitted on its profile (the tuned
    configuration's), a probe replay timed now, and the script's time left; as many of ``windows``
    per source as fit, at most ``--windows-per-source`` (said when not as planned)."""
    from ..engine import StepCost
    from . import probe_window

    cost = StepCost(**refit(tag, args.data_dir)["cost"])
    t = time.perf_counter()
    _, info = mod.replay(probe_window(), CONFIGS["study"]["lambda_policy"], **engine)
    around = time.perf_counter() - t - float(info["wall_s"])
    overheads = gpu_plan.Overheads(float(info["wall_s"]), around, "a probe replay on this engine")
    again = study_plan(argparse.Namespace(**{**vars(args), "windows_per_source": None}), windows, cost,
                       f"{tag}_cost.json (refitted on this engine's profile)", overheads,
                       fixed_s={"spent so far": time.perf_counter() - t0}, budget_s=args.budget_s)
    if again.n_per_source != plan.n_per_source or not again.fits:
        print(f"with this engine's cost the time left fits {again.n_per_source} windows per source (planned: "
              f"{plan.n_per_source})" + ("" if again.fits else ", not even those: the case stops at the budget"),
              flush=True)
    print(again.describe(), flush=True)
    return again


def _start(args, tag: str, mod, t0: float):
    """The model (tiny or 0.5B-class) and the case's files: (shape, set-up case, model)."""
    shape = TINY if args.tiny else HALF_B
    case_files = results.setup_case(tag, args.data_dir)
    case_files.folder.mkdir(parents=True, exist_ok=True)
    model = mod.build_model(shape, args.device)
    # The engine's stop runs a full garbage collection after every replay (0.5 s here with the
    # package's modules loaded): what is alive by now is frozen out of it, for the script's lifetime.
    gc.freeze()
    print(f"model built in {time.perf_counter() - t0:.1f} s ({args.config} configuration)", flush=True)
    return shape, case_files, model


def _engine_setup(args, tag: str, mod, shape, model, case_files, longest_prompt: int | None = None
                  ) -> tuple[dict, float]:
    """The tuned engine configuration and the speed ratio: tuned and profiled now (and written), or
    as a resumed case stored them. ``longest_prompt``: put in the tuning burst (:func:`tuning_burst`)."""
    if case_files.has("tuning", "profile"):
        # a resumed case keeps its engine configuration (and its λ_ref bracket)
        meta = case_files.tuning
        best, speed_ratio = meta["best_config"], float(meta["speed_ratio"])
        if "use_cuda_graph" in best.get("extra", {}) and isinstance(best["extra"]["use_cuda_graph"], list):
            best["extra"]["use_cuda_graph"] = tuple(best["extra"]["use_cuda_graph"])
        print(f"resuming {tag}: tuning and profile reused (best config {best}, speed ratio {speed_ratio:.3g})",
              flush=True)
        return best, speed_ratio
    config = CONFIGS[args.config]
    configs = [{**config["settings"], **c} for c in config["cpu" if args.device == "cpu" else "gpu"]]
    burst = tuning_burst(args.burst, max_prompt=512 if args.tiny else 2048, max_output=32 if args.tiny else 128,
                         longest_prompt=longest_prompt)
    box = gpu_plan.ALLOWANCES_S["tuning"] if args.config == "study" else 0.15 * args.budget_s
    best, tuning = tune(mod, shape, args.device, configs, burst, model, budget_s=box, policy=config["lambda_policy"])
    # --tiny (the CPU end-to-end test): a small grid, so that the case gets most of the budget
    grid = (dict(prefill_tokens=(0, 32, 128), decode_seqs=(0, 4), context_tokens=(32,), reps=2)
            if args.tiny else
            dict(prefill_tokens=(0, 64, 512, 2048, 8192), decode_seqs=(0, 1, 8, 32),
                 context_tokens=(256, 2048), reps=3) if args.config == "study" else {})
    tp = time.perf_counter()
    profile = mod.step_profile(shape, args.device, model=model, block_size=best["block_size"],
                               extra=best.get("extra"), attn_implementation=best.get("attn_implementation"), **grid)
    print(f"step profile: {len(profile)} steps timed in {time.perf_counter() - tp:.0f} s", flush=True)
    case_files.write(profile=profile)
    # Speed ratio: the simulator serves a decoding request one token per 1 ms; this engine needs
    # one step per token, and a step at a typical decode batch takes `decode_step_s`.
    decode = profile[(profile["prefill_tokens"] == 0) & (profile["decode_seqs"] > 0)]
    decode_step_s = float(decode["step_s"].median()) if len(decode) else 0.001
    speed_ratio = args.speed_ratio or 0.001 / decode_step_s
    print(f"best config {best}; decode step {decode_step_s * 1e3:.2f} ms -> speed ratio {speed_ratio:.3g}",
          flush=True)
    case_files.write(tuning={"tag": tag, "device": args.device, "config": args.config, "shape": shape.__dict__,
                             "best_config": best, "tuning": tuning, "decode_step_s": decode_step_s,
                             "speed_ratio": speed_ratio, "gpu": gpu_name(args.device)})
    return best, speed_ratio


def _guard(args) -> dict:
    """The host guard's settings of :class:`CaseConfig` from resolved ``args``."""
    return dict(drift_tolerance=args.drift_tolerance, max_retries=args.max_retries,
                reference_probes=args.reference_probes, probe_warmup=args.probe_warmup,
                probe_repeats=args.probe_repeats)


def _run_repetitions(case: CaseConfig, args, t0: float, share: float):
    """First one repetition of every window, then the others, each within ``share`` of the time
    left: a stop leaves every window covered. Returns the case's runs."""
    runs = []
    for reps in sorted({1, args.repetitions}):
        remaining = args.budget_s - (time.perf_counter() - t0)
        if remaining <= 0:
            break
        runs = run_case(dataclasses.replace(case, repetitions=reps), time_budget_s=remaining * share)
    return runs


def _finish(tag: str, args, runs, t0: float, case_files) -> None:
    fit = refit(tag, args.data_dir)
    print(f"step cost refitted on the profile: {fit['cost']} (median error {fit['fit_median_rel_error']:.1%})",
          flush=True)
    print(f"done: {len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {case_files.folder}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
