"""The prediction-error parameter: re-synthesised predictions, and a campaign at another level."""

import math
import shutil

import numpy as np
import pandas as pd
import pytest

from portbench import sim, store
from portbench.campaign import (IDENTITY_COLUMNS, CampaignConfig, cache_dir, results_path,
                                run_campaign, shard_key)
from portbench.policies import make_policy
from portbench.workload import (MAX_PREDICTED_OUTPUT_TOKENS, PREDICTION_RELATIVE_ERROR, scale,
                                synthesize_predictions, with_prediction_error, with_slo)


@pytest.fixture(scope="module")
def windows(data_dir):
    return store.load_windows(data_dir)


def test_the_study_level_returns_the_frozen_window(windows):
    for w in windows:
        assert with_prediction_error(w, PREDICTION_RELATIVE_ERROR) is w
        assert with_prediction_error(w, 0.2) is w
    # and the study's seeds do reproduce the frozen predictions bit for bit
    for w in windows[::10]:
        again = synthesize_predictions(w.output_tokens, seed=int(w.meta["synthesis_seed"]))
        np.testing.assert_array_equal(again, w.predicted_output_tokens)
        explicit = with_prediction_error(w, 0.2, seed=int(w.meta["synthesis_seed"]))
        np.testing.assert_array_equal(explicit.predicted_output_tokens, w.predicted_output_tokens)


def test_zero_error_gives_the_true_lengths_clipped_and_keeps_deadlines(windows):
    for w in windows[::7]:
        exact = with_prediction_error(w, 0.0)
        np.testing.assert_array_equal(exact.predicted_output_tokens,
                                      np.clip(w.output_tokens, 1, MAX_PREDICTED_OUTPUT_TOKENS))
        np.testing.assert_array_equal(exact.deadline_s, w.deadline_s)
        np.testing.assert_array_equal(exact.arrival_s, w.arrival_s)
        np.testing.assert_array_equal(exact.output_tokens, w.output_tokens)
        assert exact.meta["prediction_relative_error"] == 0.0
        assert exact.meta["sha256"] == w.meta["sha256"]


def test_the_spread_grows_with_the_error_level(windows):
    levels = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0)
    spread = []
    for e in levels:
        logs = np.concatenate([
            np.log(with_prediction_error(w, e).predicted_output_tokens / w.output_tokens)
            for w in windows])
        spread.append(float(np.median(np.abs(logs))))
    assert spread[0] == 0.0
    assert all(a < b for a, b in zip(spread, spread[1:])), spread
    # median |log error| of a log-normal is σ · 0.6745 with σ² = ln(1 + e²) (rounding aside)
    for e, s in zip(levels[2:], spread[2:]):
        assert s == pytest.approx(0.6745 * math.sqrt(math.log1p(e * e)), rel=0.1)
    # nested levels: each request's error keeps its sign
    w = windows[0]
    lo = np.sign(with_prediction_error(w, 0.2).predicted_output_tokens - w.output_tokens)
    hi = np.sign(with_prediction_error(w, 1.0).predicted_output_tokens - w.output_tokens)
    assert not np.any(lo * hi < 0)


def test_commutes_with_scaling_and_follows_with_slo(windows):
    w = windows[3]
    a = with_prediction_error(scale(w, 50.0), 0.5)
    b = scale(with_prediction_error(w, 0.5), 50.0)
    np.testing.assert_array_equal(a.predicted_output_tokens, b.predicted_output_tokens)
    np.testing.assert_array_equal(a.deadline_s, b.deadline_s)
    slo = with_prediction_error(with_slo(w, 40.0), 0.5)
    np.testing.assert_array_equal(slo.deadline_s, with_slo(w, 40.0).deadline_s)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), 5.01, 100, "lots", None, True])
def test_bad_error_levels_are_refused_by_name(windows, bad):
    with pytest.raises(ValueError, match="prediction relative error") as err:
        with_prediction_error(windows[0], bad)
    assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match="prediction relative error"):
        CampaignConfig(policies=("fifo",), prediction_error=bad)


