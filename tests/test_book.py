"""The notebooks execute with tiny parameters and the book builds with warnings as errors, offline."""

import re
import tempfile
from pathlib import Path

import pytest

from portbench import book


@pytest.fixture(scope="module")
def built_book(tmp_path_factory):
    book_dir = tmp_path_factory.mktemp("book") / "book"
    index = book.build_book(book.TINY_PARAMETERS, strict=True, progress=False, book_dir=book_dir)
    return index.parent


def test_every_chapter_is_built_with_its_figures(built_book):
    for name in book.available_notebooks():
        page = (built_book / "executed" / f"{name}.html").read_text()
        assert "<img" in page, f"{name}: no figure"
        assert "Traceback" not in page, f"{name}: an error in the executed notebook"
    for page in ("intro", "methods", "reproduce", "references"):
        assert (built_book / f"{page}.html").exists()


def test_chapters_follow_the_reading_conventions(built_book):
    for name in book.available_notebooks():
        page = (built_book / "executed" / f"{name}.html").read_text()
        assert page.count("Parameters of this build") == 1, f"{name}: not one parameters box"
        assert "tag_parameters" not in page and "tag_injected-parameters" not in page, \
            f"{name}: a parameters code cell is rendered"
        cells = re.findall(r'<div class="cell((?: [^"]*)?)"', page)
        assert cells and all("tag_hide-input" in c for c in cells), f"{name}: a code cell is not folded"
        assert "pb-finding" in page and '<p class="admonition-title">Finding' in page, f"{name}: no Finding box"
        assert page.rfind("pb-finding") > page.rfind('<div class="cell '), \
            f"{name}: the Finding box is not at the end"
        text = re.sub(r"<[^>]+>", "", page)
        assert "{glue" not in text and "glue:text" not in text, f"{name}: a glue role was left unresolved"


def test_introduction_has_the_headline_figure(built_book):
    intro = (built_book / "intro.html").read_text()
    assert re.search(r'<img[^>]+headline_ranks\.png', intro)
    assert (built_book / "_images" / "headline_ranks.png").exists()
    assert "Engine model of this build" in intro


def test_introduction_numbers_are_glued_not_typed(built_book):
    intro = (built_book / "intro.html").read_text()
    text = re.sub(r"<[^>]+>", "", intro)
    assert "{glue" not in text and "glue:text" not in text, "a glue role was left unresolved"
    # The RQ2 sentence is filled with the counts of the five classes.
    assert re.search(r"Of \d+ pairwise tests", text), "RQ2 counts were not pasted"


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
