"""The fidelity pipeline: the engine's per-step cost hook, the replayed-cost schedule comparison and
the cross-validation folds."""

import numpy as np
import pandas as pd
import pytest

from portbench import fidelity, sim
from portbench.engine_v1 import PS, StepCost, VllmV1Model
from portbench.policies import make_policy
from portbench.workload import make_window


def _window(n=40, seed=1):
    rng = np.random.default_rng(seed)
    return make_window("toy_w0", "toy", np.sort(rng.uniform(0, 0.5, n)), rng.integers(16, 900, n),
                       rng.integers(1, 60, n), prediction_seed=seed)


COST = StepCost(fixed_s=2e-3, per_prefill_token_s=1e-5, per_decode_seq_s=5e-5, per_context_token_s=1e-7,
                gap_s=1e-4)


def _linear_as_shaped(cost):
    coef = (cost.fixed_s, cost.per_prefill_token_s, cost.per_decode_seq_s, cost.per_context_token_s)
    return fidelity.ShapedStepCost({s: coef for s in fidelity.SHAPES}, cost, cost.gap_s)


@pytest.mark.parametrize("policy", ["fifo", "slai_faithful"])
def test_per_step_cost_hook_matches_the_closed_form(policy):
    """A per-step cost with the linear cost's coefficients walks every step and gets every time the
    closed-form engine gets (fails if the hook mis-times a step or a stretch skips the hook)."""
    w = _window()
    model = VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000, cost=COST)
    ref = sim.simulate(w, make_policy(policy), model)
    hooked = sim.simulate(w, make_policy(policy), VllmV1Model(
        max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000, cost=_linear_as_shaped(COST)))
    for f in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(ref, f), getattr(hooked, f))
    assert ref.n_steps == hooked.n_steps


def _as_real_steps(replay):
    """A replay's own step log, written as a real run's step log."""
    log = replay.log()
    out = pd.DataFrame({"window_id": "toy_w0", "policy": "fifo", "repetition": 0, "step": log["step"],
                        "start_s": log["start_ps"] / PS, "duration_s": (log["end_ps"] - log["start_ps"]) / PS,
                        "prefill_tokens": log["prefill_tokens"], "decode_seqs": log["decode_seqs"],
                        "context_tokens": log["context_tokens"], "scheduled_seqs": log["scheduled_seqs"],
                        "running": 1, "waiting": 0})
    out.loc[out.index[-1], "running"] = 0
    return out


def test_replaying_a_runs_own_step_times_reproduces_it():
    """Replay a simulated run's own steps as if they were a real run's: every step and request agrees;
    a run whose one step differs is caught."""
    w = _window()
    model = VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16, max_kv_tokens=20_000, cost=COST)
    rec = fidelity.ReplayedStepTimes(pd.DataFrame({"step": [], "busy": [], "next_start_s": [], "end_s": []}), COST)
    r0 = sim.simulate(w, make_policy("fifo"), VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16,
                                                          max_kv_tokens=20_000, cost=rec))
    assert rec.beyond == r0.n_steps       # no real step to replay: every step timed by the fallback
    real = fidelity.run_steps(_as_real_steps(rec))
    replay = fidelity.ReplayedStepTimes(real, COST)
    r1 = sim.simulate(w, make_policy("fifo"), VllmV1Model(max_num_batched_tokens=512, max_active_sequences=16,
                                                          max_kv_tokens=20_000, cost=replay))
    log = replay.log()
    rq0 = fidelity.request_steps(r0.admit_s, r0.first_token_s, r0.finish_s, real["start_s"], real["end_s"])
    rq1 = fidelity.request_steps(r1.admit_s, r1.first_token_s, r1.finish_s, log["start_ps"] / PS, log["end_ps"] / PS)
    assert (rq0.to_numpy() >= 0).all()
    served = np.ones(len(w), dtype=bool)
    st, rq = fidelity.compare_schedules(real, log, rq0, rq1, policy="fifo", arrival_s=w.arrival_s, served=served)
    assert st["agree"].all() and rq["agree"].all() and replay.beyond == 0
    bad = log.copy()
    bad.loc[5, "prefill_tokens"] += 1
    st, _ = fidelity.compare_schedules(real, bad, rq0, rq1, policy="fifo", arrival_s=w.arrival_s, served=served)
    assert not st.loc[5, "agree"] and st.loc[5, "cls"] in fidelity.DISAGREEMENT_CLASSES


def test_an_arrival_between_two_real_steps_is_classed_as_a_race():
    real = pd.DataFrame({"start_s": [0.0, 0.010], "end_s": [0.009, 0.019], "decode_seqs": [0, 0]})
    sim_ = pd.DataFrame({"decode_seqs": [0, 0]})
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0, 0.0095], [True, True]) == fidelity.RACE
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0, 0.02], [True, True]) == fidelity.OTHER
    # the racing request refused on both sides does not count
    assert fidelity.classify_episode(1, "fifo", real, sim_, [0.0, 0.0095], [True, False]) == fidelity.OTHER


def test_window_folds_hold_every_source_and_reject_one_fold():
    ids = [f"{s}_w{i}" for s in "abc" for i in range(8)]
    folds = fidelity.window_folds(ids, [i[0] for i in ids], 4)
    for f in range(4):
        assert {w[0] for w, g in folds.items() if g == f} == set("abc")
    with pytest.raises(ValueError, match="at least 2 folds"):
        fidelity.window_folds(ids, [i[0] for i in ids], 1)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="lacks columns"):
        fidelity.run_steps(pd.DataFrame({"window_id": ["w"], "policy": ["p"], "repetition": [0], "step": [0]}))
    with pytest.raises(ValueError, match="missing"):
        fidelity.ShapedStepCost({"mixed": (0, 0, 0, 0)}, COST, 0.0)
    with pytest.raises(ValueError, match="kind"):
        fidelity.cross_validated_costs(pd.DataFrame(), pd.DataFrame(), kind="cubic")
