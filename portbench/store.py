"""The frozen window store: ``data/windows/`` (one Parquet file per source plus a manifest).

Every window's rows carry a sha256 in the manifest; loading recomputes it and refuses a window whose
rows changed, naming it.

Crash safety: ``manifest.csv`` is the store's single commit point. A write never touches a Parquet
file that the current manifest names: the new rows go to a file no manifest row names (``<source>.parquet``
when free, else ``<source>.1.parquet``, ...), then the new manifest, which names that file in its
``parquet_file`` column, replaces the old one in one ``os.replace``; only then is the old file
removed. A crash before that replace leaves the old manifest naming untouched files (at worst an
unnamed file is left over, removed by the next write); a crash after it leaves the new store. A
manifest without ``parquet_file`` (as the study's windows were first shipped), or a row where it is
empty (the study's rows since), means ``<source>.parquet``.

Which windows "all" means: :func:`list_windows` and :func:`load_windows` with no source and no window
ids named give the windows of :data:`SOURCES_OF_THE_STUDY` only (``every_source=True``: every source
in the store). Campaigns, stored results, the book and the tests take that default, so a source added
later (``portbench windows add``) neither joins nor invalidates the study's tables; it takes part
wherever its source or its window ids are named.

Prefix-hashed sources (e.g. Mooncake's traces) keep each request's prompt-block hash ids in a list
column ``block_hashes`` of their Parquet file, and their manifest rows say how many prompt tokens a
block holds (``block_tokens``). Their ``sha256`` covers the hashes too (:func:`rows_sha256`); sources
without hashes have no such column and keep the checksum they always had. :func:`load_block_hashes`
reads them (outside :class:`~portbench.workload.Window`, which the engines see). Their raw traces
are shipped in ``data/traces/`` (:data:`TRACE_FILES`, checked against :data:`TRACE_SHA256`), so that
``load_window(..., history=True)`` can give a window its history, the trace's requests before it, for
a warm prefix cache (:func:`window_history`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import lzma
import os
import tempfile
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from . import traces
from .workload import History, Window, make_window

#: Columns of a source's Parquet file, in order.
REQUEST_COLUMNS = ["window_id", "request_index", "arrival_s", "input_tokens", "output_tokens",
                   "predicted_output_tokens", "source_record_id"]
#: Columns the manifest always has; sources may add provenance columns after them.
MANIFEST_COLUMNS = ["source", "window_id", "n_requests", "sha256", "paper_lambda_ref"]
#: Optional manifest column: the Parquet file (in the store folder) holding the row's window.
FILE_COLUMN = "parquet_file"
#: Optional request column of a prefix-hashed source: each request's prompt-block hash ids.
HASH_COLUMN = "block_hashes"
SOURCES_OF_THE_STUDY = ("azure_llm_2024", "bailian_qwen", "burstgpt")
#: The shipped source whose prompts carry prefix block hashes (RQ9; :mod:`portbench.engine.prefix`).
PREFIX_HASHED_SOURCE = "mooncake_conversation"
#: Every shipped prefix-hashed source; none is one of the study's, so no default selection takes them.
PREFIX_HASHED_SOURCES = ("mooncake_conversation", "mooncake_synthetic")
#: Each prefix-hashed source's raw trace, shipped with the project, relative to the data folder.
TRACE_FILES = {"mooncake_conversation": "traces/mooncake/conversation_trace.jsonl.xz",
               "mooncake_synthetic": "traces/mooncake/synthetic_trace.jsonl.xz"}
#: SHA-256 of each shipped trace's decompressed JSON lines (as the trace's publisher gives them;
#: data/README.md), checked when the trace is read.
TRACE_SHA256 = {
    "traces/mooncake/conversation_trace.jsonl.xz":
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "traces/mooncake/synthetic_trace.jsonl.xz":
        "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
}


class WindowStoreError(RuntimeError):
    """The window store is missing, inconsistent or tampered with."""


def default_data_dir() -> Path:
    """``$PORTBENCH_DATA`` if set, else the ``data/`` folder beside the package."""
    env = os.environ.get("PORTBENCH_DATA")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "data"


def windows_dir(data_dir: Path | None = None) -> Path:
    return Path(data_dir or default_data_dir()) / "windows"


def rows_sha256(arrival_s, input_tokens, output_tokens, predicted_output_tokens,
                block_hashes=None) -> str:
    """Content hash of a window's rows: the four columns as little-endian float64/int64 bytes.

    ``block_hashes`` (one sequence of ints per request, prefix-hashed sources only) follow as each
    request's hash count, then all the hashes, as int64: the counts delimit the lists, so moving a
    hash from one request to the next changes the digest too. Without them the digest is the one
    the study's windows have always had.
    """
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(arrival_s, dtype="<f8").tobytes())
    for col in (input_tokens, output_tokens, predicted_output_tokens):
        h.update(np.ascontiguousarray(col, dtype="<i8").tobytes())
    if block_hashes is not None:
        lists = [np.asarray(b, dtype="<i8") for b in block_hashes]
        h.update(np.array([len(b) for b in lists], dtype="<i8").tobytes())
        h.update(np.concatenate(lists).tobytes() if lists else b"")
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write, *, durable: bool = False) -> None:
    """Call ``write(tmp_path)`` then move the temporary file onto ``path`` in one rename.

    ``durable``: also flush the file before the rename and the folder after it, so that after a power
    loss the rename is never on disk without the file's contents (the window store's ordering).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        if durable:
            _fsync(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent)


