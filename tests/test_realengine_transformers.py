"""Real-engine replay on transformers' continuous batching (CPU, a tiny random Llama)."""

import math

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from portbench.metrics import METRICS, cell_metrics  # noqa: E402
from portbench.realengine import ModelShape  # noqa: E402
from portbench.realengine import transformers_backend as tb  # noqa: E402
from portbench.workload import make_window, scale  # noqa: E402

SHAPE = ModelShape(n_layers=2, hidden_size=128, n_heads=4, n_kv_heads=4, intermediate_size=256,
                   vocab_size=1024, max_position_embeddings=4096)


@pytest.fixture(scope="module")
def window():
    rng = np.random.default_rng(7)
    n = 24
    arrival = np.sort(rng.uniform(0.0, 15.0, n))
    w = make_window("rt-test", "synthetic", arrival, rng.integers(8, 257, n), rng.integers(2, 33, n),
                    prediction_seed=3)
    return scale(w, 10.0)                # ~1.5 s of arrivals


@pytest.fixture(scope="module")
def results(window):
    return {p: tb.replay(window, p, shape=SHAPE, max_batch_tokens=256, block_size=16, num_blocks=512)
            for p in tb.POLICIES}


@pytest.mark.parametrize("policy", list(tb.POLICIES))
def test_replay_exact_lengths_monotone_times_and_metrics(window, results, policy):
    result, info = results[policy]
    assert result.policy == policy and result.engine_model == tb.ENGINE
    np.testing.assert_array_equal(result.output_tokens, window.output_tokens)
    assert result.completed.all()
    assert np.all(result.arrival_s <= result.admit_s + 1e-9)
    assert np.all(result.admit_s <= result.first_token_s)
    assert np.all(result.first_token_s <= result.finish_s)
    # the span (metrics.py): the start of the last step, i.e. before the last token's time stamp
    assert float(result.finish_s.max()) - 1.0 < result.duration_s < float(result.finish_s.max())
    m = cell_metrics(result)
    assert set(m) == set(METRICS)
    assert m["completion_fraction"] == 1.0 and m["mean_ttft_s"] > 0 and m["token_throughput"] > 0
    assert info["scheduler_type"] == f"portbench_{policy}"
    assert info["engine_version"] == tb.engine_version() and info["environment"]["device"] == "cpu"
    assert info["generated_tokens"] == int(window.output_tokens.sum()) and info["generated_tokens_per_s"] > 0
    assert info["submit_lag_max_s"] < 0.05
    steps = info["steps"]
    assert len(steps) == result.n_steps == info["n_steps"]
    assert steps["prefill_tokens"].sum() >= window.input_tokens.sum()   # evictions recompute
    assert (steps["prefill_tokens"] <= 256).all()
    # the scheduler's own time and the queues it saw, per step
    assert (steps["schedule_s"] > 0).all() and (steps["schedule_s"] < 0.5).all()
    assert (steps["running"] >= 0).all() and (steps["waiting"] >= 0).all()
    assert (steps["running"] + steps["waiting"] > 0).all()


def test_evictions_keep_exact_lengths_and_first_token_times():
    """A cache too small for the burst: the engine evicts (recomputes) requests; lengths stay exact and the
    first token is the one before the eviction."""
    rng = np.random.default_rng(11)
    n = 16
    w = make_window("kv", "synthetic", np.zeros(n), rng.integers(64, 200, n), rng.integers(24, 48, n),
                    prediction_seed=0)
    for policy in ("fifo", "slai_faithful"):
        result, info = tb.replay(w, policy, shape=SHAPE, max_batch_tokens=256, block_size=16, num_blocks=24)
        assert result.completed.all() and result.n_preemptions == info["n_evictions"] > 0
        assert np.all(result.admit_s <= result.first_token_s) and np.all(result.first_token_s <= result.finish_s)


def test_edf_serves_the_urgent_request_of_a_burst_first():
    """Eleven long requests and, last in the same instant, one short urgent one (earliest deadline)."""
    n = 12
    p = np.full(n, 240)
    o = np.full(n, 8)
    p[-1], o[-1] = 8, 2
    w = make_window("burst", "synthetic", np.zeros(n), p, o, predicted_output_tokens=o)
    assert int(np.argmin(w.deadline_s)) == n - 1
    kw = dict(shape=SHAPE, max_batch_tokens=256, block_size=16, num_blocks=512)
    fifo, _ = tb.replay(w, "fifo", **kw)
    edf, _ = tb.replay(w, "edf", **kw)
    # FIFO prefills one long prompt a step, in arrival order: the urgent request comes (nearly) last.
    assert (fifo.first_token_s[:-1] < fifo.first_token_s[-1]).sum() >= n - 3
    # EDF admits it at the first step that sees it.
    assert (edf.first_token_s[:-1] < edf.first_token_s[-1]).sum() <= 2
    assert edf.finish_s[-1] < fifo.finish_s[-1]


def test_unknown_policy_names_the_supported_ones(window):
    with pytest.raises(KeyError, match="supported: fifo, edf"):
        tb.replay(window, "no_such_policy", shape=SHAPE)


