"""Raw-trace readers and the study's window-cutting rule.

The three raw formats of the study (BurstGPT, Azure LLM inference 2023/2024, Alibaba Bailian/Qwen),
Mooncake's prefix-hashed request traces, and any CSV with a column mapping are read into one
normalised frame:

==================  ===========================================================================
``arrival_s``       float seconds since the first *valid* row (non-decreasing)
``input_tokens``    int64, > 0
``output_tokens``   int64, > 0
``source_record_id``  ``"<file name>:<valid-row index>"`` (0-based among valid rows, as the study)
``block_hashes``    Mooncake only: each request's prompt-block hash ids (an int64 array)
==================  ===========================================================================

Readers validate everything and raise :class:`TraceFormatError` naming the file, the row and the
field. Row numbers count as a user reads the file: in a CSV the header is row 0 and the first data
row is row 1; in JSONL row ``n`` is line ``n``. Lines with no values at all are skipped (they keep
their number, so later rows still match the file). Readers never write anything.

Duplicate rows: each reader's rule is set out in the comment above the readers.

Window cutting (:func:`cut_windows`) follows the study's stride sampler; see
:func:`stride_window_starts` for the exact rule.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .workload import synthesize_predictions

#: Columns of a normalised trace frame, in order.
TRACE_COLUMNS = ["arrival_s", "input_tokens", "output_tokens", "source_record_id"]
#: The study's synthesis seeds are ``900000 + window index`` (see lssp_windows/windows_meta.csv).
PREDICTION_SEED_BASE = 900_000
#: Rows per pandas chunk: bounds memory on the 27M-row Azure file.
_CHUNK_ROWS = 1_000_000
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NAN_WORDS = {"nan", "na", "n/a", "null", "none"}
SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Prompt tokens per hashed block in the Mooncake traces (their ``hash_ids``).
MOONCAKE_BLOCK_TOKENS = 512
#: Chronology strata of a cut, in time order: window i of n is stratum ``3 i // n``, as the study
#: labelled its 30 extension windows (10 each).
STRATA = ("EARLY", "MIDDLE", "LATE")


class TraceFormatError(ValueError):
    """A raw trace file is malformed. ``row`` is 1-based (header = 0) or None; ``field`` a column or None."""

    def __init__(self, path, row: int | None, field: str | None, what: str):
        self.path = str(path)
        self.row = row
        self.field = field
        self.what = what
        where = [self.path]
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        # "{path}: row {row}, field '{field}': {what}", leaving out the parts that are None.
        head = where[0] + (": " + ", ".join(where[1:]) if len(where) > 1 else "")
        super().__init__(f"{head}: {what}")


@dataclasses.dataclass
class ReadReport:
    """What a reader saw: rows seen (non-blank data rows), rows kept, rows dropped by reason."""

    path: str
    fmt: str
    rows_seen: int = 0
    rows_valid: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The first valid row's timestamp in the file's own clock (epoch seconds for Azure), to which
    #: ``arrival_s`` is relative.
    origin_s: float | None = None
    #: Prompt tokens per block of the frame's ``block_hashes`` (prefix-hashed formats only).
    block_tokens: int | None = None

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rows_dropped": self.rows_dropped}


# --------------------------------------------------------------------------------------------
# Cell conversion. Every converter works on a chunk of text cells plus their file row numbers and
# returns values plus the first problem found as (row, field, message), or None.

Problem = tuple[int, str, str]


def _first(mask: np.ndarray, rows: np.ndarray, field: str, what) -> Problem | None:
    """The first row where ``mask`` holds, described by ``what(i)`` (i = position in the chunk)."""
    hits = np.flatnonzero(mask)
    if hits.size == 0:
        return None
    i = int(hits[0])
    return int(rows[i]), field, what(i)


def _earliest(problems: Iterable[Problem | None]) -> Problem | None:
    found = [p for p in problems if p is not None]
    return min(found, key=lambda p: p[0]) if found else None


def _to_numbers(text: pd.Series, rows: np.ndarray, field: str) -> tuple[np.ndarray, Problem | None]:
    """Parse cells as finite numbers (int64 when all are integers, else float64)."""
    text = text.str.strip()
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna().to_numpy()
    if bad.any():
        raw = text.to_numpy(dtype=object)

        def what(i):
            cell = raw[i]
            if cell == "":
                return "empty value"
            if cell.lower() in _NAN_WORDS:
                return f"NaN value {cell!r}"
            return f"not a number: {cell!r}"
        return np.zeros(len(text)), _first(bad, rows, field, what)
    arr = values.to_numpy()
    if arr.dtype.kind in "uO":
        # pandas falls back to uint64 (or Python ints) for integers past int64's range; they cannot
        # stay exact in the int64 columns downstream, so take them as floats (token readers then
        # refuse them as out of range instead of letting the int64 cast wrap them).
        arr = arr.astype(np.float64)
    if arr.dtype.kind == "f":
        infinite = ~np.isfinite(arr)
        if infinite.any():
            return arr, _first(infinite, rows, field, lambda i: f"not a finite number: {arr[i]!r}")
    return arr, None


def _to_tokens(text: pd.Series, rows: np.ndarray, field: str, *,
               allow_zero: bool = False) -> tuple[np.ndarray, Problem | None]:
    """Parse cells as token counts: integers, > 0 (>= 0 with ``allow_zero``)."""
    values, problem = _to_numbers(text, rows, field)
    if problem:
        return values, problem
    if values.dtype.kind == "f":
        fractional = values != np.floor(values)
        # Checked before the int64 cast below, which would silently wrap an out-of-range value
        # (1e20 became -9223372036854775808). 2**63 is exact in float64; int64 holds [-2**63, 2**63).
        huge = (values >= 2.0 ** 63) | (values < -(2.0 ** 63))
        raw = text.str.strip().to_numpy(dtype=object)
        problem = _earliest([
            _first(fractional, rows, field, lambda i: f"token count is not an integer: {values[i]!r}"),
            _first(huge, rows, field, lambda i: f"token count {raw[i]} is out of range (the largest "
                   f"allowed is {np.iinfo(np.int64).max})" if values[i] > 0
                   else f"negative token count {raw[i]}"),
        ])
        if problem:
            return values, problem
    values = values.astype(np.int64)
    problem = _earliest([
        _first(values < 0, rows, field, lambda i: f"negative token count {values[i]}"),
        None if allow_zero else _first(values == 0, rows, field, lambda i: "zero token count"),
    ])
    return values, problem


def _to_epoch_ns(text: pd.Series, rows: np.ndarray, field: str) -> tuple[np.ndarray, Problem | None]:
    """Parse ISO-like date-times (any number of fractional digits, optional zone) to UTC epoch ns.

    Naive times are taken as UTC (the Azure traces are UTC); ``Z``, ``UTC`` and ``±hh:mm`` suffixes
    are honoured. Integer nanoseconds keep the raw files' 100 ns resolution exactly.
    """
    text = text.str.strip()
    # pandas' ISO8601 parser knows "Z" and offsets but not a trailing " UTC"/"GMT" word.
    # (Only rewrite the rows that need it: the regex replace is per-element Python code.)
    word = text.str.contains(r"(?i)(?:UTC|GMT)$", regex=True).to_numpy(dtype=bool)
    norm = text
    if word.any():
        norm = text.copy()
        norm[word] = text[word].str.replace(r"\s*(?:UTC|GMT)$", "+00:00", regex=True, case=False)
    stamps = pd.to_datetime(norm, format="ISO8601", utc=True, errors="coerce")
    bad = stamps.isna().to_numpy()
    if bad.any():
        raw = text.to_numpy(dtype=object)
        problem = _first(bad, rows, field, lambda i: "empty value" if raw[i] == "" else
                         f"not a date-time: {raw[i]!r}")
        return np.zeros(len(text), dtype=np.int64), problem
    return stamps.astype("datetime64[ns, UTC]").array.asi8.copy(), None


# --------------------------------------------------------------------------------------------
# Row sources: CSV (chunked, via pandas) and JSON lines. Both yield (text frame, file row numbers).

_DELIMITERS = {";": "semicolon", "\t": "tab", "|": "pipe"}


def _csv_chunks(path: Path, required: Sequence[str]) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Text cells of a comma-separated file in chunks, with header checks; blank lines dropped."""
    with open(path, "rb") as fh:
        if not fh.read(1 << 16).strip():
            raise TraceFormatError(path, 0, None, "empty file: no header")
    opts = dict(dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig")
    try:
        header = [str(c).strip() for c in pd.read_csv(path, nrows=0, **opts).columns]
    except pd.errors.EmptyDataError:
        raise TraceFormatError(path, 0, None, "empty file: no header") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, 0, None, f"unreadable header: {exc}") from None
    if len(header) == 1 and len(required) > 1:
        seps = [name for sep, name in _DELIMITERS.items() if sep in header[0]]
        hint = (f"; the file looks {seps[0]}-separated, expected comma-separated" if seps
                else "; expected comma-separated columns")
        raise TraceFormatError(path, 0, None, f"header parsed as a single column {header[0]!r}{hint}")
    for col in required:
        if col not in header:
            raise TraceFormatError(path, None, col, f"missing required column (found {header})")
    # skip_blank_lines=False keeps one frame row per file line, so row numbers are exact.
    reader = pd.read_csv(path, skip_blank_lines=False, chunksize=_CHUNK_ROWS, **opts)
    start = 1
    seen_any = False
    try:
        for chunk in reader:
            chunk.columns = header
            rows = np.arange(start, start + len(chunk))
            start += len(chunk)
            blank = (chunk.apply(lambda col: col.str.strip()) == "").all(axis=1).to_numpy()
            if blank.any():
                chunk, rows = chunk[~blank], rows[~blank]
            if len(chunk):
                seen_any = True
                yield chunk.reset_index(drop=True), rows
    except pd.errors.ParserError as exc:
        line = re.search(r"line (\d+)", str(exc))
        row = int(line.group(1)) - 1 if line else None
        raise TraceFormatError(path, row, None, f"malformed CSV line: {exc}") from None
    if not seen_any:
        raise TraceFormatError(path, 1, None, "no data rows after the header")


