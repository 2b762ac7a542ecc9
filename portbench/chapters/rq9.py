"""RQ9's readings: rankings with the prefix cache off and on, the cache-aware policies' advantage by
KV capacity and load, the prefix-hashed source against the study's sources, and the hit rates.

Every comparison reuses the study's statistics (:mod:`portbench.stats`) by labelling a
configuration as a *source*: the same windows with the cache off and on are two "sources" of one
table, compared paired (resampled together); the prefix-hashed source against a study source is the
study's cross-source comparison (windows resampled within each side).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import stats
from ..metrics import METRICS
from ..rq9 import CACHE_AWARE, CAPACITIES

OFF, ON = "cache off", "cache on"


def as_sources(tables: dict) -> pd.DataFrame:
    """One table of several configurations' cells, each configuration's label in ``source``."""
    return pd.concat([t.assign(source=label) for label, t in tables.items()], ignore_index=True)


def on_vs_off(off: pd.DataFrame, on: pd.DataFrame, metric: str, *, policies, regions,
              n_resamples: int, seed: int) -> pd.DataFrame:
    """Per region: τ_b between the policies' mean ``metric`` with the cache off and on (paired over
    windows, BCa interval), the best policy of each, and the policy pairs that reverse (the RQ2
    classifier: any reversal, and the supported practical ones). Both tables hold one SLO's cells,
    the same one."""
    slo = _one_slo(off, on)
    both = as_sources({OFF: off, ON: on})
    rows = []
    for region in regions:
        tau = stats.cross_source_tau(both, metric, region, OFF, ON, policies=policies, paired=True,
                                     n_resamples=n_resamples, seed=seed, slo_multiplier=slo)
        rev = stats.reversals(both, metric, region, sources=(OFF, ON), policies=policies,
                              n_resamples=n_resamples, seed=seed, slo_multiplier=slo)
        rows.append({"region": region, "tau_b": tau.statistic, "bca_low": tau.bca_interval.low,
                     "bca_high": tau.bca_interval.high, "best_off": tau.top1_a, "best_on": tau.top1_b,
                     "reversals": int((~rev["cls"].isin(["STABLE", "UNDEFINED"])).sum()),
                     "supported": int((rev["cls"] == "SUPPORTED_PRACTICAL_REVERSAL").sum()),
                     "pairs": len(rev)})
    return pd.DataFrame(rows)


def _one_slo(*tables: pd.DataFrame) -> float:
    """The one SLO multiplier the cells of ``tables`` share (a ValueError when they hold several)."""
    slos = sorted({float(x) for t in tables for x in t["slo_multiplier"].unique()})
    if len(slos) != 1:
        raise ValueError(f"the tables compared hold the SLO multipliers {slos}: compare one SLO's cells")
    return slos[0]


def advantage(tables_on: dict, metric: str, *, baseline: str = "fifo", regions,
              n_resamples: int, seed: int) -> pd.DataFrame:
    """Each cache-aware policy's mean ``metric`` less ``baseline``'s, per KV capacity and region,
    with a 95% percentile interval from resampling windows (paired)."""
    rng = np.random.default_rng(seed)
    rows = []
    for capacity, table in tables_on.items():
        for region in regions:
            sub = table[table["region"] == region]
            wide = sub.pivot_table(index="window_id", columns="policy", values=metric)
            base = wide[baseline]
            for policy in CACHE_AWARE:
                d = (wide[policy] - base).dropna().to_numpy()
                boot = rng.choice(d, size=(n_resamples, len(d))).mean(axis=1)
                rows.append({"capacity": capacity, "region": region, "policy": policy,
                             "difference": d.mean(), "ci_low": np.quantile(boot, 0.025),
                             "ci_high": np.quantile(boot, 0.975), "n_windows": len(d)})
    return pd.DataFrame(rows)


def best_cache_aware(adv: pd.DataFrame, metric: str) -> str:
    """The cache-aware policy with the best mean difference from the baseline over every capacity
    and region (higher is better for ``metric`` as :data:`portbench.metrics.METRICS` says)."""
    mean = adv.groupby("policy")["difference"].mean()
    return str(mean.idxmax() if METRICS[metric] else mean.idxmin())


def versus_study(configurations: dict, study: pd.DataFrame, metric: str, *, policies, regions,
                 study_sources, n_resamples: int, seed: int) -> pd.DataFrame:
    """τ_b and reversals between the prefix-hashed source under each configuration and each of the
    study's sources (``study``: the ``vllm_v1`` campaign at base SLO), per region, on ``policies``."""
    rows = []
    for label, table in configurations.items():
        both = pd.concat([table.assign(source=label), study[study["source"].isin(study_sources)]],
                         ignore_index=True)
        for region in regions:
            for source in study_sources:
                tau = stats.cross_source_tau(both, metric, region, label, source, policies=policies,
                                             n_resamples=n_resamples, seed=seed)
                rev = stats.reversals(both, metric, region, sources=(label, source),
                                      policies=policies, n_resamples=n_resamples, seed=seed)
                rows.append({"configuration": label, "region": region, "source": source,
                             "tau_b": tau.statistic, "bca_low": tau.bca_interval.low,
                             "bca_high": tau.bca_interval.high,
                             "supported": int((rev["cls"] == "SUPPORTED_PRACTICAL_REVERSAL").sum())})
    return pd.DataFrame(rows)


