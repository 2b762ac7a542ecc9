"""The prepared RQ6 run for a GPU (transformers continuous batching), sized for a short device lease.

Three phases, each time-boxed inside ``--budget-s``:

1. **tune** — a fixed burst is replayed under a few engine configurations (token budget, block size,
   CUDA graphs, compile level); the fastest (generated tokens/s) is kept;
2. **profile** — the engine's step time vs prefill tokens, decode sequences and context tokens, for
   the calibrated engine model;
3. **case** — the study's case and control (:func:`portbench.realengine.study.run_case`): real-engine
   λ_ref by a short bisection bracketed around the simulator's λ_ref × the measured speed ratio, then
   ``slai_faithful`` and ``vllm_faithful`` at HIGH_PRESSURE (``--repetitions`` each, every run
   guarded by host probes), as many windows per source as time allows.

Everything lands in ``data/results/realengine/<tag>_*``; the RQ6 notebook reads it. On a CPU with
``--tiny`` the same script runs end to end in a minute or two (that is how it is tested).

    python -m portbench.realengine.gpu --device cuda --budget-s 480 --tag h200
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .. import store
from ..workload import make_window
from . import ModelShape
from .study import realengine_dir, run_case

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


def tuning_burst(n: int, seed: int = 0, max_prompt: int = 2048, max_output: int = 128):
    """A simultaneous burst with the token-length mix of the windows (seeded)."""
    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(max_prompt / 8), 1.0, n).astype(int), 8, max_prompt)
    outputs = np.clip(rng.lognormal(np.log(max_output / 4), 0.8, n).astype(int), 2, max_output)
    return make_window("tuning_burst", "synthetic", np.zeros(n), inputs, outputs, outputs)


def tune(mod, shape, device, configs, burst, model, budget_s):
    """Replay ``burst`` under each config until ``budget_s``; returns (best config, table)."""
    rows, t0 = [], time.perf_counter()
    for k, cfg in enumerate(configs):
        if rows and time.perf_counter() - t0 > budget_s:
            break
        try:
            mod.replay(burst, "fifo", shape=shape, device=device, model=model, **cfg)      # warm-up
            _, info = mod.replay(burst, "fifo", shape=shape, device=device, model=model, **cfg)
            rows.append({"config": k, **{key: json.dumps(v) if isinstance(v, dict) else v
                                          for key, v in cfg.items()},
                         "tokens_per_s": info.get("generated_tokens_per_s", np.nan), "wall_s": info.get("wall_s")})
        except Exception as exc:                 # a configuration this engine/device refuses
            rows.append({"config": k, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(f"tune {k}: {rows[-1]}", flush=True)
    ok = [r for r in rows if "tokens_per_s" in r and np.isfinite(r["tokens_per_s"])]
    if not ok:
        raise RuntimeError(f"no engine configuration worked: {rows}")
    best = configs[max(ok, key=lambda r: r["tokens_per_s"])["config"]]
    return best, rows


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=add_help)
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
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
    ap.add_argument("--speed-ratio", type=float, default=None,
                    help="override the measured speed ratio (brackets the λ_ref search)")
    ap.add_argument("--tag", default=None, help="file prefix (default: transformers_<device>)")
    ap.add_argument("--data-dir", type=Path, default=None)
    return ap


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


def run(args) -> int:
    """The three phases, for parsed arguments (see :func:`build_parser`)."""

    from . import transformers_backend as mod

    t0 = time.perf_counter()
    shape = TINY if args.tiny else HALF_B
    configs = CPU_CONFIGS if args.device == "cpu" else GPU_CONFIGS
    tag = args.tag or f"transformers_{args.device}"
    out = realengine_dir(args.data_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = mod.build_model(shape, args.device)
    burst = tuning_burst(args.burst, max_prompt=512 if args.tiny else 2048, max_output=32 if args.tiny else 128)

    best, tuning = tune(mod, shape, args.device, configs, burst, model, budget_s=0.2 * args.budget_s)
    # --tiny (the CPU end-to-end test): a small grid, so that the case gets most of the budget
    grid = (dict(prefill_tokens=(0, 32, 128), decode_seqs=(0, 4), context_tokens=(32,), reps=2)
            if args.tiny else {})
    profile = mod.step_profile(shape, args.device, model=model, block_size=best["block_size"],
                               extra=best.get("extra"), **grid)
    store.atomic_write(out / f"{tag}_step_profile.parquet", lambda p: profile.to_parquet(p, index=False))
    # Speed ratio: the simulator serves a decoding request one token per 1 ms; this engine needs
    # one step per token, and a step at a typical decode batch takes `decode_step_s`.
    decode = profile[(profile["prefill_tokens"] == 0) & (profile["decode_seqs"] > 0)]
    decode_step_s = float(decode["step_s"].median()) if len(decode) else 0.001
    speed_ratio = args.speed_ratio or 0.001 / decode_step_s
    print(f"best config {best}; decode step {decode_step_s * 1e3:.2f} ms -> speed ratio {speed_ratio:.3g}",
          flush=True)
    meta = {"tag": tag, "device": args.device, "shape": shape.__dict__, "best_config": best,
            "tuning": tuning, "decode_step_s": decode_step_s, "speed_ratio": speed_ratio}
    store.atomic_write(out / f"{tag}_tuning.json", lambda p: p.write_text(json.dumps(meta, indent=1, default=str)))

    remaining = args.budget_s - (time.perf_counter() - t0)
    runs = run_case("transformers", n_per_source=args.windows_per_source, speed_ratio=speed_ratio,
                    bisection_steps=args.bisection_steps, time_budget_s=max(0.0, remaining * 0.9),
                    repetitions=args.repetitions, drift_tolerance=args.drift_tolerance,
                    max_retries=args.max_retries, max_widenings=args.max_widenings,
                    reference_probes=args.reference_probes,
                    tag=f"{tag}_case", data_dir=args.data_dir,
                    shape=shape, device=args.device, model=model, **best)
    print(f"done: {len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
