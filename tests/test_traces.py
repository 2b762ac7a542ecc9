"""Raw-trace readers, the window-cutting rule and ``add_source`` (all fixtures are written here)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from portbench import store
from portbench.store import add_source
from portbench.traces import (TraceFormatError, cut_windows, describe_trace, read_azure,
                              read_bailian, read_burstgpt, read_generic_csv, stride_window_starts)
from portbench.workload import synthesize_predictions


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def csv_text(header, rows, sep=","):
    return "\n".join([sep.join(header), *(sep.join(str(v) for v in r) for r in rows)]) + "\n"


def assert_names(err: TraceFormatError, path: Path, row, field):
    """The error names the file, the row and the field, as attributes and in its message."""
    msg = str(err)
    assert err.path == str(path) and str(path) in msg
    assert err.row == row and err.field == field
    if row is not None:
        assert f"row {row}" in msg
    if field is not None:
        assert f"field '{field}'" in msg


# --- BurstGPT -----------------------------------------------------------------------------------

BURST_V2 = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
BURST_V3 = ["Timestamp", "Session ID", "Elapsed time", "Model", "Request tokens", "Response tokens",
            "Total tokens", "Log Type"]


def burst_rows(rows, v3=False):
    """rows: (timestamp, request, response) triples -> full BurstGPT rows."""
    out = []
    for i, (t, req, resp) in enumerate(rows):
        total = 0  # the reader ignores "Total tokens"
        base = [t, "ChatGPT", req, resp, total, "Conversation log"]
        out.append(base[:1] + [f"s{i}", 1.5] + base[1:] if v3 else base)
    return out


GOOD_BURST = [(5, 100, 20), (5, 30, 0), (5, 40, 7), (6, 50, 9), (9, 60, 0), (12, 70, 11)]


@pytest.mark.parametrize("v3", [False, True], ids=["release2", "release3"])
def test_burstgpt_reads_and_drops_failed_requests(tmp_path, v3):
    path = write(tmp_path / "burst.csv", csv_text(BURST_V3 if v3 else BURST_V2, burst_rows(GOOD_BURST, v3)))
    frame, report = read_burstgpt(path)
    assert list(frame.columns) == ["arrival_s", "input_tokens", "output_tokens", "source_record_id"]
    assert frame["arrival_s"].tolist() == [0.0, 0.0, 1.0, 7.0]
    assert frame["input_tokens"].tolist() == [100, 40, 50, 70]
    assert frame["output_tokens"].tolist() == [20, 7, 9, 11]
    assert frame["input_tokens"].dtype == np.int64 and frame["output_tokens"].dtype == np.int64
    assert frame["source_record_id"].tolist() == ["burst.csv:0", "burst.csv:1", "burst.csv:2", "burst.csv:3"]
    assert (report.rows_seen, report.rows_valid, report.rows_dropped) == (6, 4, 2)
    assert report.dropped == {"failed request (zero response tokens)": 2}
    assert report.origin_s == 5.0


def test_burstgpt_failed_row_may_have_a_zero_prompt_but_a_kept_row_may_not(tmp_path):
    path = write(tmp_path / "b.csv", csv_text(BURST_V2, burst_rows([(1, 10, 2), (2, 0, 0), (3, 4, 5)])))
    frame, report = read_burstgpt(path)
    assert frame["input_tokens"].tolist() == [10, 4] and report.rows_dropped == 1
    path = write(tmp_path / "b.csv", csv_text(BURST_V2, burst_rows([(1, 10, 2), (2, 0, 3)])))
    with pytest.raises(TraceFormatError, match="zero token count") as exc:
        read_burstgpt(path)
    assert_names(exc.value, path, 2, "Request tokens")


def test_burstgpt_identical_rows_are_legitimate(tmp_path):
    path = write(tmp_path / "b.csv", csv_text(BURST_V2, burst_rows([(3, 10, 2), (3, 10, 2), (3, 10, 2)])))
    frame, _ = read_burstgpt(path)
    assert len(frame) == 3 and frame["arrival_s"].tolist() == [0.0, 0.0, 0.0]


def test_burstgpt_all_failed_is_an_error(tmp_path):
    path = write(tmp_path / "b.csv", csv_text(BURST_V2, burst_rows([(3, 10, 0), (4, 10, 0)])))
    with pytest.raises(TraceFormatError, match="no valid rows"):
        read_burstgpt(path)


# --- Azure --------------------------------------------------------------------------------------

AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
AZURE_GOOD = [
    ("2023-11-16 18:17:03.9799600", 374, 44),
    ("2023-11-16 18:17:04", 396, 109),               # no fractional seconds
    ("2023-11-16 18:17:04.0000001", 879, 45),        # 100 ns after the previous row
    ("2023-11-16 18:17:05.5+00:00", 91, 22),         # 2024-style UTC offset
    ("2023-11-16T18:17:06.25Z", 91, 22),
    ("2023-11-16 18:17:07.1234567 UTC", 2048, 1),
]


def test_azure_parses_timestamps_to_sub_microsecond(tmp_path):
    path = write(tmp_path / "az.csv", csv_text(AZURE_HEADER, AZURE_GOOD))
    frame, report = read_azure(path)
    expected = [0.0, 0.02004, 0.0200401, 1.52004, 2.27004, 3.1434967]
    np.testing.assert_allclose(frame["arrival_s"], expected, rtol=0, atol=1e-9)
    assert frame["arrival_s"][2] - frame["arrival_s"][1] == pytest.approx(1e-7, abs=1e-12)
    assert frame["input_tokens"].tolist() == [374, 396, 879, 91, 91, 2048]
    assert frame["output_tokens"].tolist() == [44, 109, 45, 22, 22, 1]
    assert frame["source_record_id"].iloc[-1] == "az.csv:5"
    assert report.origin_s == pytest.approx(1700158623.97996, abs=1e-6)
    assert (report.rows_seen, report.rows_valid, report.rows_dropped) == (6, 6, 0)


def test_azure_timezone_offset_is_converted_to_utc(tmp_path):
    rows = [("2024-05-10 00:00:00.5+00:00", 5, 5), ("2024-05-10 02:00:01.5+02:00", 5, 6)]
    frame, _ = read_azure(write(tmp_path / "az.csv", csv_text(AZURE_HEADER, rows)))
    assert frame["arrival_s"].tolist() == [0.0, 1.0]


def test_azure_exact_duplicate_row_is_an_error_unless_allowed(tmp_path):
    rows = [AZURE_GOOD[0], AZURE_GOOD[1], ("2023-11-16 18:17:04.0000000", 396, 109), AZURE_GOOD[3]]
    path = write(tmp_path / "az.csv", csv_text(AZURE_HEADER, rows))
    with pytest.raises(TraceFormatError, match="duplicate of row 2") as exc:
        read_azure(path)
    assert_names(exc.value, path, 3, "TIMESTAMP")
    frame, _ = read_azure(path, allow_duplicates=True)
    assert len(frame) == 4


def test_azure_same_timestamp_different_tokens_is_fine(tmp_path):
    rows = [AZURE_GOOD[0], (AZURE_GOOD[0][0], 375, 44)]
    frame, _ = read_azure(write(tmp_path / "az.csv", csv_text(AZURE_HEADER, rows)))
    assert frame["arrival_s"].tolist() == [0.0, 0.0]


def test_azure_bad_timestamp(tmp_path):
    rows = [AZURE_GOOD[0], ("2023-11-16 25:99:00", 5, 5)]
    path = write(tmp_path / "az.csv", csv_text(AZURE_HEADER, rows))
    with pytest.raises(TraceFormatError, match="not a date-time") as exc:
        read_azure(path)
    assert_names(exc.value, path, 2, "TIMESTAMP")


# --- Bailian ------------------------------------------------------------------------------------

BAILIAN_FIELDS = ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type",
                  "turn", "hash_ids"]
BAILIAN_GOOD = [
    {"chat_id": 11, "parent_chat_id": -1, "timestamp": 12.5, "input_length": 945, "output_length": 94,
     "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
    {"chat_id": 12, "parent_chat_id": 11, "timestamp": 12.75, "input_length": 29067, "output_length": 3,
     "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4]},
    {"chat_id": 13, "parent_chat_id": -1, "timestamp": 12.75, "input_length": 8, "output_length": 1,
     "type": "image", "turn": 1, "hash_ids": []},
    {"chat_id": 14, "parent_chat_id": -1, "timestamp": 20.000001, "input_length": 16, "output_length": 2,
     "type": "text", "turn": 1, "hash_ids": [9]},
]


def jsonl(records):
    return "".join(json.dumps(r) + "\n" for r in records)


def bailian_csv(records):
    def cell(v):
        return '"' + json.dumps(v) + '"' if isinstance(v, list) else "" if v is None else str(v)
    return csv_text(BAILIAN_FIELDS, [[cell(r.get(k)) for k in BAILIAN_FIELDS] for r in records])


@pytest.mark.parametrize("name,render", [("trace.jsonl", jsonl), ("trace.csv", bailian_csv),
                                         ("trace.json", lambda rs: json.dumps(rs))])
def test_bailian_reads_jsonl_csv_and_json(tmp_path, name, render):
    path = write(tmp_path / name, render(BAILIAN_GOOD))
    frame, report = read_bailian(path)
    np.testing.assert_allclose(frame["arrival_s"], [0.0, 0.25, 0.25, 7.500001], rtol=0, atol=1e-9)
    assert frame["input_tokens"].tolist() == [945, 29067, 8, 16]
    assert frame["output_tokens"].tolist() == [94, 3, 1, 2]
    assert frame["source_record_id"].tolist() == [f"{name}:{i}" for i in range(4)]
    assert (report.rows_seen, report.rows_valid, report.origin_s) == (4, 4, 12.5)


def test_bailian_jsonl_blank_lines_keep_line_numbers(tmp_path):
    bad = dict(BAILIAN_GOOD[3], output_length=-1)
    text = jsonl(BAILIAN_GOOD[:2]) + "\n" + jsonl([BAILIAN_GOOD[2], bad])
    path = write(tmp_path / "t.jsonl", text)
    with pytest.raises(TraceFormatError) as exc:
        read_bailian(path)
    assert_names(exc.value, path, 5, "output_length")


def test_bailian_reused_chat_id_is_an_error(tmp_path):
    records = [BAILIAN_GOOD[0], BAILIAN_GOOD[1], dict(BAILIAN_GOOD[2], chat_id=12), BAILIAN_GOOD[3]]
    path = write(tmp_path / "t.jsonl", jsonl(records))
    with pytest.raises(TraceFormatError, match="first used at row 2") as exc:
        read_bailian(path)
    assert_names(exc.value, path, 3, "chat_id")
    assert len(read_bailian(path, allow_duplicates=True)[0]) == 4


def test_bailian_equal_timestamp_and_tokens_with_distinct_ids_is_fine(tmp_path):
    records = [BAILIAN_GOOD[0], dict(BAILIAN_GOOD[0], chat_id=99)]
    frame, _ = read_bailian(write(tmp_path / "t.jsonl", jsonl(records)))
    assert len(frame) == 2


def test_bailian_without_chat_id_falls_back_to_timestamp_and_tokens(tmp_path):
    rows = [(1.0, 5, 6), (1.5, 5, 6), (1.5, 5, 6)]
    path = write(tmp_path / "t.csv", csv_text(["timestamp", "input_length", "output_length"], rows))
    with pytest.raises(TraceFormatError, match="duplicate of row 2") as exc:
        read_bailian(path)
    assert_names(exc.value, path, 3, "timestamp")


def test_bailian_invalid_json_line(tmp_path):
    path = write(tmp_path / "t.jsonl", jsonl(BAILIAN_GOOD[:2]) + "{not json\n")
    with pytest.raises(TraceFormatError, match="invalid JSON") as exc:
        read_bailian(path)
    assert exc.value.row == 3 and "row 3" in str(exc.value)


def test_bailian_unknown_suffix(tmp_path):
    with pytest.raises(TraceFormatError, match="expected .jsonl"):
        read_bailian(write(tmp_path / "t.txt", jsonl(BAILIAN_GOOD)))


# --- generic CSV --------------------------------------------------------------------------------

def test_generic_csv_with_column_map_and_time_unit(tmp_path):
    rows = [(1000, 3, 4), (1250, 5, 6), (4000, 7, 8)]
    path = write(tmp_path / "g.csv", csv_text(["t_ms", "prompt", "completion", "other"],
                                              [(*r, "x") for r in rows]))
    cols = {"arrival_s": "t_ms", "input_tokens": "prompt", "output_tokens": "completion"}
    frame, report = read_generic_csv(path, cols, time_unit="ms")
    assert frame["arrival_s"].tolist() == [0.0, 0.25, 3.0]
    assert frame["input_tokens"].tolist() == [3, 5, 7] and frame["output_tokens"].tolist() == [4, 6, 8]
    assert report.origin_s == 1.0
    with pytest.raises(ValueError, match="time_unit"):
        read_generic_csv(path, cols, time_unit="fortnights")


def test_generic_csv_datetime_unit(tmp_path):
    path = write(tmp_path / "g.csv", csv_text(["when", "i", "o"], [("2024-01-01 00:00:00", 1, 1),
                                                                   ("2024-01-01 00:01:00.5", 1, 1)]))
    frame, _ = read_generic_csv(path, {"arrival_s": "when", "input_tokens": "i", "output_tokens": "o"},
                                time_unit="datetime")
    assert frame["arrival_s"].tolist() == [0.0, 60.5]


# --- malformed inputs, for every reader ---------------------------------------------------------
# Each format is described by: file suffix, column names (time, input, output), a renderer of
# (time, input, output) triples into file text, and its reader.

def _azure_time(t):
    return f"2024-05-10 00:00:{t:09.6f}"


FORMATS = {
    "burstgpt": dict(suffix=".csv", cols=("Timestamp", "Request tokens", "Response tokens"),
                     render=lambda rows, sep=",": csv_text(BURST_V2, burst_rows(rows), sep),
                     time=lambda t: t, read=read_burstgpt),
    "azure": dict(suffix=".csv", cols=tuple(AZURE_HEADER),
                  render=lambda rows, sep=",": csv_text(AZURE_HEADER, rows, sep),
                  time=lambda t: _azure_time(t) if isinstance(t, (int, float)) else t, read=read_azure),
    "bailian_jsonl": dict(suffix=".jsonl", cols=("timestamp", "input_length", "output_length"),
                          render=lambda rows, sep=",": jsonl(
                              {"chat_id": i, "timestamp": t, "input_length": x, "output_length": y}
                              for i, (t, x, y) in enumerate(rows)),
                          time=lambda t: t, read=read_bailian),
    "bailian_csv": dict(suffix=".csv", cols=("timestamp", "input_length", "output_length"),
                        render=lambda rows, sep=",": csv_text(
                            ["chat_id", "timestamp", "input_length", "output_length"],
                            [(i, *r) for i, r in enumerate(rows)], sep),
                        time=lambda t: t, read=read_bailian),
    "generic": dict(suffix=".csv", cols=("t", "in", "out"),
                    render=lambda rows, sep=",": csv_text(["t", "in", "out"], rows, sep),
                    time=lambda t: t,
                    read=lambda p: read_generic_csv(p, {"arrival_s": "t", "input_tokens": "in",
                                                        "output_tokens": "out"})),
}
CSV_FORMATS = [f for f in FORMATS if FORMATS[f]["suffix"] == ".csv"]


def _base_rows(fmt):
    """Four valid rows, times 1, 2, 3, 4 in the format's clock."""
    tm = FORMATS[fmt]["time"]
    return [(tm(1), 10, 5), (tm(2), 11, 6), (tm(3), 12, 7), (tm(4), 13, 8)]