def test_requests_that_cannot_fit_are_refused_by_name(window):
    total = window.input_tokens + window.output_tokens
    i = int(np.argmax(total))
    short = ModelShape(n_layers=1, hidden_size=64, n_heads=2, n_kv_heads=2, intermediate_size=128,
                       vocab_size=256, max_position_embeddings=int(total[i]) - 1)
    with pytest.raises(tb.ReplayError, match=rf"1 request\(s\) cannot run: request {i} .*max_position_embeddings"):
        tb.replay(window, "fifo", shape=short)
    with pytest.raises(tb.ReplayError, match=r"request \d+ .*num_blocks=4"):
        tb.replay(window, "fifo", shape=SHAPE, block_size=16, num_blocks=4)
    with pytest.raises(tb.ReplayError, match=r"request \d+ .*whole prompts.*max_batch_tokens=64"):
        tb.replay(window, "vllm_faithful", shape=SHAPE, max_batch_tokens=64)


def test_step_profile_has_rows_for_the_grid():
    df = tb.step_profile(SHAPE, "cpu", prefill_tokens=(0, 64), decode_seqs=(0, 4), context_tokens=(32,),
                         reps=2, warmup=1, block_size=16)
    assert len(df) == 3 * 2        # (d=4: p=0, 64) and (d=0: p=64), two reps each
    assert (df["batch_prefill_tokens"] == df["prefill_tokens"]).all()
    assert (df["batch_decode_seqs"] == df["decode_seqs"]).all()
    assert (df["forward_s"] > 0).all() and (df["step_s"] >= df["forward_s"]).all()
    assert (df["gap_s"] >= 0).all() and (df["gap_s"] < 0.5).all()     # end of one step to the next
    assert (df["schedule_s"] > 0).all() and (df["schedule_s"] < df["step_s"]).all()
    assert df.attrs["engine_version"] == tb.engine_version()


def test_probe_replays_the_fixed_batch():
    model = tb.build_model(SHAPE, "cpu")
    for policy in ("fifo", "slai_faithful", "vllm_faithful"):
        p = tb.probe(policy, shape=SHAPE, max_batch_tokens=256, block_size=16, num_blocks=512, model=model)
        assert set(p) == {"wall_s", "mean_step_s", "n_steps", "walls_s"}
        assert 0 < p["wall_s"] < 30 and p["n_steps"] >= 32          # 32 output tokens a request
        assert sorted(p["walls_s"]) == p["walls_s"] and p["walls_s"][1] == p["wall_s"]   # median of 3
        assert 0 < p["mean_step_s"] < p["wall_s"]


def test_an_oracle_policy_is_refused_on_a_real_engine():
    with pytest.raises(ValueError, match="srpt_oracle.*oracle.*true output lengths"):
        tb.scheduler_type("srpt_oracle")


def _in_flight(result, submit_s):
    """The most requests submitted and not yet finished at any submission."""
    return max(int(((submit_s <= t) & (result.finish_s > t)).sum()) for t in submit_s)


def test_max_in_flight_holds_due_requests_back(window):
    burst = make_window("cap-test", "synthetic", np.zeros(12), np.full(12, 32), np.full(12, 8), np.full(12, 8))
    result, info = tb.replay(burst, "vllm_faithful", shape=SHAPE, max_batch_tokens=256, block_size=16,
                             num_blocks=512, max_in_flight=3)
    submit = np.asarray(info["submit_s"])
    assert result.completed.all() and np.isfinite(submit).all()
    assert _in_flight(result, submit) <= 3
    assert info["n_held_by_cap"] >= 9                  # every request after the first three waited
    assert np.all(submit[3:] > 0) and np.all(result.admit_s >= submit - 1e-9)
    assert info["engine_config"]["max_in_flight"] == 3
    # the deadline still counts from the trace arrival, not from the submission
    np.testing.assert_array_equal(result.arrival_s, burst.arrival_s)
    _, free = tb.replay(burst, "vllm_faithful", shape=SHAPE, max_batch_tokens=256, block_size=16, num_blocks=512)
    assert free["n_held_by_cap"] == 0
    with pytest.raises(ValueError, match="max_in_flight"):
        tb.replay(burst, "vllm_faithful", shape=SHAPE, max_in_flight=0)


def test_whole_prompt_admission_for_slai():
    # prompts of 100 tokens against a 128-token budget: chunked, some prompt is split across steps;
    # without chunked prefill every step's prefill is a sum of whole prompts
    n = 6
    burst = make_window("whole-test", "synthetic", np.zeros(n), np.full(n, 100), np.full(n, 4), np.full(n, 4))
    kw = dict(shape=SHAPE, max_batch_tokens=128, block_size=16, num_blocks=512)
    _, chunked = tb.replay(burst, "slai_faithful", **kw)
    result, whole = tb.replay(burst, "slai_faithful", enable_chunked_prefill=False, **kw)
    assert result.completed.all()
    assert (chunked["steps"]["prefill_tokens"] % 100 != 0).any()
    assert (whole["steps"]["prefill_tokens"] % 100 == 0).all()
    with pytest.raises(tb.ReplayError, match="enable_chunked_prefill"):
        tb.replay(burst, "edf", enable_chunked_prefill=False, **kw)
