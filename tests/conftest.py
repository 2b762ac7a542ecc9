from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _hypothesis_draws_no_project_constants():
    """Hypothesis (6.1xx) mixes into its random data the literals it reads from the source of every
    project module imported so far. A test's examples then depend on which tests ran before it in the
    same process (and so on how pytest-xdist shares the tests out): on one pass through the whole suite,
    check_policy's 30 windows for vllm_faithful, vllm_chunked_prefill_faithful and sarathi_faithful
    took 330-385 s each, against 2-3 s when their file ran alone. The suite draws from Hypothesis's own
    constants only, so that every test sees the same examples however it is run."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:            # no hypothesis (not the dev extra): the tests that need it skip or fail
        return
    if not callable(getattr(providers, "_get_local_constants", None)):
        raise RuntimeError("tests/conftest.py: this Hypothesis release has no "
                           "hypothesis.internal.conjecture.providers._get_local_constants; see how it "
                           "draws the project's constants before upgrading the pin in pyproject.toml")
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty


_hypothesis_draws_no_project_constants()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The repository's own data folder (never ../shared)."""
    return REPO / "data"

