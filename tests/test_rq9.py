"""RQ9's campaigns: engine options in a campaign, the prefix columns of a cell, the chapter's readings."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from portbench import rq9, store
from portbench.campaign import CampaignConfig, campaign_stamp, run_window, shard_key
from portbench.chapters import rq9 as reading
from portbench.cli import main as cli

CACHE_ON = (("enable_prefix_caching", True),)


def test_engine_options_need_a_tag_and_a_known_setting():
    with pytest.raises(ValueError, match="needs a tag"):
        CampaignConfig(engine_model="vllm_v1", engine_options=CACHE_ON)
    with pytest.raises(KeyError, match="no setting 'cache_size'.*enable_prefix_caching"):
        CampaignConfig(engine_model="vllm_v1", engine_options=(("cache_size", 3),), tag="x")
    with pytest.raises(ValueError, match="letters, digits"):
        CampaignConfig(engine_model="vllm_v1", engine_options=CACHE_ON, tag="a/b")


def test_a_tagged_campaign_has_its_own_files_keys_and_stamp():
    w = store.load_window(f"{store.PREFIX_HASHED_SOURCE}_w00")
    plain = CampaignConfig(engine_model="vllm_v1", policies=("fifo",))
    tagged = CampaignConfig(engine_model="vllm_v1", policies=("fifo",), engine_options=CACHE_ON, tag="c")
    assert plain.table_name == "vllm_v1" and tagged.table_name == "vllm_v1_c"
    assert tagged.model().enable_prefix_caching and not plain.model().enable_prefix_caching
    assert shard_key(w, plain, 20.0, "f") != shard_key(w, tagged, 20.0, "f")
    assert "tag" not in campaign_stamp(plain, {}, "f")          # the study's stamps as they were
    assert campaign_stamp(tagged, {}, "f")["engine_options"] == [["enable_prefix_caching", True]]


def test_a_cell_with_the_cache_on_counts_the_tokens_the_cache_served():
    w = store.load_window(f"{store.PREFIX_HASHED_SOURCE}_w00")
    cells = [("OVERLOAD", "fifo"), ("OVERLOAD", "lpm")]
    on = CampaignConfig(engine_model="vllm_v1", policies=("fifo", "lpm"), engine_options=CACHE_ON, tag="c")
    off = dataclasses.replace(on, engine_options=(), tag="d")
    rows_on = run_window(w, on, 20.0, "f", cells, lambda_ref=0.7)
    rows_off = run_window(w, off, 20.0, "f", cells, lambda_ref=0.7)
    assert "prefix_hit_tokens" not in rows_off.columns
    assert (rows_on["prefix_hit_tokens"] > 0).all()
    assert (rows_on["prefix_hit_tokens"] < rows_on["prefix_queried_tokens"]).all()
    # every admission looks up at least the prompt of each request that was admitted
    assert (rows_on["prefix_queried_tokens"] >= w.input_tokens.sum() * 0.5).all()


def test_rq9_configurations():
    c = rq9.configs()
    assert list(c) == ["off", *(f"on_{kv}" for kv in rq9.CAPACITIES)]
    assert all(len(x.window_ids) == 40 and x.policies == rq9.PANEL for x in c.values())
    assert not c["off"].model().enable_prefix_caching
    assert c["on_262144"].model().max_kv_tokens == 262144 and c["on_262144"].model().enable_prefix_caching
    # every request of the source fits the smallest capacity (vllm_v1 would stall on one that does not)
    longest = max(int((w.input_tokens + w.output_tokens).max())
                  for w in store.load_windows(source=rq9.SOURCE))
    assert longest <= min(rq9.CAPACITIES)


def test_the_cli_names_an_unknown_configuration():
    with pytest.raises(SystemExit, match="unknown RQ9 configuration.*on_1.*known: off"):
        cli(["rq9-campaign", "--configurations", "on_1"])


def _table(values: dict, label="x"):
    rows = [{"source": label, "window_id": f"w{k}", "region": "KNEE", "policy": p, "slo_multiplier": 20.0,
             "anwg": v[k]} for p, v in values.items() for k in range(len(v))]
    return pd.DataFrame(rows)


def test_the_readings_on_tables_built_by_hand():
    rng = np.random.default_rng(0)
    base = {p: rng.random(12) for p in ("fifo", "lpm", "dfs_weight", "cache_aware_sjf", "edf")}
    off = _table(base)
    same = reading.on_vs_off(off, off.copy(), "anwg", policies=list(base), regions=["KNEE"],
                             n_resamples=200, seed=0)
    assert same.loc[0, "tau_b"] == 1.0 and same.loc[0, "reversals"] == 0
    flipped = _table({p: 1 - v for p, v in base.items()})
    rev = reading.on_vs_off(off, flipped, "anwg", policies=list(base), regions=["KNEE"],
                            n_resamples=200, seed=0)
    assert rev.loc[0, "tau_b"] == -1.0 and rev.loc[0, "reversals"] == 10
    better = _table({**base, "lpm": base["fifo"] + 0.1})
    adv = reading.advantage({131072: better}, "anwg", regions=["KNEE"], n_resamples=200, seed=0)
    row = adv[adv["policy"] == "lpm"].iloc[0]
    assert row["difference"] == pytest.approx(0.1) and row["ci_low"] == pytest.approx(0.1)
    assert reading.best_cache_aware(adv, "anwg") == "lpm"


def test_preempting_cells_counts_cells_with_a_preemption_off_and_on():
    def table(pre):
        return pd.DataFrame([{"policy": p, "window_id": f"w{k}", "region": "KNEE", "n_preemptions": n}
                             for p, ns in pre.items() for k, n in enumerate(ns)])
    off = table({"fifo": [1, 0, 3, 2], "slai_faithful": [2, 1, 1, 0]})
    on = table({"fifo": [1, 1, 0, 2], "slai_faithful": [0, 0, 0, 0]})
    got = reading.preempting_cells(off, on, policies=["fifo", "slai_faithful"])
    assert got.index.tolist() == ["slai_faithful", "fifo"]          # largest drop first
    assert got.loc["slai_faithful"].tolist() == [0.75, 0.0, 0.75]
    assert got.loc["fifo"].tolist() == [0.75, 0.75, 0.0]
