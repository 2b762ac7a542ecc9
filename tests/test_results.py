"""The results layer: every file under data/results/ named in one place, read and written there."""

import json

import pandas as pd
import pytest

from portbench import results


def test_the_committed_files_are_the_ones_it_names():
    assert results.campaign_path("lssp").exists() and results.campaign_path("lssp").name == "campaign_lssp.parquet"
    assert results.campaign_path("vllm_v1", prediction_error=0.5).name == "campaign_vllm_v1_prederr0.5.parquet"
    assert results.lambda_ref_path("lssp", prediction_error=0).name == "lambda_ref_lssp_prederr0.csv"
    assert results.lambda_ref_path("lssp").exists() and results.stamp_path(results.campaign_path("lssp")).exists()
    assert results.subwindow_path("lssp", 50).name == "rq8_lssp_n50.parquet"
    assert results.subwindow_cache_dir("lssp", 50).name == "rq8_lssp_n50"
    assert {t.name for t in results.campaign_tables()} >= {"lssp", "vllm_v1", "lssp_prederr0.5"}
    assert [t.prediction_error for t in results.lambda_tables() if t.name == "lssp_prederr0.5"] == [0.5]
    tags = results.case_tags()
    assert "vllm_cpu_guarded_case" in tags and "h200_study_case" in tags
    every_file = {p.name for p in results.realengine_files()}
    named = {results.Case(t).path(part).name for t in tags
             for part in [*results.CASE_FILES, *results.SETUP_FILES] if results.Case(t).has(part)}
    assert every_file == named, every_file ^ named          # no file it cannot name


def test_a_case_by_either_tag_reads_its_files_and_its_setups():
    case = results.case_of("vllm_cpu_guarded")
    assert case == results.case_of("vllm_cpu_guarded_case") == results.load_case("vllm_cpu_guarded_case")
    assert case.path("runs").name == "vllm_cpu_guarded_case_runs.parquet"
    assert case.path("meta").name == "vllm_cpu_guarded_case.json"
    assert case.path("cost").name == "vllm_cpu_guarded_cost.json"
    assert len(case.runs) and case.meta["case"]["policies"] and case.cost["cost"]
    assert case.sim_config is None and case.missing("sim_config") == ["vllm_cpu_guarded_case_sim_config.parquet"]
    with pytest.raises(KeyError, match="parts"):
        case.path("nothing")
    with pytest.raises(FileNotFoundError, match="cases there: .*vllm_cpu_guarded_case"):
        results.load_case("no_such_case")


def test_case_writes_are_atomic_and_seen_by_the_next_read(tmp_path):
    case = results.Case("t_case", tmp_path)
    assert case.runs is None and case.provenance == {}
    case.write(runs=pd.DataFrame({"a": [1, 2]}), meta={"case": {"guard": True}}, tuning={"speed_ratio": 0.5})
    assert list(case.runs["a"]) == [1, 2] and case.meta == {"case": {"guard": True}}
    case.write(runs=pd.DataFrame({"a": [3]}))
    assert list(case.runs["a"]) == [3]
    assert json.loads((tmp_path / "results" / "realengine" / "t_tuning.json").read_text()) == {"speed_ratio": 0.5}
    assert sorted(p.name for p in case.folder.iterdir()) == ["t_case.json", "t_case_runs.parquet", "t_tuning.json"]
    with pytest.raises(Exception):                               # Parquet cannot hold a bare object
        case.write(runs=pd.DataFrame({"a": [object()]}))
    assert sorted(p.name for p in case.folder.iterdir()) == ["t_case.json", "t_case_runs.parquet", "t_tuning.json"]
    assert list(results.Case("t_case", tmp_path).runs["a"]) == [3]       # the last whole write


def test_shard_cache_merges_replaces_and_drops_stale_shards(tmp_path):
    merged = results.ShardCache(tmp_path / "m", ["k", "v"], merge_on=("k",))
    assert merged.read("w1-slo20", "a" * 64) is None
    merged.write("w1-slo20", pd.DataFrame({"k": [1, 2], "v": [1.0, 2.0]}))
    merged.write("w1-slo20", pd.DataFrame({"k": [2, 3], "v": [9.0, 3.0]}))
    assert merged.frames["w1-slo20"].to_dict("list") == {"k": [1, 2, 3], "v": [1.0, 9.0, 3.0]}
    again = results.ShardCache(tmp_path / "m", ["k", "v"])
    assert again.read("w1-slo20", "a" * 64)["k"].tolist() == [1, 2, 3]
    assert again.read("w1-slo20", "b" * 64) is None              # another key: recomputed
    again.write("w1-slo20", pd.DataFrame({"k": [7], "v": [7.0]}))
    assert [p.name for p in (tmp_path / "m").iterdir()] == [f"w1-slo20-{'b' * 16}.parquet"]
    assert again.frames["w1-slo20"]["k"].tolist() == [7]        # no merge_on: replaced
    assert results.ShardCache(tmp_path / "m", ["k", "v", "new"]).read("w1-slo20", "b" * 64) is None


def test_real_engine_files_are_described():
    assert results.realengine_contents("x_case_runs.parquet").startswith("case runs")
    assert results.realengine_contents("x_case_sim_requests.parquet").startswith("each real run's simulated")
    assert results.realengine_contents("x_tuning.json").startswith("engine settings")
    assert results.realengine_contents("x_case.json").startswith("provenance: engine")
    assert results.realengine_contents("other.json") == "provenance"
