"""RQ9's real-engine replay, the parts that need no engine: the prompts that carry a window's prefix
sharing into vLLM, the refusal that keeps block hashes aligned, and the engine's cache setting."""

import numpy as np
import pytest

from portbench.fidelity.counterpart import served_part
from portbench.realengine.vllm_backend import prefix_prompt
from portbench.realengine.vllm_settings import engine_config
from portbench.workload import make_window


def hashed_window():
    return make_window("h", "test", [0.0, 0.1, 0.2], [1000, 700, 1200], [3, 3, 3], prediction_seed=0,
                       meta={"block_tokens": 512},
                       block_hashes=(np.array([1, 2]), np.array([1, 3]), np.array([1, 2, 4])))


def test_prefix_prompts_share_exactly_the_hashed_blocks_within_the_vocabulary():
    w = hashed_window()
    rng = np.random.default_rng(0)
    a, b, c = (np.array(prefix_prompt(w, i, 1024, rng)) for i in range(3))
    assert [len(a), len(b), len(c)] == [1000, 700, 1200]
    assert all(x.min() >= 3 and x.max() < 1024 for x in (a, b, c))
    np.testing.assert_array_equal(a[:512], b[:512])          # hash 1 in all three
    np.testing.assert_array_equal(a[:1000], c[:1000])        # hashes 1, 2: A is C's prefix
    assert (a[512:700] != b[512:700]).mean() > 0.9           # hash 2 against hash 3
    # the hashed part does not depend on the generator (the rest does)
    np.testing.assert_array_equal(np.array(prefix_prompt(w, 2, 1024, np.random.default_rng(9)))[:1024], c[:1024])


def test_served_part_keeps_each_requests_block_hashes():
    w = hashed_window()
    kept = served_part(w, np.array([False, True, False]))
    assert len(kept) == 2
    assert [h.tolist() for h in kept.block_hashes] == [[1, 2], [1, 2, 4]]


@pytest.mark.parametrize("on", [False, True])
def test_engine_config_carries_the_prefix_cache_setting(on):
    assert engine_config("fifo", enable_prefix_caching=on).enable_prefix_caching is on
    assert engine_config("fifo").enable_prefix_caching is False
