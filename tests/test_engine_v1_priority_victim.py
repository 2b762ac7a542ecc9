"""vLLM v1's preemption victim in the ``vllm_v1`` engine model: under FCFS the newest admission,
under vLLM's priority scheduling the running request of largest (priority, arrival), given back its
tokens when it was already scheduled in the step. Hand-worked on a three-block cache."""

import numpy as np
import pytest

from portbench.engine import StepCost, VllmV1Model
from portbench.policies import make_policy
from portbench.realengine.vllm_settings import scheduling_priorities
from portbench.testing import verified_run
from portbench.workload import make_window

#: 1 ms a step whatever runs: a step's end is its index + 1, in ms.
FLAT = StepCost(fixed_s=1e-3, per_prefill_token_s=0.0, per_decode_seq_s=0.0)
MS = 1e-3
#: Three 16-token blocks: room for one request's two blocks and the other's first.
MODEL = VllmV1Model(cost=FLAT, max_active_sequences=4, max_kv_tokens=48)


def two_requests():
    """R0 at 0 ms with a late deadline (predicted output 1000), R1 at 0.5 ms with an early one
    (predicted 1); 15-token prompts, 10 output tokens each."""
    return make_window("t", "test", [0.0, 0.5e-3], [15, 15], [10, 10], [1000, 1])


def test_the_deadline_orders_the_two():
    w = two_requests()
    assert w.deadline_s[0] > w.deadline_s[1]
    assert scheduling_priorities(w, "edf").tolist() == [1, 0]          # the rank by deadline
    assert scheduling_priorities(w, "vllm_v0_priority").tolist() == np.rint(w.deadline_s * 1e6).tolist()
    assert scheduling_priorities(w, "fifo") is None            # FCFS
    assert scheduling_priorities(w, "sarathi_faithful") is None  # no vLLM form
    assert scheduling_priorities(w, "no_such_policy") is None


# Steps 0-2 alike: step 0: R0 prefills 15 (1 block), first token at 1 ms. step 1: R0 decodes (16
# tokens, still 1 block); R1, arrived at 0.5 ms, is admitted (1 block), first token at 2 ms. step 2:
# R0 takes its 2nd block (the last free one); R1 decodes into its 1st. step 3: R0 is scheduled first
# (in its block); R1 needs a 2nd block and none is free, so one of them is preempted:
# - fifo (FCFS): the last running request, R1 itself, which waits again (prompt + 2 tokens = 17 ->
#   2 blocks to be admitted). R0 finishes at the end of step 9 (10 ms); R1 is readmitted at step 10
#   and has its 10th token after step 17 (18 ms).
# - edf (vLLM's priority scheduling, priority = the deadline's rank): the running request of largest
#   (priority, arrival), R0, though scheduled already: its token goes back to the budget, its two
#   blocks are freed, R1 takes one. R1 finishes at the end of step 10 (11 ms); R0 (prompt + 3 tokens
#   = 18 -> 2 blocks) waits until then, is readmitted at step 11 and has its 10th token after step
#   17 (18 ms). Its first admission and first token stay.
@pytest.mark.parametrize("policy, finish_ms", [("fifo", [10, 18]), ("edf", [18, 11])])
def test_the_victim_is_the_newest_under_fcfs_and_the_lowest_priority_under_priority(policy, finish_ms):
    r = verified_run(two_requests(), make_policy(policy), MODEL)
    np.testing.assert_allclose(r.admit_s, np.array([0, 1]) * MS)
    np.testing.assert_allclose(r.first_token_s, np.array([1, 2]) * MS)
    np.testing.assert_allclose(r.finish_s, np.array(finish_ms) * MS)
    assert r.n_preemptions == 1


@pytest.mark.parametrize("policy", ["edf", "vllm_v0_priority", "least_laxity_first"])
def test_a_victim_requeued_under_priority_takes_its_arrival_place(policy):
    # Under priority scheduling the queue is vLLM's heap on (priority, arrival): a preempted request
    # goes back at its arrival's place, not at the front, so the waiting list stays in arrival order.
    w = make_window("q", "test", np.arange(8) * 0.2e-3, [15] * 8, [10] * 8, [1000, 1, 1, 1, 1, 1, 1, 1])
    engine = MODEL.make_engine(w, make_policy(policy))
    seen = []
    step = engine._execute_step

    def watch(d, view):
        out = step(d, view)
        seen.append(list(engine.waiting))
        return out

    engine._execute_step = watch
    engine.run(event_skipping=False)
    assert engine.n_preemptions > 0
    assert all(q == sorted(q) for q in seen)
