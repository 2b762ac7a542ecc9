"""vLLM's own scheduler (the ``vllm_native`` engine model) against the ``vllm_v1`` model, run by run.

For each policy with a vLLM form and each configuration (:data:`CONFIGS`), every chosen window at
every chosen region's load (the window compressed by its ``vllm_v1`` λ_ref times the region's
factor, as the campaign does) runs on both engine models with the same limits and step cost. A run
is *identical* when every request's admission, first-token and finish times agree exactly (both
clocks are integer picoseconds). A run that differs is replayed step by step on both and its first
differing step classed (:data:`portbench.engine.vllm_native.CLASSES`). Speeds (simulated requests
per second of wall time, vLLM's import and configuration excluded) are printed beside ``vllm_v1``'s
and ``lssp``'s. Windows: the first N of each source (``--source``, ``--windows-per-source``); λ_ref
from a table or searched on each configuration's ``vllm_v1`` model (:func:`lambda_refs_for`).

Runs in the vLLM environment (vLLM's scheduler and ``vllm_v1``'s numba loops share one process).
``--out FILE.csv`` writes one row per run; ``--save`` writes where the book reads
(:func:`save_path`). The warm check appends run by run and resumes (:func:`run_warm_check`).

    .venv-vllm/bin/python benchmarks/native_vs_model.py --windows-per-source 0 --configs campaign study \
        long_prefill --policies fifo edf vllm_v0_priority --no-lssp --save
    .venv-vllm/bin/python benchmarks/native_vs_model.py --windows-per-source 0 --configs campaign \
        study long_prefill slai --policies slai_faithful --no-lssp --save --merge   # SLAI's port
    .venv-vllm/bin/python benchmarks/native_vs_model.py --source mooncake_conversation \
        --windows-per-source 8 --configs campaign_cache --policies fifo lpm cache_aware_sjf \
        --lambda-ref-table data/results/lambda_ref_vllm_v1_rq9_cache_on_kv131072.csv --no-lssp --save
    .venv-vllm/bin/python benchmarks/native_vs_model.py --source mooncake_conversation \
        mooncake_synthetic --windows-per-source 8 --configs warm --policies fifo lpm cache_aware_sjf \
        --lambda-ref-from-calibration --no-lssp --save                       # the warm prefix cache
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
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
#: RQ9's KV capacities (tokens; :data:`portbench.rq9.CAPACITIES`), each a warm configuration.
WARM_CAPACITIES = (131072, 262144, 524288)

# name -> (limits for both models, vLLM-only options):
# - campaign: the campaign's vllm_v1 limits (2,048-token budget, 64 sequences, 131,072 KV tokens),
#   vLLM 0.32's defaults otherwise (full-sequence KV reservation at admission, vllm_v1's too);
# - campaign_first_chunk: both admitting on the first chunk's blocks only (reserve_full_isl=False);
# - study: the study's real-system configuration: 32,768-token budget, chunked prefill off, vLLM's
#   max_model_len 32,768, at most 32 requests running (its 32 client threads), 500,000 KV tokens;
# - long_prefill: the campaign's with long_prefill_token_threshold 256;
# - slai: the campaign's with slai_faithful's engine settings on vLLM (512-token budget, 128
#   sequences); in every configuration slai_faithful's rule takes the engine's budget and sequence
#   cap (policy_for), so its scheduler port and the simulator's policy plan the step the engine runs;
# - campaign_cache: the campaign's with vLLM's prefix cache on in both (RQ9) and vLLM's max_model_len
#   raised to the KV cache (vllm_v1 has no such limit; Mooncake's longest requests, up to 126,527
#   tokens, exceed vLLM's 32,768 default); run it on a prefix-hashed source (prompts share blocks
#   where the block hashes say so); a first differing step can then be of class cache_hit;
# - campaign_cache_warm_kv<N>: campaign_cache at N KV tokens (max_model_len N), the cache warmed
#   first by serving each window's history in both (warm_start; the windows loaded with their
#   history); "warm" names the three (WARM_CAPACITIES).
CONFIGS = {
    "campaign": ({}, {}),
    "campaign_first_chunk": ({"reserve_full_isl": False}, {}),
    "study": ({"max_num_batched_tokens": 32768, "max_active_sequences": 32, "max_kv_tokens": 500_000,
               "enable_chunked_prefill": False}, {"max_model_len": 32768}),
    "long_prefill": ({"long_prefill_token_threshold": 256}, {}),
    "slai": ({"max_num_batched_tokens": 512, "max_active_sequences": 128}, {}),
    "campaign_cache": ({"enable_prefix_caching": True}, {"max_model_len": 131072}),
    **{f"campaign_cache_warm_kv{kv}": ({"enable_prefix_caching": True, "warm_start": True,
                                        "max_kv_tokens": kv}, {"max_model_len": kv})
       for kv in WARM_CAPACITIES},
}
#: Names that stand for several configurations in ``--configs``.
GROUPS = {"warm": tuple(f"campaign_cache_warm_kv{kv}" for kv in WARM_CAPACITIES)}


def is_warm(config: str) -> bool:
    return CONFIGS[config][0].get("warm_start", False)


def models(config: str):
    """(``vllm_v1`` model, ``vllm_native`` model) of ``config``; refused, naming the option, when
    this ``VllmV1Model`` lacks one of the configuration's options, or ``VllmNativeModel`` has no
    counterpart of it (``vllm_v1``'s offload tier: vLLM has none)."""
    from portbench.engine.vllm_v1 import VllmV1Model

    shared, native_only = CONFIGS[config]
    for cls, options, why in ((VllmV1Model, shared, "which portbench/engine/vllm_v1.py does not have yet"),
                              (nat.VllmNativeModel, {**shared, **native_only},
                               "to which vLLM's own scheduler (vllm_native) has no counterpart")):
        known = {f.name for f in dataclasses.fields(cls)}
        missing = [k for k in options if k not in known]
        if missing:
            raise SystemExit(f"configuration {config!r} needs {cls.__name__} option(s) "
                             f"{', '.join(missing)}, {why}")
    return VllmV1Model(**shared), nat.VllmNativeModel(**shared, **native_only)


LAMBDA_REF_TABLE = ROOT / "data" / "results" / "lambda_ref_vllm_v1.csv"


def lambda_refs(path: Path = LAMBDA_REF_TABLE) -> pd.Series:
    return pd.read_csv(path).set_index("window_id")["lambda_ref"]


def pick_windows(per_source: int | None, sources=None, *, history: bool = False,
                 longest: int | None = None):
    """The first ``per_source`` windows (None: all) of each of ``sources`` (default: the study's,
    :data:`portbench.store.SOURCES_OF_THE_STUDY`); ``history``: loaded with their history;
    ``longest``: only windows whose every request (prompt + output) is at most that many tokens
    (the others are named and passed over: vLLM would refuse such a request, ``vllm_v1`` not)."""
    manifest = store.list_windows(every_source=True)
    sources = store.SOURCES_OF_THE_STUDY if sources is None else sources
    unknown = sorted(set(sources) - set(manifest["source"]))
    if unknown:
        raise SystemExit(f"no windows of source(s) {', '.join(unknown)}; sources: "
                         f"{', '.join(dict.fromkeys(manifest['source']))}")
    windows = []
    for source in sources:
        ids = manifest.loc[manifest["source"] == source, "window_id"].tolist()
        if longest is None:
            windows += store.load_windows(window_ids=ids[:per_source] if per_source else ids,
                                          history=history)
            continue
        fits = []
        for w in store.load_windows(window_ids=ids, history=history):
            if per_source and len(fits) == per_source:
                break
            if int((w.input_tokens + w.output_tokens).max()) > longest:
                print(f"  {w.window_id} passed over: a request of more than {longest:,} tokens")
            else:
                fits.append(w)
        windows += fits
    return windows


def calibrated_lambda_refs(windows, config: str) -> dict:
    """Each window's λ_ref searched on ``config``'s ``vllm_v1`` model (the campaign's search:
    :func:`portbench.regions.find_lambda_ref`, FIFO, the 0.5% SLO-violation knee)."""
    from portbench.regions import find_lambda_ref

    model = models(config)[0]
    found = {}
    for w in windows:
        cal = find_lambda_ref(w, model=model)
        found[w.window_id] = cal.lambda_ref
        pinned = f" (pinned {cal.pinned})" if cal.pinned else ""
        print(f"  [{config}] λ_ref {w.window_id}: {cal.lambda_ref:.4g}{pinned}, "
              f"{cal.n_simulations} simulations", flush=True)
    return found


def lambda_refs_for(args, windows, configs, known=None) -> dict:
    """config -> window id -> λ_ref: searched on each configuration's ``vllm_v1`` model
    (``--lambda-ref-from-calibration``; a source without a table needs it), else read from
    ``--lambda-ref-table``. ``known``: (config, window id) -> λ_ref already found (not searched)."""
    if not args.lambda_ref_from_calibration:
        table = lambda_refs(args.lambda_ref_table)
        lacking = [w.window_id for w in windows if w.window_id not in table.index]
        if lacking:
            raise SystemExit(f"no λ_ref for {len(lacking)} window(s) ({lacking[0]}, ...) in "
                             f"{args.lambda_ref_table}: name a table that has them "
                             f"(--lambda-ref-table) or run with --lambda-ref-from-calibration")
        return {config: table for config in configs}
    known = known or {}
    print(f"λ_ref calibration on vllm_v1 ({len(windows)} windows):")
    lams = {}
    for config in configs:
        lams[config] = {w.window_id: known[config, w.window_id] for w in windows
                        if (config, w.window_id) in known}
        lams[config].update(calibrated_lambda_refs(
            [w for w in windows if w.window_id not in lams[config]], config))
    return lams


def policy_for(config: str, name: str):
    """A fresh ``name`` for ``config``: ``slai_faithful``'s rule takes the configuration's token
    budget and sequence cap (as the real runs set them, :mod:`portbench.realconfig`), so that SLAI
    plans the step the engine runs; every other policy as registered."""
    if name != "slai_faithful":
        return make_policy(name)
    model = models(config)[0]
    return make_policy(name, token_budget=model.max_num_batched_tokens,
                       max_num_seqs=model.max_active_sequences)


def timed(window, policy, model):
    """(RunResult, wall seconds, prompt tokens admissions took from the prefix cache or None) of a
    run under ``policy`` (a callable returning a fresh policy)."""
    t = time.perf_counter()
    engine = model.make_engine(window, policy())
    engine.run()
    result = engine.result(window)
    return result, time.perf_counter() - t, getattr(engine, "hit_tokens", None)


def identical(a, b) -> bool:
    return all(np.array_equal(getattr(a, s), getattr(b, s), equal_nan=True) for s in STAMPS)


def n_differing(a, b) -> int:
    """Requests whose admission, first token or finish differ between two runs."""
    same = np.ones(len(a.admit_s), dtype=bool)
    for s in STAMPS:
        x, y = getattr(a, s), getattr(b, s)
        same &= (x == y) | (np.isnan(x) & np.isnan(y))
    return int((~same).sum())


def compare(window, policy, model, native):
    """(class, step, detail) of the first differing step of one run under ``policy`` (a callable
    returning a fresh policy); None when none differs."""
    _, ms = nat.record_model_steps(window, policy(), model)
    _, ns = nat.record_native_steps(window, policy(), native)
    k = nat.first_differing_step(ms, ns)
    if k is None:
        return None, None, "step logs agree"
    cls, detail = nat.classify_step(k, ms, ns, window, policy().name, native)
    return cls, k, detail


def run_one(config: str, policy: str, window, region: str, lam: float, lssp: bool):
    """One run on both models (and ``lssp``, timed only): its row, and ``lssp``'s wall seconds."""
    model, native = models(config)
    new = functools.partial(policy_for, config, policy)
    s = scale(window, lam * REGIONS[region])
    a, ta, _ = timed(s, new, model)
    b, tb, hits = timed(s, new, native)
    wall_lssp = timed(s, new, LsspModel())[1] if lssp else 0.0
    same = identical(a, b)
    cls = step = None
    detail = ""
    if not same:
        cls, step, detail = compare(s, new, model, native)
        cls = cls or "stamps_only"
    row = {"config": config, "policy": policy, "window_id": window.window_id,
           "source": window.source}
    if is_warm(config):
        row.update(max_kv_tokens=native.max_kv_tokens, warm=True)
    row.update({"region": region, "lambda_ref": float(lam), "identical": same,
                "requests_differing": n_differing(a, b), "first_step": step, "class": cls,
                "detail": detail, "steps_model": a.n_steps, "steps_native": b.n_steps,
                "preemptions_model": a.n_preemptions, "preemptions_native": b.n_preemptions,
                "hit_tokens_native": hits, "wall_model_s": ta, "wall_native_s": tb})
    return row, wall_lssp


def summarise(config: str, policy: str, rows, windows, wall_lssp: float = 0.0) -> None:
    """Print one (configuration, policy)'s identical share, its classes with an example each, the
    prefix cache's hits (cache on) and the speeds."""
    if not rows:
        return
    frame = pd.DataFrame(rows)
    n_runs, n_same = len(frame), int(frame["identical"].sum())
    print(f"\n[{config}] {policy}: {n_same}/{n_runs} runs identical ({100 * n_same / n_runs:.1f}%)")
    size = {w.window_id: (len(w), int(w.input_tokens.sum())) for w in windows}
    n_req = sum(size[w][0] for w in frame["window_id"])
    if CONFIGS[config][0].get("enable_prefix_caching"):
        hit = int(frame["hit_tokens_native"].fillna(0).sum())
        prompt = sum(size[w][1] for w in frame["window_id"])
        print(f"  prefix cache (vLLM): {hit:,} tokens taken from the cache at admission, "
              f"{100 * hit / max(prompt, 1):.1f}% of the {prompt:,} prompt tokens (a preempted "
              f"request's own blocks included)")
    differing = frame[~frame["identical"].astype(bool)]
    for cls, count in differing["class"].value_counts().items():
        ex = differing[differing["class"] == cls].iloc[0]
        print(f"  {cls}: {count} runs ({100 * count / n_runs:.1f}%) -- "
              f"{nat.CLASSES.get(cls, 'logs agree; stamps differ')}")
        print(f"      e.g. {ex['window_id']} {ex['region']}, step {ex['first_step']}: {ex['detail']}")
    wall = {"vllm_v1": frame["wall_model_s"].sum(), "vllm_native": frame["wall_native_s"].sum()}
    if wall_lssp:
        wall["lssp"] = wall_lssp
    speeds = "  ".join(f"{name} {n_req / s:,.0f} req/s" for name, s in wall.items())
    print(f"  speed ({n_req:,} simulated requests): {speeds}")


def regions_of(k: int, regions, per_window: int | None):
    """The regions window ``k`` (its position in the selection) runs at: all of ``regions``, or
    ``per_window`` of them, taken in turn from window to window so that every region is run."""
    if not per_window or per_window >= len(regions):
        return list(regions)
    return [regions[(k * per_window + j) % len(regions)] for j in range(per_window)]


def warm_up(windows, configs, policies, lams) -> None:
    """vLLM's import and each configuration's build (and numba's loops), outside the timed runs:
    a run of the first window on every model (a warm configuration's vLLM scheduler only built)."""
    for config in configs:
        first = scale(windows[0], lams[config][windows[0].window_id])
        model, native = models(config)
        for p in policies:
            for m in (model, LsspModel()) if is_warm(config) else (model, native, LsspModel()):
                simulate(first, policy_for(config, p), m)
            if is_warm(config):
                spec = nat.native_spec(p)
                nat.build_scheduler(native, spec.scheduling_policy, spec.scheduler_cls)


def run_check(args, windows, lams) -> list:
    """Every (configuration, policy, window, region) run, a summary printed per (configuration,
    policy); returns the rows."""
    rows = []
    for config in args.configs:
        for policy in args.policies:
            group, wall_lssp = [], 0.0
            for k, w in enumerate(windows):
                for region in regions_of(k, args.regions, args.regions_per_window):
                    row, t = run_one(config, policy, w, region, float(lams[config][w.window_id]),
                                     not args.no_lssp)
                    group.append(row)
                    wall_lssp += t
            summarise(config, policy, group, windows, wall_lssp)
            rows += group
    return rows


KEY = ["config", "policy", "window_id", "region"]


def run_warm_check(args, windows, out: Path) -> pd.DataFrame:
    """The check of warm configurations, ``out`` rewritten (atomically) after every run, so that a
    stopped check resumes: a run already in ``out`` is not run again, and the λ_ref it was run at is
    reused for its (configuration, window). Returns every row of ``out``."""
    done = pd.read_csv(out) if Path(out).exists() else pd.DataFrame(columns=KEY + ["lambda_ref"])
    known = {(c, w): lam for c, w, lam in done[["config", "window_id", "lambda_ref"]].itertuples(index=False)}
    lams = lambda_refs_for(args, windows, args.configs, known)
    seen = set(map(tuple, done[KEY].itertuples(index=False)))
    todo = [(c, p, w, r) for c in args.configs for p in args.policies for k, w in enumerate(windows)
            for r in regions_of(k, args.regions, args.regions_per_window)
            if (c, p, w.window_id, r) not in seen]
    print(f"{len(seen)} runs in {out} already, {len(todo)} to run")
    if todo:
        warm_up(windows, args.configs, args.policies, lams)
    t0, rows = time.perf_counter(), done.to_dict("records")
    for j, (config, policy, w, region) in enumerate(todo):
        row, _ = run_one(config, policy, w, region, float(lams[config][w.window_id]), False)
        rows.append(row)
        frame = pd.DataFrame(rows)
        store.atomic_write(Path(out), lambda p: frame.to_csv(p, index=False))
        spent = time.perf_counter() - t0
        print(f"  [{j + 1}/{len(todo)}] {config} {policy} {w.window_id} {region}: "
              f"{'identical' if row['identical'] else row['class']} ({row['wall_native_s']:.1f} s; "
              f"{spent / 60:.1f} min, {spent / (j + 1) * (len(todo) - j - 1) / 60:.0f} min left)",
              flush=True)
    frame = pd.DataFrame(rows)
    ours = frame["config"].isin(args.configs) & frame["policy"].isin(args.policies) \
        & frame["window_id"].isin([w.window_id for w in windows])
    for (config, policy), group in frame[ours].groupby(["config", "policy"], sort=False):
        summarise(config, policy, group.to_dict("records"), windows)
    n, same = len(frame), int(frame["identical"].astype(bool).sum())
    print(f"\nall: {same}/{n} runs identical ({100 * same / max(n, 1):.2f}%)")
    return frame


def save_path(args) -> Path | None:
    """Where the rows go: ``--out``, else with ``--save`` where the book reads them:
    :func:`portbench.results.native_prefix_warm_check_path` for warm configurations,
    :func:`~portbench.results.native_prefix_check_path` for the prefix-hashed source,
    :func:`~portbench.results.native_check_path` otherwise."""
    if args.out or not args.save:
        return args.out
    if any(is_warm(c) for c in args.configs):
        return results.native_prefix_warm_check_path()
    prefix_source = args.source is not None and list(args.source) == [store.PREFIX_HASHED_SOURCE]
    return results.native_prefix_check_path() if prefix_source else results.native_check_path()


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", nargs="+", default=["fifo"])
    ap.add_argument("--configs", nargs="+", default=["campaign", "campaign_first_chunk"],
                    choices=list(CONFIGS) + list(GROUPS),
                    help="configurations (see CONFIGS); " + "; ".join(
                        f"{g}: {' '.join(c)}" for g, c in GROUPS.items()))
    ap.add_argument("--source", nargs="+", metavar="SOURCE",
                    help="the windows' source(s) (default: the study's three; prefix-hashed ones "
                         "(mooncake_conversation, mooncake_synthetic) for the prefix cache)")
    ap.add_argument("--windows-per-source", type=int, default=2,
                    help="the first N windows of each source (0: all)")
    ap.add_argument("--lambda-ref-from-calibration", action="store_true",
                    help="search each window's λ_ref on each configuration's vllm_v1 model "
                         "(regions.find_lambda_ref), not read it from lambda_ref_vllm_v1.csv; needed "
                         "for a source the table lacks")
    ap.add_argument("--lambda-ref-table", type=Path, default=LAMBDA_REF_TABLE,
                    help="λ_ref per window (CSV with window_id, lambda_ref), e.g. an RQ9 campaign's "
                         "data/results/lambda_ref_vllm_v1_rq9_cache_on_kv131072.csv")
    ap.add_argument("--regions", nargs="+", default=list(REGIONS), choices=list(REGIONS))
    ap.add_argument("--regions-per-window", type=int, default=0,
                    help="run each window at only this many of the regions, taken in turn from "
                         "window to window (0: every region)")
    ap.add_argument("--no-lssp", action="store_true", help="do not time the lssp model")
    ap.add_argument("--out", type=Path, help="write one row per run (CSV)")
    ap.add_argument("--save", action="store_true",
                    help="write the rows where the book reads them: data/results/native_vs_model.csv "
                         "(the fidelity chapter), native_vs_model_prefix.csv for the prefix-hashed "
                         "source (RQ9), native_vs_model_prefix_warm.csv for warm configurations")
    ap.add_argument("--merge", action="store_true",
                    help="with --save/--out: replace only the rows of the configurations and policies "
                         "run now, keeping the file's others (warm configurations always keep them)")
    args = ap.parse_args(argv)
    args.configs = list(dict.fromkeys(c for name in args.configs for c in GROUPS.get(name, (name,))))
    return args


def main(argv=None) -> int:
    args = parse(argv)
    nat.require_vllm()
    for p in args.policies:
        nat.native_form(p)
    for config in args.configs:
        models(config)                  # a configuration this vllm_v1 cannot run stops here
    warm = [is_warm(c) for c in args.configs]
    if any(warm) and not all(warm):
        raise SystemExit("run the warm configurations apart from the others (they go to their own file)")
    t = time.perf_counter()
    longest = min((CONFIGS[c][1]["max_model_len"] for c in args.configs), default=None) if all(warm) else None
    windows = pick_windows(args.windows_per_source or None, args.source, history=all(warm),
                           longest=longest)
    out = save_path(args)
    if all(warm):
        if out is None:
            raise SystemExit("the warm check writes run by run: name --out or --save")
        run_warm_check(args, windows, out)
        print(f"\nwrote {out} ({time.perf_counter() - t:.0f} s)")
        return 0
    lams = lambda_refs_for(args, windows, args.configs)
    warm_up(windows, args.configs, args.policies, lams)
    print(f"vLLM {nat.vllm_version()} loaded and configured in {time.perf_counter() - t:.1f} s; "
          f"{len(windows)} windows x {len(args.regions)} regions")
    rows = run_check(args, windows, lams)
    if out:
        frame = pd.DataFrame(rows)
        if args.merge and Path(out).exists():
            kept = pd.read_csv(out)
            ran = kept["config"].isin(frame["config"].unique()) & kept["policy"].isin(frame["policy"].unique())
            frame = pd.concat([kept[~ran], frame], ignore_index=True)
        store.atomic_write(Path(out), lambda p: frame.to_csv(p, index=False))
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
