"""RQ9's campaigns: the prefix-hashed source under the ``vllm_v1`` engine model, its prefix cache
off and on, and on at three KV capacities.

Each is a campaign (:func:`portbench.campaign.run_campaign`: sharded, resumable, local processes or
Dask) over the 40 ``mooncake_conversation`` windows, the six regions, at the base SLO, with the
study's 13 policies, vLLM's ``priority`` scheduling (``vllm_priority``) and the three cache-aware
key policies. Each configuration is calibrated at its own knee (the study's method: a region is a
multiple of the configuration's own λ_ref), so its regions are loads *it* finds light or heavy; the
λ_ref tables say how far the cache moves the knee. Tables: ``data/results/campaign_vllm_v1_<tag>``
(tags :data:`TAGS`), cells with the cache on carrying the tokens looked up and hit.

    python -m portbench.rq9 [--windows N] [--workers W] [--executor dask]
"""

from __future__ import annotations

import argparse

from . import store
from .campaign import CampaignConfig, load_results, run_campaign
from .policies import STUDY_POLICIES
from .workload import BASE_SLO_MULTIPLIER

SOURCE = store.PREFIX_HASHED_SOURCE
ENGINE = "vllm_v1"
#: SGLang's two cache-aware orders and shortest-job-first on uncached work.
CACHE_AWARE = ("lpm", "dfs_weight", "cache_aware_sjf")
#: The study's panel, vLLM's priority scheduling, the cache-aware policies.
PANEL = tuple(STUDY_POLICIES) + ("vllm_priority",) + CACHE_AWARE
#: KV capacities (tokens) with the cache on; the first is the engine model's default (the one the
#: cache-off campaign has). Every window's longest request (126,527 tokens) fits the smallest.
CAPACITIES = (131072, 262144, 524288)
#: Configuration -> campaign tag.
TAGS = {"off": "rq9_cache_off", **{f"on_{kv}": f"rq9_cache_on_kv{kv}" for kv in CAPACITIES}}


def configs(window_ids=None) -> dict[str, CampaignConfig]:
    """The campaigns, by configuration (``off``, ``on_<capacity>``), over ``window_ids`` (default:
    every window of :data:`SOURCE`)."""
    if window_ids is None:
        window_ids = store.list_windows(source=SOURCE)["window_id"].tolist()
    common = dict(engine_model=ENGINE, policies=PANEL, slo_multipliers=(BASE_SLO_MULTIPLIER,),
                  window_ids=tuple(window_ids))
    out = {"off": CampaignConfig(**common, tag=TAGS["off"])}
    for kv in CAPACITIES:
        out[f"on_{kv}"] = CampaignConfig(**common, tag=TAGS[f"on_{kv}"], engine_options=(
            ("enable_prefix_caching", True), ("max_kv_tokens", kv)))
    return out


def load(configuration: str, data_dir=None):
    """One configuration's campaign table (run ``python -m portbench.rq9`` first)."""
    if configuration not in TAGS:
        raise KeyError(f"unknown RQ9 configuration {configuration!r}; known: {', '.join(TAGS)}")
    return load_results(f"{ENGINE}_{TAGS[configuration]}", data_dir)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="RQ9's campaigns (prefix cache off and on)")
    ap.add_argument("--windows", type=int, help="only the first N windows of the source")
    ap.add_argument("--configurations", nargs="+", choices=list(TAGS), default=list(TAGS))
    ap.add_argument("--workers", type=int)
    ap.add_argument("--executor", default="local", choices=("local", "dask"))
    args = ap.parse_args(argv)
    ids = store.list_windows(source=SOURCE)["window_id"].tolist()[:args.windows]
    for name, config in configs(ids).items():
        if name in args.configurations:
            print(run_campaign(config, executor=args.executor, workers=args.workers).line(), flush=True)


if __name__ == "__main__":
    main()
