"""λ_ref: the engine model and FIFO are the study's if every window's knee matches its own."""

import pytest

from portbench import store
from portbench.regions import REGIONS, find_lambda_ref, region_factor


def test_lambda_ref_reproduces_the_study_for_all_120_windows(data_dir):
    worst = 0.0
    for w in store.load_windows(data_dir):
        cal = find_lambda_ref(w)
        assert cal.pinned is None
        rel = abs(cal.lambda_ref / w.meta["paper_lambda_ref"] - 1)
        assert rel <= 1e-6, (w.window_id, cal.lambda_ref, w.meta["paper_lambda_ref"])
        worst = max(worst, rel)
    print(f"max relative difference {worst:.3g}")


def test_regions_are_the_studys_multiples():
    assert REGIONS == {"LOW": 0.5, "PRE_KNEE": 0.8, "KNEE": 1.0, "POST_KNEE": 1.1, "OVERLOAD": 1.2,
                       "HIGH_PRESSURE": 1.5}
    with pytest.raises(KeyError, match="MEDIUM"):
        region_factor("MEDIUM")


def test_pinned_bounds_are_reported(data_dir):
    w = store.load_windows(data_dir)[0]
    # A threshold no run can stay below pins the search to the lower bound.
    assert find_lambda_ref(w, threshold=0.0).pinned == "low"
    # A threshold every run stays below pins it to the upper bound.
    assert find_lambda_ref(w, threshold=1.01).pinned == "high"


def test_probes_with_the_same_visible_steps_reuse_a_run_and_give_the_same_knee(data_dir):
    from portbench.regions import (BISECTION_STEPS, LOG10_BOUNDS, VIOLATION_THRESHOLD, bisect_log10,
                                   violation_rate_at)

    for w in store.load_windows(data_dir)[::40]:
        cal = find_lambda_ref(w)
        plain, _ = bisect_log10(lambda x: violation_rate_at(w, 10.0 ** x) < VIOLATION_THRESHOLD,
                                *LOG10_BOUNDS, BISECTION_STEPS)
        assert cal.lambda_ref == plain
        assert cal.n_simulations < BISECTION_STEPS + 2