def _fixture(tmp_path, fmt, rows, sep=","):
    spec = FORMATS[fmt]
    return write(tmp_path / f"trace_{fmt}{spec['suffix']}", spec["render"](rows, sep))


def _with(rows, i, col, value):
    rows = [list(r) for r in rows]
    rows[i][col] = value
    return [tuple(r) for r in rows]


# (case, row index to change (0-based), column 0/1/2 = time/input/output, new value, expected message)
CELL_CASES = [
    ("negative_input", 1, 1, -5, "negative token count -5"),
    ("negative_output", 2, 2, -1, "negative token count -1"),
    ("zero_input", 2, 1, 0, "zero token count"),
    ("nan_input", 1, 1, "nan", "NaN value"),
    ("empty_output", 3, 2, "", "empty value"),
    ("non_numeric_output", 1, 2, "abc", "not a number: 'abc'"),
    ("fractional_input", 0, 1, 1.5, "not an integer"),
    # Past int64: once wrapped round to "negative token count -9223372036854775808".
    ("huge_input", 1, 1, 99999999999999999999, "token count 99999999999999999999 is out of range"),
    ("uint64_output", 2, 2, 10000000000000000000, "token count 10000000000000000000 is out of range"),
    ("just_past_int64_input", 3, 1, 2**63, f"token count {2**63} is out of range"),
    ("float_huge_output", 0, 2, 1e30, "token count 1e\\+30 is out of range"),
    ("huge_negative_input", 2, 1, -99999999999999999999, "negative token count -99999999999999999999"),
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_valid_fixture_of_each_format_reads(tmp_path, fmt):
    frame, report = FORMATS[fmt]["read"](_fixture(tmp_path, fmt, _base_rows(fmt)))
    np.testing.assert_allclose(frame["arrival_s"], [0.0, 1.0, 2.0, 3.0], atol=1e-9)
    assert frame["input_tokens"].tolist() == [10, 11, 12, 13]
    assert report.rows_valid == 4


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case,i,col,value,what", CELL_CASES, ids=[c[0] for c in CELL_CASES])
def test_bad_cell_names_file_row_and_field(tmp_path, fmt, case, i, col, value, what):
    path = _fixture(tmp_path, fmt, _with(_base_rows(fmt), i, col, value))
    with pytest.raises(TraceFormatError, match=what) as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, i + 1, FORMATS[fmt]["cols"][col])


