"""Stored results of the book's heavy computations: each one's tables kept as Parquet files under
``data/results/<folder>/`` and reused while their key matches.

A result's key hashes what it was computed from: its name and parameters, the bytes of every input
file (a real-engine case's runs, requests, steps and cost; a campaign table), the content of any input
table handed over in memory, the frozen windows it reads (their manifest checksums), the source of
the package modules that compute it and the versions of numpy, pandas and scipy. :func:`stored` reads
a result whose files carry the current key and otherwise computes it and writes every table
atomically, the key in each file's metadata, so a result is either current or recomputed, never
half-written. As with the campaign tables, the results of the book's own parameters
(:data:`BOOK_DEFAULTS`) sit in ``data/results/<folder>/`` and are committed; results of any other
parameters (a build with fewer resamples, the tests') go to the untracked ``data/results/cache/<folder>/``.
Users: :mod:`portbench.fidelity.tables` (folder ``fidelity``) and :mod:`portbench.reference`
(folder ``reference``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from . import results, store

#: The book's own values of the parameters that change a result (every notebook's defaults:
#: ``portbench.book.COMMON_PARAMETERS``); results computed with them are the committed ones.
BOOK_DEFAULTS = {"n_resamples": 2000, "seed": 0}
_KEY = b"portbench.stored.key"
_digests: dict = {}


def source_fingerprint(code, *, leave_out=()) -> str:
    """sha256 over the source of the package modules ``code`` (files or folders relative to
    ``portbench/``; names that do not exist are skipped), less the files ``leave_out``."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in code:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
        for f in files:
            rel = f.relative_to(root).as_posix()
            if rel in leave_out:
                continue
            h.update(rel.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def file_sha256(path) -> str:
    """sha256 of a file's bytes (remembered while its size and modification time stay the same)."""
    path = Path(path)
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _digests:
        _digests[memo] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _digests[memo]


def frame_sha256(frame: pd.DataFrame) -> str:
    """sha256 of a table's content: its column names and types and every row's values."""
    h = hashlib.sha256(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()


def window_checksums(window_ids=None, data_dir=None) -> dict:
    """window_id → the manifest's sha256 of its rows (every window when ``window_ids`` is None)."""
    manifest = store.list_windows(data_dir)
    if window_ids is not None:
        manifest = manifest[manifest["window_id"].isin(set(window_ids))]
    return dict(zip(manifest["window_id"], manifest["sha256"]))


def result_stamp(name: str, *, params: dict, inputs=(), frames=(), windows: dict | None = None, code: str = "",
                 data_dir=None) -> dict:
    """What a result is computed from (its key is :func:`stamp_key` of this)."""
    import scipy

    base = results.results_dir(data_dir).parent.resolve()
    files = {}
    for path in inputs:
        path = Path(path)
        try:
            label = path.resolve().relative_to(base).as_posix()
        except ValueError:
            label = path.name
        files[label] = file_sha256(path)
    return {"name": name, "params": {k: params[k] for k in sorted(params)}, "inputs": files,
            "frames": [frame_sha256(f) for f in frames], "windows": {k: windows[k] for k in sorted(windows or {})},
            "code": code, "versions": {"numpy": np.__version__, "pandas": pd.__version__, "scipy": scipy.__version__}}


def stamp_key(stamp: dict) -> str:
    return hashlib.sha256(json.dumps(stamp, sort_keys=True, default=str).encode()).hexdigest()


def _read_meta(path: Path):
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError):
        return None
    raw = meta.get(_KEY)
    return json.loads(raw) if raw else None


def read_current(name: str, key: str, folder: Path) -> dict | None:
    """The stored tables of result ``name`` when every one of its files carries ``key`` (else None)."""
    metas = [(p, _read_meta(p)) for p in results.stored_parts(folder, name)]
    if not metas or any(m is None or m.get("key") != key for _, m in metas):
        return None
    paths = {part: results.stored_part_path(folder, name, part) for part in metas[0][1]["parts"]}
    if set(paths.values()) != {p for p, _ in metas}:
        return None
    return {part: pd.read_parquet(path) for part, path in paths.items()}


def write_result(name: str, tables: dict, stamp: dict, folder: Path) -> None:
    """Write every table of a result, each atomically, the key and stamp in each file's metadata;
    files of the same result with other parts are removed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = json.dumps({"key": stamp_key(stamp), "parts": sorted(tables), "stamp": stamp}, sort_keys=True,
                      default=str).encode()
    Path(folder).mkdir(parents=True, exist_ok=True)
    for part, frame in tables.items():
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"stored result {name}: part {part} is a {type(frame).__name__}, not a DataFrame")
        arrow = pa.Table.from_pandas(frame)
        arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), _KEY: meta})
        store.atomic_write(results.stored_part_path(folder, name, part), lambda p, t=arrow: pq.write_table(t, p, compression="zstd"))
    for stale in results.stored_parts(folder, name):
        if stale.name.removeprefix(f"{name}.").removesuffix(".parquet") not in tables:
            stale.unlink(missing_ok=True)


def stored(folder: str, name: str, compute, *, code: str, params: dict | None = None, inputs=(), frames=(),
           window_ids=None, data_dir=None, refresh: bool = False) -> dict:
    """Result ``name``'s tables (part → DataFrame): read from ``data/results/<folder>/`` (or its cache
    folder, see :data:`BOOK_DEFAULTS`) when stored with the current key, else ``compute()`` (returning
    part → DataFrame) and store them. The key: ``params`` (the values the result depends on beyond its
    inputs), ``inputs`` (the files it reads), ``frames`` (tables it is handed), ``window_ids`` (the
    frozen windows it reads; ``"all"``: every one) and ``code`` (:func:`source_fingerprint` of the
    modules behind it). ``refresh``: compute and store even when current."""
    params = dict(params or {})
    windows = window_checksums(None if window_ids == "all" else window_ids, data_dir) if window_ids else {}
    stamp = result_stamp(name, params=params, inputs=inputs, frames=frames, windows=windows, code=code,
                         data_dir=data_dir)
    committed = all(params.get(k, v) == v for k, v in BOOK_DEFAULTS.items())
    where = results.stored_dir(folder, data_dir, committed=committed)
    tables = None if refresh else read_current(name, stamp_key(stamp), where)
    if tables is None:
        tables = compute()
        write_result(name, tables, stamp, where)
    return tables


def stored_results(folder: str, data_dir=None) -> pd.DataFrame:
    """The committed results of a folder: name, parts, bytes and the input files they were computed from."""
    rows = {}
    for path in results.stored_parts(results.stored_dir(folder, data_dir)):
        meta = _read_meta(path) or {}
        name = path.name.rsplit(".", 2)[0]
        row = rows.setdefault(name, {"name": name, "parts": 0, "bytes": 0,
                                     "inputs": ", ".join(meta.get("stamp", {}).get("inputs", {}))})
        row["parts"] += 1
        row["bytes"] += path.stat().st_size
    return pd.DataFrame(list(rows.values()))


# --- small values as a table and back -------------------------------------------------------------
def values_frame(values: dict) -> pd.DataFrame:
    """A dict of numbers, flags, texts and Nones as a table that keeps each value's type
    (:func:`frame_values`); numpy scalars are stored as the Python value they hold."""
    rows = []
    for key, v in values.items():
        kind, number, text = encode(v)
        rows.append({"key": key, "kind": kind, "number": number, "text": text})
    return pd.DataFrame(rows, columns=["key", "kind", "number", "text"])


def frame_values(frame: pd.DataFrame) -> dict:
    """The dict :func:`values_frame` stored, each value of its own type again."""
    return {k: decode(kind, number, text) for k, kind, number, text in
            zip(frame["key"], frame["kind"], frame["number"], frame["text"])}


def encode(value) -> tuple[str, float, str]:
    """One value as (kind, number, text) columns a Parquet file can hold (:func:`decode`)."""
    value = value.item() if isinstance(value, np.generic) else value
    if value is None:
        return "none", np.nan, ""
    if isinstance(value, bool):
        return "bool", float(value), ""
    if isinstance(value, int):
        if abs(value) > 2 ** 53:
            return "bigint", np.nan, str(value)
        return "int", float(value), ""
    if isinstance(value, float):
        return "float", value, ""
    if isinstance(value, str):
        return "str", np.nan, value
    raise TypeError(f"cannot store a {type(value).__name__} as a value: {value!r}")


def decode(kind: str, number: float, text: str):
    """The value :func:`encode` wrote."""
    return {"none": lambda: None, "bool": lambda: bool(number), "int": lambda: int(number),
            "bigint": lambda: int(text), "float": lambda: float(number), "str": lambda: str(text)}[kind]()


if __name__ == "__main__":
    import sys

    for folder in sys.argv[1:] or ("fidelity", "reference"):
        print(f"data/results/{folder}/")
        print(stored_results(folder).to_string(index=False))
