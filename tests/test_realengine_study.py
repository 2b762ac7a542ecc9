"""The prepared GPU script and the RQ6 case runner, end to end on the CPU with a tiny model."""

import json

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from portbench.realengine import gpu  # noqa: E402
from portbench.realengine.study import backend  # noqa: E402


@pytest.fixture
def tiny_store(make_tiny_store):
    """Three sources × 1 window × 10 requests, short prompts and outputs."""
    return make_tiny_store(span_s=1.0, max_input=128, max_output=16)


def test_gpu_script_runs_end_to_end_on_cpu(tiny_store):
    # one repetition, no re-runs, one widening, one reference probe, each probe a single timed replay
    # (no warm-up), a fixed speed ratio: a busy test host would otherwise spend the time on re-runs,
    # on re-measured references and on long replays at the low λ a slow profile would bracket. The budget is a ceiling, not a target (the case stops
    # when its 6 runs are done, ~1–2 min here): a tight one made this test fail on a slow host.
    assert gpu.main(["--device", "cpu", "--tiny", "--budget-s", "900", "--windows-per-source", "1",
                     "--bisection-steps", "1", "--burst", "12", "--tag", "t", "--repetitions", "1",
                     "--max-retries", "0", "--max-widenings", "1", "--speed-ratio", "0.1",
                     "--reference-probes", "1", "--probe-warmup", "0", "--probe-repeats", "1",
                     "--data-dir", str(tiny_store)]) == 0
    out = tiny_store / "results" / "realengine"
    runs = pd.read_parquet(out / "t_case_runs.parquet")
    assert set(runs["policy"]) == {"slai_faithful", "vllm_faithful"}
    assert set(runs["source"]) == {"azure_llm_2024", "burstgpt", "bailian_qwen"}
    assert runs["anwg"].between(0, 1).all() and (runs["lambda_ref_real"] > 0).all()
    # the host guard's figures are stored with every run
    assert (runs["probe_before_s"] > 0).all() and (runs["probe_after_s"] > 0).all()
    assert (runs["probe_ref_s"] > 0).all() and (runs["drift"] >= 0).all()
    assert (runs["attempt"] == 0).all() and (runs["repetition"] == 0).all()
    assert runs["host_flagged"].eq(runs["drift"] > 0.15).all()
    steps = pd.read_parquet(out / "t_case_steps.parquet")
    assert {"window_id", "policy", "repetition", "attempt", "start_s", "duration_s", "prefill_tokens",
            "decode_seqs", "context_tokens", "schedule_s", "running", "waiting"} <= set(steps.columns)
    assert set(steps["window_id"]) == set(runs["window_id"])
    requests = pd.read_parquet(out / "t_case_requests.parquet")
    assert len(requests) == 10 * len(runs)
    done = requests.dropna(subset=["finish_s"])
    assert (done["first_token_s"] <= done["finish_s"]).all()
    meta = json.loads((out / "t_case.json").read_text())
    assert meta["environment"]["engine"] and meta["environment"]["date"]
    profile = pd.read_parquet(out / "t_step_profile.parquet")
    assert {"prefill_tokens", "decode_seqs", "context_tokens", "step_s", "gap_s",
            "schedule_s"} <= set(profile.columns)


def test_unknown_backend_is_named():
    with pytest.raises(KeyError, match="sglang"):
        backend("sglang")