def test_largest_int64_token_count_is_kept(tmp_path):
    path = _fixture(tmp_path, "generic", _with(_base_rows("generic"), 1, 1, 2**63 - 1))
    frame, _ = FORMATS["generic"]["read"](path)
    assert frame["input_tokens"].tolist()[1] == 2**63 - 1


# The CLI's --format names and the FORMATS fixture each one reads.
CLI_FORMATS = {"burstgpt": "burstgpt", "azure": "azure", "bailian": "bailian_jsonl",
               "bailian_csv": "bailian_csv", "csv": "generic"}


@pytest.mark.parametrize("cli_fmt", CLI_FORMATS)
def test_out_of_range_tokens_via_add_source_write_nothing(tmp_path, cli_fmt):
    fmt = CLI_FORMATS[cli_fmt]
    path = _fixture(tmp_path, fmt, _with(_base_rows(fmt), 2, 2, 99999999999999999999))
    data = tmp_path / "data"
    store.write_source("existing", [{"window_id": "existing_w00", "arrival_s": [0.0, 1.0],
                                     "input_tokens": [3, 4], "output_tokens": [5, 6],
                                     "predicted_output_tokens": [5, 6]}], data)
    before = snapshot(data)
    cmap = dict(zip(("arrival_s", "input_tokens", "output_tokens"), FORMATS["generic"]["cols"]))
    with pytest.raises(TraceFormatError, match="out of range") as exc:
        add_source("new", path, fmt=cli_fmt.removesuffix("_csv"), n_windows=1, window_size=2, seed=0,
                   data_dir=data, column_map=cmap if cli_fmt == "csv" else None)
    assert_names(exc.value, path, 3, FORMATS[fmt]["cols"][2])
    assert snapshot(data) == before


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "burstgpt"])
def test_zero_output_is_an_error_outside_burstgpt(tmp_path, fmt):
    path = _fixture(tmp_path, fmt, _with(_base_rows(fmt), 2, 2, 0))
    with pytest.raises(TraceFormatError, match="zero token count") as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, 3, FORMATS[fmt]["cols"][2])


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_or_empty_timestamp(tmp_path, fmt):
    path = _fixture(tmp_path, fmt, _with(_base_rows(fmt), 2, 0, ""))
    with pytest.raises(TraceFormatError, match="empty value") as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, 3, FORMATS[fmt]["cols"][0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_unsorted_timestamps(tmp_path, fmt):
    rows = _base_rows(fmt)
    rows = [rows[0], rows[2], rows[1], rows[3]]  # row 3 is earlier than row 2
    path = _fixture(tmp_path, fmt, rows)
    with pytest.raises(TraceFormatError, match="earlier than the previous row") as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, 3, FORMATS[fmt]["cols"][0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_column(tmp_path, fmt):
    spec = FORMATS[fmt]
    path = _fixture(tmp_path, fmt, _base_rows(fmt))
    if spec["suffix"] == ".csv":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        frame.drop(columns=[spec["cols"][2]]).to_csv(path, index=False)
    else:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        write(path, jsonl({k: v for k, v in r.items() if k != spec["cols"][2]} for r in records))
    with pytest.raises(TraceFormatError, match="missing required") as exc:
        spec["read"](path)
    assert_names(exc.value, path, None, spec["cols"][2])


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_file(tmp_path, fmt):
    path = write(tmp_path / f"empty{FORMATS[fmt]['suffix']}", "")
    with pytest.raises(TraceFormatError, match="empty file") as exc:
        FORMATS[fmt]["read"](path)
    expected_row = 0 if FORMATS[fmt]["suffix"] == ".csv" else 1
    assert_names(exc.value, path, expected_row, None)


@pytest.mark.parametrize("fmt", CSV_FORMATS)
def test_header_only_file(tmp_path, fmt):
    path = _fixture(tmp_path, fmt, [])
    with pytest.raises(TraceFormatError, match="no data rows") as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, 1, None)


@pytest.mark.parametrize("fmt", CSV_FORMATS)
def test_wrong_delimiter(tmp_path, fmt):
    path = _fixture(tmp_path, fmt, _base_rows(fmt), sep=";")
    with pytest.raises(TraceFormatError, match="single column.*semicolon-separated") as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, 0, None)


