"""The study's RQ6 case on vLLM on this machine's CPU (run with the vLLM environment, `.venv-vllm`).

    .venv-vllm/bin/python benchmarks/rq6_vllm_cpu.py [--windows-per-source 10] [--budget-s 5400]

Measures vLLM's step profile (saved for the calibrated engine model), derives the speed ratio that
brackets the real-engine λ_ref search, then runs the case and its control with
``portbench.realengine.study.run_case``; results land in ``data/results/realengine/vllm_cpu_*``.
"""

import argparse
import dataclasses
import json
import time

from portbench import store
from portbench.realengine import ModelShape
from portbench.realengine.study import realengine_dir, run_case

#: A tiny random Llama: a window replays in seconds on two CPU cores.
SHAPE = ModelShape(n_layers=2, hidden_size=128, n_heads=4, n_kv_heads=4, intermediate_size=256)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows-per-source", type=int, default=10)
    ap.add_argument("--bisection-steps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=5400)
    ap.add_argument("--tag", default="vllm_cpu")
    args = ap.parse_args()

    from portbench.realengine import vllm_backend as mod

    out = realengine_dir()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    profile = mod.step_profile(shape=SHAPE)
    store.atomic_write(out / f"{args.tag}_step_profile.parquet", lambda p: profile.to_parquet(p, index=False))
    decode = profile[(profile["prefill_tokens"] == 0) & (profile["decode_seqs"] > 0)]
    decode_step_s = float(decode["step_s"].median())
    speed_ratio = 0.001 / decode_step_s
    print(f"decode step {decode_step_s * 1e3:.2f} ms -> speed ratio {speed_ratio:.3g}", flush=True)
    store.atomic_write(out / f"{args.tag}_tuning.json", lambda p: p.write_text(json.dumps(
        {"shape": dataclasses.asdict(SHAPE), "decode_step_s": decode_step_s, "speed_ratio": speed_ratio},
        indent=1)))
    runs = run_case("vllm", n_per_source=args.windows_per_source, speed_ratio=speed_ratio,
                    bisection_steps=args.bisection_steps,
                    time_budget_s=args.budget_s - (time.perf_counter() - t0), tag=f"{args.tag}_case",
                    shape=SHAPE)
    print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