def hit_rates(on: pd.DataFrame, metric: str, *, policies) -> pd.DataFrame:
    """Per policy and region: the share of looked-up tokens the cache served (pooled over windows)
    and the mean ``metric``."""
    sub = on[on["policy"].isin(policies)]
    g = sub.groupby(["policy", "region"], sort=False)
    out = pd.DataFrame({"hit_rate": g["prefix_hit_tokens"].sum() / g["prefix_queried_tokens"].sum(),
                        metric: g[metric].mean()})
    return out.reset_index()


def preempting_cells(off: pd.DataFrame, on: pd.DataFrame, *, policies) -> pd.DataFrame:
    """Per policy: the share of its cells (window × region) with at least one preemption, cache off
    and on, and ``drop``, off less on."""
    def share(t):
        sub = t[t["policy"].isin(policies)]
        return (sub["n_preemptions"] > 0).groupby(sub["policy"]).mean()
    out = pd.DataFrame({"off": share(off), "on": share(on)})
    return out.assign(drop=out["off"] - out["on"]).sort_values("drop", ascending=False)


def capacity_label(kv_tokens: int) -> str:
    return f"{kv_tokens // 1024}k tokens"




#: Each cache-aware order and the cache-blind order it refines: shortest-job-first on uncached work
#: against shortest-job-first on all work; SGLang's cache-aware orders against arrival order.
TWINS = {"cache_aware_sjf": "estimated_service_time_first", "lpm": "fifo", "dfs_weight": "fifo"}


def saturated_share(table: pd.DataFrame, metric: str = "anwg", *, policies, threshold: float = 0.95) -> float:
    """The share of (policy, region) cells whose mean ``metric`` over the windows is at least
    ``threshold``: where most cells sit there, a ranking is mostly ties."""
    means = table[table["policy"].isin(policies)].groupby(["policy", "region"])[metric].mean()
    return float((means >= threshold).mean())


def twin_differences(table: pd.DataFrame, metric: str = "anwg", *, regions, n_resamples: int,
                     seed: int) -> pd.DataFrame:
    """Per cache-aware policy and region: its mean ``metric`` less its cache-blind twin's
    (:data:`TWINS`), paired over windows, with a 95% window-bootstrap interval."""
    rows = []
    for region in regions:
        wide = table[table["region"] == region].pivot_table(index="window_id", columns="policy", values=metric)
        for policy, twin in TWINS.items():
            if policy in wide and twin in wide:
                d, ci = stats.paired_difference(wide[policy], wide[twin], n_resamples=n_resamples, seed=seed)
                rows.append({"region": region, "policy": policy, "twin": twin, "difference": d,
                             "ci_low": ci.low, "ci_high": ci.high})
    return pd.DataFrame(rows)


def policy_gains(off: pd.DataFrame, on: pd.DataFrame, metric: str = "anwg", *, policies) -> pd.DataFrame:
    """Per policy: its mean ``metric`` over every (window, region) cell with the cache off and on,
    and ``gain``, on less off (both tables hold one SLO's cells, the same windows and regions)."""
    _one_slo(off, on)
    mean = {label: t[t["policy"].isin(policies)].groupby("policy")[metric].mean()
            for label, t in ((OFF, off), (ON, on))}
    out = pd.DataFrame(mean)
    return out.assign(gain=out[ON] - out[OFF]).sort_values("gain", ascending=not METRICS.get(metric, True))


def versus_twins(table: pd.DataFrame, metric: str = "anwg", *, n_resamples: int, seed: int) -> pd.DataFrame:
    """Per cache-aware policy of :data:`TWINS`: its mean ``metric`` over ``table``'s cells, and its
    mean less its cache-blind twin's, each window's cells averaged over the regions first, paired
    over windows with a 95% window-bootstrap interval; best first (``best``: the row of the
    cache-aware policy with the best mean)."""
    _one_slo(table)
    per_window = table.groupby(["window_id", "policy"])[metric].mean().unstack()
    rows = []
    for policy, twin in TWINS.items():
        if policy in per_window and twin in per_window:
            d, ci = stats.paired_difference(per_window[policy], per_window[twin], n_resamples=n_resamples,
                                            seed=seed)
            rows.append({"policy": policy, "twin": twin, "mean": per_window[policy].mean(), "difference": d,
                         "ci_low": ci.low, "ci_high": ci.high})
    out = pd.DataFrame(rows).sort_values("mean", ascending=not METRICS.get(metric, True))
    return out.assign(best=np.arange(len(out)) == 0).set_index("policy")


def hit_rate_key(gpu_kv: int, tier_kv: int) -> str:
    """The glue suffix of a cache in the hit-rate table: ``<gpu>`` or ``<gpu>_tier<tier>`` tokens."""
    return f"{gpu_kv}_tier{tier_kv}" if tier_kv else f"{gpu_kv}"


__all__ = ["OFF", "ON", "CAPACITIES", "as_sources", "on_vs_off", "advantage", "best_cache_aware",
           "versus_study", "hit_rates", "preempting_cells", "capacity_label", "TWINS",
           "saturated_share", "twin_differences", "policy_gains", "versus_twins", "hit_rate_key"]
