"""Notebook parameters: read as their defaults' types, checked and refused before anything runs, and
documented. The built book itself is checked in ``tests/test_built_book.py``, which builds it once."""

import tempfile
from pathlib import Path

import pytest

from portbench import book


def test_notebook_parameters_are_checked():
    with pytest.raises(ValueError, match="unknown parameter"):
        book.execute_notebook("rq1_cross_source", {"no_such_parameter": 1},
                              out_dir=Path(tempfile.mkdtemp()))


def test_bad_metric_parameter_names_the_metric(tmp_path):
    with pytest.raises(book.ParameterError, match="unknown metric 'bogus'"):
        book.execute_notebook("rq1_cross_source", {"metric": "bogus", "output_dir": str(tmp_path)},
                              out_dir=tmp_path)
    assert not (tmp_path / "rq1_cross_source.ipynb").exists()


def test_parameters_are_read_as_the_type_of_their_default():
    plan = book.plan_parameters({"margin": "0.2", "sizes": "5,10", "panel": "fifo,edf,slai_faithful", "n_resamples": "100",
                                 "case_sources": "azure_llm_2024,bailian_qwen"})
    assert plan["rq2_reversals"]["margin"] == 0.2 and plan["rq6_real_engine"]["margin"] == 0.2
    assert plan["rq5_sample_complexity"]["sizes"] == [5, 10]
    assert plan["rq1_cross_source"]["panel"] == "fifo,edf,slai_faithful"
    assert all(p["n_resamples"] == 100 for p in plan.values())
    assert "margin" not in plan["rq1_cross_source"]          # only notebooks that declare it
    assert plan["rq6_real_engine"]["case_sources"] == ["azure_llm_2024", "bailian_qwen"]


@pytest.mark.parametrize("params, message", [
    ({"no_such_parameter": "1"}, r"unknown parameter\(s\) \['no_such_parameter'\]"),
    ({"margin": "wide"}, r"rq2_reversals: parameter margin must be a number"),
    ({"n_resamples": "2.5"}, r"parameter n_resamples must be an integer"),
    ({"confidence_level": "1.5"}, r"confidence_level: must lie strictly between 0.0 and 1.0"),
    ({"posthoc_region": "MIDNIGHT"}, r"unknown region 'MIDNIGHT'"),
    ({"panel": "fifo,no_such_policy,edf"}, r"unknown policy id\(s\) \['no_such_policy'\]"),
    ({"engine_model": "quantum"}, r"unknown engine model 'quantum'"),
    ({"case_sources": "azure_llm_2024"}, r"must name two different sources"),
    ({"sizes": "5,ten"}, r"parameter sizes must be a list of integers"),
])
def test_bad_parameters_are_refused_before_anything_runs(params, message):
    with pytest.raises(book.ParameterError, match=message):
        book.plan_parameters(params)


def test_a_parameter_of_another_notebook_is_refused_for_the_selected_ones():
    with pytest.raises(book.ParameterError, match=r"unknown parameter\(s\) \['margin'\] for notebook\(s\) rq1_cross_source"):
        book.plan_parameters({"margin": "0.2"}, ["rq1_cross_source"])
    with pytest.raises(book.ParameterError, match="unknown notebook"):
        book.plan_parameters({}, ["rq9"])


def test_book_command_refuses_bad_parameters_before_running(monkeypatch, capsys):
    from portbench import cli

    def never(*args, **kwargs):
        raise AssertionError("nothing may run after a bad parameter")

    monkeypatch.setattr(book, "build_book", never)
    monkeypatch.setattr("portbench.campaign.results_are_current", never)
    assert cli.main(["book", "-p", "margin=wide", "--notebooks", "rq2_reversals"]) == 2
    assert "parameter margin must be a number" in capsys.readouterr().err
    assert cli.main(["book", "-p", "bogus=1"]) == 2
    assert "unknown parameter(s) ['bogus']" in capsys.readouterr().err
    assert cli.main(["book", "-p", "margin"]) == 2
    assert "-p wants NAME=VALUE" in capsys.readouterr().err


def test_every_parameter_is_documented():
    reproduce = (book.BOOK_DIR / "reproduce.md").read_text()
    for name in book.available_notebooks():
        for key, p in book.notebook_parameters(name).items():
            assert f"`{key}`" in reproduce, f"{name}: parameter {key} is not in book/reproduce.md"
            assert p.meaning, f"{name}: parameter {key} has no comment saying what it means"
