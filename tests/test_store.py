import os
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
    # the listing shows every source in the store, the added ones too
    assert ("176 windows: azure_llm_2024 40, bailian_qwen 40, burstgpt 40, mooncake_conversation 40, "
            "mooncake_synthetic 16") in out


# --- damage and crash safety --------------------------------------------------------------------

def _copy_store(data_dir, tmp_path):
    shutil.copytree(data_dir / "windows", tmp_path / "windows")
    return tmp_path


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b"not parquet" * 50],
                         ids=["truncated", "empty", "garbage"])
def test_a_corrupt_parquet_file_is_named_as_damage(data_dir, tmp_path, capsys, damage):
    store_dir = _copy_store(data_dir, tmp_path)
    path = store_dir / "windows" / "bailian_qwen.parquet"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(store.WindowStoreError, match="window store .* is damaged; restore it from git") as exc:
        store.load_windows(store_dir, source="bailian_qwen")
    assert str(path) in str(exc.value) and "Parquet" in str(exc.value)
    # The command line reports it as one error line, not a pyarrow traceback.
    assert cli_main(["--data-dir", str(store_dir), "windows", "describe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("portbench: error: ") and str(path) in err and "Traceback" not in err
    # The other sources are unaffected.
    assert len(store.load_windows(store_dir, source="burstgpt")) == 40


def test_a_manifest_naming_a_file_outside_the_store_is_refused(tmp_path):
    store.write_source("t", [_window("t_w00")], tmp_path)
    path = tmp_path / "windows" / "manifest.csv"
    manifest = pd.read_csv(path)
    manifest[store.FILE_COLUMN] = "../../elsewhere.parquet"
    manifest.to_csv(path, index=False)
    with pytest.raises(store.WindowStoreError, match="parquet_file"):
        store.load_window("t_w00", tmp_path)


def _window(window_id, n=3, bump=0):
    return {"window_id": window_id, "arrival_s": np.arange(n, dtype=float),
            "input_tokens": np.arange(1, n + 1) + bump, "output_tokens": np.full(n, 7 + bump),
            "predicted_output_tokens": np.full(n, 8), "source_record_id": [f"f:{i}" for i in range(n)],
            "note": f"bump {bump}"}


def _content(data_dir):
    """Everything a reader of the store gets: each window's rows and metadata, in manifest order."""
    return [(w.window_id, w.source, w.arrival_s.tobytes(), w.input_tokens.tobytes(),
             w.output_tokens.tobytes(), w.predicted_output_tokens.tobytes(), sorted(w.meta.items()))
            for w in store.load_windows(data_dir, every_source=True)]


class _Crash(BaseException):
    """The process dies here (a BaseException, so no `except Exception` cleanup runs on the way out)."""


class _CrashAt:
    """Make the ``n``-th filesystem call die, and every call after it (a dead process does nothing)."""

    CALLS = ("open", "chmod", "fsync", "replace", "rename", "unlink", "remove")

    def __init__(self, monkeypatch, n):
        self.n, self.calls, self.dead = n, [], False
        for name in self.CALLS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            if self.dead or len(self.calls) + 1 == self.n:
                self.dead = True
                raise _Crash(f"crash at call {self.n} ({name})")
            out = real(*args, **kwargs)
            self.calls.append((name, *map(str, args[:2])))
            return out
        return call

    @property
    def committed(self):
        """Whether the new manifest had been renamed into place before the crash."""
        return any(c[0] == "replace" and c[2].endswith("/manifest.csv") for c in self.calls)


def _files(data_dir):
    return {p.name: p.read_bytes() for p in (data_dir / "windows").iterdir()}


def _crash_every_step(monkeypatch, make_base, write):
    """Run ``write`` on a fresh copy of the base store, dying at its 1st, 2nd, ... filesystem call."""
    n, before = 0, None
    while True:
        n += 1
        base = make_base(n)
        before = before or _content(base)   # every base is the same store
        before_files = _files(base)
        with monkeypatch.context() as m:
            crash = _CrashAt(m, n)
            try:
                write(base)
                finished = True
            except _Crash:
                finished = False
        after = _content(base)
        if not crash.committed:
            assert after == before, f"crash at step {n}: the previous store changed"
            named = store._named_files(store.read_manifest(base)) | {"manifest.csv"}
            assert {k: v for k, v in _files(base).items() if k in named} == {
                k: v for k, v in before_files.items() if k in named}
        else:
            assert after != before
        # The next write goes through and leaves only the files the manifest names.
        store.write_source("recovery", [_window("recovery_w00")], base, replace=True)
        assert set(_files(base)) == store._named_files(store.read_manifest(base)) | {"manifest.csv"}
        if finished:
            return n - 1, after


def test_a_crash_at_any_step_of_a_replace_leaves_a_loadable_store(data_dir, tmp_path, monkeypatch):
    """Replacing a source of the shipped store (no parquet_file column): old or new, never between."""
    new = [_window("burstgpt_x00", bump=1), _window("burstgpt_x01", bump=2)]
    steps, final = _crash_every_step(
        monkeypatch, lambda n: _copy_store(data_dir, tmp_path / f"crash{n}"),
        lambda d: store.write_source("burstgpt", new, d, replace=True))
    assert steps >= 10   # two durable renames and a removal, each several calls
    ids = [c[0] for c in final]
    assert "burstgpt_x00" in ids and not any(i.startswith("burstgpt_w") for i in ids)
    # The untouched sources still load with their shipped content.
    assert [c for c in final if c[1] != "burstgpt"] == [c for c in _content(data_dir) if c[1] != "burstgpt"]


def test_a_crash_at_any_step_of_an_add_or_a_second_replace(tmp_path, monkeypatch):
    def base(name):
        def make(n):
            d = tmp_path / f"{name}{n}"
            store.write_source("a", [_window("a_w00")], d)
            store.write_source("a", [_window("a_w00", bump=1)], d, replace=True)   # now in a.1.parquet
            return d
        return make
    assert (base("check")(0) / "windows" / "a.1.parquet").exists()
    _crash_every_step(monkeypatch, base("add"), lambda d: store.write_source("b", [_window("b_w00")], d))
    _crash_every_step(monkeypatch, base("replace"),
                      lambda d: store.write_source("a", [_window("a_w00", bump=5)], d, replace=True))


def test_replace_alternates_files_and_keeps_the_shipped_layout_readable(data_dir, tmp_path):
    store_dir = _copy_store(data_dir, tmp_path)
    shipped = _content(data_dir)
    store.write_source("burstgpt", [_window("burstgpt_x00")], store_dir, replace=True)
    assert not (store_dir / "windows" / "burstgpt.parquet").exists()
    assert (store_dir / "windows" / "burstgpt.1.parquet").exists()
    store.write_source("burstgpt", [_window("burstgpt_x00", bump=3)], store_dir, replace=True)
    assert sorted(_files(store_dir)) == ["azure_llm_2024.parquet", "bailian_qwen.parquet",
                                         "burstgpt.parquet", "manifest.csv", "mooncake_conversation.parquet",
                                         "mooncake_synthetic.parquet"]
    after = _content(store_dir)
    assert [c for c in after if c[1] != "burstgpt"] == [c for c in shipped if c[1] != "burstgpt"]
    (w,) = store.load_windows(store_dir, source="burstgpt")
    assert w.input_tokens.tolist() == [4, 5, 6] and w.meta["note"] == "bump 3"
    assert store.FILE_COLUMN not in w.meta
