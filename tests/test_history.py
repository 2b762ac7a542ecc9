"""The Mooncake traces shipped in ``data/traces/``, the second prefix-hashed source
(``mooncake_synthetic``), and a window's history (``store.load_window(..., history=True)``): the trace's
requests before the window, for a warm prefix cache."""

import dataclasses
import hashlib
import lzma
import shutil

import numpy as np
import pytest

from portbench import store, traces
from portbench.traces import cut_windows, read_mooncake
from portbench.workload import History, synthesize_predictions

SYNTHETIC = "mooncake_synthetic"
CONVERSATION = store.PREFIX_HASHED_SOURCE


def _start(window) -> int:
    return int(window.meta["start_index_in_valid_rows"])


def _trace_frame(data_dir, source):
    """The trace parsed afresh by the reader, bypassing the store's cache."""
    frame, _ = read_mooncake(data_dir / store.TRACE_FILES[source])
    return frame


def _copy_data(data_dir, tmp_path):
    """A copy of the window store and the shipped traces, to damage."""
    shutil.copytree(data_dir / "windows", tmp_path / "windows")
    shutil.copytree(data_dir / "traces", tmp_path / "traces")
    return tmp_path


# --- the shipped traces -----------------------------------------------------------------------------

def test_the_shipped_traces_are_the_published_files(data_dir):
    assert store.PREFIX_HASHED_SOURCE == "mooncake_conversation"
    assert store.PREFIX_HASHED_SOURCES == (CONVERSATION, SYNTHETIC)
    assert set(store.TRACE_FILES) == set(store.PREFIX_HASHED_SOURCES)
    assert not set(store.PREFIX_HASHED_SOURCES) & set(store.SOURCES_OF_THE_STUDY)
    for source in store.PREFIX_HASHED_SOURCES:
        path = store.trace_path(source)
        assert path == store.default_data_dir() / store.TRACE_FILES[source]
        assert path.parent == data_dir / "traces" / "mooncake"
        with lzma.open(path) as f:
            assert hashlib.sha256(f.read()).hexdigest() == store.TRACE_SHA256[store.TRACE_FILES[source]]
    assert store.TRACE_SHA256 == {   # as the publisher's README gives them (data/README.md)
        "traces/mooncake/conversation_trace.jsonl.xz":
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "traces/mooncake/synthetic_trace.jsonl.xz":
            "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"}
    licence = (data_dir / "traces" / "mooncake" / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence


# --- history ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("window_id", [f"{CONVERSATION}_w00", f"{CONVERSATION}_w07",
                                       f"{SYNTHETIC}_w00", f"{SYNTHETIC}_w09"])
def test_history_holds_every_valid_row_before_the_window(data_dir, window_id):
    w = store.load_window(window_id, data_dir, history=True)
    start = _start(w)
    assert isinstance(w.history, History) and len(w.history) == start > 0
    assert w.history.block_tokens == 512 == w.meta["block_tokens"]
    assert w.history.input_tokens.dtype == w.history.output_tokens.dtype == np.int64
    assert all(h.dtype == np.int64 for h in w.history.block_hashes)
    assert not w.history.input_tokens.flags.writeable          # shared with the trace: read-only


@pytest.mark.parametrize("source", store.PREFIX_HASHED_SOURCES)
def test_the_first_window_of_each_source_has_the_traces_rows_before_it(data_dir, source):
    frame = _trace_frame(data_dir, source)
    w = store.load_windows(data_dir, source, history=True)[0]
    start = _start(w)
    np.testing.assert_array_equal(w.history.input_tokens, frame["input_tokens"].to_numpy()[:start])
    np.testing.assert_array_equal(w.history.output_tokens, frame["output_tokens"].to_numpy()[:start])
    assert [h.tolist() for h in w.history.block_hashes] == \
        [h.tolist() for h in frame["block_hashes"][:start]]
    # ... and the window itself starts at the next row.
    np.testing.assert_array_equal(w.input_tokens, frame["input_tokens"].to_numpy()[start:start + len(w)])
    assert w.block_hashes[0].tolist() == frame["block_hashes"][start].tolist()


def test_without_history_a_window_is_loaded_as_before(data_dir):
    wid = f"{SYNTHETIC}_w02"
    plain, warm = store.load_window(wid, data_dir), store.load_window(wid, data_dir, history=True)
    assert plain.history is None
    assert all(w.history is None for w in store.load_windows(data_dir, SYNTHETIC))
    for name in ("arrival_s", "input_tokens", "output_tokens", "predicted_output_tokens", "deadline_s"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(warm, name))
    assert plain.meta == warm.meta
    # Copies share the history object.
    assert dataclasses.replace(warm, slo_multiplier=2.0).history is warm.history


def test_each_trace_is_read_once_per_process(data_dir, monkeypatch):
    calls = []
    real = traces.read_mooncake
    monkeypatch.setattr(traces, "read_mooncake", lambda path: calls.append(path) or real(path))
    store._read_trace.cache_clear()
    store.load_windows(data_dir, window_ids=[f"{SYNTHETIC}_w00", f"{SYNTHETIC}_w01"], history=True)
    store.load_window(f"{SYNTHETIC}_w05", data_dir, history=True)
    assert len(calls) == 1


