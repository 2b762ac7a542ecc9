import shutil

import numpy as np
import pandas as pd
import pytest

from portbench import store
from portbench.cli import main as cli_main


def test_store_has_the_studys_120_windows(data_dir):
    manifest = store.list_windows(data_dir)
    assert len(manifest) == 120
    assert manifest.groupby("source")["window_id"].count().to_dict() == {
        s: 40 for s in store.SOURCES_OF_THE_STUDY}
    assert (manifest["n_requests"] == 200).all()
    assert manifest["paper_lambda_ref"].notna().all()


def test_every_window_loads_and_verifies(data_dir):
    windows = store.load_windows(data_dir)
    assert len(windows) == 120
    for w in windows:
        assert len(w) == 200
        assert w.arrival_s[0] == 0.0
        assert np.all(np.diff(w.arrival_s) >= 0)
        assert np.all(w.input_tokens > 0) and np.all(w.output_tokens > 0)
        assert np.all(w.deadline_s > w.arrival_s)


def test_a_tampered_window_is_refused_by_name(data_dir, tmp_path):
    shutil.copytree(data_dir / "windows", tmp_path / "windows")
    path = tmp_path / "windows" / "burstgpt.parquet"
    table = pd.read_parquet(path)
    victim = table["window_id"].iloc[0]
    table.loc[5, "output_tokens"] += 1
    table.to_parquet(path, index=False)
    with pytest.raises(store.WindowStoreError, match=f"{victim}.*checksum"):
        store.load_window(victim, tmp_path)
    # Other windows of the same file still load.
    other = table["window_id"].iloc[-1]
    assert store.load_window(other, tmp_path).window_id == other


def test_unknown_window_and_source_are_named(data_dir):
    with pytest.raises(KeyError, match="no_such_window"):
        store.load_window("no_such_window", data_dir)
    with pytest.raises(KeyError, match="no_such_source"):
        store.list_windows(data_dir, "no_such_source")


def test_write_source_refuses_bad_rows_and_writes_nothing(tmp_path):
    good = {"window_id": "t_w00", "arrival_s": [0.0, 1.0], "input_tokens": [3, 4],
            "output_tokens": [5, 6], "predicted_output_tokens": [5, 6]}
    store.write_source("t", [good], tmp_path)
    before = {p.name: p.read_bytes() for p in (tmp_path / "windows").iterdir()}
    bad = dict(good, window_id="u_w00", input_tokens=[3, 0])
    with pytest.raises(ValueError, match="u_w00"):
        store.write_source("u", [bad], tmp_path)
    after = {p.name: p.read_bytes() for p in (tmp_path / "windows").iterdir()}
    assert before == after
    with pytest.raises(store.WindowStoreError, match="already has windows"):
        store.write_source("t", [good], tmp_path)


def test_store_matches_the_shared_copy_exactly(data_dir):
    """The shipped store equals a fresh import of the study's CSVs (when ../shared is present)."""
    shared = data_dir.parent.parent / "shared" / "lssp_windows"
    if not (shared / "windows.csv").exists():
        pytest.skip("../shared/lssp_windows not present")
    requests = pd.read_csv(shared / "windows.csv")
    for w in store.load_windows(data_dir):
        rows = requests[requests["window_id"] == w.window_id]
        np.testing.assert_array_equal(rows["input_tokens"], w.input_tokens)
        np.testing.assert_array_equal(rows["output_tokens"], w.output_tokens)
        np.testing.assert_array_equal(rows["predicted_output_tokens"], w.predicted_output_tokens)
        np.testing.assert_allclose(rows["arrival_s"], w.arrival_s, rtol=0, atol=1e-6)


def test_cli_windows_list(data_dir, capsys):
    assert cli_main(["--data-dir", str(data_dir), "windows", "list"]) == 0
    out = capsys.readouterr().out
    assert "120 windows: azure_llm_2024 40, bailian_qwen 40, burstgpt 40" in out
