"""vLLM's own scheduler (the ``vllm_native`` engine model) against the ``vllm_v1`` model, run by run.

For each policy with a vLLM form and each configuration, every chosen window at every region's load
(the window compressed by its ``vllm_v1`` λ_ref, ``data/results/lambda_ref_vllm_v1.csv``, times the
region's factor, as the campaign does) runs on both engine models with the same limits and step
cost. A run is *identical* when every request's admission, first-token and finish times agree
exactly (both clocks are integer picoseconds, so equal decisions give equal times). For a run that
differs, both are replayed step by step and the first differing step is classed
(:data:`portbench.engine.vllm_native.CLASSES`: a vLLM rule ``vllm_v1`` lacks, a preemption victim,
tie order, ...). Speeds (simulated requests per second of wall time, vLLM's import and configuration
excluded) are printed beside ``vllm_v1``'s and ``lssp``'s on the same runs.

Configurations (``--configs``):

- ``campaign``: the campaign's ``vllm_v1`` limits (2,048-token budget, 64 sequences, 131,072 KV
  tokens), vLLM 0.32's defaults otherwise (full-sequence KV reservation at admission, which
  ``vllm_v1`` has too);
- ``campaign_first_chunk``: the same with both admitting on the first chunk's blocks only
  (``reserve_full_isl=False``, vLLM before 0.32's option);
- ``study``: the study's real-system configuration: 32,768-token budget, chunked prefill off (vLLM;
  vllm_v1 always chunks), ``max_model_len`` 32,768, at most 32 requests running (the study's 32
  client threads, as an engine cap here), 500,000 KV tokens;
- ``long_prefill``: the campaign's with ``long_prefill_token_threshold`` 256.

Runs in the vLLM environment (``.venv-vllm/bin/python benchmarks/native_vs_model.py``); vLLM's
scheduler and ``vllm_v1``'s numba loops share one process (only building a whole vLLM engine clashes
with numba). ``--out FILE.csv`` writes one row per run; ``--save`` writes them where the fidelity
chapter reads them (:func:`portbench.results.native_check_path`):

    .venv-vllm/bin/python benchmarks/native_vs_model.py --windows-per-source 0 --configs campaign study \
        long_prefill --policies fifo edf vllm_priority --no-lssp --save
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from portbench import results, store  # noqa: E402
from portbench.engine import LsspModel, simulate  # noqa: E402
from portbench.engine import vllm_native as nat  # noqa: E402
from portbench.policies import make_policy  # noqa: E402
from portbench.regions import REGIONS  # noqa: E402
from portbench.workload import scale  # noqa: E402

STAMPS = ("admit_s", "first_token_s", "finish_s")

#: name -> (limits for both models, vLLM-only options)
CONFIGS = {
    "campaign": ({}, {}),
    "campaign_first_chunk": ({"reserve_full_isl": False}, {}),
    "study": ({"max_num_batched_tokens": 32768, "max_active_sequences": 32, "max_kv_tokens": 500_000},
              {"enable_chunked_prefill": False, "max_model_len": 32768}),
    "long_prefill": ({"long_prefill_token_threshold": 256}, {}),
}


def models(config: str):
    from portbench.engine.vllm_v1 import VllmV1Model

    shared, native_only = CONFIGS[config]
    return VllmV1Model(**shared), nat.VllmNativeModel(**shared, **native_only)


def lambda_refs() -> pd.Series:
    path = ROOT / "data" / "results" / "lambda_ref_vllm_v1.csv"
    return pd.read_csv(path).set_index("window_id")["lambda_ref"]


def pick_windows(per_source: int | None):
    manifest = store.list_windows()
    windows = []
    for source in dict.fromkeys(manifest["source"]):
        ids = manifest.loc[manifest["source"] == source, "window_id"].tolist()
        windows += store.load_windows(window_ids=ids[:per_source] if per_source else ids)
    return windows


def timed(window, policy: str, model):
    t = time.perf_counter()
    result = simulate(window, make_policy(policy), model)
    return result, time.perf_counter() - t


def identical(a, b) -> bool:
    return all(np.array_equal(getattr(a, s), getattr(b, s), equal_nan=True) for s in STAMPS)


def n_differing(a, b) -> int:
    """Requests whose admission, first token or finish differ between two runs."""
    same = np.ones(len(a.admit_s), dtype=bool)
    for s in STAMPS:
        x, y = getattr(a, s), getattr(b, s)
        same &= (x == y) | (np.isnan(x) & np.isnan(y))
    return int((~same).sum())


def compare(window, policy: str, model, native):
    """(class, step, detail) of the first differing step of one run (None when none differs)."""
    _, ms = nat.record_model_steps(window, make_policy(policy), model)
    _, ns = nat.record_native_steps(window, make_policy(policy), native)
    k = nat.first_differing_step(ms, ns)
    if k is None:
        return None, None, "step logs agree"
    cls, detail = nat.classify_step(k, ms, ns, window, policy, native)
    return cls, k, detail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", nargs="+", default=["fifo"])
    ap.add_argument("--configs", nargs="+", default=["campaign", "campaign_first_chunk"],
                    choices=list(CONFIGS))
    ap.add_argument("--windows-per-source", type=int, default=2,
                    help="the first N windows of each source (0: all 40)")
    ap.add_argument("--regions", nargs="+", default=list(REGIONS), choices=list(REGIONS))
    ap.add_argument("--no-lssp", action="store_true", help="do not time the lssp model")
    ap.add_argument("--out", type=Path, help="write one row per run (CSV)")
    ap.add_argument("--save", action="store_true",
                    help="write the rows where the fidelity chapter reads them (data/results/native_vs_model.csv)")
    args = ap.parse_args(argv)

    nat.require_vllm()
    for p in args.policies:
        nat.native_form(p)
    t = time.perf_counter()
    windows = pick_windows(args.windows_per_source or None)
    lam = lambda_refs()
    # vLLM's import and each configuration's build happen once, outside the timed runs
    first = scale(windows[0], lam[windows[0].window_id])
    for config in args.configs:
        for p in args.policies:
            for m in (*models(config), LsspModel()):       # numba's loops are loaded here too
                simulate(first, make_policy(p), m)
    print(f"vLLM {nat.vllm_version()} loaded and configured in {time.perf_counter() - t:.1f} s; "
          f"{len(windows)} windows x {len(args.regions)} regions")
    rows = []
    for config in args.configs:
        model, native = models(config)
        for policy in args.policies:
            wall = collections.Counter()
            n_req = 0
            classes = collections.Counter()
            examples = {}
            n_same = n_runs = 0
            for w in windows:
                for region in args.regions:
                    s = scale(w, lam[w.window_id] * REGIONS[region])
                    a, ta = timed(s, policy, model)
                    b, tb = timed(s, policy, native)
                    wall["vllm_v1"] += ta
                    wall["vllm_native"] += tb
                    if not args.no_lssp:
                        wall["lssp"] += timed(s, policy, LsspModel())[1]
                    n_req += len(s)
                    same = identical(a, b)
                    n_runs += 1
                    n_same += same
                    cls = step = None
                    detail = ""
                    if not same:
                        cls, step, detail = compare(s, policy, model, native)
                        cls = cls or "stamps_only"
                        classes[cls] += 1
                        examples.setdefault(cls, (w.window_id, region, step, detail))
                    rows.append({"config": config, "policy": policy, "window_id": w.window_id,
                                 "source": w.source, "region": region, "identical": same,
                                 "requests_differing": n_differing(a, b), "first_step": step,
                                 "class": cls, "detail": detail,
                                 "steps_model": a.n_steps, "steps_native": b.n_steps,
                                 "preemptions_model": a.n_preemptions,
                                 "preemptions_native": b.n_preemptions,
                                 "wall_model_s": ta, "wall_native_s": tb})
            print(f"\n[{config}] {policy}: {n_same}/{n_runs} runs identical "
                  f"({100 * n_same / n_runs:.1f}%)")
            for cls, count in classes.most_common():
                wid, region, step, detail = examples[cls]
                print(f"  {cls}: {count} runs ({100 * count / n_runs:.1f}%) -- "
                      f"{nat.CLASSES.get(cls, 'logs agree; stamps differ')}")
                print(f"      e.g. {wid} {region}, step {step}: {detail}")
            speeds = "  ".join(f"{name} {n_req / s:,.0f} req/s" for name, s in wall.items())
            print(f"  speed ({n_req:,} simulated requests): {speeds}")
    out = results.native_check_path() if args.save else args.out
    if out:
        frame = pd.DataFrame(rows)
        store.atomic_write(Path(out), lambda p: frame.to_csv(p, index=False))
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
