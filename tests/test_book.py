"""The notebooks execute with tiny parameters and the book builds with warnings as errors, offline."""

import re
import shutil
import subprocess
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
    import papermill
    with pytest.raises(papermill.PapermillExecutionError, match="unknown metric 'bogus'"):
        book.execute_notebook("rq1_cross_source", {"metric": "bogus", "output_dir": str(tmp_path)},
                              out_dir=tmp_path)
    assert not (tmp_path / "rq1_cross_source.ipynb").exists()


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _dom(url: str) -> str:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tempfile.mkdtemp()}", "--virtual-time-budget=8000", "--dump-dom", url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed (.ci/run installs it)")
def test_book_renders_in_headless_chromium_with_offline_maths(built_book):
    index = _dom((built_book / "index.html").resolve().as_uri())
    assert "Findings" in index
    methods = _dom((built_book / "methods.html").resolve().as_uri())
    assert "mjx-container" in methods, "MathJax did not typeset (offline copy not loaded?)"
    chapter = _dom((built_book / "executed" / "rq2_reversals.html").resolve().as_uri())
    assert "SUPPORTED_PRACTICAL_REVERSAL" in chapter and "<img" in chapter