@pytest.mark.parametrize("fmt", CSV_FORMATS)
def test_blank_lines_are_skipped_but_keep_row_numbers(tmp_path, fmt):
    rows = _with(_base_rows(fmt), 3, 2, "abc")
    path = _fixture(tmp_path, fmt, rows)
    lines = path.read_text().splitlines()
    write(path, "\n".join(lines[:3] + [""] + lines[3:]) + "\n\n")  # blank line becomes file row 3
    with pytest.raises(TraceFormatError, match="not a number") as exc:
        FORMATS[fmt]["read"](path)
    assert_names(exc.value, path, 5, FORMATS[fmt]["cols"][2])
    rows[3] = _base_rows(fmt)[3]
    path = _fixture(tmp_path, fmt, rows)
    write(path, path.read_text() + "\n\n")
    assert FORMATS[fmt]["read"](path)[1].rows_seen == 4


def test_csv_line_with_extra_fields(tmp_path):
    path = write(tmp_path / "g.csv", "t,in,out\n1,2,3\n2,3,4,5\n")
    with pytest.raises(TraceFormatError, match="malformed CSV") as exc:
        read_generic_csv(path, {"arrival_s": "t", "input_tokens": "in", "output_tokens": "out"})
    assert exc.value.row == 2 and "row 2" in str(exc.value)


