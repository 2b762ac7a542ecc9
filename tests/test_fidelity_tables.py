"""Stored results (portbench.stored) and the fidelity chapter's stored computations
(portbench.fidelity.tables): a result is reused while its key matches, recomputed when an input, a
parameter or a table it is handed changes, and what is read back equals a fresh computation."""

import ast
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from portbench import book, stored
from portbench.fidelity import tables

GUARDED = "vllm_cpu_guarded"


# --- the store ------------------------------------------------------------------------------------
def _result(tmp_path, calls, *, params=None, frames=(), inputs=None, refresh=False):
    def compute():
        calls.append(1)
        return {"a": pd.DataFrame({"x": [1, 2], "y": ["u", "v"]}), "b": pd.DataFrame({"z": [0.5]})}

    return stored.stored("toy", "one", compute, code="code-v1", params=params, frames=frames,
                         inputs=inputs or [tmp_path / "input.txt"], data_dir=tmp_path, refresh=refresh)


def test_a_current_result_is_read_and_a_changed_input_recomputes_it(tmp_path):
    (tmp_path / "input.txt").write_text("first")
    calls = []
    first = _result(tmp_path, calls)
    again = _result(tmp_path, calls)
    assert len(calls) == 1
    for part in ("a", "b"):
        pd.testing.assert_frame_equal(first[part], again[part])
    assert sorted(p.name for p in (tmp_path / "results" / "toy").iterdir()) == ["one.a.parquet", "one.b.parquet"]
    (tmp_path / "input.txt").write_text("second")
    _result(tmp_path, calls)
    assert len(calls) == 2
    _result(tmp_path, calls, refresh=True)
    assert len(calls) == 3


def test_the_key_holds_the_parameters_and_the_tables_handed_over(tmp_path):
    (tmp_path / "input.txt").write_text("x")
    calls = []
    frame = pd.DataFrame({"v": [1.0, 2.0]})
    _result(tmp_path, calls, params={"k": 1}, frames=[frame])
    _result(tmp_path, calls, params={"k": 1}, frames=[frame.copy()])
    assert len(calls) == 1
    _result(tmp_path, calls, params={"k": 2}, frames=[frame])
    _result(tmp_path, calls, params={"k": 2}, frames=[frame.assign(v=[1.0, 2.5])])
    assert len(calls) == 3


def test_results_of_other_parameters_than_the_books_are_kept_apart(tmp_path):
    (tmp_path / "input.txt").write_text("x")
    calls = []
    _result(tmp_path, calls, params={"n_resamples": 50, "seed": 0})
    assert (tmp_path / "results" / "cache" / "toy" / "one.a.parquet").exists()
    assert not (tmp_path / "results" / "toy").exists()
    _result(tmp_path, calls, params=dict(stored.BOOK_DEFAULTS))
    assert (tmp_path / "results" / "toy" / "one.a.parquet").exists()
    assert len(calls) == 2


def test_a_result_whose_parts_carry_different_keys_is_recomputed(tmp_path):
    """A write stopped between two parts leaves one part of the new key: the result is not current."""
    (tmp_path / "input.txt").write_text("x")
    calls = []
    _result(tmp_path, calls)
    folder = tmp_path / "results" / "toy"
    kept = (folder / "one.b.parquet").read_bytes()
    (tmp_path / "input.txt").write_text("y")
    _result(tmp_path, calls)
    (folder / "one.b.parquet").write_bytes(kept)           # the old key's part back beside the new one
    assert stored.read_current("one", "anything", folder) is None
    _result(tmp_path, calls)
    assert len(calls) == 3
    assert not list(folder.glob("*.tmp"))


def test_values_keep_their_types():
    values = {"i": 3, "f": 0.25, "nan": float("nan"), "b": True, "s": "met", "none": None,
              "np_f": np.float64(1.5), "np_i": np.int64(7), "big": 2 ** 60}
    back = stored.frame_values(stored.values_frame(values))
    assert list(back) == list(values)
    for key in ("i", "np_i", "big"):
        assert type(back[key]) is int
    assert type(back["f"]) is float and type(back["np_f"]) is float and np.isnan(back["nan"])
    assert back["b"] is True and back["s"] == "met" and back["none"] is None
    assert back["np_i"] == 7 and back["big"] == 2 ** 60
    with pytest.raises(TypeError):
        stored.values_frame({"x": [1, 2]})


