"""Key policies on vLLM (CPU build), tiny random Llama: RQ7's ``sjf_aging`` and ``hrrn`` through the
key adapter, ``vllm_v1_priority`` as vLLM v1's priority scheduling; skipped where vLLM is not installed.

The ordering tests run the key adapter's own code on hand-made queues (no engine); the
replays run in one spawned subprocess, as in ``tests/test_realengine_vllm.py``. Run with
``.venv-vllm/bin/python -m pytest -q tests/test_realengine_vllm_rq7.py`` (under a minute on 2 cores).
"""

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.request_queue import FCFSRequestQueue  # noqa: E402

from portbench.policies import make_policy  # noqa: E402
from portbench.realengine import vllm_backend as vb  # noqa: E402
from portbench.realengine.vllm_key_scheduler import GAPS, KeyPolicyScheduler, KeyView  # noqa: E402
from portbench.workload import Window, make_window  # noqa: E402

SEQS = 2                      # few sequences, so that admission order shows
NOW = 100.0                   # the replay's clock for the hand-made queues


def bare_scheduler(window, policy, queue, seq=None):
    """The key adapter's queue logic without an engine: the waiting queue holds requests ``queue``
    (window indices, in this order; ``seq``: their engine queue order, default the same)."""
    s = KeyPolicyScheduler.__new__(KeyPolicyScheduler)
    reqs = [SimpleNamespace(request_id=f"q{i}", num_output_tokens=0) for i in queue]
    s.waiting, s.running = FCFSRequestQueue(reqs), []
    s._policy = policy
    s._view = KeyView(window, SimpleNamespace(max_kv_tokens=0))
    s._index = {r.request_id: i for r, i in zip(reqs, queue)}
    s._seq = {r.request_id: k for r, k in zip(reqs, seq or range(len(queue)))}
    s._clock = lambda: NOW
    s.kv_cache_manager = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: 0))
    s.block_size = 16
    policy.reset(s._view)
    return s


def order(s):
    return [s._index[r.request_id] for r in s.waiting]


def sjf_window(waits, predicted):
    n = len(waits)
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    return Window("w", "test", f(NOW - np.asarray(waits)), np.full(n, 64), np.full(n, 8),
                  np.asarray(predicted, dtype=np.int64), f(np.full(n, NOW + 50)))


def test_short_predicted_first_at_equal_wait():
    s = bare_scheduler(sjf_window([0, 0, 0], [900, 10, 300]), make_policy("sjf_aging"), [0, 1, 2])
    assert s.key_reorder(NOW)
    assert order(s) == [1, 2, 0]
    assert not s.key_reorder(NOW)                    # already in order: untouched


def test_a_long_wait_promotes_a_long_request():
    # one second of waiting outweighs thousands of predicted tokens under the default medians
    s = bare_scheduler(sjf_window([0.0, 2.0], [10, 5000]), make_policy("sjf_aging"), [0, 1])
    s.key_reorder(NOW)
    assert order(s) == [1, 0]
    # ... but not when it arrived at the same time
    s = bare_scheduler(sjf_window([2.0, 2.0], [10, 5000]), make_policy("sjf_aging"), [0, 1])
    s.key_reorder(NOW)
    assert order(s) == [0, 1]


def test_the_order_is_the_policys_key_and_ties_keep_the_engines_queue_order():
    """lof orders by predicted output alone, longest first: equal predictions keep the engine's queue order (the
    scheduler's own sequence numbers, e.g. a preempted request in front), not the deque's current
    order."""
    rng = np.random.default_rng(0)
    n = 30
    pred = rng.integers(1, 4, n) * 100                  # many ties
    w = sjf_window(rng.uniform(0, 5, n), pred)
    queue = rng.permutation(n).tolist()                 # the deque, shuffled by earlier steps
    seq = rng.permutation(n).tolist()                   # the engine's queue order
    s = bare_scheduler(w, make_policy("lof"), queue, seq)
    s.key_reorder(NOW)
    got = order(s)
    place = dict(zip(queue, seq))
    assert sorted(got) == list(range(n))
    assert all((-pred[a], place[a]) < (-pred[b], place[b]) for a, b in zip(got, got[1:]))


