"""The "Add your own scheduler" chapter's policy file and its stored results on three engine models."""

import hashlib
from pathlib import Path

import pandas as pd
import pytest

import portbench
from portbench import results
from portbench.commands import import_policy_modules
from portbench.engine.queue import KeyPolicy
from portbench.policies import make_policy

EXAMPLE = Path(portbench.__file__).parent / "examples" / "shortest_predicted_remaining_first.py"


def test_the_example_file_registers_one_key_policy_once():
    names = import_policy_modules([EXAMPLE])
    assert names in (["shortest_predicted_remaining_first"], [])      # [] when already imported here
    assert isinstance(make_policy("shortest_predicted_remaining_first"), KeyPolicy)
    assert import_policy_modules([EXAMPLE]) == []                      # again: no clash with itself


def test_a_policy_file_that_is_missing_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such.py"):
        import_policy_modules([tmp_path / "no_such.py"])


def test_the_stored_three_engine_results_are_of_the_example_as_it_is():
    """The chapter shows them only when they are of the file as shipped: an edit of the example
    without rerunning benchmarks/custom_policy_engines.py --save fails here."""
    table = pd.read_csv(results.custom_engines_path())
    ours = table[table["policy"] == "shortest_predicted_remaining_first"]
    assert len(ours) and (ours["policy_sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()).all()
    assert set(table["engine_model"]) == {"lssp", "vllm_v1", "vllm_native"}
    cells = table.groupby(["engine_model", "window_id", "region"]).size()
    assert cells.nunique() == 1 and cells.iloc[0] == table["policy"].nunique()   # every policy in every cell
