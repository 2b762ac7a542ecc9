"""The engine loop and FIFO against hand-worked cases and the study's λ_ref."""

import numpy as np
import pytest

from portbench import sim
from portbench.policies import make_policy
from portbench.workload import make_window


def window(arrivals, inputs, outputs, predicted=None):
    return make_window("t", "test", arrivals, inputs, outputs,
                       predicted if predicted is not None else outputs)


def test_fifo_single_request_timing():
    # Arrives at 2.3 ms: first seen at step 3 (ceil), decodes steps 3..7 -> first token 4 ms, done 8 ms.
    w = window([0.0, 0.0023], [10, 10], [1, 5])
    r = sim.simulate(w, make_policy("fifo"))
    assert r.admit_s[1] == pytest.approx(0.003)
    assert r.first_token_s[1] == pytest.approx(0.004)
    assert r.finish_s[1] == pytest.approx(0.008)
    assert r.finish_s[0] == pytest.approx(0.001)


def test_fifo_skips_what_does_not_fit_and_lets_a_small_prompt_overtake():
    model = sim.LsspModel(max_kv_tokens=100)
    # Request 0 (60 tokens) runs; request 1 (50) does not fit beside it; request 2 (30) does.
    w = window([0.0, 0.0, 0.0], [60, 50, 30], [10, 1, 1])
    r = sim.simulate(w, make_policy("fifo"), model)
    assert r.admit_s[0] == 0.0 and r.admit_s[2] == 0.0
    # KV use grows with decoded tokens: 60+30 at step 0; request 2 leaves after step 0
    # (61 in use at step 1 -> 61 + 50 > 100); request 0 finishes at step 9, so request 1 enters at 10.
    assert r.admit_s[1] == pytest.approx(0.010)


def test_fifo_respects_max_active_sequences():
    model = sim.LsspModel(max_active_sequences=2)
    w = window([0.0] * 3, [1, 1, 1], [3, 3, 3])
    r = sim.simulate(w, make_policy("fifo"), model)
    np.testing.assert_allclose(r.admit_s, [0.0, 0.0, 0.003])
    np.testing.assert_allclose(r.finish_s, [0.003, 0.003, 0.006])


def test_drain_limit_leaves_long_requests_unfinished():
    model = sim.LsspModel(drain_s=0.01)
    w = window([0.0, 0.0], [1, 1], [5, 50])
    r = sim.simulate(w, make_policy("fifo"), model)
    assert r.completed.tolist() == [True, False]
    assert r.n_steps == 10


def test_unknown_policy_is_named():
    with pytest.raises(KeyError, match="no_such_policy"):
        make_policy("no_such_policy")