def _read_text(path: Path) -> str:
    """A text file's contents, decompressed when its name ends in ``.xz`` (as Mooncake ships its traces)."""
    if path.suffix.lower() != ".xz":
        return path.read_text(encoding="utf-8-sig")
    try:
        with lzma.open(path, "rt", encoding="utf-8-sig") as fh:
            return fh.read()
    except lzma.LZMAError as exc:
        raise TraceFormatError(path, None, None, f"not a readable .xz file: {exc}") from None


def _json_rows(path: Path, required: Sequence[str], optional: Sequence[str] = (),
               raw: Sequence[str] = ()) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """JSON lines (or one JSON array) as a single text frame; row n = line n (array: element n).

    Columns in ``raw`` keep their JSON values (lists stay lists; absent is None) instead of text.
    """
    text = _read_text(path)
    if not text.strip():
        raise TraceFormatError(path, 1, None, "empty file: no records")
    if text.lstrip().startswith("["):
        try:
            records = list(enumerate(json.loads(text), start=1))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, None, None, f"invalid JSON: {exc}") from None
    else:
        records = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, n, None, f"invalid JSON: {exc.msg}") from None
    for n, rec in records:
        if not isinstance(rec, dict):
            raise TraceFormatError(path, n, None, f"expected a JSON object, got {type(rec).__name__}")
    for col in required:
        if not any(col in rec for _, rec in records):
            raise TraceFormatError(path, None, col, "missing required field")

    def cell(value):
        # JSON null and an absent key both read as an empty cell; numbers keep their exact repr.
        return "" if value is None else str(value)
    cols = {c: pd.Series([cell(rec.get(c)) for _, rec in records], dtype=str)
            for c in (*required, *optional) if c in required or any(c in r for _, r in records)}
    cols.update({c: pd.Series([rec.get(c) for _, rec in records], dtype=object) for c in raw})
    yield pd.DataFrame(cols), np.array([n for n, _ in records], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# The shared reader core.

@dataclasses.dataclass
class _Spec:
    """How one format maps to the normalised frame."""

    fmt: str
    time_col: str
    input_col: str
    output_col: str
    time_kind: str = "number"            # "number" (seconds × scale) or "datetime"
    time_scale: float = 1.0
    failed_zero_output: bool = False     # BurstGPT: output 0 = failed request, dropped
    duplicate_key: tuple[str, ...] = ()  # columns whose repeat is an error (see module docstring)
    id_col: str | None = None            # a per-request id column whose repeat is an error


def _read(path, spec: _Spec, chunks: Iterator[tuple[pd.DataFrame, np.ndarray]],
          allow_duplicates: bool = False) -> tuple[pd.DataFrame, ReadReport]:
    path = Path(path)
    report = ReadReport(path=str(path), fmt=spec.fmt)
    times, inputs, outputs, keep_masks, row_parts, ids = [], [], [], [], [], []
    prev = None  # last timestamp of the previous chunk, for the order check across chunks
    for chunk, rows in chunks:
        report.rows_seen += len(chunk)
        if spec.time_kind == "datetime":
            t, p_t = _to_epoch_ns(chunk[spec.time_col], rows, spec.time_col)
        else:
            t, p_t = _to_numbers(chunk[spec.time_col], rows, spec.time_col)
        # BurstGPT: a zero response marks a failed request (dropped), whatever its prompt count;
        # only rows that are kept must have a positive prompt.
        x, p_in = _to_tokens(chunk[spec.input_col], rows, spec.input_col,
                             allow_zero=spec.failed_zero_output)
        y, p_out = _to_tokens(chunk[spec.output_col], rows, spec.output_col,
                              allow_zero=spec.failed_zero_output)
        keep = y > 0 if spec.failed_zero_output else np.ones(len(t), dtype=bool)
        p_kept = None
        if spec.failed_zero_output and not (p_in or p_out):
            p_kept = _first(keep & (x == 0), rows, spec.input_col, lambda i: "zero token count")
        problem = _earliest([p_t, p_in, p_out, p_kept])
        if problem:
            raise TraceFormatError(path, *problem)
        earlier = np.diff(t, prepend=t[0] if prev is None else prev) < 0
        problem = _first(earlier, rows, spec.time_col, lambda i: (
            f"timestamp {chunk[spec.time_col].iloc[i].strip()!r} is earlier than the previous row's; "
            "rows must be in arrival order"))
        if problem:
            raise TraceFormatError(path, *problem)
        prev = t[-1]
        times.append(t)
        inputs.append(x)
        outputs.append(y)
        keep_masks.append(keep)
        row_parts.append(rows)
        if spec.id_col and spec.id_col in chunk:
            ids.append(chunk[spec.id_col].str.strip().to_numpy(dtype=object))

    # A float chunk (e.g. "5.0") makes the whole column float; otherwise integer stays exact.
    t = np.concatenate(times) if any(a.dtype.kind == "f" for a in times) else \
        np.concatenate(times).astype(np.int64)
    keep = np.concatenate(keep_masks)
    rows = np.concatenate(row_parts)
    x, y = np.concatenate(inputs), np.concatenate(outputs)
    if not allow_duplicates:
        _check_duplicates(path, spec, t, x, y, rows, np.concatenate(ids) if ids else None)
    n_failed = int((~keep).sum())
    if n_failed:
        report.dropped["failed request (zero response tokens)"] = n_failed
    t, x, y = t[keep], x[keep], y[keep]
    if len(t) == 0:
        raise TraceFormatError(path, None, spec.output_col,
                               f"no valid rows: all {report.rows_seen} rows are failed requests")
    report.rows_valid = len(t)
    # Rebase in the native type first: integer epoch-ns minus integer origin is exact.
    if spec.time_kind == "datetime":
        report.origin_s = int(t[0]) / 1e9
        arrival = (t - t[0]).astype(np.float64) / 1e9
    else:
        report.origin_s = float(t[0]) * spec.time_scale
        arrival = (t - t[0]).astype(np.float64) * spec.time_scale
    record_ids = f"{path.name}:" + pd.Series(np.arange(len(t))).astype(str)
    frame = pd.DataFrame({"arrival_s": arrival, "input_tokens": x.astype(np.int64),
                          "output_tokens": y.astype(np.int64), "source_record_id": record_ids})
    return frame, report


def _check_duplicates(path: Path, spec: _Spec, t, x, y, rows, ids) -> None:
    """Apply the format's duplicate rule (module docstring) to all rows, failed ones included."""
    if spec.id_col and ids is not None:
        present = ids != ""
        series = pd.Series(ids[present])
        dup = series.duplicated().to_numpy()
        if dup.any():
            i = int(np.flatnonzero(dup)[0])
            first = int(np.flatnonzero((series == series.iloc[i]).to_numpy())[0])
            r = rows[present]
            raise TraceFormatError(path, int(r[i]), spec.id_col,
                                   f"duplicate request id {series.iloc[i]!r} (first used at row {r[first]})")
        return
    if not spec.duplicate_key:
        return
    key = pd.DataFrame({"t": t, "x": x, "y": y})
    dup = key.duplicated().to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        same = (key["t"] == t[i]) & (key["x"] == x[i]) & (key["y"] == y[i])
        first = int(rows[int(np.flatnonzero(same.to_numpy())[0])])
        raise TraceFormatError(path, int(rows[i]), spec.time_col,
                               f"exact duplicate of row {first} (same {', '.join(spec.duplicate_key)}); "
                               "pass allow_duplicates=True to keep it")


# --------------------------------------------------------------------------------------------
# Public readers.

# Duplicate rows (decision):
#
# * BurstGPT and generic CSV: no duplicate check. BurstGPT timestamps are whole seconds, so equal
#   timestamps, and even equal (timestamp, tokens) rows, are ordinary traffic.
# * Azure: a row whose TIMESTAMP (compared at full parsed precision, 100 ns in the raw files),
#   ContextTokens and GeneratedTokens all equal an earlier row's is an error. At 100 ns resolution two
#   distinct requests practically never coincide, so such a row is a copy (e.g. a file concatenated
#   twice).
# * Bailian: ``chat_id`` identifies a request, so a reused ``chat_id`` is an error. Equal
#   (timestamp, tokens) with distinct ids is legitimate. A file without a ``chat_id`` column falls back
#   to the Azure rule (timestamp + input + output).
# * Mooncake: no duplicate check. Its timestamps come in ticks about 3 s apart (dozens of requests
#   share one), and the conversation trace holds one line repeated verbatim, hashes included; with no
#   request id, a repeat cannot be told from two users sending the same turn.
# * ``allow_duplicates=True`` on :func:`read_azure` / :func:`read_bailian` keeps such rows instead.

def read_burstgpt(path) -> tuple[pd.DataFrame, ReadReport]:
    """BurstGPT CSV (releases 1–3; columns found by name). Rows with 0 response tokens are failed
    requests: dropped and counted in the report. Equal whole-second timestamps are fine."""
    spec = _Spec("burstgpt", "Timestamp", "Request tokens", "Response tokens", failed_zero_output=True)
    path = Path(path)
    return _read(path, spec, _csv_chunks(path, [spec.time_col, spec.input_col, spec.output_col]))


def read_azure(path, *, allow_duplicates: bool = False) -> tuple[pd.DataFrame, ReadReport]:
    """Azure LLM inference trace (2023/2024) CSV: ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``.

    Timestamps keep all fractional digits (the files have 7) to the nanosecond; naive ones are UTC.
    ``report.origin_s`` is the first valid row's epoch time.
    """
    spec = _Spec("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", time_kind="datetime",
                 duplicate_key=("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    path = Path(path)
    return _read(path, spec, _csv_chunks(path, [spec.time_col, spec.input_col, spec.output_col]),
                 allow_duplicates)


def read_bailian(path, *, allow_duplicates: bool = False) -> tuple[pd.DataFrame, ReadReport]:
    """Alibaba qwen-bailian usage trace: JSON lines (``.jsonl``/``.json``) or ``.csv``.

    Uses ``timestamp`` (seconds from the trace start), ``input_length``, ``output_length``; a
    repeated ``chat_id`` is an error (module docstring).
    """
    spec = _Spec("bailian", "timestamp", "input_length", "output_length", id_col="chat_id",
                 duplicate_key=("timestamp", "input_length", "output_length"))
    path = Path(path)
    required = [spec.time_col, spec.input_col, spec.output_col]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        chunks = _json_rows(path, required, optional=["chat_id"])
    elif suffix == ".csv":
        chunks = _csv_chunks(path, required)
    else:
        raise TraceFormatError(path, None, None,
                               f"unknown Bailian file type {path.suffix!r}: expected .jsonl, .json or .csv")
    return _read(path, spec, chunks, allow_duplicates)


def _hash_ids_problem(ids, n_input: int) -> str | None:
    """What is wrong with one request's Mooncake ``hash_ids`` value (None: nothing)."""
    if ids is None:
        return "missing value: expected a list of block hash ids"
    if not isinstance(ids, list):
        return f"expected a list of block hash ids, got {json.dumps(ids)}"
    if not ids:
        return "empty list: every prompt has at least one block"
    bad = [h for h in ids if type(h) is not int or not -(2 ** 63) <= h < 2 ** 63]   # (bool is no id)
    if bad:
        return f"block hash id {json.dumps(bad[0])} is not a 64-bit integer"
    blocks = -(-n_input // MOONCAKE_BLOCK_TOKENS)
    if len(ids) > blocks:
        return (f"{len(ids)} block hash ids, but a prompt of {n_input} tokens has only {blocks} "
                f"block(s) of {MOONCAKE_BLOCK_TOKENS}")
    return None


def read_mooncake(path) -> tuple[pd.DataFrame, ReadReport]:
    """Mooncake (FAST '25) request trace: JSON lines, plain or ``.xz``, with ``timestamp`` (ms from the
    trace start), ``input_length``, ``output_length`` and ``hash_ids``.

    The frame gains ``block_hashes``: each request's ``hash_ids``, the ids of its prompt's blocks of
    ``report.block_tokens`` (512) tokens, equal ids meaning a shared prefix. A missing, empty or
    non-integer list, or one longer than the prompt's ceil(input_length / 512) blocks, is an error
    naming the line. No duplicate check (module docstring).
    """
    spec = _Spec("mooncake", "timestamp", "input_length", "output_length", time_scale=1e-3)
    path = Path(path)
    field = "hash_ids"
    (chunk, rows), = _json_rows(path, [spec.time_col, spec.input_col, spec.output_col, field], raw=[field])
    frame, report = _read(path, spec, iter([(chunk, rows)]))
    report.block_tokens = MOONCAKE_BLOCK_TOKENS
    if len(frame) != len(chunk):        # the hashes pair with the rows one to one: no row may be dropped
        raise AssertionError(f"{path}: {len(chunk)} records read, {len(frame)} kept")
    hashes = []
    for ids, row, n_in in zip(chunk[field], rows, frame["input_tokens"]):
        problem = _hash_ids_problem(ids, int(n_in))
        if problem:
            raise TraceFormatError(path, int(row), field, problem)
        hashes.append(np.array(ids, dtype=np.int64))
    frame["block_hashes"] = pd.Series(hashes, index=frame.index, dtype=object)
    return frame, report


def read_generic_csv(path, columns: Mapping[str, str], time_unit: str = "s") -> tuple[pd.DataFrame, ReadReport]:
    """Any comma-separated trace. ``columns`` maps ``arrival_s``, ``input_tokens`` and ``output_tokens``
    to the file's column names. ``time_unit``: ``s``, ``ms``, ``us``, ``ns`` (numbers) or ``datetime``
    (ISO date-times, as Azure). Zero tokens are errors; duplicates are not checked."""
    missing = [k for k in ("arrival_s", "input_tokens", "output_tokens") if k not in columns]
    if missing:
        raise ValueError(f"columns mapping lacks {missing}; it needs arrival_s, input_tokens, output_tokens")
    if time_unit != "datetime" and time_unit not in _TIME_UNITS:
        raise ValueError(f"time_unit must be one of {[*_TIME_UNITS, 'datetime']}, got {time_unit!r}")
    spec = _Spec("generic", columns["arrival_s"], columns["input_tokens"], columns["output_tokens"],
                 time_kind="datetime" if time_unit == "datetime" else "number",
                 time_scale=_TIME_UNITS.get(time_unit, 1.0))
    path = Path(path)
    return _read(path, spec, _csv_chunks(path, [spec.time_col, spec.input_col, spec.output_col]))


#: ``fmt`` names accepted by :func:`read_trace` / :func:`portbench.store.add_source` (``csv`` = ``generic``, as the CLI says).
READERS = {"burstgpt": read_burstgpt, "azure": read_azure, "bailian": read_bailian,
           "mooncake": read_mooncake, "generic": read_generic_csv, "csv": read_generic_csv}


# --------------------------------------------------------------------------------------------
# Window cutting.

def stride_window_starts(n_valid: int, *, n_windows: int, window_size: int = 200, seed: int,
                         offset: int = 0, exclude: Iterable[tuple[int, int]] = ()) -> list[int]:
    """Start indices (into the valid rows) of ``n_windows`` non-overlapping windows; the study's rule.

    1. Free space: valid-row indices ``[offset, n_valid)`` minus every ``exclude`` range
       ``[start, end)`` (the study pins its Stage-0 windows this way), split into intervals; intervals
       shorter than ``window_size`` are dropped. Lay the rest end to end: a "free axis" of length F.
       F < ``n_windows × window_size`` is an error (never fewer or shorter windows).
    2. ``stride = F // n_windows``; bucket i is ``[i·stride, (i+1)·stride)``, the last one running to F.
    3. With ``rng = numpy.random.default_rng(seed)``, for each bucket in order: if
       ``bucket_end − window_size > bucket_start`` draw ``rng.integers(bucket_start,
       bucket_end − window_size + 1)``, else take ``bucket_start`` without drawing.
    4. Map that free position back to its interval and clamp so the whole window lies inside that one
       interval (it never straddles an excluded range).

    With no exclusions this equals the study's Stage-0 sampler; with its pinned ranges, its
    Pilot-V2 extension sampler (the starts in ``sampling_reports.json`` are reproduced exactly).
    Overlapping windows (only possible after a clamp) are an error.
    """
    if n_windows < 1 or window_size < 1:
        raise ValueError(f"need n_windows >= 1 and window_size >= 1, got {n_windows}, {window_size}")
    if not 0 <= offset:
        raise ValueError(f"offset must be >= 0, got {offset}")
    intervals, cursor = [], 0
    for lo, hi in sorted((int(a), int(b)) for a, b in exclude):
        if lo > cursor:
            intervals.append((cursor, lo))
        cursor = max(cursor, hi)
    if cursor < n_valid:
        intervals.append((cursor, n_valid))
    intervals = [(max(lo, offset), hi) for lo, hi in intervals if hi > max(lo, offset)]
    usable = [(lo, hi) for lo, hi in intervals if hi - lo >= window_size]
    free_total = sum(hi - lo for lo, hi in usable)
    if free_total < n_windows * window_size:
        raise ValueError(f"not enough valid rows for {n_windows} windows of {window_size}: "
                         f"{free_total} usable free rows (of {n_valid} valid, offset {offset}), "
                         f"need {n_windows * window_size}")
    stride = free_total // n_windows
    rng = np.random.default_rng(seed)
    free_starts = np.cumsum([0] + [hi - lo for lo, hi in usable])  # free-axis start of each interval
    starts = []
    for i in range(n_windows):
        lo = i * stride
        hi = lo + stride if i < n_windows - 1 else free_total
        pos = int(rng.integers(lo, hi - window_size + 1)) if hi - window_size > lo else lo
        k = min(int(np.searchsorted(free_starts, pos, side="right")) - 1, len(usable) - 1)
        a, b = usable[k]
        starts.append(min(max(a + pos - int(free_starts[k]), a), b - window_size))
    ordered = sorted(starts)
    for s1, s2 in zip(ordered, ordered[1:]):
        if s2 < s1 + window_size:
            raise ValueError(f"windows at valid rows {s1} and {s2} overlap; try another seed")
    return starts


def cut_windows(frame: pd.DataFrame, *, n_windows: int, window_size: int = 200, seed: int,
                source: str, offset: int = 0, exclude: Iterable[tuple[int, int]] = (),
                first_index: int = 0, prediction_seed_base: int = PREDICTION_SEED_BASE) -> list[dict]:
    """Cut ``n_windows`` runs of ``window_size`` consecutive valid rows (see :func:`stride_window_starts`).

    Window k (``k = first_index + i`` in bucket order) is ``"{source}_w{k:02d}"``; its arrivals are
    rebased to its first request and its predictions are
    ``synthesize_predictions(output, seed=prediction_seed_base + k)`` (the study's seeds by default).
    Returns dicts as :func:`portbench.store.write_source` takes them, with provenance fields
    ``start_index_in_valid_rows``, ``chronology_stratum`` (:data:`STRATA`), ``sampling_seed`` and
    ``synthesis_seed`` for the manifest, and the frame's ``block_hashes`` when it has them.
    """
    missing = [c for c in TRACE_COLUMNS[:3] if c not in frame]
    if missing:
        raise ValueError(f"trace frame lacks columns {missing}")
    arrival = frame["arrival_s"].to_numpy(dtype=np.float64)
    if np.any(np.diff(arrival) < 0):
        raise ValueError("trace frame arrivals are not sorted")
    inputs = frame["input_tokens"].to_numpy(dtype=np.int64)
    outputs = frame["output_tokens"].to_numpy(dtype=np.int64)
    record_ids = (frame["source_record_id"].astype(str).to_numpy() if "source_record_id" in frame
                  else None)
    hashes = frame["block_hashes"].to_numpy() if "block_hashes" in frame else None
    starts = stride_window_starts(len(frame), n_windows=n_windows, window_size=window_size, seed=seed,
                                  offset=offset, exclude=exclude)
    windows = []
    for i, start in enumerate(starts):
        k = first_index + i
        span = slice(start, start + window_size)
        a = arrival[span]
        out = outputs[span].copy()
        window = {
            "window_id": f"{source}_w{k:02d}",
            "arrival_s": a - a[0],
            "input_tokens": inputs[span].copy(),
            "output_tokens": out,
            "predicted_output_tokens": synthesize_predictions(out, seed=prediction_seed_base + k),
            "source_record_id": list(record_ids[span]) if record_ids is not None else None,
            "start_index_in_valid_rows": int(start),
            "chronology_stratum": STRATA[3 * i // n_windows],
            "sampling_seed": int(seed),
            "synthesis_seed": int(prediction_seed_base + k),
        }
        if hashes is not None:
            window["block_hashes"] = list(hashes[span])
        windows.append(window)
    return windows


# --------------------------------------------------------------------------------------------
# Store integration and summaries.

def read_trace(path, fmt: str, *, column_map: Mapping[str, str] | None = None,
               time_unit: str = "s") -> tuple[pd.DataFrame, ReadReport]:
    """Dispatch to the reader for ``fmt`` (``burstgpt``, ``azure``, ``bailian``, ``mooncake``,
    ``generic``/``csv``)."""
    if fmt not in READERS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {sorted(READERS)}")
    if READERS[fmt] is read_generic_csv:
        if column_map is None:
            raise ValueError(f"fmt={fmt!r} needs column_map (keys arrival_s, input_tokens, "
                             "output_tokens -> the file's column names)")
        return read_generic_csv(path, column_map, time_unit=time_unit)
    if column_map is not None or time_unit != "s":
        raise ValueError(f"column_map and time_unit apply to fmt='generic'/'csv' only, not {fmt!r}")
    return READERS[fmt](path)


def describe_trace(frame: pd.DataFrame) -> dict:
    """Rows, duration, mean arrival rate and token statistics of a normalised trace frame."""
    n = len(frame)
    arrival = frame["arrival_s"].to_numpy(dtype=np.float64)
    duration = float(arrival[-1] - arrival[0]) if n else 0.0

    def stats(col):
        v = frame[col].to_numpy(dtype=np.float64)
        if not n:
            return {}
        return {"min": int(v.min()), "mean": float(v.mean()), "median": float(np.median(v)),
                "p99": float(np.percentile(v, 99)), "max": int(v.max())}
    return {"rows": n, "duration_s": duration,
            "mean_rate_per_s": (n - 1) / duration if duration > 0 else float("nan"),
            "input_tokens": stats("input_tokens"), "output_tokens": stats("output_tokens")}
