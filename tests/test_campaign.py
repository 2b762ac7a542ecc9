"""Campaign: cache reuse, resume after a kill, and identical results on every executor."""

import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from portbench import store
from portbench.campaign import CampaignConfig, cache_dir, run_campaign


def small_store(data_dir, tmp_path, per_source=2):
    shutil.copytree(data_dir / "windows", tmp_path / "windows")
    manifest = store.list_windows(tmp_path)
    return tuple(manifest.groupby("source").head(per_source)["window_id"])


def config(window_ids, policies=("fifo",)):
    return CampaignConfig(policies=policies, regions=("LOW", "KNEE", "HIGH_PRESSURE"), slo_multipliers=(20.0,),
                          window_ids=window_ids)


def test_second_run_reuses_the_cache(data_dir, tmp_path):
    ids = small_store(data_dir, tmp_path, 1)
    first = run_campaign(config(ids), data_dir=tmp_path, workers=1, progress=False)
    assert first.n_cells == 9 and first.n_cells_computed == 9
    second = run_campaign(config(ids), data_dir=tmp_path, workers=1, progress=False)
    assert second.n_cells_computed == 0 and second.n_cells_reused == 9
    pd.testing.assert_frame_equal(first.table, second.table)
    lam = pd.read_csv(tmp_path / "results" / "lambda_ref_lssp.csv")
    assert (lam["relative_difference"] <= 1e-6).all()


def test_executors_give_bit_identical_tables(data_dir, tmp_path):
    ids = small_store(data_dir, tmp_path, 1)
    tables = []
    for k, (executor, workers) in enumerate([("local", 1), ("local", 2), ("dask", 2)]):
        out = tmp_path / f"run{k}"
        shutil.copytree(tmp_path / "windows", out / "windows")
        s = run_campaign(config(ids), data_dir=out, executor=executor, workers=workers,
                         progress=False)
        tables.append(s.table)
    for t in tables[1:]:
        pd.testing.assert_frame_equal(tables[0], t, check_exact=True)


def test_killed_campaign_resumes_with_identical_results(data_dir, tmp_path):
    ids = small_store(data_dir, tmp_path, 4)
    reference = run_campaign(config(ids), data_dir=tmp_path / "ref" if shutil.copytree(
        tmp_path / "windows", tmp_path / "ref" / "windows") else None, workers=1, progress=False).table

    cmd = [sys.executable, "-m", "portbench.cli", "--data-dir", str(tmp_path), "campaign",
           "--policies", "fifo", "--regions", "LOW", "KNEE", "HIGH_PRESSURE", "--workers", "1",
           "--slo-multipliers", "20", "--quiet", "--windows", *ids]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = cache_dir("lssp", tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if shards.exists() and len(list(shards.glob("*.parquet"))) >= 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(list(shards.glob("*.parquet")))
    assert 0 < n_before < len(ids), "the kill should land midway"
    assert not (tmp_path / "results" / "campaign_lssp.parquet").exists()

    resumed = run_campaign(config(ids), data_dir=tmp_path, workers=1, progress=False)
    assert resumed.n_cells_reused == 3 * n_before
    pd.testing.assert_frame_equal(reference, resumed.table, check_exact=True)


def test_bad_campaign_parameters_are_named():
    with pytest.raises(KeyError, match="no_such_policy"):
        CampaignConfig(policies=("no_such_policy",))
    with pytest.raises(KeyError, match="MEDIUM"):
        CampaignConfig(policies=("fifo",), regions=("MEDIUM",))
    with pytest.raises(KeyError, match="vidur"):
        CampaignConfig(policies=("fifo",), engine_model="vidur")
    with pytest.raises(ValueError, match="SLO multiplier"):
        CampaignConfig(policies=("fifo",), slo_multipliers=(0,))


def test_the_vllm_native_models_file_decides_only_its_own_tables():
    """An edit of engine/vllm_native.py (vLLM's scheduler in virtual time) leaves the lssp and
    vllm_v1 tables current: their fingerprint does not read it; vllm_native's does."""
    from portbench.campaign import code_fingerprint

    assert code_fingerprint("lssp") == code_fingerprint("vllm_v1") == code_fingerprint()
    assert code_fingerprint("vllm_native") != code_fingerprint("lssp")
