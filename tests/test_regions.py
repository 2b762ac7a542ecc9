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


# --- the attainable knee ------------------------------------------------------------------------

def test_solo_service_is_the_decode_time_on_lssp_and_an_idle_run_on_vllm_v1(data_dir):
    import numpy as np

    from portbench.engine import LsspModel, engine_model, simulate
    from portbench.policies import make_policy
    from portbench.regions import solo_service_s

    w = store.load_windows(data_dir, source="burstgpt")[0]
    model = LsspModel()
    np.testing.assert_allclose(solo_service_s(w, model), w.output_tokens * model.step_s, rtol=1e-9)
    v1 = engine_model("vllm_v1")
    solo = solo_service_s(w, v1)
    one = w.__class__(**{**w.__dict__, "arrival_s": w.arrival_s[:1] * 0, "input_tokens": w.input_tokens[5:6],
                         "output_tokens": w.output_tokens[5:6],
                         "predicted_output_tokens": w.predicted_output_tokens[5:6],
                         "deadline_s": w.deadline_s[5:6] + 1e9})
    alone = simulate(one, make_policy("fifo"), v1)
    assert solo[5] == pytest.approx(alone.finish_s[0] - alone.admit_s[0], rel=1e-9)


def test_attainable_leaves_out_exactly_the_requests_no_scheduler_can_meet(data_dir):
    import numpy as np

    from portbench.engine import LsspModel, visible_steps
    from portbench.regions import attainable, solo_service_s
    from portbench.workload import scale

    w = store.load_windows(data_dir, source="burstgpt")[0]
    model = LsspModel()
    solo = solo_service_s(w, model)
    for factor in (100.0, 500.0, 2000.0):
        s = scale(w, factor)
        start = visible_steps(s.arrival_s, model.step_s) * model.step_s
        expect = start + solo <= s.deadline_s         # the first step it could run in, then its decode
        np.testing.assert_array_equal(attainable(s, solo, model), expect)
    # more compression leaves more requests out, never fewer
    counts = [int(attainable(scale(w, f), solo, model).sum()) for f in (100.0, 500.0, 2000.0)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_attainable_knee_is_at_or_above_the_studys_and_moves_burstgpt(data_dir):
    ws = store.load_windows(data_dir)
    azure = [w for w in ws if w.source == "azure_llm_2024"][:3]
    burst = [w for w in ws if w.source == "burstgpt"][:3]
    for w in azure + burst:
        study, att = find_lambda_ref(w), find_lambda_ref(w, knee="attainable")
        assert att.lambda_ref >= study.lambda_ref * (1 - 1e-6), w.window_id
    # BurstGPT's knee is one impossible request: without it the knee is a queue, at a higher load
    assert all(find_lambda_ref(w, knee="attainable").lambda_ref > 1.5 * find_lambda_ref(w).lambda_ref
               for w in burst)
    with pytest.raises(ValueError, match="unknown knee 'steep'.*study, attainable"):
        find_lambda_ref(azure[0], knee="steep")


def test_a_campaign_at_the_attainable_knee_has_its_own_table_and_keys(data_dir):
    from portbench.campaign import CampaignConfig, campaign_stamp, shard_key

    w = store.load_windows(data_dir)[0]
    study = CampaignConfig(policies=("fifo",), slo_multipliers=(20.0,))
    knee = CampaignConfig(policies=("fifo",), slo_multipliers=(20.0,), knee="attainable")
    assert study.table_name == "lssp" and knee.table_name == "lssp_attainable_knee"
    assert shard_key(w, study, 20.0, "code") != shard_key(w, knee, 20.0, "code")
    assert "knee" not in campaign_stamp(study, {}, "code") and campaign_stamp(knee, {}, "code")["knee"] == "attainable"
    with pytest.raises(ValueError, match="unknown knee"):
        CampaignConfig(knee="steep")
