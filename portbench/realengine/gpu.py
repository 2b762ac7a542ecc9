"""The prepared RQ6 run for a GPU (transformers continuous batching), sized for a short device lease.

``--config`` picks the engine settings (:data:`CONFIGS`): ``policy`` (each policy with the token
budget the tuning picks; SLAI chunks prompts) or ``study``, the study's real-system configuration
(the A100 runs': both policies at a 32,768-token budget and ``max_model_len``, no chunked prefill,
256 sequences, at most 32 requests in flight, λ_ref searched on ``vllm_faithful``; see
:data:`portbench.realengine.vllm_backend.STUDY_ENGINE` for where each fact comes from).

Three phases, each time-boxed inside ``--budget-s``:

1. **tune** — a fixed burst is replayed under a few engine configurations (block size, CUDA graphs,
   compile level, and under ``policy`` the token budget); the one whose replay costs the least wall
   time, its set-up (cache, CUDA-graph warm-up) included, is kept: every replay of the case and of
   its probes pays both, and a short lease is spent on them;
2. **profile** — the engine's step time vs prefill tokens, decode sequences and context tokens, for
   the calibrated engine model;
3. **case** — the study's case and control (:func:`portbench.realengine.study.run_case`): real-engine
   λ_ref by a short bisection bracketed around the simulator's λ_ref × the measured speed ratio, then
   ``slai_faithful`` and ``vllm_faithful`` at HIGH_PRESSURE, every run guarded by host probes:
   first one repetition of every window (sources interleaved), then the further ``--repetitions``,
   as many as time allows. Later windows of a source bracket their λ_ref search around that
   source's windows searched so far (``--adapt-bracket``).

Everything lands in ``data/results/realengine/<tag>_*`` (:func:`portbench.results.setup_case`); the
RQ6 notebook reads it. On a CPU with
``--tiny`` the same script runs end to end in a minute or two (that is how it is tested).

    python -m portbench.realengine.gpu --device cuda --budget-s 480 --tag h200
    python -m portbench.realengine.gpu --device cuda --config study --budget-s 300 --tag h200_study

Restarting with the same ``--tag`` resumes the case (the tuning and profile are reused).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from .. import results
from ..workload import make_window
from . import PROBE_REPEATS, PROBE_WARMUP, ModelShape, gpu_name
from .study import CaseConfig, run_case

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

#: The study's real-system settings carried to this engine (the token budget is the policy's, so the
#: tuning varies only how the engine runs: CUDA graphs for both paths, for the decode path alone, none).
#: 4,096 blocks of 256 tokens hold 32 requests of 32,768 tokens.
STUDY_SETTINGS = {"max_batch_tokens": 32768, "max_in_flight": 32, "enable_chunked_prefill": False}
STUDY_EXTRA = {"max_requests_per_batch": 256}
STUDY_GPU_CONFIGS = [
    {"block_size": 256, "num_blocks": 4096, "extra": {**STUDY_EXTRA, "use_cuda_graph": False}},
    {"block_size": 256, "num_blocks": 4096, "extra": {**STUDY_EXTRA, "use_cuda_graph": (False, True)}},
    {"block_size": 256, "num_blocks": 4096, "extra": {**STUDY_EXTRA, "use_cuda_graph": True}},
]
STUDY_CPU_CONFIGS = [
    {"block_size": 32, "num_blocks": 2048, "extra": dict(STUDY_EXTRA)},
    {"block_size": 64, "num_blocks": 1024, "extra": dict(STUDY_EXTRA)},
]

#: ``--config``: engine settings common to every tuned configuration, the tuning's candidates
#: (GPU, CPU), the policy the tuning burst and the λ_ref search replay.
CONFIGS = {
    "policy": {"settings": {}, "gpu": GPU_CONFIGS, "cpu": CPU_CONFIGS, "lambda_policy": "fifo"},
    "study": {"settings": STUDY_SETTINGS, "gpu": STUDY_GPU_CONFIGS, "cpu": STUDY_CPU_CONFIGS,
              "lambda_policy": "vllm_faithful"},
}


def tuning_burst(n: int, seed: int = 0, max_prompt: int = 2048, max_output: int = 128):
    """A simultaneous burst with the token-length mix of the windows (seeded)."""
    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(max_prompt / 8), 1.0, n).astype(int), 8, max_prompt)
    outputs = np.clip(rng.lognormal(np.log(max_output / 4), 0.8, n).astype(int), 2, max_output)
    return make_window("tuning_burst", "synthetic", np.zeros(n), inputs, outputs, outputs)


def tune(mod, shape, device, configs, burst, model, budget_s, policy="fifo"):
    """Replay ``burst`` under ``policy`` and each config until ``budget_s``; returns (best config,
    table). The best is the one whose (second) replay took the least wall time, set-up included."""
    rows, t0 = [], time.perf_counter()
    for k, cfg in enumerate(configs):
        if rows and time.perf_counter() - t0 > budget_s:
            break
        try:
            # a configuration that stalls is given up after a minute, not the replay's default 5
            mod.replay(burst, policy, shape=shape, device=device, model=model, timeout_s=60, **cfg)  # warm-up
            _, info = mod.replay(burst, policy, shape=shape, device=device, model=model, timeout_s=60, **cfg)
            setup = float(info.get("setup_s", 0.0))
            rows.append({"config": k, **{key: json.dumps(v) if isinstance(v, (dict, tuple)) else v
                                          for key, v in cfg.items()},
                         "tokens_per_s": info.get("generated_tokens_per_s", np.nan), "wall_s": info.get("wall_s"),
                         "setup_s": setup, "replay_s": setup + float(info.get("wall_s", np.nan)),
                         "n_steps": info.get("n_steps")})
        except Exception as exc:                 # a configuration this engine/device refuses
            rows.append({"config": k, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(f"tune {k}: {rows[-1]}", flush=True)
    ok = [r for r in rows if "replay_s" in r and np.isfinite(r["replay_s"])]
    if not ok:
        raise RuntimeError(f"no engine configuration worked: {rows}")
    best = configs[min(ok, key=lambda r: r["replay_s"])["config"]]
    return best, rows


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=add_help)
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--config", default="policy", choices=sorted(CONFIGS),
                    help="engine settings: policy (each policy's own) or study (the study's real system)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (CPU end-to-end test)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget for all phases")
    ap.add_argument("--windows-per-source", type=int, default=8)
    ap.add_argument("--bisection-steps", type=int, default=4)
    ap.add_argument("--burst", type=int, default=96, help="requests in the tuning burst")
    ap.add_argument("--repetitions", type=int, default=2, help="runs of each (window, policy)")
    ap.add_argument("--drift-tolerance", type=float, default=0.15,
                    help="host probe drift that makes a run be re-run")
    ap.add_argument("--max-retries", type=int, default=2, help="re-runs of a run the host guard rejected")
    ap.add_argument("--reference-probes", type=int, default=3,
                    help="host probes that make each policy's reference at the start of the case")
    ap.add_argument("--max-widenings", type=int, default=3,
                    help="widenings of the λ_ref bracket when the knee is outside it")
    ap.add_argument("--bracket-factor", type=float, default=8.0,
                    help="the first λ_ref bracket of a source: guess / factor .. guess * factor")
    ap.add_argument("--adapt-bracket", type=float, default=2.0,
                    help="later windows of a source: bracket factor around its searched windows' ratio (0: off)")
    ap.add_argument("--probe-warmup", type=int, default=PROBE_WARMUP, help="untimed replays of each host probe")
    ap.add_argument("--probe-repeats", type=int, default=PROBE_REPEATS, help="timed replays of each host probe")
    ap.add_argument("--speed-ratio", type=float, default=None,
                    help="override the measured speed ratio (brackets the λ_ref search)")
    ap.add_argument("--tag", default=None, help="file prefix (default: transformers_<device>)")
    ap.add_argument("--refit-only", action="store_true",
                    help="only refit the step cost on a finished run's profile and steps (no engine)")
    ap.add_argument("--data-dir", type=Path, default=None)
    return ap


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


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


def run(args) -> int:
    """The three phases, for parsed arguments (see :func:`build_parser`)."""

    tag = args.tag or f"transformers_{args.device}" + ("" if args.config == "policy" else f"_{args.config}")
    if args.refit_only:
        print(json.dumps(refit(tag, args.data_dir), indent=1), flush=True)
        return 0

    from . import transformers_backend as mod

    t0 = time.perf_counter()
    shape = TINY if args.tiny else HALF_B
    config = CONFIGS[args.config]
    settings = dict(config["settings"])
    configs = [{**settings, **c} for c in config["cpu" if args.device == "cpu" else "gpu"]]
    case_files = results.setup_case(tag, args.data_dir)
    case_files.folder.mkdir(parents=True, exist_ok=True)
    model = mod.build_model(shape, args.device)
    print(f"model built in {time.perf_counter() - t0:.1f} s ({args.config} configuration)", flush=True)
    if case_files.has("tuning", "profile"):
        # a resumed case keeps its engine configuration (and its λ_ref bracket)
        meta = case_files.tuning
        best, speed_ratio = meta["best_config"], float(meta["speed_ratio"])
        if "use_cuda_graph" in best.get("extra", {}) and isinstance(best["extra"]["use_cuda_graph"], list):
            best["extra"]["use_cuda_graph"] = tuple(best["extra"]["use_cuda_graph"])
        print(f"resuming {tag}: tuning and profile reused (best config {best}, speed ratio {speed_ratio:.3g})",
              flush=True)
    else:
        burst = tuning_burst(args.burst, max_prompt=512 if args.tiny else 2048,
                             max_output=32 if args.tiny else 128)
        best, tuning = tune(mod, shape, args.device, configs, burst, model, budget_s=0.15 * args.budget_s,
                            policy=config["lambda_policy"])
        # --tiny (the CPU end-to-end test): a small grid, so that the case gets most of the budget
        grid = (dict(prefill_tokens=(0, 32, 128), decode_seqs=(0, 4), context_tokens=(32,), reps=2)
                if args.tiny else
                dict(prefill_tokens=(0, 64, 512, 2048, 8192), decode_seqs=(0, 1, 8, 32),
                     context_tokens=(256, 2048), reps=3) if args.config == "study" else {})
        tp = time.perf_counter()
        profile = mod.step_profile(shape, args.device, model=model, block_size=best["block_size"],
                                   extra=best.get("extra"), **grid)
        print(f"step profile: {len(profile)} steps timed in {time.perf_counter() - tp:.0f} s", flush=True)
        case_files.write(profile=profile)
        # Speed ratio: the simulator serves a decoding request one token per 1 ms; this engine needs
        # one step per token, and a step at a typical decode batch takes `decode_step_s`.
        decode = profile[(profile["prefill_tokens"] == 0) & (profile["decode_seqs"] > 0)]
        decode_step_s = float(decode["step_s"].median()) if len(decode) else 0.001
        speed_ratio = args.speed_ratio or 0.001 / decode_step_s
        print(f"best config {best}; decode step {decode_step_s * 1e3:.2f} ms -> speed ratio {speed_ratio:.3g}",
              flush=True)
        meta = {"tag": tag, "device": args.device, "config": args.config, "shape": shape.__dict__,
                "best_config": best, "tuning": tuning, "decode_step_s": decode_step_s,
                "speed_ratio": speed_ratio, "gpu": gpu_name(args.device)}
        case_files.write(tuning=meta)

    case = CaseConfig("transformers", n_per_source=args.windows_per_source, speed_ratio=speed_ratio,
                      bisection_steps=args.bisection_steps, drift_tolerance=args.drift_tolerance,
                      max_retries=args.max_retries, max_widenings=args.max_widenings,
                      bracket_factor=args.bracket_factor, adapt_bracket=args.adapt_bracket or None,
                      reference_probes=args.reference_probes, probe_warmup=args.probe_warmup,
                      probe_repeats=args.probe_repeats, lambda_policy=config["lambda_policy"],
                      tag=case_files.tag, data_dir=args.data_dir,
                      engine_kwargs=dict(shape=shape, device=args.device, model=model, **best))
    # first one repetition of every window, then the others: a stop leaves every window covered
    runs = []
    for reps in sorted({1, args.repetitions}):
        remaining = args.budget_s - (time.perf_counter() - t0)
        if remaining <= 0:
            break
        runs = run_case(dataclasses.replace(case, repetitions=reps), time_budget_s=remaining * 0.9)
    fit = refit(tag, args.data_dir)
    print(f"step cost refitted on the profile: {fit['cost']} (median error {fit['fit_median_rel_error']:.1%})",
          flush=True)
    print(f"done: {len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {case_files.folder}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
