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



@pytest.fixture
def make_tiny_store(tmp_path):
    """A function that writes three sources × 1 window × 10 requests into ``tmp_path`` (arrivals over
    ``span_s`` seconds, prompts of 8 to ``max_input`` tokens, outputs of 2 to ``max_output``) and
    returns that folder: a store whose replays on the tiny model take a fraction of a second."""
    import numpy as np

    from portbench import store

    def make(span_s: float, max_input: int, max_output: int) -> Path:
        rng = np.random.default_rng(0)
        for source in ("azure_llm_2024", "burstgpt", "bailian_qwen"):
            n = 10
            store.write_source(source, [{
                "window_id": f"{source}_t0", "arrival_s": np.sort(rng.uniform(0, span_s, n)),
                "input_tokens": rng.integers(8, max_input, n), "output_tokens": rng.integers(2, max_output, n),
                "predicted_output_tokens": rng.integers(2, max_output, n), "paper_lambda_ref": 60.0}], tmp_path)
        return tmp_path

    return make