def test_a_window_without_a_seed_is_refused(windows):
    from portbench.workload import make_window
    w = make_window("no_seed", "test", [0.0, 1.0], [10, 10], [5, 5], [5, 5])
    with pytest.raises(ValueError, match="no_seed.*synthesis_seed"):
        with_prediction_error(w, 0.5)
    assert with_prediction_error(w, 0.5, seed=1).predicted_output_tokens.shape == (2,)


def test_fifo_and_so_lambda_ref_ignore_the_error_level(windows):
    # FIFO reads no prediction and deadlines are kept: a FIFO run is identical at every level, so
    # the calibrated λ_ref (a function of FIFO runs) is too.
    w = windows[45]
    s = scale(w, 1.5 * w.meta["paper_lambda_ref"])
    base = sim.simulate(s, make_policy("fifo"))
    other = sim.simulate(with_prediction_error(s, 1.0), make_policy("fifo"))
    for field in ("admit_s", "first_token_s", "finish_s", "deadline_s"):
        np.testing.assert_array_equal(getattr(base, field), getattr(other, field))


def test_study_level_keys_and_paths_are_unchanged(windows):
    w = windows[0]
    study = CampaignConfig(policies=("fifo",))
    assert study.prediction_error == 0.2
    other = CampaignConfig(policies=("fifo",), prediction_error=0.5)
    assert shard_key(w, study, 20.0, "code") != shard_key(w, other, 20.0, "code")
    assert shard_key(w, CampaignConfig(policies=("fifo",), prediction_error=0.20), 20.0, "code") == \
        shard_key(w, study, 20.0, "code")
    assert results_path("lssp").name == "campaign_lssp.parquet"
    assert results_path("lssp", prediction_error=0.5).name == "campaign_lssp_prederr0.5.parquet"
    assert cache_dir("lssp").name == "lssp"
    assert cache_dir("lssp", prediction_error=0.5).name == "lssp_prederr0.5"
    assert "prediction_error" in IDENTITY_COLUMNS


def test_tiny_campaign_at_another_error_level(data_dir, tmp_path):
    shutil.copytree(data_dir / "windows", tmp_path / "windows")
    manifest = store.list_windows(tmp_path)
    ids = tuple(manifest[manifest["source"] == "azure_llm_2024"]["window_id"][:2])
    common = dict(policies=("fifo", "estimated_service_time_first"), regions=("HIGH_PRESSURE",),
                  slo_multipliers=(20.0,), window_ids=ids)
    study = run_campaign(CampaignConfig(**common), data_dir=tmp_path, workers=1, progress=False)
    noisy = run_campaign(CampaignConfig(**common, prediction_error=0.5), data_dir=tmp_path,
                         workers=1, progress=False)
    assert noisy.path.name == "campaign_lssp_prederr0.5.parquet" and noisy.path.exists()
    assert study.path.name == "campaign_lssp.parquet" and study.path.exists()
    assert (study.table["prediction_error"] == 0.2).all()
    assert (noisy.table["prediction_error"] == 0.5).all()
    assert len(noisy.table) == len(study.table) == 4
    key = ["window_id", "region", "policy"]
    a = study.table.set_index(key).sort_index()
    b = noisy.table.set_index(key).sort_index()
    pd.testing.assert_series_equal(a["lambda_ref"], b["lambda_ref"])       # same regions
    fifo = (slice(None), "HIGH_PRESSURE", "fifo")
    pd.testing.assert_series_equal(a.loc[fifo, "anwg"], b.loc[fifo, "anwg"])
    estf = (slice(None), "HIGH_PRESSURE", "estimated_service_time_first")
    metrics = ["anwg", "mean_latency_s", "p95_latency_s", "mean_ttft_s"]
    assert not np.allclose(a.loc[estf, metrics].to_numpy(float), b.loc[estf, metrics].to_numpy(float))
    # each level reuses its own cache and leaves the other's alone
    again = run_campaign(CampaignConfig(**common), data_dir=tmp_path, workers=1, progress=False)
    assert again.n_cells_computed == 0
    again = run_campaign(CampaignConfig(**common, prediction_error=0.5), data_dir=tmp_path,
                         workers=1, progress=False)
    assert again.n_cells_computed == 0