# --- window cutting -----------------------------------------------------------------------------

def synthetic_frame(n=5000, seed=0, name="syn.csv"):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "arrival_s": 100.0 + np.cumsum(rng.exponential(0.1, n)),
        "input_tokens": rng.integers(1, 4000, n),
        "output_tokens": rng.integers(1, 500, n),
        "source_record_id": [f"{name}:{i}" for i in range(n)],
    })


def test_cut_windows_are_consecutive_rebased_and_disjoint():
    frame = synthetic_frame()
    windows = cut_windows(frame, n_windows=6, seed=7, source="syn")
    assert [w["window_id"] for w in windows] == [f"syn_w{k:02d}" for k in range(6)]
    taken = set()
    for k, w in enumerate(windows):
        start = w["start_index_in_valid_rows"]
        rows = frame.iloc[start:start + 200]
        assert len(w["arrival_s"]) == 200
        assert w["source_record_id"] == [f"syn.csv:{i}" for i in range(start, start + 200)]
        assert w["arrival_s"][0] == 0.0
        np.testing.assert_allclose(w["arrival_s"], rows["arrival_s"] - rows["arrival_s"].iloc[0])
        assert w["input_tokens"].tolist() == rows["input_tokens"].tolist()
        assert w["output_tokens"].tolist() == rows["output_tokens"].tolist()
        assert w["synthesis_seed"] == 900_000 + k and w["sampling_seed"] == 7
        np.testing.assert_array_equal(w["predicted_output_tokens"],
                                      synthesize_predictions(w["output_tokens"], seed=900_000 + k))
        span = set(range(start, start + 200))
        assert not span & taken
        taken |= span
    starts = [w["start_index_in_valid_rows"] for w in windows]
    assert starts == sorted(starts)


