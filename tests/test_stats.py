"""portbench.stats: against scipy, on hand-built tables whose answers are known, and for determinism."""

import math

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs as sp
from scipy import stats as sps

from portbench import stats as S


def table_from(values, metric="anwg", region="KNEE", slo=20.0, factor=1.0):
    """A tidy results table from {(source, policy): per-window values} (window k of a source is
    the same window for every policy)."""
    rows = []
    for (source, policy), vals in values.items():
        for k, v in enumerate(np.atleast_1d(vals)):
            rows.append({"source": source, "window_id": f"{source}_w{k:02d}", "region": region,
                         "region_factor": factor, "policy": policy, "slo_multiplier": slo,
                         metric: float(v)})
    return pd.DataFrame(rows)


def noisy_table(rng, sources=("s1", "s2"), n_policies=6, n_windows=20, scale=0.3, region="KNEE"):
    effects = np.linspace(0, 1, n_policies)
    values = {}
    for s in sources:
        for k in range(n_policies):
            values[(s, f"p{k}")] = effects[k] + scale * rng.normal(size=n_windows)
    return table_from(values, region=region)


# ---------------------------------------------------------------------------------------------
# Kendall τ_b

def test_tau_b_hand_worked_tie():
    # pairs (1,2) and (1,3) concordant, (2,3) tied in x only: n0 = 3, n1 = 1, n2 = 0
    # τ_b = (2 − 0) / √((3 − 1)(3 − 0)) = 2/√6
    assert S.kendall_tau_b([1, 2, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6), abs=1e-15)


def test_tau_b_matches_scipy_with_ties_and_is_nan_when_constant():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(2, 14))
        x, y = rng.integers(0, 4, n), rng.integers(0, 4, n)
        ref = sps.kendalltau(x, y, variant="b").statistic
        got = S.kendall_tau_b(x, y)
        assert (math.isnan(ref) and math.isnan(got)) or got == pytest.approx(ref, abs=1e-12)
    assert math.isnan(S.kendall_tau_b([1, 1, 1], [1, 2, 3]))
    # NaN positions leave the ranking
    assert S.kendall_tau_b([1, 2, np.nan, 3], [1, 2, 0, 3]) == pytest.approx(1.0)


