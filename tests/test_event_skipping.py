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
    the fast path, with its stretches over arrivals that cannot be admitted, equals the walk."""
    from portbench.engine import VllmV1Model
    model = VllmV1Model(max_kv_tokens=32768)
    for window in frozen_windows:
        for factor in (1.5, 6.0):
            w = scale(window, factor)
            fast = sim.simulate(w, make_policy(policy), model, event_skipping=True)
            slow = sim.simulate(w, make_policy(policy), model, event_skipping=False)
            assert_same(fast, slow)
