import numpy as np
import pytest

from portbench.workload import make_window, scale, slo_deadlines, synthesize_predictions, with_slo


def toy():
    return make_window("toy", "test", [10.0, 10.5, 12.0], [1000, 10, 200], [5, 50, 7],
                       [4, 60, 7])


def test_deadline_uses_predicted_output_and_multiplier():
    w = toy()
    # arrival 0 + 20 * (0.0004*1000 + 0.02*4) = 9.6
    assert w.deadline_s[0] == pytest.approx(9.6)
    assert w.deadline_s[1] == pytest.approx(0.5 + 20 * (0.004 + 1.2))
    w40 = with_slo(w, 40)
    np.testing.assert_allclose(w40.deadline_s - w40.arrival_s, 2 * (w.deadline_s - w.arrival_s))


def test_arrivals_rebased_to_zero():
    assert list(toy().arrival_s) == [0.0, 0.5, 2.0]


def test_scale_divides_gaps_and_slack_together():
    w = toy()
    s = scale(w, 4.0)
    np.testing.assert_allclose(s.arrival_s, [0.0, 0.125, 0.5])
    np.testing.assert_allclose(s.deadline_s - s.arrival_s, (w.deadline_s - w.arrival_s) / 4)
    assert s.time_scale == 4.0
    assert scale(s, 2.0).time_scale == 8.0
    with pytest.raises(ValueError, match="scale factor"):
        scale(w, 0)


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="not sorted"):
        make_window("bad", "t", [1.0, 0.5], [1, 1], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="positive"):
        make_window("bad", "t", [0.0, 0.5], [1, 0], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="prediction_seed"):
        make_window("bad", "t", [0.0, 0.5], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="SLO multiplier"):
        slo_deadlines([0.0], [1], [1], multiplier=0)


def test_synthesized_predictions_are_seeded_and_about_20_percent_off():
    true = np.full(20000, 100)
    a = synthesize_predictions(true, seed=7)
    assert np.array_equal(a, synthesize_predictions(true, seed=7))
    assert not np.array_equal(a, synthesize_predictions(true, seed=8))
    rel = a / true
    assert rel.std() / rel.mean() == pytest.approx(0.20, abs=0.01)
    assert (synthesize_predictions([1] * 100, seed=0) >= 1).all()


def test_synthesis_reproduces_the_studys_predictions_for_all_120_windows(data_dir):
    from portbench import store
    for w in store.load_windows(data_dir):
        k = int(w.window_id.rsplit("_w", 1)[1])        # the study seeds window k with 900000 + k
        np.testing.assert_array_equal(synthesize_predictions(w.output_tokens, seed=900_000 + k),
                                      w.predicted_output_tokens, err_msg=w.window_id)
