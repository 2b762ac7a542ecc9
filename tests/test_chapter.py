"""A chapter's preamble: parameters checked, the table read, its regions and sources listed."""

import pandas as pd
import pytest

from portbench.chapters import Chapter, campaign_table, check_metric, check_region, open_chapter
from portbench.policies import PRIMARY_PANEL
from portbench.regions import REGIONS


def write_table(path, *, prediction_errors=(0.2,), policies=("fifo", "edf", "las")):
    rows = [{"source": source, "window_id": f"{source}_w{w}", "region": region, "policy": policy,
             "slo_multiplier": 20.0, "prediction_error": err, "anwg": 0.5}
            for source in ("burstgpt", "azure_llm_2024")            # not in sorted order
            for w in range(2)
            for region in ("OVERLOAD", "LOW", "KNEE")               # not in load order
            for policy in policies for err in prediction_errors]
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_a_chapter_reads_its_table_and_lists_regions_by_load_and_sources_sorted(tmp_path):
    path = write_table(tmp_path / "t.parquet")
    out = tmp_path / "figures" / "deep"
    chapter = open_chapter("lssp", str(path), out, metric="anwg", panel="primary")
    assert isinstance(chapter, Chapter)
    assert out.is_dir()
    assert chapter.policies == PRIMARY_PANEL
    assert chapter.regions == [r for r in REGIONS if r in {"OVERLOAD", "LOW", "KNEE"}]
    assert chapter.regions == ["LOW", "KNEE", "OVERLOAD"]
    assert chapter.sources == ["azure_llm_2024", "burstgpt"]
    pd.testing.assert_frame_equal(chapter.table, campaign_table("lssp", str(path)))


def test_no_panel_means_no_policies_and_a_listed_panel_keeps_its_order(tmp_path):
    path = write_table(tmp_path / "t.parquet")
    assert open_chapter("lssp", str(path)).policies == ()
    assert open_chapter("lssp", str(path), panel="las,fifo,edf").policies == ("las", "fifo", "edf")


def test_bad_parameters_fail_before_the_table_is_read(tmp_path):
    missing = tmp_path / "no_such.parquet"
    with pytest.raises(ValueError, match="unknown metric 'bogus'; metrics: anwg"):
        open_chapter("lssp", str(missing), metric="bogus")
    with pytest.raises(ValueError, match="unknown region 'MIDNIGHT'; regions: LOW"):
        open_chapter("lssp", str(missing), named_regions=("KNEE", "MIDNIGHT"))
    with pytest.raises(ValueError, match="unknown policy id"):
        open_chapter("lssp", str(missing), panel="fifo,no_such_policy,edf")
    check_metric("anwg")
    check_region("HIGH_PRESSURE")


def test_required_policies_name_the_campaign_to_run(tmp_path):
    path = write_table(tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"lacks \['sjf_aging'\]: run `portbench campaign --engine-model lssp`"):
        open_chapter("lssp", str(path), required_policies=("fifo", "sjf_aging"))


def test_frozen_predictions_keep_the_study_predictions_only(tmp_path):
    path = write_table(tmp_path / "t.parquet", prediction_errors=(0.0, 0.2, 1.0))
    every = open_chapter("lssp", str(path))
    frozen = open_chapter("lssp", str(path), frozen_predictions=True)
    assert len(every.table) == 3 * len(frozen.table)
    assert set(frozen.table["prediction_error"]) == {0.2}
    # a table without the column is kept whole
    pd.read_parquet(path).drop(columns="prediction_error").to_parquet(tmp_path / "u.parquet")
    assert len(open_chapter("lssp", str(tmp_path / "u.parquet"), frozen_predictions=True).table) == len(every.table)