def test_the_books_parameters_are_the_notebooks_defaults():
    assert stored.BOOK_DEFAULTS == {k: book.COMMON_PARAMETERS[k] for k in stored.BOOK_DEFAULTS}
    declared = book.notebook_parameters("fidelity")
    for name, value in {**tables.BOOK_CASES, **tables.BOOK_ENGINES}.items():
        assert declared[name].default == value, name


def test_the_key_covers_every_module_the_computations_import():
    """Every portbench module a fidelity computation imports is in tables.RESULT_CODE (or only names a
    path or a label), so that a change to it recomputes the stored results."""
    root = Path(tables.__file__).resolve().parent.parent
    covered = {Path(c).stem for c in tables.RESULT_CODE}
    only_paths_or_labels = {"realengine", "campaign", "stored", "book", "present"}
    for path in sorted((root / "fidelity").glob("*.py")) + [root / "repeatability.py"]:
        rel = path.relative_to(root).as_posix()
        inside = "/" in rel                          # a module of portbench.fidelity
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level) or (inside and node.level == 1):
                continue
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            for top in names:
                assert top in covered | only_paths_or_labels, \
                    f"{rel} imports portbench.{top}, which is not in tables.RESULT_CODE"


# --- the fidelity chapter's computations, on a small copy of the guarded case ---------------------
@pytest.fixture(scope="module")
def small_case(tmp_path_factory, data_dir):
    """The guarded case's runs on two windows (both policies, both repetitions), in a data folder of
    its own beside a copy of the windows and the case's profile-fitted cost."""
    root = tmp_path_factory.mktemp("data")
    shutil.copytree(data_dir / "windows", root / "windows")
    src, dst = data_dir / "results" / "realengine", root / "results" / "realengine"
    dst.mkdir(parents=True)
    runs = pd.read_parquet(src / f"{GUARDED}_case_runs.parquet")
    keep = sorted(set(runs["window_id"]))[:1] + sorted(set(runs["window_id"]))[-1:]
    for part in ("runs", "requests", "steps"):
        frame = pd.read_parquet(src / f"{GUARDED}_case_{part}.parquet")
        frame[frame["window_id"].isin(keep)].to_parquet(dst / f"{GUARDED}_case_{part}.parquet")
    shutil.copy(src / f"{GUARDED}_cost.json", dst)
    return root


def test_a_stored_comparison_equals_a_fresh_one_and_follows_its_files(small_case):
    from portbench import fidelity

    first = tables.profile_comparison(GUARDED, GUARDED, data_dir=small_case)
    case = tables.load(GUARDED, small_case)
    _, fresh, summary = fidelity.sim_vs_real(case["runs"], case["requests"], case["windows"],
                                             tables.profile_cost(GUARDED, small_case))
    read = tables.profile_comparison(GUARDED, GUARDED, data_dir=small_case)
    pd.testing.assert_frame_equal(read["runs"][fresh.columns], fresh)
    assert stored.frame_values(read["all"]) == summary
    assert len(fresh) == 8 and read["runs"]["step_ratio"].notna().all()
    pd.testing.assert_frame_equal(first["runs"], read["runs"])
    # one run fewer in the case's runs file: a new key, and the result follows
    path = small_case / "results" / "realengine" / f"{GUARDED}_case_runs.parquet"
    runs = pd.read_parquet(path)
    runs.iloc[1:].to_parquet(path)
    try:
        assert len(tables.profile_comparison(GUARDED, GUARDED, data_dir=small_case)["runs"]) == 7
    finally:
        runs.to_parquet(path)


def test_a_stored_replay_equals_a_fresh_one(small_case):
    from portbench import fidelity

    read = tables.replay_agreement(GUARDED, GUARDED, data_dir=small_case)
    read = tables.replay_agreement(GUARDED, GUARDED, data_dir=small_case)        # the second read is stored
    case = tables.load(GUARDED, small_case)
    st, rq, _ = fidelity.replayed_cost_comparison(case["runs"], case["requests"], case["steps"], case["windows"],
                                                  tables.profile_cost(GUARDED, small_case))
    pd.testing.assert_frame_equal(read["steps"], fidelity.agreement_table(st))
    pd.testing.assert_frame_equal(read["classes"], fidelity.class_counts(st, rq))
    assert stored.frame_values(read["means"]) == {"steps": float(st["agree"].mean()),
                                                  "requests": float(rq["agree"].mean())}
