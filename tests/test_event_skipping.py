"""The fast path (jumping over steps where nothing can change) equals walking every step.

Random small windows for every registered policy are ``portbench.testing.check_policy``'s job
(tests/test_policy_contract.py); here, real windows far past the knee.
"""

import numpy as np
import pytest

from portbench import sim
from portbench.policies import make_policy
from portbench.testing import first_difference
from portbench.workload import scale


def assert_same(fast: sim.RunResult, slow: sim.RunResult):
    diff = first_difference(fast, slow)
    assert diff is None, diff


@pytest.fixture(scope="module")
def frozen_windows():
    from portbench import store
    return [store.load_windows(source=s)[0] for s in store.SOURCES_OF_THE_STUDY]


@pytest.mark.parametrize("policy", ["fifo", "edf", "least_laxity_first", "estimated_service_time_first",
                                    "weighted_fair_share", "admission_control", "vllm_faithful",
                                    "slai_faithful", "kv_constrained_online", "scorpio_style_slo_guard"])
def test_vllm_v1_fast_path_on_frozen_windows(policy, frozen_windows):
    """Real windows at and far past the vllm_v1 knee (long queues, KV-bound admission, preemption):
    the fast path, with its stretches over arrivals that cannot be admitted, equals the walk. The
    step cost reads the context and has a gap between steps (the default has neither), so that a
    stretch's summed step times are checked too."""
    from portbench.engine import StepCost, VllmV1Model
    model = VllmV1Model(max_kv_tokens=32768, cost=StepCost(per_context_token_s=3.1e-8, gap_s=2.3e-4))
    for window in frozen_windows:
        for factor in (1.5, 6.0):
            w = scale(window, factor)
            fast = sim.simulate(w, make_policy(policy), model, event_skipping=True)
            slow = sim.simulate(w, make_policy(policy), model, event_skipping=False)
            assert_same(fast, slow)


def test_vllm_v1_chunk_stretches_equal_the_walk(monkeypatch):
    """Long prompts prefilled in many chunks of the 2,048-token budget (prefix-hashed windows, with
    the prefix cache on and off): the stretches over the steps that repeat a chunk step equal
    walking them, and they do happen. The step cost reads the context and has a gap between steps,
    so that a stretch's step times must follow the growing context exactly."""
    from portbench import store
    from portbench.engine import StepCost, VllmV1Model
    from portbench.engine import vllm_v1

    stretches = []
    bulk = vllm_v1._V1Engine._bulk_steps

    def spy(self, k, run, p, c, context):
        stretches.append((k, p, c))
        return bulk(self, k, run, p, c, context)

    monkeypatch.setattr(vllm_v1._V1Engine, "_bulk_steps", spy)
    windows = store.load_windows(source=store.PREFIX_HASHED_SOURCE)[:2]
    for caching in (True, False):
        model = VllmV1Model(enable_prefix_caching=caching, max_kv_tokens=262144,
                            cost=StepCost(per_context_token_s=3.1e-8, gap_s=2.3e-4))
        for window in windows:
            for factor in (1.0, 4.0):
                w = scale(window, factor)
                for policy in ("fifo", "edf", "lpm", "kv_constrained_online"):
                    fast = sim.simulate(w, make_policy(policy), model, event_skipping=True)
                    slow = sim.simulate(w, make_policy(policy), model, event_skipping=False)
                    assert_same(fast, slow)
    chunked = [s for s in stretches if s[1] >= 0]
    assert chunked and max(k for k, _, _ in chunked) > 1