def test_cut_windows_is_deterministic_per_seed():
    frame = synthetic_frame()
    a = cut_windows(frame, n_windows=5, seed=1, source="s")
    b = cut_windows(frame, n_windows=5, seed=1, source="s")
    c = cut_windows(frame, n_windows=5, seed=2, source="s")
    starts = [[w["start_index_in_valid_rows"] for w in ws] for ws in (a, b, c)]
    assert starts[0] == starts[1] and starts[0] != starts[2]
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(wa["predicted_output_tokens"], wb["predicted_output_tokens"])


def test_cut_windows_first_index_and_prediction_seed_base():
    frame = synthetic_frame(1000)
    (w,) = cut_windows(frame, n_windows=1, seed=3, source="s", first_index=10, prediction_seed_base=5)
    assert w["window_id"] == "s_w10" and w["synthesis_seed"] == 15


def test_cut_windows_needs_enough_rows():
    with pytest.raises(ValueError, match="not enough valid rows"):
        cut_windows(synthetic_frame(999), n_windows=5, seed=1, source="s")
    with pytest.raises(ValueError, match="not enough valid rows"):
        cut_windows(synthetic_frame(1200), n_windows=5, seed=1, source="s", offset=201)


def test_stride_sampler_reproduces_the_studys_bailian_windows():
    # The study's sampling report for Bailian traceB: 172,800 valid rows, offset 50,000; the 10 Stage-0
    # windows (seed 20260903) are then pinned and 30 more drawn around them (seed 21260903).
    pinned = [52305, 65369, 75060, 90867, 110710, 113825, 125868, 145520, 154493, 168717]
    extension = [52699, 57949, 58493, 63074, 69494, 71079, 77540, 80780, 85902, 88416, 91453, 96709,
                 101812, 104076, 108124, 112775, 118581, 123137, 126312, 129534, 135447, 136915,
                 141051, 144958, 149861, 153251, 157810, 162870, 167392, 171033]
    assert stride_window_starts(172_800, n_windows=10, seed=20260903, offset=50_000) == pinned
    assert stride_window_starts(172_800, n_windows=30, seed=21260903, offset=50_000,
                                exclude=[(s, s + 200) for s in pinned]) == extension


