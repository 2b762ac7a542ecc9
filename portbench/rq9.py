"""RQ9's campaigns: the prefix-hashed sources under the ``vllm_v1`` engine model, its prefix cache
off, on (cold or warm) at three GPU KV capacities, and on with a KV offload tier.

Each is a campaign (:func:`portbench.campaign.run_campaign`: sharded, resumable, local processes or
Dask) over a source's windows (:data:`SOURCES`: Mooncake's conversation and synthetic traces), the
six regions, at the base SLO and a tighter one (:data:`TIGHT_SLO`), with the study's 13 policies,
vLLM v0's ``priority`` scheduling and the three cache-aware key policies (:data:`PANEL`), each cell
with RQ8's TTFT attainment. Configurations (:func:`configs`):

- ``off``: no prefix cache, calibrated at its own knee: the cache-off knee;
- ``on_<kv>`` (conversation only): the cache on, cold (empty at the window's start), own knee;
- ``warm_<kv>``: the cache on and warm (as serving the trace's earlier requests one by one left it);
- ``tier_<tokens>``: warm, with an offload tier of that many tokens behind the default GPU cache;
- ``..._same_load``: at the cache-off knee (the same absolute loads as ``off``): the primary reading.

Tables ``data/results/campaign_vllm_v1_<tag>`` (:func:`tag`).

    portbench rq9-campaign [--source S] [--windows N] [--configurations off warm_131072_same_load] [--workers W]
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd

from . import results, store
from .campaign import CampaignConfig, code_fingerprint, load_results
from .engine import blockpool, engine_model, simulate
from .policies import STUDY_POLICIES, make_policy
from .regions import REGIONS
from .workload import BASE_SLO_MULTIPLIER, scale

#: The prefix-hashed sources, the first the one RQ9 began with.
SOURCES = store.PREFIX_HASHED_SOURCES
SOURCE = SOURCES[0]
ENGINE = "vllm_v1"
#: SGLang's two cache-aware orders and shortest-job-first on uncached work.
CACHE_AWARE = ("lpm", "dfs_weight", "cache_aware_sjf")
#: The study's panel, vLLM v0's priority scheduling, the cache-aware policies.
PANEL = tuple(STUDY_POLICIES) + ("vllm_v0_priority",) + CACHE_AWARE
#: KV capacities (tokens) with the cache on; the first is the engine model's default (the one the
#: cache-off campaign has). Every window's longest request (126,527 tokens) fits the smallest.
CAPACITIES = (131072, 262144, 524288)
#: A tighter SLO, read beside the base one: the study's budget without its ×20 (0.4 ms a prompt token
#: and 20 ms an output token). At ×20 most policies meet nearly every deadline in every region; at
#: ×1, fewer than half of the (policy, region) cells do (a 12-window pilot: 39% at ×1, 49% at ×1.5,
#: 66% at ×2.5, 85% at ×10), so the rankings can differ.
TIGHT_SLO = 1.0
#: Capacities whose cold cache-on campaign also runs at the cache-off knee (the same absolute loads).
SAME_LOAD_CAPACITIES = (131072, 524288)
#: The GPU capacity of the warm and tiered configurations (the engine model's default).
GPU_KV = CAPACITIES[0]
#: Offload-tier sizes (tokens) in the hit-rate table; the campaigns run the one of :data:`TIER_KV`.
TIER_SIZES = (1 << 20, 1 << 22, 1 << 23)
TIER_KV = 1 << 22
#: Configuration -> campaign tag (of the first source; another source's tags add its short name).
TAGS = {"off": "rq9_cache_off", **{f"on_{kv}": f"rq9_cache_on_kv{kv}" for kv in CAPACITIES},
        **{f"on_{kv}_same_load": f"rq9_cache_on_kv{kv}_same_load" for kv in SAME_LOAD_CAPACITIES},
        **{f"warm_{GPU_KV}{s}": f"rq9_warm_kv{GPU_KV}{s}" for s in ("", "_same_load")},
        **{f"tier_{TIER_KV}{s}": f"rq9_tier{TIER_KV}_kv{GPU_KV}{s}" for s in ("", "_same_load")}}
#: The configurations each source runs (the cold ones only on the first).
COLD = tuple(c for c in TAGS if c.startswith("on_"))
#: The primary reading: cache off against the warm GPU cache and the offload tier, at one load.
PRIMARY = ("off", f"warm_{GPU_KV}_same_load", f"tier_{TIER_KV}_same_load")


def tag(configuration: str, source: str = SOURCE) -> str:
    """The campaign tag of ``configuration`` on ``source``."""
    if configuration not in TAGS:
        raise KeyError(f"unknown RQ9 configuration {configuration!r}; known: {', '.join(TAGS)}")
    check_source(source)
    if source == SOURCE:
        return TAGS[configuration]
    if configuration in COLD:
        raise KeyError(f"RQ9 configuration {configuration!r} runs on {SOURCE} only")
    return TAGS[configuration].replace("rq9_", f"rq9_{source.split('_')[-1]}_", 1)


def check_source(source: str) -> None:
    if source not in SOURCES:
        raise KeyError(f"unknown RQ9 source {source!r}; sources: {', '.join(SOURCES)}")


def source_window_ids(first: int | None = None, data_dir=None, source: str = SOURCE) -> list[str]:
    """The source's window ids (its ``first`` ones only, when given)."""
    check_source(source)
    ids = store.list_windows(data_dir, source=source)["window_id"].tolist()
    if not ids:
        raise KeyError(f"no windows of {source!r} in the store (see data/README.md)")
    return ids[:first] if first else ids


