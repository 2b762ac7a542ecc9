"""The prepared GPU script and the RQ6 case runner, end to end on the CPU with a tiny model."""

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from portbench import store  # noqa: E402
from portbench.realengine import gpu  # noqa: E402
from portbench.realengine.study import backend  # noqa: E402


@pytest.fixture
def tiny_store(tmp_path):
    """Three sources × 1 window × 10 requests, short prompts and outputs."""
    rng = np.random.default_rng(0)
    for source in ("azure_llm_2024", "burstgpt", "bailian_qwen"):
        n = 10
        store.write_source(source, [{
            "window_id": f"{source}_t0", "arrival_s": np.sort(rng.uniform(0, 1.0, n)),
            "input_tokens": rng.integers(8, 128, n), "output_tokens": rng.integers(2, 16, n),
            "predicted_output_tokens": rng.integers(2, 16, n), "paper_lambda_ref": 60.0}], tmp_path)
    return tmp_path


def test_gpu_script_runs_end_to_end_on_cpu(tiny_store):
    assert gpu.main(["--device", "cpu", "--tiny", "--budget-s", "40", "--windows-per-source", "1",
                     "--bisection-steps", "1", "--burst", "12", "--tag", "t",
                     "--data-dir", str(tiny_store)]) == 0
    out = tiny_store / "results" / "realengine"
    runs = pd.read_parquet(out / "t_case_runs.parquet")
    assert set(runs["policy"]) == {"slai_faithful", "vllm_faithful"}
    assert set(runs["source"]) == {"azure_llm_2024", "burstgpt", "bailian_qwen"}
    assert runs["anwg"].between(0, 1).all() and (runs["lambda_ref_real"] > 0).all()
    requests = pd.read_parquet(out / "t_case_requests.parquet")
    assert len(requests) == 10 * len(runs)
    done = requests.dropna(subset=["finish_s"])
    assert (done["first_token_s"] <= done["finish_s"]).all()
    meta = json.loads((out / "t_case.json").read_text())
    assert meta["environment"]["engine"] and meta["environment"]["date"]
    profile = pd.read_parquet(out / "t_step_profile.parquet")
    assert {"prefill_tokens", "decode_seqs", "context_tokens", "step_s"} <= set(profile.columns)


def test_unknown_backend_is_named():
    with pytest.raises(KeyError, match="sglang"):
        backend("sglang")
