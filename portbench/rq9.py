"""RQ9's campaigns: the prefix-hashed source under the ``vllm_v1`` engine model, its prefix cache
off and on, and on at three KV capacities.

Each is a campaign (:func:`portbench.campaign.run_campaign`: sharded, resumable, local processes or
Dask) over the 40 ``mooncake_conversation`` windows, the six regions, at the base SLO and a tighter
one (:data:`TIGHT_SLO`), with the
study's 13 policies, vLLM v0's ``priority`` scheduling (``vllm_v0_priority``) and the three cache-aware
key policies. Each configuration is calibrated at its own knee (the study's method: a region is a
multiple of the configuration's own λ_ref), so its regions are loads *it* finds light or heavy; the
λ_ref tables say how far the cache moves the knee. The ``_same_load`` configurations run the cache
on at the cache-off knee instead, so that cache off and on meet the same absolute loads. Tables: ``data/results/campaign_vllm_v1_<tag>``
(tags :data:`TAGS`), cells with the cache on carrying the tokens looked up and hit.

    portbench rq9-campaign [--windows N] [--configurations off on_131072] [--workers W] [--executor dask]
"""

from __future__ import annotations

import dataclasses

from . import store
from .campaign import CampaignConfig, load_results
from .policies import STUDY_POLICIES
from .workload import BASE_SLO_MULTIPLIER

SOURCE = store.PREFIX_HASHED_SOURCE
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
#: Capacities whose cache-on campaign also runs at the cache-off knee (the same absolute loads).
SAME_LOAD_CAPACITIES = (131072, 524288)
#: Configuration -> campaign tag.
TAGS = {"off": "rq9_cache_off", **{f"on_{kv}": f"rq9_cache_on_kv{kv}" for kv in CAPACITIES},
        **{f"on_{kv}_same_load": f"rq9_cache_on_kv{kv}_same_load" for kv in SAME_LOAD_CAPACITIES}}


def source_window_ids(first: int | None = None, data_dir=None) -> list[str]:
    """The source's window ids (its ``first`` ones only, when given)."""
    ids = store.list_windows(data_dir, source=SOURCE)["window_id"].tolist()
    if not ids:
        raise KeyError(f"no windows of {SOURCE!r} in the store (see data/README.md)")
    return ids[:first] if first else ids


def configs(window_ids=None, data_dir=None) -> dict[str, CampaignConfig]:
    """The campaigns, by configuration (``off``, ``on_<capacity>``), over ``window_ids`` (default:
    every window of :data:`SOURCE`)."""
    if window_ids is None:
        window_ids = source_window_ids(data_dir=data_dir)
    common = dict(engine_model=ENGINE, policies=PANEL, slo_multipliers=(BASE_SLO_MULTIPLIER, TIGHT_SLO),
                  window_ids=tuple(window_ids))
    out = {"off": CampaignConfig(**common, tag=TAGS["off"])}
    for kv in CAPACITIES:
        out[f"on_{kv}"] = CampaignConfig(**common, tag=TAGS[f"on_{kv}"], engine_options=(
            ("enable_prefix_caching", True), ("max_kv_tokens", kv)))
    for kv in SAME_LOAD_CAPACITIES:
        out[f"on_{kv}_same_load"] = dataclasses.replace(out[f"on_{kv}"], tag=TAGS[f"on_{kv}_same_load"],
                                                        lambda_ref_from=out["off"].table_name)
    return out


def load(configuration: str, data_dir=None, slo: float = BASE_SLO_MULTIPLIER):
    """One configuration's cells at SLO multiplier ``slo`` (run ``portbench rq9-campaign`` first)."""
    if configuration not in TAGS:
        raise KeyError(f"unknown RQ9 configuration {configuration!r}; known: {', '.join(TAGS)}")
    table = load_results(f"{ENGINE}_{TAGS[configuration]}", data_dir)
    cells = table[table["slo_multiplier"] == float(slo)]
    if cells.empty:
        raise ValueError(f"the RQ9 table of {configuration!r} has no cells at SLO ×{slo:g} (it has "
                         f"{sorted(set(table['slo_multiplier']))}): run portbench rq9-campaign")
    return cells.reset_index(drop=True)