def test_stride_sampler_never_enters_excluded_ranges():
    exclude = [(1000, 1200), (2500, 2900)]
    for seed in range(20):
        starts = stride_window_starts(5000, n_windows=8, window_size=100, seed=seed, exclude=exclude)
        for s in starts:
            assert all(s + 100 <= lo or s >= hi for lo, hi in exclude)


# --- add_source ---------------------------------------------------------------------------------

def burst_fixture(tmp_path, n=900, name="burst.csv"):
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.integers(0, 3, n))
    resp = rng.integers(1, 60, n)
    resp[::50] = 0  # failed requests
    rows = list(zip(t.tolist(), rng.integers(1, 900, n).tolist(), resp.tolist()))
    return write(tmp_path / name, csv_text(BURST_V2, burst_rows(rows))), int((resp > 0).sum())


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_add_source_writes_a_loadable_store(tmp_path):
    path, n_valid = burst_fixture(tmp_path)
    data = tmp_path / "data"
    manifest = add_source("mytrace", path, fmt="burstgpt", n_windows=3, seed=11, data_dir=data)
    assert manifest["window_id"].tolist() == ["mytrace_w00", "mytrace_w01", "mytrace_w02"]
    windows = store.load_windows(data_dir=data, source="mytrace")   # (unnamed: the study's sources)
    assert [w.window_id for w in windows] == manifest["window_id"].tolist()
    frame, report = read_burstgpt(path)
    assert report.rows_valid == n_valid
    expected = cut_windows(frame, n_windows=3, seed=11, source="mytrace")
    for w, e in zip(windows, expected):
        assert len(w) == 200 and w.source == "mytrace"
        np.testing.assert_array_equal(w.arrival_s, e["arrival_s"])
        np.testing.assert_array_equal(w.output_tokens, e["output_tokens"])
        np.testing.assert_array_equal(w.predicted_output_tokens, e["predicted_output_tokens"])
        assert w.meta["start_index_in_valid_rows"] == e["start_index_in_valid_rows"]
        assert w.meta["source_file"] == "burst.csv"
    table = pd.read_parquet(data / "windows" / "mytrace.parquet")
    assert table["source_record_id"].iloc[0] == f"burst.csv:{expected[0]['start_index_in_valid_rows']}"


