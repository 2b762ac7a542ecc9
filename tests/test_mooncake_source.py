"""The prefix-hashed source (issue 38): Mooncake's reader, block hashes in the store and under the
window checksum, the shipped ``mooncake_conversation`` windows, and default campaigns that keep to
the study's three sources."""

import hashlib
import json
import lzma
import shutil

import numpy as np
import pandas as pd
import pytest

from portbench import store
from portbench.campaign import CampaignConfig, results_are_current, run_campaign
from portbench.cli import main as cli_main
from portbench.store import add_source
from portbench.traces import (MOONCAKE_BLOCK_TOKENS, TraceFormatError, cut_windows,
                              read_mooncake, read_trace)
from portbench.workload import synthesize_predictions

SOURCE = "mooncake_conversation"
RAW = "conversation_trace.jsonl.xz"
#: sha256 of the study's 120 "window_id sha256" manifest lines, sorted, as at the commit before the
#: Mooncake windows were added: adding a source must leave every one of them as it was.
STUDY_CHECKSUMS_DIGEST = "ce9424ce1588964774bbabac105ed06f362a5064c3478e99bac10652959465af"


def records(n=40):
    """A small valid trace: a shared first block, ticks of equal timestamps, every prompt's blocks."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        x = int(rng.integers(1, 3000))
        blocks = -(-x // MOONCAKE_BLOCK_TOKENS)
        out.append({"timestamp": 1500 * (i // 3), "input_length": x,
                    "output_length": int(rng.integers(1, 400)),
                    "hash_ids": [0] + list(range(100 * i + 1, 100 * i + blocks))})
    return out


def write_trace(path, recs, *, xz=False):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)
    if xz:
        with lzma.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the reader -------------------------------------------------------------------------------------

@pytest.mark.parametrize("xz", [False, True])
def test_reader_normalises_and_keeps_the_hashes(tmp_path, xz):
    recs = records()
    path = write_trace(tmp_path / ("t.jsonl.xz" if xz else "t.jsonl"), recs, xz=xz)
    frame, report = read_mooncake(path)
    assert report.rows_valid == len(recs) and report.block_tokens == 512 and report.fmt == "mooncake"
    np.testing.assert_allclose(frame["arrival_s"], [r["timestamp"] / 1000 for r in recs], rtol=0, atol=1e-12)
    assert frame["input_tokens"].tolist() == [r["input_length"] for r in recs]
    assert frame["output_tokens"].tolist() == [r["output_length"] for r in recs]
    assert [h.tolist() for h in frame["block_hashes"]] == [r["hash_ids"] for r in recs]
    assert frame["block_hashes"].iloc[0].dtype == np.int64
    assert frame["source_record_id"].iloc[7] == f"{path.name}:7"
    same, _ = read_trace(path, "mooncake")
    assert [h.tolist() for h in same["block_hashes"]] == [r["hash_ids"] for r in recs]


def test_fewer_hashes_than_blocks_are_allowed(tmp_path):
    recs = records()
    recs[2] = dict(recs[2], input_length=5000, hash_ids=[0, 7])       # 10 blocks, 2 hashed
    frame, _ = read_mooncake(write_trace(tmp_path / "t.jsonl", recs))
    assert frame["block_hashes"].iloc[2].tolist() == [0, 7]


# record 4 is line 5 of the file
BAD = [
    ("decreasing timestamp", {"timestamp": 1499}, "timestamp", "earlier than the previous row"),
    ("empty hash list", {"hash_ids": []}, "hash_ids", "empty list"),
    ("too many hashes", {"input_length": 1025, "hash_ids": [0, 1, 2, 3]}, "hash_ids",
     "4 block hash ids, but a prompt of 1025 tokens has only 3 block"),
    ("hashes of a full prompt plus one", {"input_length": 1024, "hash_ids": [0, 1, 2]}, "hash_ids",
     "only 2 block"),
    ("hash list missing", {"hash_ids": None}, "hash_ids", "missing value"),
    ("hash list not a list", {"hash_ids": "0,1"}, "hash_ids", "expected a list"),
    ("fractional hash id", {"hash_ids": [0, 1.5]}, "hash_ids", "1.5 is not a 64-bit integer"),
    ("boolean hash id", {"hash_ids": [True]}, "hash_ids", "true is not a 64-bit integer"),
    ("hash id past int64", {"hash_ids": [2 ** 63]}, "hash_ids", "not a 64-bit integer"),
    ("missing input length", {"input_length": None}, "input_length", "empty value"),
    ("fractional input length", {"input_length": 12.5}, "input_length", "not an integer"),
    ("text output length", {"output_length": "many"}, "output_length", "not a number"),
    ("zero input length", {"input_length": 0}, "input_length", "zero token count"),
    ("negative output length", {"output_length": -3}, "output_length", "negative token count"),
    ("text timestamp", {"timestamp": "soon"}, "timestamp", "not a number"),
]


@pytest.mark.parametrize("change, field, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("xz", [False, True])
def test_bad_input_names_file_line_and_field(tmp_path, change, field, message, xz):
    recs = records()
    recs[4] = {k: v for k, v in {**recs[4], **change}.items() if v is not None}
    path = write_trace(tmp_path / ("bad.jsonl.xz" if xz else "bad.jsonl"), recs, xz=xz)
    with pytest.raises(TraceFormatError, match=message) as exc:
        read_mooncake(path)
    assert (exc.value.row, exc.value.field) == (5, field)
    assert str(exc.value).startswith(f"{path}: row 5, field '{field}': ")


def test_line_numbers_count_blank_lines_and_bad_json(tmp_path):
    recs = records()
    lines = [json.dumps(r) for r in recs[:3]] + ["", json.dumps(dict(recs[3], hash_ids=[]))]
    with pytest.raises(TraceFormatError, match="row 5, field 'hash_ids'"):
        read_mooncake(write_trace(tmp_path / "t.jsonl", lines))
    with pytest.raises(TraceFormatError, match="row 2: invalid JSON"):
        read_mooncake(write_trace(tmp_path / "t.jsonl", [json.dumps(recs[0]), "{not json"]))
    with pytest.raises(TraceFormatError, match="field 'hash_ids': missing required field"):
        read_mooncake(write_trace(tmp_path / "t.jsonl", [{k: v for k, v in r.items() if k != "hash_ids"}
                                                         for r in recs]))
    (tmp_path / "t.jsonl.xz").write_bytes(b"not xz at all")
    with pytest.raises(TraceFormatError, match="not a readable .xz file"):
        read_mooncake(tmp_path / "t.jsonl.xz")


# --- the store: hashes, checksum, atomic failures ---------------------------------------------------

def test_the_checksum_covers_every_hash_and_where_it_belongs():
    cols = (np.array([0.0, 1.0]), np.array([600, 100]), np.array([5, 6]), np.array([5, 7]))
    base = store.rows_sha256(*cols, block_hashes=[[1, 2], [3]])
    assert base != store.rows_sha256(*cols)                                  # hashes are covered
    assert base != store.rows_sha256(*cols, block_hashes=[[1, 2], [4]])      # one hash changed
    assert base != store.rows_sha256(*cols, block_hashes=[[1], [2, 3]])      # one hash moved
    assert base == store.rows_sha256(*cols, block_hashes=[np.array([1, 2]), (3,)])
    # without hashes the digest is the four columns' alone, as the study's windows always had
    h = hashlib.sha256(np.asarray(cols[0], "<f8").tobytes())
    for c in cols[1:]:
        h.update(np.asarray(c, "<i8").tobytes())
    assert store.rows_sha256(*cols) == h.hexdigest()


def test_add_source_stores_hashes_and_loads_them(tmp_path):
    recs = records(60)
    path = write_trace(tmp_path / "t.jsonl.xz", recs, xz=True)
    data = tmp_path / "data"
    rows = add_source("moon", path, fmt="mooncake", n_windows=3, window_size=10, seed=5, data_dir=data)
    assert rows["block_tokens"].tolist() == [512] * 3
    assert rows["chronology_stratum"].tolist() == ["EARLY", "MIDDLE", "LATE"]
    for entry in rows.itertuples():
        start = entry.start_index_in_valid_rows
        hashes = store.load_block_hashes(entry.window_id, data)
        assert [h.tolist() for h in hashes] == [r["hash_ids"] for r in recs[start:start + 10]]
        w = store.load_window(entry.window_id, data)
        assert store.rows_sha256(w.arrival_s, w.input_tokens, w.output_tokens, w.predicted_output_tokens,
                                 block_hashes=hashes) == entry.sha256
    table = pd.read_parquet(data / "windows" / "moon.parquet")
    assert "block_hashes" in table and "block_hashes" not in pd.read_csv(data / "windows" / "manifest.csv")


def test_a_changed_hash_fails_the_checksum_by_name(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", records(60))
    data = tmp_path / "data"
    add_source("moon", path, fmt="mooncake", n_windows=2, window_size=10, seed=1, data_dir=data)
    file = data / "windows" / "moon.parquet"
    table = pd.read_parquet(file)
    victim = table["window_id"].iloc[0]
    hashes = list(table["block_hashes"])
    hashes[3] = np.append(hashes[3][:-1], 999_999)
    table["block_hashes"] = pd.Series(hashes, dtype=object)
    table.to_parquet(file, index=False)
    with pytest.raises(store.WindowStoreError, match=f"{victim}.*checksum"):
        store.load_block_hashes(victim, data)
    with pytest.raises(store.WindowStoreError, match=f"{victim}.*checksum"):
        store.load_window(victim, data)
    other = table["window_id"].iloc[-1]
    assert len(store.load_block_hashes(other, data)) == 10


def test_bad_trace_leaves_the_store_exactly_as_it_was(tmp_path):
    data = tmp_path / "data"
    good = write_trace(tmp_path / "good.jsonl", records(60))
    add_source("moon", good, fmt="mooncake", n_windows=2, window_size=10, seed=1, data_dir=data)
    before = snapshot(data)
    for i, change in enumerate([{"hash_ids": []}, {"timestamp": 0}, {"input_length": 100, "hash_ids": [0, 1]}]):
        recs = records(60)
        recs[30] = {**recs[30], **change}
        bad = write_trace(tmp_path / f"bad{i}.jsonl", recs)
        with pytest.raises(TraceFormatError, match="row 31"):
            add_source("other", bad, fmt="mooncake", n_windows=2, window_size=10, seed=1, data_dir=data)
        with pytest.raises(TraceFormatError, match="row 31"):
            add_source("moon", bad, fmt="mooncake", n_windows=2, window_size=10, seed=1, data_dir=data,
                       replace=True)
        assert snapshot(data) == before
    assert cli_main(["--data-dir", str(data), "windows", "add", "other", str(bad), "--format", "mooncake",
                     "--n-windows", "2", "--window-size", "10"]) == 2
    assert snapshot(data) == before


def test_write_source_refuses_bad_hashes_and_writes_nothing(tmp_path):
    def window(wid, **extra):
        return {"window_id": wid, "arrival_s": [0.0, 1.0], "input_tokens": [600, 100], "output_tokens": [5, 6],
                "predicted_output_tokens": [5, 6], "block_tokens": 512, **extra}
    store.write_source("t", [window("t_w00", block_hashes=[[1, 2], [1]])], tmp_path)
    before = snapshot(tmp_path)
    for bad, message in [([window("u_w00", block_hashes=[[1, 2], []])], "request 1.*non-empty"),
                         ([window("u_w00", block_hashes=[[1, 2, 3], [1]])], "request 0: 3 block hashes"),
                         ([window("u_w00", block_hashes=[[1, 2]])], "1 block-hash lists for 2 requests"),
                         ([window("u_w00", block_hashes=[[1.5], [1]])], "integers"),
                         ([window("u_w00", block_hashes=[[1], [1]]), window("u_w01")], "some windows")]:
        with pytest.raises(store.WindowStoreError, match=message):
            store.write_source("u", bad, tmp_path)
        assert snapshot(tmp_path) == before
    store.write_source("plain", [window("p_w00")], tmp_path)
    with pytest.raises(KeyError, match="no block hashes"):
        store.load_block_hashes("p_w00", tmp_path)


# --- the shipped windows ----------------------------------------------------------------------------

def test_the_shipped_mooncake_windows_load_with_their_hashes(data_dir):
    manifest = store.list_windows(data_dir, SOURCE)
    assert len(manifest) == 40 and (manifest["n_requests"] == 200).all()
    assert (manifest["block_tokens"] == 512).all() and (manifest["sampling_seed"] == 20260904).all()
    assert manifest["chronology_stratum"].value_counts().to_dict() == {"EARLY": 14, "MIDDLE": 13, "LATE": 13}
    assert (manifest["source_file"] == RAW).all() and manifest["paper_lambda_ref"].isna().all()
    starts = manifest["start_index_in_valid_rows"].to_numpy()
    assert (np.diff(starts) >= 200).all() and starts[-1] + 200 <= 12_031
    shared_first_block = 0
    for entry, w in zip(manifest.itertuples(), store.load_windows(data_dir, SOURCE)):
        hashes = store.load_block_hashes(w.window_id, data_dir)
        assert len(w) == len(hashes) == 200
        lengths = np.array([len(h) for h in hashes])
        assert (lengths >= 1).all() and (lengths <= -(-w.input_tokens // 512)).all(), w.window_id
        k = int(w.window_id.rsplit("_w", 1)[1])
        np.testing.assert_array_equal(w.predicted_output_tokens,
                                      synthesize_predictions(w.output_tokens, seed=900_000 + k))
        assert store.rows_sha256(w.arrival_s, w.input_tokens, w.output_tokens,
                                 w.predicted_output_tokens) != entry.sha256     # the hashes are in it
        shared_first_block += sum(h[0] == 0 for h in hashes)
    assert shared_first_block == 40 * 200      # in this trace every prompt starts with block 0


def test_the_shipped_windows_are_the_cut_of_the_raw_trace(data_dir):
    raw = store.trace_path(SOURCE, data_dir)
    frame, report = read_mooncake(raw)
    assert report.rows_valid == 12_031
    cut = cut_windows(frame, n_windows=40, seed=20260904, source=SOURCE)
    manifest = store.list_windows(data_dir, SOURCE).set_index("window_id")
    for c in cut:
        w = store.load_window(c["window_id"], data_dir)
        np.testing.assert_array_equal(w.arrival_s, c["arrival_s"])
        np.testing.assert_array_equal(w.input_tokens, c["input_tokens"])
        np.testing.assert_array_equal(w.output_tokens, c["output_tokens"])
        assert [h.tolist() for h in store.load_block_hashes(c["window_id"], data_dir)] == \
            [h.tolist() for h in c["block_hashes"]]
        assert manifest.loc[c["window_id"], "chronology_stratum"] == c["chronology_stratum"]


def test_the_studys_checksums_are_unchanged(data_dir):
    manifest = store.list_windows(data_dir)
    assert sorted(set(manifest["source"])) == sorted(store.SOURCES_OF_THE_STUDY) and len(manifest) == 120
    text = "".join(f"{w} {s}\n" for w, s in sorted(zip(manifest["window_id"], manifest["sha256"])))
    assert hashlib.sha256(text.encode()).hexdigest() == STUDY_CHECKSUMS_DIGEST
    table = pd.read_parquet(data_dir / "windows" / "burstgpt.parquet")
    assert "block_hashes" not in table          # the study's files are as they were


# --- default selections keep to the study's sources -------------------------------------------------

def test_default_selections_are_the_studys_windows(data_dir):
    ids = set(store.list_windows(data_dir)["window_id"])
    assert len(ids) == 120 and not any(i.startswith(SOURCE) for i in ids)
    assert {w.source for w in store.load_windows(data_dir)} == set(store.SOURCES_OF_THE_STUDY)
    every = store.list_windows(data_dir, every_source=True)
    assert set(every["source"]) == {*store.SOURCES_OF_THE_STUDY, *store.PREFIX_HASHED_SOURCES} and len(every) == 176
    # named explicitly, the new source's windows are there
    assert len(store.list_windows(data_dir, SOURCE)) == 40
    named = store.load_windows(data_dir, window_ids=[f"{SOURCE}_w03", "burstgpt_stage0_w00"])
    assert [w.window_id for w in named] == [f"{SOURCE}_w03", "burstgpt_stage0_w00"]


def _tiny_window(wid, n=12, **extra):
    return {"window_id": wid, "arrival_s": np.arange(n) * 0.5, "input_tokens": np.full(n, 700),
            "output_tokens": np.full(n, 20), "predicted_output_tokens": np.full(n, 20), **extra}


def test_default_campaign_ignores_an_added_source(tmp_path):
    store.write_source("burstgpt", [_tiny_window("burstgpt_w00"), _tiny_window("burstgpt_w01")], tmp_path)
    config = CampaignConfig(policies=("fifo",), regions=("KNEE",), slo_multipliers=(20.0,))
    first = run_campaign(config, data_dir=tmp_path, workers=1, progress=False)
    assert sorted(set(first.table["window_id"])) == ["burstgpt_w00", "burstgpt_w01"]

    store.write_source("moon", [_tiny_window("moon_w00", block_hashes=[[0, 1]] * 12, block_tokens=512)],
                       tmp_path)
    assert results_are_current(config, tmp_path)               # adding a source recomputes nothing
    again = run_campaign(config, data_dir=tmp_path, workers=1, progress=False)
    assert again.n_cells_computed == 0 and set(again.table["window_id"]) == set(first.table["window_id"])

    named = CampaignConfig(policies=("fifo",), regions=("KNEE",), slo_multipliers=(20.0,),
                           window_ids=("moon_w00",))
    assert not results_are_current(named, tmp_path)
    out = run_campaign(named, data_dir=tmp_path, workers=1, progress=False, output=tmp_path / "moon.parquet")
    assert set(out.table["source"]) == {"moon"}