def test_vectorised_tau_matches_scipy_row_by_row():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 5, (300, 11)).astype(float)
    y = rng.integers(0, 5, (300, 11)).astype(float)
    got = S._tau_rows(x, y, rtol=0.0)
    ref = np.array([sps.kendalltau(a, b, variant="b").statistic for a, b in zip(x, y)])
    np.testing.assert_allclose(got, ref, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Benjamini–Hochberg and BCa against scipy

def test_cross_metrics_integer_signs_give_the_float_signs_tau_exactly():
    # cross_metric works each metric's resampled signs out once, as int8 with a mask of the defined
    # pairs; τ_b over every metric pair (some pairs undefined on one side, some rows tied or
    # constant, a subset of the pairs) is tau_from_signs' to the last bit
    from portbench.stats.compare import _metric_signs, _paired_tau
    rng = np.random.default_rng(3)
    v = rng.integers(0, 4, size=(300, 3, 7)).astype(float)      # resamples x metrics x policies
    v[rng.random(v.shape) < 0.05] = np.nan
    v[:5, 1] = 2.0                                                # constant rankings
    signs, float_signs = _metric_signs(v), S.pair_signs(v)
    for use in (np.ones(21, dtype=bool), rng.random(21) < 0.6):
        for a, b in ((0, 1), (0, 2), (1, 2)):
            want = S.tau_from_signs(float_signs[:, a][:, use], float_signs[:, b][:, use])
            np.testing.assert_array_equal(_paired_tau(signs, a, b, use), want)


def test_benjamini_hochberg_is_scipys_over_the_defined_entries():
    # hand-worked, m = 4 (the NaN is not counted): sorted p·m/i = 0.04, 0.06, 0.0533…, 0.20, then
    # the running minimum from the top gives 0.04, 0.0533…, 0.0533…, 0.20
    got = S.benjamini_hochberg([0.01, 0.04, np.nan, 0.03, 0.20])
    np.testing.assert_allclose(got, [0.04, 0.16 / 3, np.nan, 0.16 / 3, 0.20], rtol=1e-15, atol=0)
    rng = np.random.default_rng(3)
    p = rng.uniform(size=40) ** 3
    p[[3, 17, 30]] = np.nan
    got = S.benjamini_hochberg(p)
    finite = ~np.isnan(p)
    np.testing.assert_array_equal(got[finite], sps.false_discovery_control(p[finite], method="bh"))
    assert np.isnan(got[~finite]).all()
    np.testing.assert_array_equal(S.benjamini_hochberg(p.reshape(5, 8)), got.reshape(5, 8))
    assert np.isnan(S.benjamini_hochberg([np.nan, np.nan])).all()
    assert S.benjamini_hochberg([]).shape == (0,)
    with pytest.raises(ValueError):
        S.benjamini_hochberg([0.2, 1.5])                      # not a p-value: refused, not clipped


def test_column_quantiles_use_the_finite_entries_of_each_column():
    rng = np.random.default_rng(31)
    x = rng.normal(size=(200, 4))
    x[rng.random(200) < 0.3, 1] = np.nan
    x[:5, 2] = np.inf
    x[:, 3] = np.nan                                          # no finite entry: NaN, no warning
    got = S._column_quantiles(x, [0.025, 0.975])
    for k in range(3):
        col = x[:, k][np.isfinite(x[:, k])]
        np.testing.assert_array_equal(got[:, k], np.quantile(col, [0.025, 0.975]))
    assert np.isnan(got[:, 3]).all()


def test_bca_and_percentile_match_scipy_for_the_same_resamples():
    rng = np.random.default_rng(4)
    x = rng.lognormal(size=30)
    y = rng.lognormal(size=25) * 1.3
    for method in ("BCa", "percentile"):
        one = sps.bootstrap((x,), np.mean, method=method, n_resamples=2000,
                            rng=np.random.default_rng(5))
        two = sps.bootstrap((x, y), lambda a, b, axis: a.mean(axis) - b.mean(axis), method=method,
                            n_resamples=2000, rng=np.random.default_rng(6))
        if method == "BCa":
            ci1 = S.bca_interval(x.mean(), one.bootstrap_distribution,
                                 [(x.sum() - x) / (len(x) - 1)])[0]
            ci2 = S.bca_interval(x.mean() - y.mean(), two.bootstrap_distribution,
                                 [(x.sum() - x) / (len(x) - 1) - y.mean(),
                                  x.mean() - (y.sum() - y) / (len(y) - 1)])[0]
        else:
            ci1 = S._percentile_interval(one.bootstrap_distribution, 0.95)
            ci2 = S._percentile_interval(two.bootstrap_distribution, 0.95)
        for ours, theirs in ((ci1, one), (ci2, two)):
            assert ours.low == pytest.approx(theirs.confidence_interval.low, rel=1e-12)
            assert ours.high == pytest.approx(theirs.confidence_interval.high, rel=1e-12)


def test_count_matrix_bootstrap_of_a_mean_agrees_with_scipy_bca():
    # our resampling path (counts @ values) and BCa vs scipy's own resamples: same within MC error
    rng = np.random.default_rng(7)
    x = rng.gamma(2.0, size=40)
    counts = S._count_matrix(np.random.default_rng(8), len(x), 20000)
    boot = S._weighted_means(counts, x[:, None])[:, 0]
    jack = S._weighted_means(S._jackknife_weights(len(x)), x[:, None])[:, 0]
    ours = S.bca_interval(x.mean(), boot, [jack])[0]
    ref = sps.bootstrap((x,), np.mean, method="BCa", n_resamples=20000,
                        rng=np.random.default_rng(9)).confidence_interval
    assert ours.low == pytest.approx(ref.low, rel=0.02)
    assert ours.high == pytest.approx(ref.high, rel=0.02)


# ---------------------------------------------------------------------------------------------
# Condition means and undefined values

def test_condition_means_exclude_and_count_undefined():
    a = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    b = np.array([0.5, np.nan, 0.7, np.nan, 0.9])
    t = table_from({("s1", "a"): a, ("s1", "b"): b, ("s2", "a"): a, ("s2", "b"): np.full(5, np.nan)})
    res = S.condition_means(t, "anwg")
    assert res.means.loc["b", ("s1", "KNEE")] == pytest.approx(0.7)
    assert res.n_windows.loc["b", ("s1", "KNEE")] == 3
    assert res.n_excluded.loc["b", ("s1", "KNEE")] == 2
    assert math.isnan(res.means.loc["b", ("s2", "KNEE")])
    assert res.n_excluded.loc["b", ("s2", "KNEE")] == 5
    assert res.n_excluded_total == 7
    # a policy undefined in every window of a source leaves that comparison
    t2 = pd.concat([t, table_from({("s1", "c"): a + 1, ("s2", "c"): a + 1})])
    assert S.cross_source_tau(t2, "anwg", "KNEE", "s1", "s2", n_resamples=50).n_policies == 2


# ---------------------------------------------------------------------------------------------
# Cross-source τ

def test_cross_source_tau_point_bootstrap_and_jackknife():
    t = noisy_table(np.random.default_rng(10))
    res = S.cross_source_tau(t, "anwg", "KNEE", "s1", "s2", n_resamples=300, seed=11)
    va = t[t.source == "s1"].pivot(index="window_id", columns="policy", values="anwg").to_numpy()
    vb = t[t.source == "s2"].pivot(index="window_id", columns="policy", values="anwg").to_numpy()
    assert res.statistic == pytest.approx(
        sps.kendalltau(va.mean(0), vb.mean(0), variant="b").statistic, abs=1e-12)
    # the vectorised bootstrap equals a plain loop over the same resample indices
    rng = np.random.default_rng(11)
    ia = rng.integers(0, len(va), (300, len(va)))
    ib = rng.integers(0, len(vb), (300, len(vb)))
    loop = [sps.kendalltau(va[ia[k]].mean(0), vb[ib[k]].mean(0), variant="b").statistic
            for k in range(300)]
    np.testing.assert_allclose(res.bootstrap_distribution, loop, atol=1e-12)
    # the vectorised jackknife gives the acceleration of a plain loop
    jack = [[sps.kendalltau(np.delete(va, i, 0).mean(0), vb.mean(0), variant="b").statistic
             for i in range(len(va))],
            [sps.kendalltau(va.mean(0), np.delete(vb, i, 0).mean(0), variant="b").statistic
             for i in range(len(vb))]]
    num = den = 0.0
    for j in jack:
        j = np.asarray(j)
        u = (len(j) - 1) * (j.mean() - j)
        num += (u ** 3).sum() / len(j) ** 3
        den += (u ** 2).sum() / len(j) ** 2
    assert res.acceleration == pytest.approx(num / (6 * den ** 1.5) if den else 0.0, abs=1e-12)
    for ci in (res.percentile_interval, res.bca_interval):
        assert -1 <= ci.low <= ci.high <= 1
    assert res.confidence_interval == res.bca_interval


def test_cross_source_table_and_concordance():
    t = noisy_table(np.random.default_rng(12), sources=("s1", "s2", "s3"), scale=0.05)
    frame = S.cross_source_table(t, n_resamples=100)
    assert len(frame) == 3 and frame["bh"].all()
    w = S.source_concordance(t, "anwg", "KNEE", n_permutations=999)
    assert w.statistic == pytest.approx(1.0) and w.pvalue < 0.01
    loo = S.leave_one_source_out(t, "anwg", "KNEE", n_permutations=99)
    assert list(loo["left_out"]) == ["s1", "s2", "s3"]
    np.testing.assert_allclose(loo["tau_b"], 1.0)


# ---------------------------------------------------------------------------------------------
# Kendall's W

def test_kendalls_w_identical_rankings_give_one():
    m = np.tile([3.0, 1.0, 2.0, 2.0, 5.0], (4, 1))          # ties included
    res = S.kendalls_w(m, n_permutations=999, seed=0)
    assert res.statistic == pytest.approx(1.0)
    assert res.pvalue < 0.01
    assert S.kendalls_w([[1, 2, 3], [3, 2, 1]], n_permutations=0).statistic == pytest.approx(0.0)


def test_kendalls_w_tie_correction_matches_friedman_identity():
    # with raters as blocks, W = χ²_F / (m (n − 1)), tie corrections included on both sides
    rng = np.random.default_rng(13)
    m = rng.integers(0, 4, (5, 7)).astype(float)
    chi2 = sps.friedmanchisquare(*m.T).statistic
    assert S.kendalls_w(m, n_permutations=0).statistic == pytest.approx(chi2 / (5 * 6), rel=1e-12)
    a = S.kendalls_w(m, n_permutations=500, seed=4)
    b = S.kendalls_w(m, n_permutations=500, seed=4)
    assert a == b


# ---------------------------------------------------------------------------------------------
# Reversals

def reversal_table():
    rng = np.random.default_rng(14)
    n = 20
    small = lambda: 0.005 * rng.normal(size=n)               # noqa: E731
    alt = np.tile([1.3, -0.7], n // 2)                        # mean 0.3, sd 1: a wide CI
    const = lambda v: np.full(n, v)                           # noqa: E731
    values = {
        ("s1", "a"): 0.9 + small(), ("s1", "b"): 0.5 + small(),       # supported reversal
        ("s2", "a"): 0.5 + small(), ("s2", "b"): 0.9 + small(),
        ("s1", "c"): const(0.50), ("s1", "d"): const(0.49),             # 2% margin
        ("s2", "c"): const(0.49), ("s2", "d"): const(0.50),
        ("s1", "e"): 2.0 + alt, ("s1", "f"): const(2.0),                # 15% margin, noisy
        ("s2", "e"): const(2.0), ("s2", "f"): 2.0 + alt,
        ("s1", "g"): const(0.8), ("s1", "h"): const(0.4),               # same order
        ("s2", "g"): const(0.8), ("s2", "h"): const(0.4),
        ("s1", "u"): const(0.7), ("s2", "u"): const(np.nan),            # undefined in s2
        ("s1", "z"): const(0.0), ("s2", "z"): const(0.0),               # zero loser
    }
    return table_from(values)


def cls_of(frame, a, b):
    row = frame[(frame.policy_a == a) & (frame.policy_b == b)]
    assert len(row) == 1
    return row.iloc[0]


def test_reversal_classes_of_a_hand_built_table():
    res = S.reversals(reversal_table(), "anwg", "KNEE", n_resamples=2000, seed=0)
    assert len(res) == 45                                     # C(10, 2) pairs × 1 source pair
    expected = {("a", "b"): "SUPPORTED_PRACTICAL_REVERSAL", ("c", "d"): "MICROSCOPIC",
                ("e", "f"): "UNSUPPORTED_WIDE_CI", ("g", "h"): "STABLE",
                ("g", "u"): "UNDEFINED", ("g", "z"): "UNDEFINED"}
    for (a, b), cls in expected.items():
        assert cls_of(res, a, b)["cls"] == cls, (a, b)
    ab, ef = cls_of(res, "a", "b"), cls_of(res, "e", "f")
    assert ab["margin_x"] == pytest.approx(0.4 / 0.5, rel=0.05)
    assert ab["p_x"] == 0 and ab["p"] == 0 and ab["bh"]
    assert ef["margin_x"] == pytest.approx(0.15) and ef["ci_low_x"] < 0 < ef["ci_high_x"]
    assert ef["p"] > 0.05 and not ef["bh"]
    counts = S.reversal_counts(res)
    assert list(counts.index) == list(S.REVERSAL_CLASSES) and (counts > 0).all()
    # the absolute floor demotes a reversal whose |Δ| does not exceed it in both sources
    floored = S.reversals(reversal_table(), "anwg", "KNEE", n_resamples=200, absolute_floor=0.5)
    assert cls_of(floored, "a", "b")["cls"] == "MICROSCOPIC"


def test_reversal_margin_loser_quirk_and_direction_aware():
    # latency, lower is better: the raw-lowest "loser" is the better policy (the original's rule)
    t = table_from({("s1", "a"): np.full(10, 1.0), ("s1", "b"): np.full(10, 1.105),
                    ("s2", "a"): np.full(10, 1.105), ("s2", "b"): np.full(10, 1.0)},
                   metric="mean_latency_s")
    quirk = cls_of(S.reversals(t, "mean_latency_s", "KNEE", n_resamples=100), "a", "b")
    aware = cls_of(S.reversals(t, "mean_latency_s", "KNEE", n_resamples=100,
                               direction_aware=True), "a", "b")
    assert quirk["margin_x"] == pytest.approx(0.105) and quirk["cls"] == "SUPPORTED_PRACTICAL_REVERSAL"
    assert aware["margin_x"] == pytest.approx(0.105 / 1.105) and aware["cls"] == "MICROSCOPIC"


def test_reversals_are_deterministic_for_a_seed():
    t = noisy_table(np.random.default_rng(15), sources=("s1", "s2", "s3"), scale=1.0)
    a = S.reversals(t, "anwg", "KNEE", n_resamples=500, seed=3)
    b = S.reversals(t, "anwg", "KNEE", n_resamples=500, seed=3)
    c = S.reversals(t, "anwg", "KNEE", n_resamples=500, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 15 * 3
    assert not np.allclose(a["ci_low_x"], c["ci_low_x"])
    both = S.reversal_analysis(pd.concat([t, t.assign(region="LOW", region_factor=0.5)]),
                               n_resamples=100)
    assert list(S.reversal_counts(both, by="region").index) == ["LOW", "KNEE"]


# ---------------------------------------------------------------------------------------------
# Cross-metric, SLO sensitivity, sample complexity, temporal splits

def test_cross_metric_orientation_ties_and_summary():
    rng = np.random.default_rng(16)
    shift = 0.01 * rng.normal(size=15)                        # same shift for every policy
    rows = []
    for k, p in enumerate(["a", "b", "c", "d"]):
        anwg = 0.5 + 0.1 * k + shift
        rows.append(pd.DataFrame({
            "source": "s1", "window_id": [f"w{i}" for i in range(15)], "region": "KNEE",
            "policy": p, "slo_multiplier": 20.0, "anwg": anwg,
            "mean_latency_s": 2.0 - anwg,                     # lower is better: same ranking
            "weighted_goodput": 2.0 - anwg,                   # higher is better: reversed
            "slo_violation_rate": 0.0,                        # all tied
            "mean_ttft_s": np.nan if p == "a" else 1.0 + k,   # undefined for one policy
        }))
    t = pd.concat(rows, ignore_index=True)
    res = S.cross_metric(t, "s1", "KNEE", metrics=("anwg", "mean_latency_s", "weighted_goodput",
                                                  "slo_violation_rate"), n_resamples=200)
    get = lambda a, b: res.pairs.set_index(["metric_a", "metric_b"]).loc[(a, b)]  # noqa: E731
    assert get("anwg", "mean_latency_s")["tau_b"] == pytest.approx(1.0)
    assert get("anwg", "mean_latency_s")["ci_low"] == pytest.approx(1.0)
    assert get("anwg", "weighted_goodput")["tau_b"] == pytest.approx(-1.0)
    tied = get("anwg", "slo_violation_rate")
    assert math.isnan(tied["tau_b"]) and tied["top1_tied_b"] and tied["top1_b"] == "a"
    assert get("anwg", "mean_latency_s")["top1_a"] == "d"
    assert res.median_tau == pytest.approx(-1.0) and res.n_defined == 3
    assert res.share_negative == pytest.approx(2 / 3) and res.top1_agreement == pytest.approx(1 / 3)
    ttft = S.cross_metric(t, "s1", "KNEE", metrics=("anwg", "mean_ttft_s"), n_resamples=50)
    assert ttft.pairs.iloc[0]["n_policies"] == 3 and ttft.pairs.iloc[0]["tau_b"] == pytest.approx(-1.0)


def test_slo_sensitivity_top1_change():
    base = {("s1", p): np.full(8, v) + np.arange(8) * 0.01 for p, v in zip("abc", (0.5, 0.6, 0.7))}
    loose = {("s1", p): np.full(8, v) for p, v in zip("abc", (0.8, 0.6, 0.7))}
    t = pd.concat([table_from(base), table_from(base, slo=10.0), table_from(loose, slo=40.0)])
    res = S.slo_sensitivity(t, n_resamples=100).set_index("variant")
    assert res.loc[10.0, "tau_b"] == pytest.approx(1.0) and not res.loc[10.0, "top1_changed"]
    assert res.loc[40.0, "top1_changed"] and res.loc[40.0, "top1_b"] == "a"
    assert res.loc[40.0, "tau_b"] == pytest.approx(sps.kendalltau([.5, .6, .7], [.8, .6, .7]).statistic)


def test_sample_complexity():
    rng = np.random.default_rng(17)
    clear = noisy_table(rng, sources=("s1",), n_policies=5, n_windows=12, scale=0.01)
    res = S.sample_complexity(clear, "anwg", "s1", sizes=(3, 6, 12, 20), n_draws=200)
    assert res["p_full"].iloc[:3].eq(1).all() and res["p_top1"].iloc[:3].eq(1).all()
    assert math.isnan(res["p_full"].iloc[3])
    noisy = noisy_table(rng, sources=("s1",), n_policies=5, n_windows=12, scale=2.0)
    again = S.sample_complexity(noisy, "anwg", "s1", sizes=(2, 12), n_draws=300)
    assert 0 <= again["p_full"].iloc[0] < 1 and again["p_full"].iloc[1] == 1
    pd.testing.assert_frame_equal(again, S.sample_complexity(noisy, "anwg", "s1", sizes=(2, 12),
                                                             n_draws=300))
    pooled = pd.concat([noisy, noisy.assign(region="LOW", region_factor=0.5)])
    res = S.sample_complexity(pooled, "anwg", "s1", sizes=(2,), pool_regions=True)
    assert list(res["region"]) == ["ALL"]


def test_temporal_split_and_groups():
    ids = [f"w{i:02d}" for i in range(40)]
    groups = S.chronological_groups(ids, ("EARLY", "MIDDLE", "LATE"))
    assert pd.Series(groups).value_counts().to_dict() == {"EARLY": 13, "MIDDLE": 13, "LATE": 14}
    t = noisy_table(np.random.default_rng(18), sources=("s1",), n_windows=20, scale=0.02)
    halves = S.chronological_groups(sorted(t.window_id.unique()))
    res = S.temporal_split(t, "anwg", "KNEE", "s1", halves, n_resamples=200)
    assert len(res) == 1 and res.iloc[0]["tau_b"] == pytest.approx(1.0)
    assert (res.iloc[0]["group_a"], res.iloc[0]["n_windows_a"]) == ("EARLY", 10)


# ---------------------------------------------------------------------------------------------
# Friedman, Nemenyi and Conover against scipy and scikit-posthocs
#
# Our variant, option by option, and the library call that matches it:
# - Friedman: average ranks within a block with the tie correction = scipy.stats.friedmanchisquare.
# - Nemenyi: |R̄_i − R̄_j| / √(k(k+1)/(6n)), times √2, against the studentized range (k, df = ∞),
#   no tie correction, unadjusted = scikit_posthocs.posthoc_nemenyi_friedman.
# - Conover: two-sided t on rank sums, (n−1)(k−1) df, variance from Σ r² (ties included) and the
#   Friedman statistic, unadjusted = scikit_posthocs.posthoc_conover_friedman(p_adjust=None).
# We rank 1 = best after orienting the metric, the library ranks ascending: we hand it −x for a
# higher-is-better metric (x itself for a lower-is-better one), so both work on the same ranks.
# Same formulas, terms grouped differently: the Conover variance holds 1 − T/(n(k−1)), which
# cancels as agreement grows, so p-values agree to ~1e-13 relative (≤ 4.5e-13 measured on the
# study's table, deep in the tail); rtol 1e-12, never an absolute tolerance.
# The one difference of definition: when the rank sums are equal and the variance is 0 (every
# block ranks the policies the same way), the library's t is 0/0 = NaN; ours is p = 1 (no
# evidence of a difference). We compare after mapping the library's NaN there to 1.

def block_matrix(t, metric="anwg"):
    return t.pivot_table(index=["source", "window_id"], columns="policy", values=metric)


def assert_post_hoc_equal(ours, theirs, *, degenerate_ok=False):
    assert list(ours.index) == list(theirs.index) == list(theirs.columns) == list(ours.columns)
    theirs = theirs.to_numpy(dtype=float)
    if degenerate_ok:
        theirs = np.where(np.isnan(theirs), 1.0, theirs)
    assert not np.isnan(theirs).any()
    np.testing.assert_allclose(ours.to_numpy(), theirs, rtol=1e-12, atol=0)


def test_friedman_matches_scipy_and_scikit_posthocs():
    rng = np.random.default_rng(19)
    t = noisy_table(rng, sources=("s1", "s2"), n_policies=5, n_windows=15, scale=0.5)
    t["anwg"] = t["anwg"].round(1)                             # ties within blocks
    extra = table_from({("s1", "broken"): np.r_[np.nan, np.ones(14)], ("s2", "broken"): np.ones(15)})
    res = S.friedman(pd.concat([t, extra]), "anwg", "KNEE")
    assert res.dropped_policies == ("broken",) and res.n_blocks == 30 and res.n_policies == 5
    x = block_matrix(t)
    assert (x.apply(lambda row: row.duplicated().any(), axis=1)).sum() >= 5    # ties do occur
    ref = sps.friedmanchisquare(*x.to_numpy().T)
    assert res.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert res.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    assert_post_hoc_equal(res.nemenyi, sp.posthoc_nemenyi_friedman(-x))
    assert_post_hoc_equal(res.conover, sp.posthoc_conover_friedman(-x, p_adjust=None))
    assert res.conover.to_numpy().min() < 1e-3                 # the tail is compared too
    # mean ranks: 1 = best, so the policy with the largest effect has the smallest
    np.testing.assert_allclose(res.mean_ranks, sps.rankdata(-x.to_numpy(), axis=1).mean(axis=0))
    assert res.mean_ranks.idxmin() == "p4"
    per_source = S.friedman(t, "anwg", "KNEE", source="s1")
    assert per_source.n_blocks == 15
    xs = block_matrix(t[t.source == "s1"])
    assert_post_hoc_equal(per_source.conover, sp.posthoc_conover_friedman(-xs, p_adjust=None))


def test_friedman_lower_is_better_metric_and_many_random_designs():
    rng = np.random.default_rng(20)
    for _ in range(40):
        n, k = int(rng.integers(2, 25)), int(rng.integers(3, 9))
        x = np.round(rng.normal(size=(n, k)) + np.linspace(0, rng.uniform(0, 2), k), 0)
        if np.ptp(sps.rankdata(x, axis=1), axis=0).max() == 0:
            continue                                            # perfect agreement: next test
        t = table_from({("s1", f"p{j}"): x[:, j] for j in range(k)}, metric="mean_latency_s")
        res = S.friedman(t, "mean_latency_s", "KNEE")
        xm = block_matrix(t, "mean_latency_s")                  # lower is better: rank x itself
        assert res.statistic == pytest.approx(sps.friedmanchisquare(*x.T).statistic, rel=1e-12)
        assert_post_hoc_equal(res.nemenyi, sp.posthoc_nemenyi_friedman(xm))
        assert_post_hoc_equal(res.conover, sp.posthoc_conover_friedman(xm, p_adjust=None))


def test_post_hoc_on_perfect_agreement():
    # always d > b = c > a (b and c tied in every block): the Conover variance is exactly 0
    t = table_from({("s1", p): np.full(10, v) + np.arange(10)
                    for p, v in zip("abcd", (0.1, 0.2, 0.2, 0.3))})
    res = S.friedman(t, "anwg", "KNEE")
    assert list(res.mean_ranks) == [4.0, 2.5, 2.5, 1.0]
    x = block_matrix(t)
    assert res.statistic == pytest.approx(sps.friedmanchisquare(*x.to_numpy().T).statistic, rel=1e-12)
    assert_post_hoc_equal(res.nemenyi, sp.posthoc_nemenyi_friedman(-x))
    with np.errstate(divide="ignore", invalid="ignore"):       # the library's 0/0 and x/0
        lib = sp.posthoc_conover_friedman(-x, p_adjust=None)
    assert np.isnan(lib.loc["b", "c"]) and res.conover.loc["b", "c"] == 1.0
    assert_post_hoc_equal(res.conover, lib, degenerate_ok=True)
    assert (res.conover.to_numpy()[~np.eye(4, dtype=bool)] != 1).sum() == 10   # the others are 0
    # without ties: the largest Friedman statistic, n(k − 1)
    t3 = table_from({("s1", p): np.full(10, v) + np.arange(10) for p, v in zip("abc", (0.1, 0.2, 0.3))})
    res3 = S.friedman(t3, "anwg", "KNEE")
    assert list(res3.mean_ranks) == [3.0, 2.0, 1.0] and res3.statistic == pytest.approx(20.0)
    assert_post_hoc_equal(res3.nemenyi, sp.posthoc_nemenyi_friedman(-block_matrix(t3)))


def test_paired_difference_resamples_windows_together():
    from portbench.stats import paired_difference

    a = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    d, ci = paired_difference(a, a - 0.5, n_resamples=300, seed=1)
    assert d == 0.5 and ci.low == ci.high == 0.5              # a constant difference: no spread, NaN left out
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    d, ci = paired_difference(x + 0.3 + rng.normal(scale=0.01, size=200), x, n_resamples=500, seed=2)
    assert ci.low < d < ci.high and ci.excludes(0.0) and ci.high - ci.low < 0.01
    d, ci = paired_difference([np.nan], [1.0])
    assert np.isnan(d) and np.isnan(ci.low)
