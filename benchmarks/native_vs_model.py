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
- ``study``: the study's real-system configuration: 32,768-token budget, chunked prefill off (both
  engine models), ``max_model_len`` 32,768 (vLLM's), at most 32 requests running (the study's 32
  client threads, as an engine cap here), 500,000 KV tokens;
- ``long_prefill``: the campaign's with ``long_prefill_token_threshold`` 256;
- ``slai``: the campaign's with ``slai_faithful``'s engine settings on vLLM (a 512-token budget, 128
  sequences), its rule's own defaults. In every configuration ``slai_faithful``'s rule takes the
  engine's token budget and sequence cap (:func:`policy_for`, as the real runs set them), so that its
  scheduler port and the simulator's policy plan the step the engine runs (the port asks the policy
  itself at each step, on vLLM's state: :mod:`portbench.realengine.slai_plan`);
- ``campaign_cache``: the campaign's with vLLM's prefix cache on in both (``enable_prefix_caching``;
  RQ9), and vLLM's ``max_model_len`` raised to the KV cache (131,072 tokens): ``vllm_v1`` has no
  such limit, and Mooncake's longest requests (up to 126,527 tokens) exceed vLLM's 32,768 default.
  Prompts share blocks where the windows' block hashes say so (:mod:`portbench.engine.prefix`), so
  run it on a prefix-hashed source (``--source mooncake_conversation``); on the study's windows
  only a preempted request's own blocks can hit. The first differing step of a run can then also
  be of class ``cache_hit`` (another hit at admission, or an admission in one engine only of a
  request with a hit).

Windows (``--source``, ``--windows-per-source``): the first N windows of each source, by default of
the study's sources (:data:`portbench.store.SOURCES_OF_THE_STUDY`). A source without λ_ref
(``mooncake_conversation``) needs ``--lambda-ref-from-calibration``: each window's λ_ref is then
searched as the campaign's is (:func:`portbench.regions.find_lambda_ref`: FIFO, the 0.5% SLO-violation
knee, bisection on log10 λ) on each configuration's own ``vllm_v1`` model, and printed.

Runs in the vLLM environment (``.venv-vllm/bin/python benchmarks/native_vs_model.py``); vLLM's
scheduler and ``vllm_v1``'s numba loops share one process (only building a whole vLLM engine clashes
with numba). ``--out FILE.csv`` writes one row per run; ``--save`` writes them where the fidelity
chapter reads them (:func:`portbench.results.native_check_path`):

    .venv-vllm/bin/python benchmarks/native_vs_model.py --windows-per-source 0 --configs campaign study \
        long_prefill --policies fifo edf vllm_v0_priority --no-lssp --save
    .venv-vllm/bin/python benchmarks/native_vs_model.py --windows-per-source 0 --configs campaign \
        study long_prefill slai --policies slai_faithful --no-lssp --save --merge   # SLAI's port

RQ9's check (prefix caching, Mooncake windows, λ_ref calibrated on ``vllm_v1`` with the cache on):

    .venv-vllm/bin/python benchmarks/native_vs_model.py --source mooncake_conversation \
        --windows-per-source 4 --configs campaign_cache --lambda-ref-from-calibration --no-lssp
"""

from __future__ import annotations

import argparse
import collections
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

#: name -> (limits for both models, vLLM-only options)
CONFIGS = {
    "campaign": ({}, {}),
    "campaign_first_chunk": ({"reserve_full_isl": False}, {}),
    "study": ({"max_num_batched_tokens": 32768, "max_active_sequences": 32, "max_kv_tokens": 500_000,
               "enable_chunked_prefill": False}, {"max_model_len": 32768}),
    "long_prefill": ({"long_prefill_token_threshold": 256}, {}),
    "slai": ({"max_num_batched_tokens": 512, "max_active_sequences": 128}, {}),
    "campaign_cache": ({"enable_prefix_caching": True}, {"max_model_len": 131072}),
}


def models(config: str):
    """(``vllm_v1`` model, ``vllm_native`` model) of ``config``; refused, naming the option, when
    this ``VllmV1Model`` lacks one of the configuration's options."""
    import dataclasses

    from portbench.engine.vllm_v1 import VllmV1Model

    shared, native_only = CONFIGS[config]
    known = {f.name for f in dataclasses.fields(VllmV1Model)}
    missing = [k for k in shared if k not in known]
    if missing:
        raise SystemExit(f"configuration {config!r} needs VllmV1Model option(s) "
                         f"{', '.join(missing)}, which portbench/engine/vllm_v1.py does not have yet")
    return VllmV1Model(**shared), nat.VllmNativeModel(**shared, **native_only)