def test_a_source_without_a_shipped_trace_has_no_history(data_dir):
    with pytest.raises(KeyError, match="source 'burstgpt' has no shipped trace"):
        store.load_window("burstgpt_stage0_w00", data_dir, history=True)
    with pytest.raises(KeyError, match="no shipped trace"):          # the default: the study's windows
        store.load_windows(data_dir, history=True)
    with pytest.raises(KeyError, match="'bailian_qwen'"):
        store.trace_path("bailian_qwen")


# --- damage ---------------------------------------------------------------------------------------------

def test_a_store_that_disagrees_with_the_trace_is_refused(data_dir, tmp_path):
    base = _copy_data(data_dir, tmp_path)
    wid = f"{SYNTHETIC}_w01"
    start = _start(store.load_window(wid, base))
    manifest = base / "windows" / "manifest.csv"
    text = manifest.read_text()
    old = f"{wid},200,"
    line = next(x for x in text.splitlines() if x.startswith(f"{SYNTHETIC},{old}"))
    # The start index is not under the window's checksum: shift it by one row.
    manifest.write_text(text.replace(line, line.replace(f",{start}.0,", f",{start + 1}.0,")))
    assert store.load_window(wid, base).window_id == wid          # the rows themselves still verify
    with pytest.raises(store.WindowStoreError, match=f"{wid}.*disagree.*request 0"):
        store.load_window(wid, base, history=True)
    # The other windows are unaffected.
    assert len(store.load_window(f"{SYNTHETIC}_w02", base, history=True).history) > 0


def test_a_wrong_or_missing_trace_file_is_named(data_dir, tmp_path):
    base = _copy_data(data_dir, tmp_path)
    synthetic = base / store.TRACE_FILES[SYNTHETIC]
    shutil.copyfile(base / store.TRACE_FILES[CONVERSATION], synthetic)
    with pytest.raises(store.WindowStoreError, match="synthetic_trace.jsonl.xz.*SHA-256"):
        store.load_window(f"{SYNTHETIC}_w00", base, history=True)
    synthetic.write_bytes(b"not xz at all")
    with pytest.raises(store.WindowStoreError, match="synthetic_trace.jsonl.xz.*not a readable xz"):
        store.load_window(f"{SYNTHETIC}_w00", base, history=True)
    synthetic.unlink()
    with pytest.raises(store.WindowStoreError, match=f"'{SYNTHETIC}'.*synthetic_trace.jsonl.xz is missing"):
        store.load_windows(base, SYNTHETIC, history=True)
    # The conversation source's trace is intact.
    assert store.load_window(f"{CONVERSATION}_w00", base, history=True).history is not None


# --- the synthetic source --------------------------------------------------------------------------------

def test_the_synthetic_windows_are_the_cut_of_the_shipped_trace(data_dir):
    manifest = store.list_windows(data_dir, SYNTHETIC)
    assert len(manifest) == 16 and (manifest["n_requests"] == 200).all()
    assert (manifest["block_tokens"] == 512).all() and (manifest["sampling_seed"] == 20260904).all()
    assert manifest["synthesis_seed"].tolist() == [900_000 + k for k in range(16)]
    assert (manifest["source_file"] == "synthetic_trace.jsonl.xz").all()
    assert manifest["chronology_stratum"].value_counts().to_dict() == {"EARLY": 6, "MIDDLE": 5, "LATE": 5}
    assert manifest["paper_lambda_ref"].isna().all()
    cut = cut_windows(_trace_frame(data_dir, SYNTHETIC), n_windows=16, seed=20260904, source=SYNTHETIC)
    windows = store.load_windows(data_dir, SYNTHETIC, history=True)      # every one verifies
    for c, w, start in zip(cut, windows, manifest["start_index_in_valid_rows"]):
        assert w.window_id == c["window_id"] and c["start_index_in_valid_rows"] == start == len(w.history)
        np.testing.assert_array_equal(w.arrival_s, c["arrival_s"])
        np.testing.assert_array_equal(w.output_tokens, c["output_tokens"])
        np.testing.assert_array_equal(w.predicted_output_tokens, c["predicted_output_tokens"])
        np.testing.assert_array_equal(w.predicted_output_tokens, synthesize_predictions(
            w.output_tokens, seed=int(c["synthesis_seed"])))
        assert [h.tolist() for h in w.block_hashes] == [h.tolist() for h in c["block_hashes"]]


def test_no_default_selection_takes_a_prefix_hashed_source(data_dir):
    assert set(store.list_windows(data_dir)["source"]) == set(store.SOURCES_OF_THE_STUDY)
    every = store.list_windows(data_dir, every_source=True)
    assert set(every["source"]) == {*store.SOURCES_OF_THE_STUDY, *store.PREFIX_HASHED_SOURCES}
    assert len(every) == 120 + 40 + 16