def _damaged(path: Path) -> str:
    """How to recover, for the messages about a damaged store file."""
    return (f"the window store {Path(path).parent} is damaged; restore it from git (the shipped store: "
            "`git checkout -- data/windows`) or rebuild it with `portbench windows import-lssp` or "
            "`portbench windows add --replace`")


def read_manifest(data_dir: Path | None = None) -> pd.DataFrame:
    path = windows_dir(data_dir) / "manifest.csv"
    if not path.exists():
        raise WindowStoreError(f"no window manifest at {path}")
    try:
        manifest = pd.read_csv(path, dtype={"window_id": str, "source": str, "sha256": str,
                                            FILE_COLUMN: str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise WindowStoreError(f"{path}: unreadable manifest ({exc}); {_damaged(path)}") from None
    missing = [c for c in MANIFEST_COLUMNS if c not in manifest.columns]
    if missing:
        raise WindowStoreError(f"{path}: missing columns {missing}; {_damaged(path)}")
    if manifest["window_id"].duplicated().any():
        dup = manifest.loc[manifest["window_id"].duplicated(), "window_id"].iloc[0]
        raise WindowStoreError(f"{path}: window_id {dup!r} listed twice")
    return manifest


def _file_of(entry) -> str:
    """The Parquet file a manifest row's window lives in (the shipped layout has no FILE_COLUMN)."""
    name = entry.get(FILE_COLUMN)
    if name is None or pd.isna(name) or name == "":
        return f"{entry['source']}.parquet"
    if Path(name).name != name or not name.endswith(".parquet"):
        # A manifest only ever names files inside the store folder.
        raise WindowStoreError(f"window {entry['window_id']!r}: manifest field '{FILE_COLUMN}' is "
                               f"{name!r}, not a Parquet file name in the store folder")
    return name


@lru_cache(maxsize=16)
def _read_source_table(path: str, stamp: tuple) -> pd.DataFrame:
    # ``stamp`` (mtime, inode, size) only keys the cache: a rewritten file is read again.
    try:
        table = pd.read_parquet(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        # A truncated or overwritten file surfaces as a raw pyarrow error otherwise.
        raise WindowStoreError(f"{path}: not a readable Parquet file ({exc}); {_damaged(path)}") from None
    missing = [c for c in REQUEST_COLUMNS if c not in table.columns]
    if missing:
        raise WindowStoreError(f"{path}: missing columns {missing}; {_damaged(path)}")
    return table


def _source_table(data_dir: Path | None, entry) -> pd.DataFrame:
    path = windows_dir(data_dir) / _file_of(entry)
    if not path.exists():
        raise WindowStoreError(f"source {entry['source']!r} is in the manifest but {path} is missing; "
                               f"{_damaged(path)}")
    st = path.stat()
    return _read_source_table(str(path), (st.st_mtime_ns, st.st_ino, st.st_size))


def list_windows(data_dir: Path | None = None, source: str | None = None, *,
                 every_source: bool = False) -> pd.DataFrame:
    """The manifest rows of ``source``; with none named, of the study's sources, or of every source
    with ``every_source`` (module docstring: why the study's by default)."""
    manifest = read_manifest(data_dir)
    if source is not None:
        if source not in set(manifest["source"]):
            raise KeyError(f"unknown source {source!r}; known: {sorted(set(manifest['source']))}")
        manifest = manifest[manifest["source"] == source]
    elif not every_source:
        manifest = manifest[manifest["source"].isin(SOURCES_OF_THE_STUDY)]
    return manifest.reset_index(drop=True)


def _entry(window_id: str, data_dir: Path | None) -> pd.Series:
    manifest = read_manifest(data_dir)
    entry = manifest[manifest["window_id"] == window_id]
    if entry.empty:
        raise KeyError(f"unknown window {window_id!r} (see `portbench windows list`)")
    return entry.iloc[0]


def load_window(window_id: str, data_dir: Path | None = None, *, history: bool = False) -> Window:
    """Load one window (of any source) and verify its checksum. ``history``: also attach the trace's
    requests before it (:func:`window_history`; prefix-hashed sources only)."""
    window = _window_from_entry(_entry(window_id, data_dir), data_dir)
    return _with_history(window, data_dir) if history else window


def load_block_hashes(window_id: str, data_dir: Path | None = None) -> list[np.ndarray]:
    """Each request's prompt-block hash ids (int64 arrays, in request order) of a window of a
    prefix-hashed source, checksum verified; the manifest's ``block_tokens`` says how many prompt
    tokens a block holds."""
    entry = _entry(window_id, data_dir)
    rows = _verified_rows(entry, data_dir)
    if HASH_COLUMN not in rows:
        raise KeyError(f"window {window_id!r}: source {entry['source']!r} has no block hashes")
    return [np.asarray(b, dtype=np.int64) for b in rows[HASH_COLUMN]]


def load_windows(data_dir: Path | None = None, source: str | None = None,
                 window_ids: Iterable[str] | None = None, *, every_source: bool = False,
                 history: bool = False) -> list[Window]:
    """Load and verify many windows, in manifest order (``window_ids``: in that order). With no source
    and no window ids named: the study's windows, or every window with ``every_source`` (module
    docstring); named window ids may be of any source. ``history``: as :func:`load_window`'s."""
    manifest = list_windows(data_dir, source, every_source=every_source or window_ids is not None)
    if window_ids is not None:
        wanted = list(window_ids)
        unknown = sorted(set(wanted) - set(manifest["window_id"]))
        if unknown:
            raise KeyError(f"unknown windows: {unknown}")
        manifest = manifest.set_index("window_id").loc[wanted].reset_index()
    if not history:
        return [_window_from_entry(row, data_dir) for _, row in manifest.iterrows()]
    for name in dict.fromkeys(manifest["source"]):      # refuse before loading anything
        _trace_file_of(name)
    return [_with_history(_window_from_entry(row, data_dir), data_dir) for _, row in manifest.iterrows()]


# --------------------------------------------------------------------------------------------
# The prefix-hashed sources' shipped traces, and a window's history (the requests before it).

@dataclasses.dataclass(frozen=True, eq=False)
class _Trace:
    """A shipped trace's valid rows, in order, as :func:`portbench.traces.read_mooncake` reads them
    (read-only int64 arrays: a history is a view of them, never a copy)."""

    path: str
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    block_hashes: tuple
    block_tokens: int


def _trace_file_of(source: str) -> str:
    """The shipped trace of ``source``, relative to the data folder; a KeyError naming the source
    where it has none."""
    if source not in TRACE_FILES:
        raise KeyError(f"source {source!r} has no shipped trace, so its windows have no history; "
                       f"sources with one: {sorted(TRACE_FILES)}")
    return TRACE_FILES[source]


def trace_path(source: str, data_dir: Path | None = None) -> Path:
    """Where the raw trace of a prefix-hashed source is shipped (``data/traces/...``)."""
    return Path(data_dir or default_data_dir()) / _trace_file_of(source)


def _restore_trace(path) -> str:
    return (f"restore the shipped trace from git (`git checkout -- data/traces`); {path} must be the "
            "byte-identical copy that data/README.md describes")


@lru_cache(maxsize=4)
def _read_trace(path: str, stamp: tuple, sha256: str) -> _Trace:
    # ``stamp`` (mtime, inode, size) only keys the cache: a rewritten file is read again.
    digest = hashlib.sha256()
    try:
        with lzma.open(path) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except (lzma.LZMAError, EOFError) as exc:
        raise WindowStoreError(f"{path}: not a readable xz file ({exc}); {_restore_trace(path)}") from None
    if digest.hexdigest() != sha256:
        raise WindowStoreError(f"{path}: its decompressed SHA-256 is {digest.hexdigest()[:12]}…, the "
                               f"shipped trace's is {sha256[:12]}…; {_restore_trace(path)}")
    frame, report = traces.read_mooncake(path)
    columns = [frame[c].to_numpy(dtype=np.int64, copy=True) for c in ("input_tokens", "output_tokens")]
    hashes = tuple(np.array(h, dtype=np.int64) for h in frame["block_hashes"])
    for array in (*columns, *hashes):
        array.setflags(write=False)
    return _Trace(path, *columns, hashes, int(report.block_tokens))


def _shipped_trace(source: str, data_dir: Path | None) -> _Trace:
    """The verified, parsed shipped trace of ``source``: read once per process (and file version)."""
    rel = _trace_file_of(source)
    path = Path(data_dir or default_data_dir()) / rel
    if not path.is_file():
        raise WindowStoreError(f"source {source!r}: its shipped trace {path} is missing; "
                               f"{_restore_trace(path)}")
    st = path.stat()
    return _read_trace(str(path), (st.st_mtime_ns, st.st_ino, st.st_size), TRACE_SHA256[rel])


def trace_history(source: str, data_dir: Path | None = None) -> History:
    """The whole shipped trace of ``source`` (every valid row, in order) as a
    :class:`~portbench.workload.History`: e.g. to serve it all one request after another."""
    trace = _shipped_trace(source, data_dir)
    return History(trace.input_tokens, trace.output_tokens, trace.block_hashes, trace.block_tokens)


def _check_rows_match(window: Window, trace: _Trace, start: int) -> None:
    """Refuse a window whose requests are not the trace's valid rows ``[start, start + n)``."""
    n = len(window)
    head = f"window {window.window_id!r} and the shipped trace {trace.path} disagree"
    fix = ("the trace and the window store must be the shipped ones: restore both from git, or cut the "
           "source again from this trace (`portbench windows add ... --replace`)")
    if not 0 <= start <= len(trace.input_tokens) - n:
        raise WindowStoreError(f"{head}: the window's rows [{start}, {start + n}) are not among the "
                               f"trace's {len(trace.input_tokens)} valid rows; {fix}")
    for name in ("input_tokens", "output_tokens"):
        ours, theirs = getattr(window, name), getattr(trace, name)[start:start + n]
        bad = np.flatnonzero(ours != theirs)
        if bad.size:
            i = int(bad[0])
            raise WindowStoreError(f"{head}: request {i} has {name} {ours[i]}, the trace's valid row "
                                   f"{start + i} has {theirs[i]}; {fix}")
    if window.block_hashes is None:
        raise WindowStoreError(f"{head}: the window has no block hashes; {fix}")
    for i, (ours, theirs) in enumerate(zip(window.block_hashes, trace.block_hashes[start:start + n])):
        if not np.array_equal(ours, theirs):
            raise WindowStoreError(f"{head}: request {i}'s block hashes differ from the trace's valid "
                                   f"row {start + i}; {fix}")


def window_history(window: Window, data_dir: Path | None = None) -> History:
    """The shipped trace's valid rows before ``window``'s first request (rows
    ``[0, start_index_in_valid_rows)``, in order) as a :class:`~portbench.workload.History`, after
    checking that the rows from there on are the window's own requests (tokens and block hashes).

    Its arrays are read-only views of the trace, read and verified once per process. A KeyError
    names a source with no shipped trace; a :class:`WindowStoreError` says where the trace, its
    checksum or its rows disagree with the store.
    """
    trace = _shipped_trace(window.source, data_dir)
    where = f"window {window.window_id!r}"
    expected_file = Path(_trace_file_of(window.source)).name
    if window.meta.get("source_file") != expected_file:
        raise WindowStoreError(f"{where}: cut from {window.meta.get('source_file')!r}, but its source's "
                               f"shipped trace is {expected_file!r}")
    if window.meta.get("block_tokens") != trace.block_tokens:
        raise WindowStoreError(f"{where}: blocks of {window.meta.get('block_tokens')} tokens, the trace's "
                               f"are of {trace.block_tokens}")
    start = window.meta.get("start_index_in_valid_rows")
    if start is None or start != int(start):
        raise WindowStoreError(f"{where}: its manifest row has no valid-row start index ({start!r})")
    start = int(start)
    _check_rows_match(window, trace, start)
    return History(trace.input_tokens[:start], trace.output_tokens[:start], trace.block_hashes[:start],
                   trace.block_tokens)


def _with_history(window: Window, data_dir: Path | None) -> Window:
    return dataclasses.replace(window, history=window_history(window, data_dir))


def _verified_rows(entry: pd.Series, data_dir: Path | None) -> pd.DataFrame:
    """A window's request rows, in order, after checking them against the manifest's count and sha256."""
    table = _source_table(data_dir, entry)
    rows = table[table["window_id"] == entry["window_id"]].sort_values("request_index")
    if len(rows) != entry["n_requests"]:
        raise WindowStoreError(f"window {entry['window_id']!r}: manifest says {entry['n_requests']} "
                               f"requests, the store has {len(rows)}")
    cols = [rows[c].to_numpy() for c in REQUEST_COLUMNS[2:6]]
    digest = rows_sha256(*cols, block_hashes=rows[HASH_COLUMN] if HASH_COLUMN in rows else None)
    if digest != entry["sha256"]:
        raise WindowStoreError(f"window {entry['window_id']!r} failed its checksum: its rows were "
                               f"changed since the manifest was written (expected {entry['sha256'][:12]}…, "
                               f"got {digest[:12]}…)")
    return rows


def _window_from_entry(entry: pd.Series, data_dir: Path | None) -> Window:
    rows = _verified_rows(entry, data_dir)
    meta = {k: v for k, v in entry.items()
            if k not in ("source", "window_id", FILE_COLUMN) and not pd.isna(v)}
    hashes = ([np.asarray(b, dtype=np.int64) for b in rows[HASH_COLUMN]]
              if HASH_COLUMN in rows else None)
    return make_window(entry["window_id"], entry["source"],
                       *(rows[c].to_numpy() for c in REQUEST_COLUMNS[2:6]), meta=meta,
                       block_hashes=hashes)


def write_source(source: str, windows: list[dict], data_dir: Path | None = None, *,
                 replace: bool = False) -> pd.DataFrame:
    """Add (or with ``replace`` overwrite) a source's windows in the store, atomically.

    ``windows``: dicts with ``window_id``, the four request columns, optional ``source_record_id``
    (list of str), optional ``block_hashes`` (one non-empty int sequence per request; all windows of
    a source have them or none does; with a ``block_tokens`` field a request has at most
    ceil(input / block_tokens) of them) and any extra manifest fields (``paper_lambda_ref`` defaults
    to NaN). Returns the new manifest rows.
    """
    wdir = windows_dir(data_dir)
    manifest_path = wdir / "manifest.csv"
    manifest = read_manifest(data_dir) if manifest_path.exists() else pd.DataFrame(columns=MANIFEST_COLUMNS)
    if source in set(manifest["source"]) and not replace:
        raise WindowStoreError(f"source {source!r} already has windows in {wdir}; pass replace to overwrite")
    ids = [w["window_id"] for w in windows]
    if len(set(ids)) != len(ids):
        raise WindowStoreError(f"source {source!r}: duplicate window ids")
    others = manifest[manifest["source"] != source]
    clash = sorted(set(ids) & set(others["window_id"]))
    if clash:
        raise WindowStoreError(f"window ids already used by another source: {clash[:5]}")
    hashed = {HASH_COLUMN in w for w in windows}
    if len(hashed) > 1:
        raise WindowStoreError(f"source {source!r}: some windows have {HASH_COLUMN} and some do not")
    frames, entries = [], []
    for w in windows:
        n = len(w["arrival_s"])
        frame = pd.DataFrame({
            "window_id": w["window_id"],
            "request_index": np.arange(n, dtype=np.int64),
            "arrival_s": np.asarray(w["arrival_s"], dtype=np.float64),
            "input_tokens": np.asarray(w["input_tokens"], dtype=np.int64),
            "output_tokens": np.asarray(w["output_tokens"], dtype=np.int64),
            "predicted_output_tokens": np.asarray(w["predicted_output_tokens"], dtype=np.int64),
            "source_record_id": list(w.get("source_record_id") or [""] * n),
        })
        # Validates (sorted arrivals, positive tokens) before anything is written.
        make_window(w["window_id"], source, *(frame[c].to_numpy() for c in REQUEST_COLUMNS[2:6]))
        if HASH_COLUMN in w:
            frame[HASH_COLUMN] = pd.Series(_checked_hashes(w, frame["input_tokens"].to_numpy()),
                                           index=frame.index, dtype=object)
        frames.append(frame)
        extra = {k: v for k, v in w.items() if k not in (*REQUEST_COLUMNS, HASH_COLUMN)}
        entries.append({"source": source, "window_id": w["window_id"], "n_requests": n,
                        "sha256": rows_sha256(*(frame[c].to_numpy() for c in REQUEST_COLUMNS[2:6]),
                                              block_hashes=frame.get(HASH_COLUMN)),
                        "paper_lambda_ref": extra.pop("paper_lambda_ref", np.nan), **extra})
    table = pd.concat(frames, ignore_index=True)
    # The new rows go to a file the current manifest does not name (module docstring), so the live
    # store is never touched before the manifest switch.
    live = _named_files(manifest)
    # len(live) + 1 candidates cannot all be taken.
    name = next(n for n in (f"{source}.parquet", *(f"{source}.{k}.parquet" for k in range(1, len(live) + 1)))
                if n not in live)
    for entry in entries:
        entry[FILE_COLUMN] = name
    new_manifest = pd.concat([others, pd.DataFrame(entries)], ignore_index=True)
    new_manifest = new_manifest.sort_values(["source", "window_id"], kind="stable").reset_index(drop=True)
    try:
        atomic_write(wdir / name, lambda p: table.to_parquet(p, index=False), durable=True)
        atomic_write(manifest_path, lambda p: new_manifest.to_csv(p, index=False), durable=True)  # commit
    except Exception:
        # Drop the new file unless the manifest switch happened (a failure after the rename).
        try:
            committed = name in _named_files(read_manifest(data_dir))
        except WindowStoreError:   # no manifest: nothing names the file
            committed = False
        if not committed:
            (wdir / name).unlink(missing_ok=True)
        raise
    # Committed. Now remove what no manifest row names: the replaced file and any leftovers of a
    # crashed write (unnamed Parquet files, temporary files). A crash here only leaves such files.
    keep = _named_files(new_manifest)
    for stale in [*wdir.glob("*.parquet"), *wdir.glob(".*.tmp")]:
        if stale.name not in keep:
            stale.unlink(missing_ok=True)
    return pd.DataFrame(entries)


def _checked_hashes(window: dict, input_tokens: np.ndarray) -> list[np.ndarray]:
    """A window's block hashes as int64 arrays, refused (naming the window and request) unless each
    request has a non-empty list of integers, no longer than its prompt's blocks."""
    hashes = window[HASH_COLUMN]
    wid = window["window_id"]
    if len(hashes) != len(input_tokens):
        raise WindowStoreError(f"window {wid!r}: {len(hashes)} block-hash lists for "
                               f"{len(input_tokens)} requests")
    block = window.get("block_tokens")
    out = []
    for i, (h, n_in) in enumerate(zip(hashes, input_tokens)):
        arr = np.asarray(h)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind != "i":
            raise WindowStoreError(f"window {wid!r}, request {i}: block hashes must be a non-empty list "
                                   f"of integers, got {h!r}")
        if block and arr.size > -(-int(n_in) // int(block)):
            raise WindowStoreError(f"window {wid!r}, request {i}: {arr.size} block hashes for a "
                                   f"{n_in}-token prompt of blocks of {block}")
        out.append(arr.astype(np.int64))
    return out


def _named_files(manifest: pd.DataFrame) -> set[str]:
    """The Parquet files a manifest names."""
    return {_file_of(row) for _, row in manifest.iterrows()}


def import_lssp(shared_dir: Path, data_dir: Path | None = None) -> pd.DataFrame:
    """Convert the study's frozen windows (``lssp_windows/`` CSVs) into the store.

    Arrivals are taken at full precision, ``float(hp_arrival_s) * absolute_load_factor`` (the study's
    own value; the CSV's ``arrival_s`` is the same rounded to 1 µs).
    """
    shared_dir = Path(shared_dir)
    requests = pd.read_csv(shared_dir / "windows.csv", dtype={"hp_arrival_s": str, "hp_deadline_s": str})
    meta = pd.read_csv(shared_dir / "windows_meta.csv")
    out = []
    for source, source_meta in meta.groupby("source", sort=True):
        windows = []
        for _, m in source_meta.iterrows():
            rows = requests[requests["window_id"] == m["window_id"]].sort_values("request_index")
            arrival = np.array([float(x) for x in rows["hp_arrival_s"]]) * float(m["absolute_load_factor"])
            extra = m.drop(["source", "window_id"]).to_dict()
            windows.append({"window_id": m["window_id"], "arrival_s": arrival,
                            "input_tokens": rows["input_tokens"].to_numpy(),
                            "output_tokens": rows["output_tokens"].to_numpy(),
                            "predicted_output_tokens": rows["predicted_output_tokens"].to_numpy(),
                            "source_record_id": rows["source_record_id"].tolist(), **extra})
        out.append(write_source(source, windows, data_dir, replace=True))
    return pd.concat(out, ignore_index=True)


def add_source(source: str, path, *, fmt: str, n_windows: int, seed: int, window_size: int = 200,
               data_dir=None, replace: bool = False, column_map: Mapping[str, str] | None = None,
               offset: int = 0, time_unit: str = "s") -> pd.DataFrame:
    """Read a raw trace, cut windows and add them to the store as ``source``; returns manifest rows.

    Everything (reading, validation, cutting) completes before ``store.write_source`` is called, and
    that write is atomic, so any error leaves the store untouched. A prefix-hashed format's windows
    keep their block hashes (and ``block_tokens`` in the manifest), covered by their checksum.
    The new source joins default campaigns only where it is named (:mod:`portbench.store`).
    """
    if not traces.SOURCE_NAME.match(source):
        raise ValueError(f"source name {source!r} must be letters, digits, '_', '.' or '-'")
    manifest_path = windows_dir(data_dir) / "manifest.csv"
    if not replace and manifest_path.exists() and source in set(read_manifest(data_dir)["source"]):
        # Fail before reading a possibly huge file.
        raise WindowStoreError(f"source {source!r} already has windows; pass replace to overwrite")
    frame, report = traces.read_trace(path, fmt, column_map=column_map, time_unit=time_unit)
    windows = traces.cut_windows(frame, n_windows=n_windows, window_size=window_size, seed=seed,
                          source=source, offset=offset)
    for w in windows:
        w["source_file"] = Path(path).name
        if report.block_tokens:
            w["block_tokens"] = report.block_tokens
    return write_source(source, windows, data_dir, replace=replace)