def test_failed_add_leaves_the_store_exactly_as_it_was(tmp_path):
    path, _ = burst_fixture(tmp_path)
    data = tmp_path / "data"
    add_source("first", path, fmt="burstgpt", n_windows=2, seed=1, data_dir=data)
    before = snapshot(data)
    assert before  # parquet + manifest

    # A late row stamped 1 s: earlier than the rows before it.
    bad = write(tmp_path / "bad.csv", path.read_text() + "1,ChatGPT,5,5,10,API log\n")
    with pytest.raises(TraceFormatError, match="earlier than the previous row"):
        add_source("second", bad, fmt="burstgpt", n_windows=2, seed=1, data_dir=data)
    with pytest.raises(ValueError, match="not enough valid rows"):
        add_source("second", path, fmt="burstgpt", n_windows=50, seed=1, data_dir=data)
    with pytest.raises(store.WindowStoreError, match="already has windows"):
        add_source("first", path, fmt="burstgpt", n_windows=2, seed=2, data_dir=data)
    with pytest.raises(ValueError, match="column_map"):
        add_source("second", path, fmt="generic", n_windows=2, seed=1, data_dir=data)
    assert snapshot(data) == before

    # A replace that fails validation also leaves the old windows in place.
    with pytest.raises(TraceFormatError):
        add_source("first", bad, fmt="burstgpt", n_windows=2, seed=1, data_dir=data, replace=True)
    assert snapshot(data) == before


def test_failed_add_into_an_empty_dir_writes_nothing(tmp_path):
    bad = write(tmp_path / "bad.csv", "Timestamp;Request tokens;Response tokens\n1;2;3\n")
    data = tmp_path / "data"
    with pytest.raises(TraceFormatError, match="single column"):
        add_source("s", bad, fmt="burstgpt", n_windows=1, seed=1, window_size=1, data_dir=data)
    assert not data.exists() or snapshot(data) == {}


def test_add_source_replace_and_generic(tmp_path):
    n = 700
    rows = [(i * 0.5, 10 + i % 7, 1 + i % 5) for i in range(n)]
    path = write(tmp_path / "g.csv", csv_text(["t", "p", "c"], rows))
    cmap = {"arrival_s": "t", "input_tokens": "p", "output_tokens": "c"}
    data = tmp_path / "data"
    add_source("gen", path, fmt="generic", column_map=cmap, n_windows=2, seed=1, data_dir=data)
    add_source("gen", path, fmt="csv", column_map=cmap, n_windows=3, seed=2, data_dir=data,
               replace=True)  # "csv" is the CLI's name for the generic reader
    windows = store.load_windows(data_dir=data, source="gen")
    assert len(windows) == 3
    assert all(w.arrival_s[1] == 0.5 for w in windows)


# --- describe_trace -----------------------------------------------------------------------------

def test_describe_trace(tmp_path):
    frame, _ = read_burstgpt(write(tmp_path / "b.csv", csv_text(BURST_V2, burst_rows(GOOD_BURST))))
    d = describe_trace(frame)
    assert d["rows"] == 4 and d["duration_s"] == 7.0
    assert d["mean_rate_per_s"] == pytest.approx(3 / 7)
    assert d["input_tokens"]["min"] == 40 and d["input_tokens"]["max"] == 100
    assert d["output_tokens"]["mean"] == pytest.approx(11.75)


def test_row_numbers_and_order_check_hold_across_chunks(tmp_path, monkeypatch):
    from portbench import traces
    monkeypatch.setattr(traces, "_CHUNK_ROWS", 3)
    rows = [(t, 5, 5) for t in (1, 2, 3, 4, 5, 6, 7)]
    path = write(tmp_path / "g.csv", csv_text(["t", "in", "out"], rows))
    cols = {"arrival_s": "t", "input_tokens": "in", "output_tokens": "out"}
    frame, report = read_generic_csv(path, cols)
    assert frame["arrival_s"].tolist() == [0, 1, 2, 3, 4, 5, 6] and report.rows_seen == 7
    assert frame["source_record_id"].iloc[6] == "g.csv:6"
    path = write(tmp_path / "g.csv", csv_text(["t", "in", "out"], _with(rows, 3, 0, 2.5)))  # row 4
    with pytest.raises(TraceFormatError, match="earlier") as exc:
        read_generic_csv(path, cols)
    assert_names(exc.value, path, 4, "t")
    path = write(tmp_path / "g.csv", csv_text(["t", "in", "out"], _with(rows, 5, 2, "x")))  # row 6
    with pytest.raises(TraceFormatError, match="not a number") as exc:
        read_generic_csv(path, cols)
    assert_names(exc.value, path, 6, "out")