def test_policy_specs():
    w = burst_window()
    # the deadline in microseconds and edf's rank: the same order
    assert np.argsort(vb.priorities(w, "vllm_v1_priority"), kind="stable").tolist() == \
        np.argsort(vb.priorities(w, "edf"), kind="stable").tolist()
    for name in ("sjf_aging", "lof", "hrrn"):
        spec = vb.policy_spec(name)
        assert spec.scheduling_policy == "fcfs"
        assert spec.scheduler_cls == f"{KeyPolicyScheduler.__module__}.{KeyPolicyScheduler.__qualname__}"
    assert vb.policy_spec("vllm_v1_priority").scheduling_policy == "priority"
    with pytest.raises(KeyError, match="not a key policy"):
        vb.policy_spec("fastserve_mlfq")
    with pytest.raises(ValueError, match="oracle"):
        vb.policy_spec("srpt_oracle")


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
    "hrrn_burst": ("replay", (burst_window(), "hrrn"), {"max_num_seqs": SEQS}),
    "prio_burst": ("replay", (burst_window(), "vllm_v1_priority"), {"max_num_seqs": SEQS}),
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
    for name in ("sjf_burst", "hrrn_burst", "prio_burst"):
        result, _ = runs[name]
        assert _rank_corr(result.first_token_s, idx) < -0.8, name


def test_the_key_adapter_is_plugged_in(runs):
    for name in ("sjf_burst", "sjf_rand", "hrrn_burst"):
        _, info = runs[name]
        stats = info["scheduler_stats"]
        assert stats["calls"] == info["n_steps"]
        assert stats["undescribed"] == 0                 # every request was the window's
        assert info["scheduler_gaps"] == list(GAPS)
        assert info["engine_config"]["scheduler_cls"].endswith("KeyPolicyScheduler")
        assert info["engine_config"]["scheduling_policy"] == "fcfs"
    assert runs["sjf_burst"][1]["scheduler_stats"]["reordered_steps"] >= 1
    _, prio = runs["prio_burst"]
    assert prio["engine_config"]["scheduling_policy"] == "priority" and "scheduler_stats" not in prio


USER_POLICY = '''
from portbench.engine.queue import KeyPolicy
from portbench.policies import register


@register
class LongestPromptFirst(KeyPolicy):
    name = "user_longest_prompt_first"

    def key(self, view, ids):
        return -view.input_tokens[ids]
'''


def test_the_cli_replays_a_users_own_key_policy_on_vllm(tmp_path):
    """`portbench realengine replay` with a policy file: one Bailian window at the committed case's
    real-engine λ_ref (reused, no search), FIFO and the user's policy, guarded runs written to the
    data folder named; the two admit requests in different orders."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    from portbench import store

    data = tmp_path / "data"
    shutil.copytree(store.windows_dir(), data / "windows")
    (data / "results" / "realengine").mkdir(parents=True)
    shutil.copy(store.default_data_dir() / "results" / "realengine" / "vllm_cpu_guarded_case.json",
                data / "results" / "realengine")
    module = tmp_path / "my_policy.py"
    module.write_text(USER_POLICY)
    cli = Path(sys.executable).parent / "portbench"
    out = subprocess.run([str(cli), "realengine", "replay", "--policies", "fifo", "user_longest_prompt_first",
                          "--policy-module", str(module), "--sources", "bailian_qwen", "--data-dir", str(data),
                          "--tag", "mine_case", "--quiet",
                          "--reference-probes", "1", "--probe-warmup", "0", "--probe-repeats", "1"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "user_longest_prompt_first" in out.stdout and "best by mean ANWG" in out.stdout
    folder = data / "results" / "realengine"
    runs = pd.read_parquet(folder / "mine_case_runs.parquet")
    assert sorted(runs["policy"]) == ["fifo", "user_longest_prompt_first"]
    assert not (folder / "mine_case_calibration.parquet").exists() or len(pd.read_parquet(folder / "mine_case_calibration.parquet")) == 0
    req = pd.read_parquet(folder / "mine_case_requests.parquet")
    admit = {p: g.sort_values("request_index")["admit_s"].rank(method="first").to_numpy()
             for p, g in req.groupby("policy")}
    assert not np.array_equal(admit["fifo"], admit["user_longest_prompt_first"])
