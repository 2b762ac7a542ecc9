"""RQ7's ``sjf_aging`` and ``vllm_priority`` on vLLM (CPU build), tiny random Llama: skipped where
vLLM is not installed.

The ordering tests run the scheduler subclass's own code on hand-made queues (no engine); the
replays run in one spawned subprocess, as in ``tests/test_realengine_vllm.py``. Run with
``.venv-vllm/bin/python -m pytest -q tests/test_realengine_vllm_rq7.py`` (under a minute on 2 cores).
"""

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.request_queue import FCFSRequestQueue  # noqa: E402

from portbench.policies.sjf_aging import SjfAging  # noqa: E402
from portbench.realengine import vllm_backend as vb  # noqa: E402
from portbench.realengine.vllm_sjf_scheduler import GAPS, SjfAgingScheduler, score_order  # noqa: E402
from portbench.workload import Window, make_window  # noqa: E402

SEQS = 2                      # few sequences, so that admission order shows
NOW = 1_000_000.0             # a wall-clock instant for the hand-made queues


def req(rid, waited_s, prompt=64):
    return SimpleNamespace(request_id=rid, arrival_time=NOW - waited_s, num_prompt_tokens=prompt)


def bare_scheduler(requests, predicted, rule=SjfAging()):
    """The subclass's queue logic without an engine: only what :meth:`sjf_reorder` reads."""
    s = SjfAgingScheduler.__new__(SjfAgingScheduler)
    s.waiting = FCFSRequestQueue(requests)
    s._length, s._seq, s.rule = dict(predicted), {r.request_id: k for k, r in enumerate(requests)}, rule
    return s


def test_short_predicted_first_at_equal_wait():
    reqs = [req("a", 0.0), req("b", 0.0), req("c", 0.0)]
    s = bare_scheduler(reqs, {"a": 900, "b": 10, "c": 300})
    assert s.sjf_reorder(NOW)
    assert [r.request_id for r in s.waiting] == ["b", "c", "a"]
    assert not s.sjf_reorder(NOW)                    # already in order: untouched


def test_a_long_wait_promotes_a_long_request():
    # one second of waiting outweighs thousands of predicted tokens under the default medians
    reqs = [req("short_new", 0.0), req("long_old", 2.0)]
    s = bare_scheduler(reqs, {"short_new": 10, "long_old": 5000})
    s.sjf_reorder(NOW)
    assert [r.request_id for r in s.waiting] == ["long_old", "short_new"]
    # ... but not when it arrived at the same time
    s = bare_scheduler([req("short_new", 2.0), req("long_old", 2.0)], {"short_new": 10, "long_old": 5000})
    s.sjf_reorder(NOW)
    assert [r.request_id for r in s.waiting] == ["short_new", "long_old"]


def test_the_order_is_the_simulator_policy_score():
    rng = np.random.default_rng(0)
    n = 40
    waits = rng.uniform(0, 12, n)
    pred = rng.integers(1, 60000, n)
    reqs = [req(f"r{k}", waits[k]) for k in range(n)]
    rule = SjfAging(time_median=3.0)
    got = [int(r.request_id[1:]) for r in score_order(reqs, {f"r{k}": pred[k] for k in range(n)}, rule, NOW)]
    view = SimpleNamespace(now=NOW, arrival_s=NOW - waits, predicted_output_tokens=pred, input_tokens=pred)
    rule.reset(view)
    score = rule.scores(view, np.arange(n))
    assert np.all(np.diff(score[got]) <= 0)          # highest score first
    assert sorted(got) == list(range(n))


def test_ties_go_to_the_earlier_arrival_then_submission():
    reqs = [req("late", 0.0), req("x1", 1.0), req("x0", 1.0)]
    s = bare_scheduler(reqs, {})                     # undescribed: length 0 for all
    s.sjf_reorder(NOW)
    assert [r.request_id for r in s.waiting] == ["x1", "x0", "late"]


def test_policy_specs():
    w = burst_window()
    assert vb.priorities(w, "vllm_priority") == vb.priorities(w, "edf")
    spec = vb.policy_spec("sjf_aging")
    assert spec.scheduling_policy == "fcfs" and spec.request_fields == ("predicted_output_tokens",)
    assert spec.scheduler_cls == f"{SjfAgingScheduler.__module__}.{SjfAgingScheduler.__qualname__}"
    assert vb.policy_spec("vllm_priority").scheduling_policy == "priority"


def burst_window(n=12):
    """All at t = 0, equal prompts and outputs; predicted lengths and deadlines *decrease* with the
    index, so both policies serve the burst back to front (FCFS front to back)."""
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    i = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    idx = np.arange(n)
    return Window("burst", "test", f(np.zeros(n)), i(np.full(n, 64)), i(np.full(n, 8)),
                  i(2000 - 150 * idx), f(10.0 - 0.5 * idx))


def random_window(n=16, seed=3):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0.0, 0.4, n))
    return make_window("rand", "test", arrival, rng.integers(8, 129, n), rng.integers(2, 17, n),
                       prediction_seed=seed)


JOBS = {
    "sjf_burst": ("replay", (burst_window(), "sjf_aging"), {"max_num_seqs": SEQS}),
    "sjf_rand": ("replay", (random_window(), "sjf_aging"), {"max_num_seqs": SEQS}),
    "prio_burst": ("replay", (burst_window(), "vllm_priority"), {"max_num_seqs": SEQS}),
    "fifo_burst": ("replay", (burst_window(), "fifo"), {"max_num_seqs": SEQS}),
}


@pytest.fixture(scope="module")
def runs():
    results = vb.replay_isolated(list(JOBS.values()), timeout_s=600)
    return dict(zip(JOBS, results))


def _rank_corr(x, y):
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


@pytest.mark.parametrize("name", list(JOBS))
def test_replays_complete_with_exact_lengths(runs, name):
    result, info = runs[name]
    assert result.completed.all()
    assert info["generated_tokens"] == int(result.output_tokens.sum())
    assert np.all(result.arrival_s <= result.admit_s + 1e-9)
    assert np.all(result.first_token_s <= result.finish_s)
    assert result.n_preemptions == 0


def test_new_policies_serve_the_burst_back_to_front(runs):
    idx = np.arange(len(burst_window()))
    fifo, _ = runs["fifo_burst"]
    assert _rank_corr(fifo.first_token_s, idx) > 0.8
    for name in ("sjf_burst", "prio_burst"):
        result, _ = runs[name]
        assert _rank_corr(result.first_token_s, idx) < -0.8, name


def test_sjf_scheduler_is_plugged_in(runs):
    for name in ("sjf_burst", "sjf_rand"):
        _, info = runs[name]
        stats = info["scheduler_stats"]
        assert stats["calls"] == info["n_steps"]
        assert stats["undescribed"] == 0                 # every request had its predicted length
        assert info["scheduler_gaps"] == list(GAPS)
        assert info["engine_config"]["scheduler_cls"].endswith("SjfAgingScheduler")
        assert info["engine_config"]["scheduling_policy"] == "fcfs"
    assert runs["sjf_burst"][1]["scheduler_stats"]["reordered_steps"] >= 1
    _, prio = runs["prio_burst"]
    assert prio["engine_config"]["scheduling_policy"] == "priority" and "scheduler_stats" not in prio
