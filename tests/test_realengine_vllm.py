"""Real-engine replay on vLLM (CPU build), tiny random Llama: skipped where vLLM is not installed.

All engine work runs in one spawned subprocess (vLLM's CPU backend binds the threads and memory of
the process that builds an engine), engines reused between the replays of a configuration. Run with
``/work/venv-vllm/bin/python -m pytest -q tests/test_realengine_vllm.py`` (about a minute on 2 cores).
"""

import math

import numpy as np
import pytest

pytest.importorskip("vllm")

from portbench import fidelity  # noqa: E402
from portbench.metrics import cell_metrics  # noqa: E402
from portbench.realengine import ModelShape  # noqa: E402
from portbench.realengine import vllm_backend as vb  # noqa: E402
from portbench.workload import Window, make_window  # noqa: E402

SHAPE = ModelShape()          # 2 layers x 128 wide
SEQS = 4                      # few sequences, so that admission order shows


def random_window(n=24, seed=3):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0.0, 0.6, n))
    arrival[: n // 2] = 0.0                                  # a burst, then a trickle
    return make_window("rand", "test", np.sort(arrival), rng.integers(8, 257, n),
                       rng.integers(2, 33, n), prediction_seed=seed)


def burst_window(n=16):
    """All at t = 0; deadlines *decrease* with arrival index, prompts *increase*."""
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    i = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    idx = np.arange(n)
    return Window("burst", "test", f(np.zeros(n)), i(200 - 10 * idx), i(np.full(n, 12)),
                  i(np.full(n, 12)), f(10.0 - 0.5 * idx))


def long_window():
    """A prompt longer than vllm_faithful's 2,560-token budget between two short ones."""
    return make_window("long", "test", [0.0, 0.0, 0.05], [64, 3000, 32], [4, 4, 4],
                       prediction_seed=1)


def mixed_window():
    """Requests the two refusal rules disagree on: prompt <= 2,560 but prompt + output > 2,560 (1, 4)."""
    return make_window("mixed", "test", [0.0, 0.0, 0.01, 0.02, 0.03], [64, 2500, 3000, 32, 2559],
                       [4, 100, 4, 4, 2], prediction_seed=1)


def shared_prefix_window():
    """B repeats A's prompt (the same 512-token hash block, 300 tokens) after A has finished; C's
    prompt is its own."""
    return make_window("shared", "test", [0.0, 0.4, 0.5], [300, 300, 300], [4, 4, 4], prediction_seed=1,
                       meta={"block_tokens": 512}, block_hashes=(np.array([7]), np.array([7]), np.array([8])))


#: (prompt, max_tokens) straight to vllm_faithful's engine (max_model_len 2560)
OUTCOMES = [(2500, 100), (2559, 1), (2559, 2), (2560, 1), (3000, 4), (64, 8)]

JOBS = {
    "fifo_rand": ("replay", (random_window(), "fifo"), {"max_num_seqs": SEQS}),
    "fifo_burst": ("replay", (burst_window(), "fifo"), {"max_num_seqs": SEQS}),
    "edf_burst": ("replay", (burst_window(), "edf"), {"max_num_seqs": SEQS}),
    "slai_rand": ("replay", (random_window(), "slai_faithful"), {"max_num_seqs": SEQS}),
    "slai_burst": ("replay", (burst_window(), "slai_faithful"), {"max_num_seqs": SEQS}),
    "faithful_long": ("replay", (long_window(), "vllm_faithful"), {"max_num_seqs": SEQS}),
    "faithful_mixed": ("replay", (mixed_window(), "vllm_faithful"), {"max_num_seqs": SEQS}),
    "faithful_inflight": ("replay", (random_window(), "vllm_faithful"), {"max_num_seqs": SEQS, "max_in_flight": 2}),
    "slai_equal": ("replay", (mixed_window(), "slai_faithful"), {"max_num_seqs": SEQS, **vb.EQUAL_ADMISSION}),
    "fifo_cache": ("replay", (shared_prefix_window(), "fifo"), {"max_num_seqs": SEQS,
                                                                  "enable_prefix_caching": True}),
    "outcomes": ("engine_outcomes", ("vllm_faithful", OUTCOMES), {"max_num_seqs": SEQS}),
    "probe_faithful": ("probe", ("vllm_faithful",), {"max_num_seqs": SEQS}),
    "probe_slai": ("probe", ("slai_faithful",), {"max_num_seqs": SEQS}),
    "profile": ("step_profile", (), {"prefill_tokens": (0, 64), "decode_seqs": (0, 4),
                                     "context_tokens": (32,), "repeats": 2, "max_num_seqs": 8}),
}


@pytest.fixture(scope="module")
def runs():
    results = vb.replay_isolated(list(JOBS.values()), timeout_s=600)
    return dict(zip(JOBS, results))


def test_a_policy_vllm_cannot_run_names_the_supported_ones():
    # las holds and preempts (not a key policy): it would need a port of its own
    with pytest.raises(KeyError, match="not a key policy") as err:
        vb.policy_spec("las")
    for name in ("fifo", "edf", "slai_faithful", "vllm_faithful", "weighted_fair_share", "sjf_aging"):
        assert name in str(err.value)
    with pytest.raises(KeyError, match="not registered"):
        vb.replay(random_window(4), "no_such_policy")
    assert vb.policy_spec("weighted_fair_share").scheduler_cls.endswith("KeyPolicyScheduler")


def test_priorities_follow_the_study_keys():
    w = burst_window()
    assert vb.priorities(w, "fifo") == [0] * len(w)
    # a key on fixed data: each request's rank in the simulator's order, ties included
    edf = vb.priorities(w, "edf")
    assert edf == sorted(edf, reverse=True)                   # later index = earlier deadline
    assert sorted(edf) == list(range(len(w)))
    est = vb.priorities(w, "estimated_service_time_first")
    assert sorted(est) == list(range(len(w)))
    by_key = np.lexsort((np.arange(len(w)), w.deadline_s, w.input_tokens / 2 + w.predicted_output_tokens))
    assert np.argsort(est).tolist() == by_key.tolist()


@pytest.mark.parametrize("name", ["fifo_rand", "fifo_burst", "edf_burst", "slai_rand", "slai_burst"])
def test_exact_lengths_and_time_order(runs, name):
    result, info = runs[name]
    assert result.completed.all()
    assert info["generated_tokens"] == int(result.output_tokens.sum())
    assert np.all(result.arrival_s <= result.admit_s + 1e-9)
    assert np.all(result.admit_s <= result.first_token_s + 1e-9)
    assert np.all(result.first_token_s <= result.finish_s)
    assert np.all(result.arrival_s < result.first_token_s)
    assert info["vllm_version"] and info["environment"]["engine"] == "vllm"
    assert info["n_steps"] == result.n_steps > 0
    assert result.n_preemptions == 0
    # the instrumented scheduler: its own time and the batch of every step
    steps = info["steps"]
    assert len(steps["schedule_s"]) == info["n_steps"]
    assert np.all(np.asarray(steps["schedule_s"]) > 0) and np.all(np.asarray(steps["schedule_s"]) < 0.5)
    assert np.nansum(steps["prefill_tokens"]) == int(result.input_tokens.sum())      # no recompute
    assert np.nansum(steps["decode_seqs"]) == int((result.output_tokens - 1).sum())
    assert np.all(np.asarray(steps["scheduled_seqs"]) <= SEQS)
    assert 0 < info["mean_schedule_ms"] < info["mean_step_ms"]


def test_cell_metrics(runs):
    result, _ = runs["fifo_rand"]
    m = cell_metrics(result)
    assert m["completion_fraction"] == 1.0
    for key in ("anwg", "mean_latency_s", "p95_latency_s", "mean_ttft_s", "token_throughput"):
        assert math.isfinite(m[key])


def _rank_corr(x, y):
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_edf_and_fcfs_order_a_burst_differently(runs):
    fifo, _ = runs["fifo_burst"]
    edf, _ = runs["edf_burst"]
    idx = np.arange(len(fifo.arrival_s))
    # FCFS serves the burst in submission order; EDF by deadline, i.e. in reverse.
    assert _rank_corr(fifo.first_token_s, idx) > 0.8
    assert _rank_corr(edf.first_token_s, idx) < -0.8
    assert fifo.first_token_s[0] < fifo.first_token_s[-1]
    assert edf.first_token_s[-1] < edf.first_token_s[0]


def test_slai_runs_and_admits_shortest_prompt_first(runs):
    result, info = runs["slai_burst"]
    idx = np.arange(len(result.arrival_s))
    # Prompts shrink with the index: shortest-prompt-first serves the burst back to front.
    assert _rank_corr(result.first_token_s, idx) < -0.8
    stats = info["slai_stats"]
    assert stats["calls"] == info["n_steps"]
    assert info["slai_gaps"]
    assert info["engine_config"]["scheduler_cls"].endswith("SlaiScheduler")
    assert info["engine_config"]["max_num_batched_tokens"] == 512


def test_vllm_faithful_rejects_prompts_over_the_budget(runs):
    result, info = runs["faithful_long"]
    assert info["rejected"] == [1]
    assert info["engine_config"]["max_num_batched_tokens"] == 2560
    assert not info["engine_config"]["enable_chunked_prefill"]
    assert list(result.completed) == [True, False, True]
    assert np.isnan(result.first_token_s[1])


def test_step_profile(runs):
    df = runs["profile"]
    assert set(df.columns) >= {"prefill_tokens", "decode_seqs", "context_tokens",
                               "kv_context_tokens", "batch_tokens", "step_s"}
    assert len(df) == 3 * 2                                    # (0,4), (64,0), (64,4) x 2 repeats
    assert df["clean"].all()
    assert (df["step_s"] > 0).all()
    assert {"gap_s", "schedule_s"} <= set(df.columns)
    assert (df["schedule_s"] > 0).all() and (df["schedule_s"] < df["step_s"]).all()
    gaps = df["gap_s"].dropna()
    assert len(gaps) >= len(df) - 1 and (gaps >= 0).all() and (gaps < 0.5).all()


def test_probe_on_the_built_engines(runs):
    for name in ("probe_faithful", "probe_slai"):
        p = runs[name]
        assert set(p) == {"wall_s", "mean_step_s", "n_steps", "walls_s"}
        assert p["n_steps"] >= 32 and 0 < p["mean_step_s"] < p["wall_s"] < 30
        assert len(p["walls_s"]) == 3 and p["walls_s"][1] == p["wall_s"]      # the median of three


def test_vllm_refuses_or_caps_what_the_replay_refuses(runs):
    """vLLM 0.32 itself (max_model_len = 2560 for vllm_faithful): a prompt of 2,560 tokens or more is
    refused at submission; a shorter prompt whose output would run past 2,560 is cut at 2,560 tokens.
    The replay refuses both up front, and the simulated counterpart refuses the same requests."""
    out = runs["outcomes"]
    assert out[0] == {"tokens": 60, "capped": True}          # 2500 + 100 > 2560: capped at 2560
    assert out[1] == {"tokens": 1, "capped": False}          # 2559 + 1 = 2560: served
    assert out[2] == {"tokens": 1, "capped": True}           # 2559 + 2 > 2560: capped
    assert "error" in out[3] and "error" in out[4]           # prompt >= max_model_len: refused
    assert out[5] == {"tokens": 8, "capped": False}
    not_served = [("error" in o or o["capped"]) for o in out]
    rule = [p + m > 2560 for p, m in OUTCOMES]
    assert not_served == rule

    result, info = runs["faithful_mixed"]
    w = mixed_window()
    real = fidelity.real_refused(w, info["engine_config"]["max_model_len"])
    assert info["rejected"] == np.flatnonzero(real).tolist() == [1, 2, 4]
    assert list(~result.completed) == real.tolist()
    sim_result, sim_refused = fidelity.simulate_counterpart(w, "vllm_faithful", fidelity_cost())
    np.testing.assert_array_equal(sim_refused, real)
    np.testing.assert_array_equal(~sim_result.completed, real)


def fidelity_cost():
    from portbench.engine import StepCost
    return StepCost()


def test_steps_name_their_requests_and_requests_their_submission(runs):
    """Each step's batch (``scheduled``) adds up to every request's prompt and output tokens (the last
    output token is never fed back), and each request's submission clock and step are recorded."""
    for name in ("fifo_rand", "slai_rand", "faithful_inflight"):
        result, info = runs[name]
        fed = np.zeros(len(result.arrival_s), dtype=np.int64)
        for text in info["steps"]["scheduled"]:
            for key, n in vb.parse_scheduled(text).items():
                fed[int(key)] += n
        assert (fed == result.input_tokens + result.output_tokens - 1).all(), name
        submit, step = np.asarray(info["submit_s"]), np.asarray(info["submit_step"])
        assert np.all(result.arrival_s <= submit + 1e-9) and np.all(submit <= result.admit_s + 1e-9)
        starts = np.asarray(info["steps"]["start_s"])
        assert np.all(step >= 0) and np.all(starts[step] >= submit - 1e-9)   # no earlier step could see it
        assert np.all((step == 0) | (starts[np.maximum(step - 1, 0)] <= submit))


def test_max_in_flight_holds_due_requests_back(runs):
    result, info = runs["faithful_inflight"]
    submit = np.asarray(info["submit_s"])
    in_flight = [int(((submit <= t) & (result.finish_s > t)).sum()) for t in submit]
    assert max(in_flight) <= 2 and info["max_in_flight"] == 2
    assert (submit - result.arrival_s).max() > 0.05                  # the burst waited for workers


def test_equal_admission_refuses_the_same_requests_on_both_policies(runs):
    _, slai = runs["slai_equal"]
    _, faithful = runs["faithful_mixed"]
    assert slai["engine_config"]["max_model_len"] == faithful["engine_config"]["max_model_len"] == 2560
    assert slai["rejected"] == faithful["rejected"] == [1, 2, 4]


def test_prefix_caching_serves_the_shared_prompt_as_the_model_predicts(runs):
    # vLLM's own cache: B finds A's full blocks (at most (300 - 1) // block size of them), C none;
    # the vllm_v1 model with the engine's block size and the cache on hits the same tokens.
    from portbench.engine import simulate
    from portbench.engine.vllm_v1 import VllmV1Model
    from portbench.policies import make_policy

    result, info = runs["fifo_cache"]
    bs = info["block_size"]
    assert info["engine_config"]["enable_prefix_caching"] is True
    np.testing.assert_array_equal(info["cached_tokens"], [0, (299 // bs) * bs, 0])
    model = VllmV1Model(block_size=bs, max_active_sequences=SEQS, enable_prefix_caching=True)
    predicted = simulate(shared_prefix_window(), make_policy("fifo"), model)
    assert predicted.prefix_hit_tokens == int(info["cached_tokens"].sum())