def configs(window_ids=None, data_dir=None, source: str = SOURCE) -> dict[str, CampaignConfig]:
    """The campaigns of ``source``, by configuration (see the module docstring), over ``window_ids``
    (default: every window of the source)."""
    if window_ids is None:
        window_ids = source_window_ids(data_dir=data_dir, source=source)
    common = dict(engine_model=ENGINE, policies=PANEL, slo_multipliers=(BASE_SLO_MULTIPLIER, TIGHT_SLO),
                  window_ids=tuple(window_ids), phase_metrics=True)
    off = CampaignConfig(**common, tag=tag("off", source))
    cache = (("enable_prefix_caching", True),)
    options = {f"warm_{GPU_KV}": cache + (("warm_start", True),),
               f"tier_{TIER_KV}": cache + (("warm_start", True), ("offload_kv_tokens", TIER_KV))}
    if source == SOURCE:
        options.update({f"on_{kv}": cache + (("max_kv_tokens", kv),) for kv in CAPACITIES})
    out = {"off": off}
    for name, opts in options.items():
        out[name] = CampaignConfig(**common, tag=tag(name, source), engine_options=opts)
        if f"{name}_same_load" in TAGS:
            out[f"{name}_same_load"] = dataclasses.replace(out[name], tag=tag(f"{name}_same_load", source),
                                                           lambda_ref_from=off.table_name)
    return {c: out[c] for c in TAGS if c in out}


def load(configuration: str, data_dir=None, slo: float = BASE_SLO_MULTIPLIER, source: str = SOURCE):
    """One configuration's cells at SLO multiplier ``slo`` (run ``portbench rq9-campaign`` first)."""
    table = load_results(f"{ENGINE}_{tag(configuration, source)}", data_dir)
    cells = table[table["slo_multiplier"] == float(slo)]
    if cells.empty:
        raise ValueError(f"the RQ9 table of {configuration!r} has no cells at SLO ×{slo:g} (it has "
                         f"{sorted(set(table['slo_multiplier']))}): run portbench rq9-campaign")
    return cells.reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Hit rates: the whole trace's steady one beside a warm window's, per capacity and tier

#: (label, GPU tokens, tier tokens) of the hit-rate table's rows.
HIT_RATE_CACHES = tuple((f"GPU {kv >> 10}k", kv, 0) for kv in CAPACITIES) + tuple(
    (f"GPU {GPU_KV >> 10}k + tier {t >> 20}M", GPU_KV, t) for t in TIER_SIZES)
#: The region whose FIFO run gives a window's hit rate (the cache-off knee's load).
HIT_RATE_REGION = "KNEE"


def hit_rate_path(source: str, data_dir=None):
    return results.results_dir(data_dir) / f"rq9_hit_rates_{source}.csv"


def hit_rate_table(source: str = SOURCE, data_dir=None, *, force: bool = False) -> pd.DataFrame:
    """Per cache of :data:`HIT_RATE_CACHES`: the steady hit rate of the source's whole trace (served
    one request after another, :func:`~portbench.engine.blockpool.serve_trace`) and the warm windows'
    (FIFO at :data:`HIT_RATE_REGION` of the cache-off knee, tokens pooled over the windows), each
    with the share the tier served. Written beside the campaign tables, with a stamp; recomputed only
    when the code, the windows or the cache-off λ_ref changed (or ``force``)."""
    check_source(source)
    path = hit_rate_path(source, data_dir)
    lam_path = results.lambda_ref_path(f"{ENGINE}_{tag('off', source)}", data_dir)
    if not lam_path.exists():
        raise FileNotFoundError(f"no cache-off λ_ref for {source} at {lam_path}: run "
                                f"`portbench rq9-campaign --source {source} --configurations off` first")
    lam = pd.read_csv(lam_path).set_index("window_id")["lambda_ref"]
    windows = store.load_windows(data_dir, source=source, history=True)
    stamp = {"code": code_fingerprint(ENGINE), "caches": [list(c) for c in HIT_RATE_CACHES],
             "region": HIT_RATE_REGION, "windows": {w.window_id: w.meta.get("sha256", "") for w in windows},
             "lambda_ref": {k: float(v) for k, v in lam.items()}}
    if not force and path.exists() and results.read_stamp(path) == stamp:
        return pd.read_csv(path)
    trace = store.trace_history(source, data_dir)
    rows = []
    for label, kv, tier in HIT_RATE_CACHES:
        model = dataclasses.replace(engine_model(ENGINE), enable_prefix_caching=True, max_kv_tokens=kv,
                                    warm_start=True, offload_kv_tokens=tier)
        q, g, t = blockpool.serve_trace(trace, kv // model.block_size, model.block_size, tier // model.block_size)
        wq = wh = wt = 0
        for w in windows:
            r = simulate(scale(w, REGIONS[HIT_RATE_REGION] * lam[w.window_id]), make_policy("fifo"), model)
            wq, wh, wt = wq + r.prefix_queried_tokens, wh + r.prefix_hit_tokens, wt + r.prefix_tier_hit_tokens
        rows.append({"source": source, "cache": label, "gpu_kv_tokens": kv, "tier_kv_tokens": tier,
                     "steady_hit_rate": (g + t) / q, "steady_tier_share": t / q,
                     "window_hit_rate": wh / wq, "window_tier_share": wt / wq, "n_windows": len(windows)})
    table = pd.DataFrame(rows)
    store.atomic_write(path, lambda p: table.to_csv(p, index=False))
    store.atomic_write(results.stamp_path(path), lambda p: p.write_text(json.dumps(stamp, sort_keys=True)))
    return table
