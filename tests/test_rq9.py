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
    assert list(c) == list(rq9.TAGS)
    assert all(len(x.window_ids) == 40 and x.policies == rq9.PANEL and x.phase_metrics for x in c.values())
    tier = c[f"tier_{rq9.TIER_KV}_same_load"].model()
    assert tier.warm_start and tier.offload_kv_tokens == rq9.TIER_KV and tier.max_kv_tokens == rq9.GPU_KV
    synthetic = rq9.configs(source="mooncake_synthetic")
    assert list(synthetic) == [k for k in rq9.TAGS if k not in rq9.COLD]
    assert all(len(x.window_ids) == 16 and "synthetic" in x.tag for x in synthetic.values())
    assert synthetic["warm_131072_same_load"].lambda_ref_from == synthetic["off"].table_name
    with pytest.raises(KeyError, match="first source only|runs on"):
        rq9.tag("on_131072", "mooncake_synthetic")
    with pytest.raises(KeyError, match="unknown RQ9 source"):
        rq9.configs(source="burstgpt")
    assert all(x.slo_multipliers == (20.0, rq9.TIGHT_SLO) for x in c.values())
    same = c[f"on_{rq9.SAME_LOAD_CAPACITIES[0]}_same_load"]
    assert same.lambda_ref_from == c["off"].table_name and same.model().enable_prefix_caching
    assert not any(x.lambda_ref_from for k, x in c.items() if not k.endswith("same_load"))
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


def test_a_campaign_can_take_its_lambda_ref_from_another(tmp_path):
    """The cache on at the cache-off knee: each window's λ_ref comes from the other campaign's λ_ref
    file (its own key and stamp); a missing file or window is named."""
    from portbench.campaign import borrowed_lambda_refs

    src = tmp_path / "data"
    (src / "results").mkdir(parents=True)
    w = store.load_window(f"{store.PREFIX_HASHED_SOURCE}_w00")
    on = CampaignConfig(engine_model="vllm_v1", policies=("fifo",), engine_options=CACHE_ON, tag="c")
    same = dataclasses.replace(on, tag="c_same", lambda_ref_from="vllm_v1_d")
    with pytest.raises(ValueError, match="needs a tag"):
        CampaignConfig(engine_model="vllm_v1", lambda_ref_from="vllm_v1_d")
    with pytest.raises(FileNotFoundError, match="takes λ_ref from vllm_v1_d.*run that campaign first"):
        borrowed_lambda_refs(same, [w], src)
    pd.DataFrame({"window_id": ["other"], "lambda_ref": [0.5]}).to_csv(src / "results" / "lambda_ref_vllm_v1_d.csv")
    with pytest.raises(KeyError, match="no λ_ref for 1 windows"):
        borrowed_lambda_refs(same, [w], src)
    pd.DataFrame({"window_id": [w.window_id], "lambda_ref": [0.7]}).to_csv(src / "results" / "lambda_ref_vllm_v1_d.csv")
    assert borrowed_lambda_refs(same, [w], src) == {w.window_id: 0.7} and borrowed_lambda_refs(on, [w], src) == {}
    assert shard_key(w, same, 20.0, "f") != shard_key(w, on, 20.0, "f")
    assert campaign_stamp(same, {}, "f")["lambda_ref_from"] == "vllm_v1_d" and "lambda_ref_from" not in campaign_stamp(on, {}, "f")


def test_the_tight_slo_readings_on_tables_built_by_hand():
    high = _table({"fifo": [0.96, 0.99], "lpm": [1.0, 1.0], "edf": [0.5, 0.6]})
    assert reading.saturated_share(high, policies=["fifo", "lpm", "edf"]) == pytest.approx(2 / 3)
    twins = reading.twin_differences(_table({"fifo": [0.5, 0.6, 0.7], "lpm": [0.6, 0.7, 0.8]}), regions=["KNEE"],
                                     n_resamples=200, seed=0)
    row = twins.set_index("policy").loc["lpm"]
    assert row["twin"] == "fifo" and row["difference"] == pytest.approx(0.1)
    assert row["ci_low"] == pytest.approx(0.1) and row["ci_high"] == pytest.approx(0.1)
