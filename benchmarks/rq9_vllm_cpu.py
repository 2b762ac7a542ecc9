"""RQ9 on the real engine: vLLM (CPU build, a tiny random-weight Llama) with its prefix cache off and
on, beside the ``vllm_v1`` model's prediction for the same requests.

    .venv-vllm/bin/python benchmarks/rq9_vllm_cpu.py                 # run (resumes), then compare
    .venv-vllm/bin/python benchmarks/rq9_vllm_cpu.py --compare-only  # compare what is stored

What runs (fixed before any run, not tuned to its outcome):

- **Windows**: the first 50-request block (:func:`portbench.open_questions.sub_windows`, RQ8's
  smallest size) of each ``mooncake_conversation`` window; the ``--windows`` blocks (default 3)
  whose served prompts share the most tokens with an earlier prompt of the block (an unbounded
  cache's share, from the block hashes), so that the cache has something to serve. Requests with
  prompt + output above ``max_model_len`` = 16,384 are refused by both engines (the replay's
  refusal rule): the CPU build's attention over longer contexts would take minutes a request.
- **Engine**: vLLM's FCFS (``fifo``), 2,048-token budget with chunked prefill, 64 sequences,
  0.25 GiB of KV cache; prefix caching off, then on, with prompts whose tokens are the same exactly
  where the trace's block hashes say so (:func:`portbench.realengine.vllm_backend.prefix_prompt`).
- **Load**: each block at ``PRE_KNEE`` (0.8 ×) of its λ_ref under the ``vllm_v1`` model with the
  cache off (the same limits, the default CPU step cost); the same arrivals with the cache on.
- **Runs**: two repetitions of each (block, cache) pair, each between host probes and re-run while
  they drift (:func:`portbench.realengine.study.run_case`); the cases ``vllm_cpu_rq9_cache_off_case`` and
  ``vllm_cpu_rq9_cache_on_case`` in ``data/results/realengine/``, written after every run, interleaved
  block by block so that both see the same host.

The comparison (printed, and written to ``data/results/rq9_vllm_cpu_summary.csv``): the ``vllm_v1`` model
with the cache off and on, the real runs' limits, KV blocks (the engine's block size and capacity)
and a step cost fitted on the real steps of the *other* blocks (``rich``, cross-validated by
block), on the same scaled requests; per request the E2E and TTFT error against each real run
(median and p90), beside the real engine against itself (repetition 0 against 1, the same
requests), and their ratio; the tokens served from the cache (vLLM's ``num_cached_tokens`` at a
request's first scheduling; the model's hit tokens over admissions) as a share of the prompt
tokens; and the cache's effect, mean E2E and TTFT with the cache on relative to off, real (per
repetition) and predicted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# No numba in the process that builds vLLM's engine (the two clash): the engine models are
# imported by the functions that simulate, and the runs go to a child process (--run-only).
from portbench import results, rq9, store  # noqa: E402
from portbench.open_questions import sub_windows  # noqa: E402
from portbench.workload import BASE_SLO_MULTIPLIER, scale, with_slo  # noqa: E402

SIZE = 50
MAX_MODEL_LEN = 16384
REGION = "PRE_KNEE"
POLICY = "fifo"
ENGINE = {"max_num_batched_tokens": 2048, "max_num_seqs": 64, "kv_cache_gib": 0.25,
          "max_model_len": MAX_MODEL_LEN}
TAGS = {False: "vllm_cpu_rq9_cache_off_case", True: "vllm_cpu_rq9_cache_on_case"}


def refused(w) -> np.ndarray:
    """The requests both engines refuse: prompt + output above ``max_model_len`` (the replay's rule)."""
    from portbench.fidelity.counterpart import real_refused

    return real_refused(w, MAX_MODEL_LEN)


def shared_share(w) -> float:
    """The share of the served prompt tokens of block ``w`` that an unbounded cache could serve: the
    leading 512-token hash blocks that an earlier served prompt of the block also had."""
    served = np.flatnonzero(~refused(w))
    seen, shared, total = set(), 0, 0
    for i in served:
        hashes, n = w.block_hashes[i].tolist(), int(w.input_tokens[i])
        k = next((j for j, h in enumerate(hashes) if h not in seen), len(hashes))
        shared += min(k * int(w.meta["block_tokens"]), n)
        total += n
        seen.update(hashes)
    return shared / total if total else 0.0


def first_block(window_id: str):
    """The first ``SIZE`` requests of the source's window ``window_id``, at the base SLO."""
    return sub_windows(with_slo(store.load_window(window_id), BASE_SLO_MULTIPLIER), SIZE)[0]


def chosen_blocks(k: int) -> list:
    blocks = [first_block(wid) for wid in rq9.source_window_ids()]
    ranked = sorted(blocks, key=lambda w: (-shared_share(w), w.window_id))
    return ranked[:k]


def sim_model(**kw):
    from portbench.engine.vllm_v1 import VllmV1Model

    return VllmV1Model(max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
                       max_active_sequences=ENGINE["max_num_seqs"], **kw)


def lambda_entry(w) -> dict:
    from portbench.fidelity.counterpart import served_part
    from portbench.regions import find_lambda_ref

    lam = find_lambda_ref(served_part(w, refused(w)), model=sim_model()).lambda_ref
    return {"lambda": float(lam), "pinned": False, "pinned_side": "", "probes": 0,
            "from": "vllm_v1 model, cache off, default step cost, the real runs' limits"}


def run(blocks, lambdas, budget_s) -> None:
    from portbench.realengine.study import CaseConfig, run_case

    t0 = time.perf_counter()
    for j in range(len(blocks)):
        for cache in (False, True):
            left = None if budget_s is None else budget_s - (time.perf_counter() - t0)
            if left is not None and left <= 0:
                print("time budget reached: rerun to resume")
                return
            config = CaseConfig(backend="vllm", windows=tuple(blocks[:j + 1]), policies=(POLICY,),
                                region=REGION, repetitions=2, tag=TAGS[cache], lambda_refs=lambdas,
                                engine_kwargs={**ENGINE, "enable_prefix_caching": cache})
            run_case(config, time_budget_s=left)


def predictions(case, blocks, cache: bool, kv_tokens: int, block_size: int) -> pd.DataFrame:
    """The model's run of every stored (block, repetition), per request, with the step cost fitted
    on the other blocks' real steps."""
    from portbench.engine import simulate
    from portbench.engine.stepcost import cross_validated_costs
    from portbench.fidelity.counterpart import on_full_window, served_part
    from portbench.policies import make_policy

    runs = case.runs
    costs = cross_validated_costs(case.steps, runs, k=runs["window_id"].nunique(), kind="rich")
    by_id = {w.window_id: w for w in blocks}
    out = []
    for wid, g in runs.groupby("window_id"):
        w = scale(by_id[wid], float(g["load_factor"].iloc[0]))
        out_of = refused(w)
        model = sim_model(max_kv_tokens=kv_tokens, block_size=block_size, enable_prefix_caching=cache,
                          cost=costs[(costs["folds"][wid], POLICY)])
        r = simulate(served_part(w, out_of), make_policy(POLICY), model)
        full = on_full_window(w, r, out_of)
        out.append(pd.DataFrame({"window_id": wid, "request_index": np.arange(len(w)),
                                 "arrival_s": w.arrival_s, "input_tokens": w.input_tokens,
                                 "admit_s": full.admit_s, "first_token_s": full.first_token_s,
                                 "finish_s": full.finish_s, "refused": out_of,
                                 "hit_tokens_run": r.prefix_hit_tokens, "queried_tokens_run": r.prefix_queried_tokens,
                                 "preemptions_run": r.n_preemptions}))
    return pd.concat(out, ignore_index=True)


def _errors(a: pd.DataFrame, b: pd.DataFrame, what: str) -> np.ndarray:
    """|a − b| / b per request (E2E: finish − arrival; TTFT: first token − arrival), both served."""
    key = {"e2e": "finish_s", "ttft": "first_token_s"}[what]
    m = a.merge(b, on=["window_id", "request_index"], suffixes=("_a", "_b"))
    x = m[f"{key}_a"] - m["arrival_s_a"]
    y = m[f"{key}_b"] - m["arrival_s_b"]
    ok = x.notna() & y.notna() & (y > 0)
    return (np.abs(x - y) / y)[ok].to_numpy()


def compare(blocks) -> pd.DataFrame:
    rows = []
    means = {}
    for cache, tag in TAGS.items():
        case = results.Case(tag)
        if not case.has("runs"):
            print(f"{tag}: no runs yet")
            return pd.DataFrame()
        info = case.provenance.get("engine_info", {})
        bs = int(info.get("block_size", 16))
        kv = int(info["kv_capacity_tokens"]) - bs          # vLLM keeps one block back (its null block)
        sim = predictions(case, blocks, cache, kv, bs)
        real = case.requests
        reps = sorted(real["repetition"].unique())
        served = real[~real["refused"]]
        for what in ("e2e", "ttft"):
            sim_err = np.concatenate([_errors(sim, real[real["repetition"] == r], what) for r in reps])
            rr = (_errors(real[real["repetition"] == reps[0]], real[real["repetition"] == reps[1]], what)
                  if len(reps) > 1 else np.array([]))
            for stat, f in (("median", np.median), ("p90", lambda v: np.percentile(v, 90))):
                s = float(f(sim_err)) if len(sim_err) else np.nan
                q = float(f(rr)) if len(rr) else np.nan
                rows.append({"cache": "on" if cache else "off", "measure": f"{what} error {stat}",
                             "sim_vs_real": s, "real_vs_real": q, "ratio": s / q if q else np.nan})
        hit_real = (served["cached_tokens"].sum() / served["input_tokens"].sum()
                    if "cached_tokens" in served and cache else 0.0)
        per_block = sim.groupby("window_id").first()
        hit_sim = per_block["hit_tokens_run"].sum() / sim.loc[~sim["refused"], "input_tokens"].sum()
        rows.append({"cache": "on" if cache else "off", "measure": "prompt tokens from the cache",
                     "sim_vs_real": hit_sim, "real_vs_real": hit_real, "ratio": np.nan})
        rows.append({"cache": "on" if cache else "off", "measure": "preemptions (model; real, per repetition)",
                     "sim_vs_real": float(per_block["preemptions_run"].sum()),
                     "real_vs_real": float(case.runs["n_preemptions"].sum()) / len(reps), "ratio": np.nan})
        rows.append({"cache": "on" if cache else "off", "measure": "runs (real; host-flagged)",
                     "sim_vs_real": float(len(case.runs)),
                     "real_vs_real": float(case.runs["host_flagged"].sum()), "ratio": np.nan})
        sim_served = sim[~sim["refused"]]
        means[cache] = {
            "sim": {m: float((sim_served[k] - sim_served["arrival_s"]).mean()) for m, k in
                    (("e2e", "finish_s"), ("ttft", "first_token_s"))},
            "real": {r: {m: float((g[k] - g["arrival_s"]).mean()) for m, k in
                         (("e2e", "finish_s"), ("ttft", "first_token_s"))}
                     for r, g in served.groupby("repetition")}}
    for m in ("e2e", "ttft"):
        pred = means[True]["sim"][m] / means[False]["sim"][m] - 1
        reals = [means[True]["real"][r][m] / means[False]["real"][r][m] - 1
                 for r in means[True]["real"] if r in means[False]["real"]]
        rows.append({"cache": "on vs off", "measure": f"mean {m} change", "sim_vs_real": pred,
                     "real_vs_real": float(np.mean(reals)) if reals else np.nan, "ratio": np.nan,
                     "real_by_repetition": ";".join(f"{x:+.4f}" for x in reals)})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=3, help="blocks to replay (default 3)")
    ap.add_argument("--compare-only", action="store_true", help="compare the stored runs, run nothing")
    ap.add_argument("--budget-s", type=float, help="stop starting runs after this many seconds")
    ap.add_argument("--run-only", metavar="LAMBDAS_JSON", help=argparse.SUPPRESS)   # the child
    args = ap.parse_args(argv)
    if args.run_only:           # the blocks are the parent's choice, in its order: their λ_ref keys
        lambdas = json.loads(args.run_only)
        run([first_block(wid.rsplit(f"_n{SIZE}_", 1)[0]) for wid in lambdas], lambdas, args.budget_s)
        return 0
    blocks = chosen_blocks(args.windows)
    for w in blocks:
        print(f"{w.window_id}: {int((~refused(w)).sum())} of {len(w)} requests served, "
              f"{shared_share(w):.1%} of their prompt tokens shared with an earlier one")
    if not args.compare_only:
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise SystemExit("vLLM is not installed here: `make setup-vllm`, then run this with "
                             ".venv-vllm/bin/python")
        lambdas = {w.window_id: lambda_entry(w) for w in blocks}
        child = [sys.executable, __file__, "--run-only", json.dumps(lambdas)]
        if args.budget_s is not None:
            child += ["--budget-s", str(args.budget_s)]
        subprocess.run(child, check=True)
    table = compare(blocks)
    if len(table):
        pd.set_option("display.width", 160)
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        path = results.rq9_real_check_path()
        store.atomic_write(path, lambda p: table.to_csv(p, index=False))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