LAMBDA_REF_TABLE = ROOT / "data" / "results" / "lambda_ref_vllm_v1.csv"


def lambda_refs(path: Path = LAMBDA_REF_TABLE) -> pd.Series:
    return pd.read_csv(path).set_index("window_id")["lambda_ref"]


def pick_windows(per_source: int | None, sources=None):
    """The first ``per_source`` windows (None: all) of each of ``sources`` (default: the study's,
    :data:`portbench.store.SOURCES_OF_THE_STUDY`)."""
    manifest = store.list_windows(every_source=True)
    sources = store.SOURCES_OF_THE_STUDY if sources is None else sources
    unknown = sorted(set(sources) - set(manifest["source"]))
    if unknown:
        raise SystemExit(f"no windows of source(s) {', '.join(unknown)}; sources: "
                         f"{', '.join(dict.fromkeys(manifest['source']))}")
    windows = []
    for source in sources:
        ids = manifest.loc[manifest["source"] == source, "window_id"].tolist()
        windows += store.load_windows(window_ids=ids[:per_source] if per_source else ids)
    return windows


def calibrated_lambda_refs(windows, config: str) -> dict:
    """Each window's λ_ref searched on ``config``'s ``vllm_v1`` model (the campaign's search)."""
    from portbench.regions import find_lambda_ref

    model = models(config)[0]
    found = {}
    for w in windows:
        cal = find_lambda_ref(w, model=model)
        found[w.window_id] = cal.lambda_ref
        pinned = f" (pinned {cal.pinned})" if cal.pinned else ""
        print(f"  [{config}] λ_ref {w.window_id}: {cal.lambda_ref:.4g}{pinned}, "
              f"{cal.n_simulations} simulations")
    return found


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", nargs="+", default=["fifo"])
    ap.add_argument("--configs", nargs="+", default=["campaign", "campaign_first_chunk"],
                    choices=list(CONFIGS))
    ap.add_argument("--source", nargs="+", metavar="SOURCE",
                    help="the windows' source(s) (default: the study's three; "
                         "mooncake_conversation for RQ9's prefix caching)")
    ap.add_argument("--windows-per-source", type=int, default=2,
                    help="the first N windows of each source (0: all 40)")
    ap.add_argument("--lambda-ref-from-calibration", action="store_true",
                    help="search each window's λ_ref on each configuration's vllm_v1 model "
                         "(regions.find_lambda_ref), not read it from lambda_ref_vllm_v1.csv; needed "
                         "for a source the table lacks")
    ap.add_argument("--lambda-ref-table", type=Path, default=LAMBDA_REF_TABLE,
                    help="λ_ref per window (CSV with window_id, lambda_ref), e.g. an RQ9 campaign's "
                         "data/results/lambda_ref_vllm_v1_rq9_cache_on_kv131072.csv")
    ap.add_argument("--regions", nargs="+", default=list(REGIONS), choices=list(REGIONS))
    ap.add_argument("--no-lssp", action="store_true", help="do not time the lssp model")
    ap.add_argument("--out", type=Path, help="write one row per run (CSV)")
    ap.add_argument("--save", action="store_true",
                    help="write the rows where the book reads them: data/results/native_vs_model.csv "
                         "(the fidelity chapter), or native_vs_model_prefix.csv for the prefix-hashed "
                         "source (RQ9)")
    ap.add_argument("--merge", action="store_true",
                    help="with --save/--out: replace only the rows of the configurations and policies "
                         "run now, keeping the file's others")
    args = ap.parse_args(argv)

    nat.require_vllm()
    for p in args.policies:
        nat.native_form(p)
    for config in args.configs:
        models(config)                  # a configuration this vllm_v1 cannot run stops here
    t = time.perf_counter()
    windows = pick_windows(args.windows_per_source or None, args.source)
    if args.lambda_ref_from_calibration:
        print(f"λ_ref calibration on vllm_v1 ({len(windows)} windows):")
        lams = {config: calibrated_lambda_refs(windows, config) for config in args.configs}
    else:
        table = lambda_refs(args.lambda_ref_table)
        lacking = [w.window_id for w in windows if w.window_id not in table.index]
        if lacking:
            raise SystemExit(f"no λ_ref for {len(lacking)} window(s) ({lacking[0]}, ...) in "
                             f"{args.lambda_ref_table}: name a table that has them "
                             f"(--lambda-ref-table) or run with --lambda-ref-from-calibration")
        lams = {config: table for config in args.configs}
    # vLLM's import and each configuration's build happen once, outside the timed runs
    for config in args.configs:
        first = scale(windows[0], lams[config][windows[0].window_id])
        for p in args.policies:
            for m in (*models(config), LsspModel()):       # numba's loops are loaded here too
                simulate(first, policy_for(config, p), m)
    print(f"vLLM {nat.vllm_version()} loaded and configured in {time.perf_counter() - t:.1f} s; "
          f"{len(windows)} windows x {len(args.regions)} regions")
    rows = []
    for config in args.configs:
        model, native = models(config)
        lam = lams[config]
        for policy in args.policies:
            new = functools.partial(policy_for, config, policy)
            wall = collections.Counter()
            n_req = 0
            classes = collections.Counter()
            examples = {}
            n_same = n_runs = 0
            hit = prompt = 0
            for w in windows:
                for region in args.regions:
                    s = scale(w, lam[w.window_id] * REGIONS[region])
                    a, ta, _ = timed(s, new, model)
                    b, tb, hits = timed(s, new, native)
                    wall["vllm_v1"] += ta
                    wall["vllm_native"] += tb
                    if not args.no_lssp:
                        wall["lssp"] += timed(s, new, LsspModel())[1]
                    n_req += len(s)
                    hit += hits or 0
                    prompt += int(s.input_tokens.sum())
                    same = identical(a, b)
                    n_runs += 1
                    n_same += same
                    cls = step = None
                    detail = ""
                    if not same:
                        cls, step, detail = compare(s, new, model, native)
                        cls = cls or "stamps_only"
                        classes[cls] += 1
                        examples.setdefault(cls, (w.window_id, region, step, detail))
                    rows.append({"config": config, "policy": policy, "window_id": w.window_id,
                                 "source": w.source, "region": region,
                                 "lambda_ref": float(lam[w.window_id]), "identical": same,
                                 "requests_differing": n_differing(a, b), "first_step": step,
                                 "class": cls, "detail": detail,
                                 "steps_model": a.n_steps, "steps_native": b.n_steps,
                                 "preemptions_model": a.n_preemptions,
                                 "preemptions_native": b.n_preemptions,
                                 "hit_tokens_native": hits,
                                 "wall_model_s": ta, "wall_native_s": tb})
            print(f"\n[{config}] {policy}: {n_same}/{n_runs} runs identical "
                  f"({100 * n_same / n_runs:.1f}%)")
            if native.enable_prefix_caching:
                print(f"  prefix cache (vLLM): {hit:,} tokens taken from the cache at admission, "
                      f"{100 * hit / max(prompt, 1):.1f}% of the {prompt:,} prompt tokens (a preempted "
                      f"request's own blocks included)")
            for cls, count in classes.most_common():
                wid, region, step, detail = examples[cls]
                print(f"  {cls}: {count} runs ({100 * count / n_runs:.1f}%) -- "
                      f"{nat.CLASSES.get(cls, 'logs agree; stamps differ')}")
                print(f"      e.g. {wid} {region}, step {step}: {detail}")
            speeds = "  ".join(f"{name} {n_req / s:,.0f} req/s" for name, s in wall.items())
            print(f"  speed ({n_req:,} simulated requests): {speeds}")
    prefix_source = args.source is not None and list(args.source) == [store.PREFIX_HASHED_SOURCE]
    out = args.out
    if args.save:
        out = results.native_prefix_check_path() if prefix_source else results.native_check_path()
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
