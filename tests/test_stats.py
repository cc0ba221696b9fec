"""Known answers for vkit.decide.stats: sample sizes, confidence-sequence widths and coverage, FDR."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from vkit.decide import stats as st

pytestmark = pytest.mark.unit


def test_sample_size_normal_known_answer():
    # STATS.md: σ = 2%, d = 3%, α = 0.05, power 0.8 -> 5.5 -> 6 per arm one-sided, 6.98 -> 7 two-sided.
    assert st.n_per_arm_normal(0.02, 0.03) == 6
    assert st.n_per_arm_normal(0.02, 0.03, sided=2) == 7


def test_sample_size_exact_t_known_answer():
    n, pw = st.n_per_arm_t(0.02, 0.03)
    assert (n, round(pw, 3)) == (7, 0.841)
    n, pw = st.n_per_arm_t(0.02, 0.03, sided=2)
    assert (n, round(pw, 3)) == (9, 0.848)
    assert st.n_per_arm_t(0.02, 0.03, paired=True)[0] == 8
    assert st.n_per_arm_t(0.02, 0.03, paired=True, rho=0.5)[0] == 5


def test_min_detectable_known_answer():
    assert [round(st.min_detectable(0.02, n) * 100, 2) for n in (3, 5, 10)] == [4.06, 3.15, 2.22]


def test_sample_size_rejects_nonsense():
    with pytest.raises(ValueError):
        st.n_per_arm_normal(0.0, 0.03)
    with pytest.raises(ValueError):
        st.n_per_arm_t(0.02, 0.03, alpha=1.5)


def test_t_mixture_widths_match_stats_md():
    # STATS.md, 95% half-widths of a paired relative difference (2% noise per arm) with the
    # two-sided t-mixture, c = 0.5: 6.78 / 4.20 / 3.55 / 2.30% at 5 / 8 / 10 / 20 pairs. The
    # one-sided boundary at α/2 coincides with the two-sided one at α to this precision.
    tm = st.TMixture(0.025, 0.5, kmax=25)
    sd = 0.02 * math.sqrt(2)
    got = [round(float(tm.half_width(k, sd)) * 100, 2) for k in (5, 8, 10, 20)]
    assert got == [6.78, 4.20, 3.55, 2.30]


def test_t_mixture_cannot_decide_on_two_pairs():
    tm = st.TMixture(0.05, 0.5, kmax=10)
    assert math.isinf(tm.mult[2]) and math.isfinite(tm.mult[4])


def test_normal_mixture_shrinks_and_beyond_table():
    nm = st.NormalMixture(0.05, 1.0, kmax=20)
    hw = nm.half_width(np.array([2, 5, 10, 20, 40]), 1.0)
    assert np.all(np.diff(hw) < 0)
    # beyond the table it computes the root directly
    assert float(hw[-1]) == pytest.approx(float(st.NormalMixture(0.05, 1.0, kmax=40).half_width(40, 1.0)))


@pytest.mark.parametrize("kind", ["t", "normal"])
def test_confidence_sequence_coverage_over_50_looks(kind):
    # Each one-sided bound must hold at every look at once with probability >= 1 - α.
    rng = np.random.default_rng(11)
    reps, looks, alpha = 4000, 50, 0.05
    x = rng.normal(0.0, 1.0, (reps, looks))
    k = np.arange(1, looks + 1)
    mean = np.cumsum(x, axis=1) / k
    if kind == "t":
        cs = st.TMixture(alpha, 0.5, kmax=looks)
        ss = np.cumsum(x * x, axis=1)
        sd = np.sqrt(np.maximum(ss - k * mean**2, 0) / np.maximum(k - 1, 1))
        hw = cs.half_width(k, sd)
    else:
        cs = st.NormalMixture(alpha, 1.0, kmax=looks)
        hw = cs.half_width(k, 1.0)
    miss_low = np.mean(np.any(mean - hw > 0, axis=1))
    miss_high = np.mean(np.any(mean + hw < 0, axis=1))
    assert miss_low <= alpha and miss_high <= alpha
    # and it is not vacuous: a true mean of 1σ is excluded from below 0 eventually
    assert np.mean(np.any((mean + 1.0) - hw > 0, axis=1)) > 0.99


def test_peeking_with_a_fixed_t_test_breaks_alpha_but_the_sequence_does_not():
    # STATS.md: re-running a paired t-test after every pair from 3 to 10: ~14.6% false accepts.
    rng = np.random.default_rng(5)
    reps = 4000
    d = rng.normal(0, 1, (reps, 10))
    peek = np.zeros(reps, bool)
    cs_hit = np.zeros(reps, bool)
    tm = st.TMixture(0.05, 0.5, kmax=10)
    for k in range(3, 11):
        p = sps.ttest_1samp(d[:, :k], 0, axis=1, alternative="greater").pvalue
        peek |= p < 0.05
        m = d[:, :k].mean(1)
        cs_hit |= m - tm.half_width(k, d[:, :k].std(1, ddof=1)) > 0
    assert 0.12 < peek.mean() < 0.18
    assert cs_hit.mean() < 0.02


def test_e_value_is_one_at_no_data_and_grows_with_evidence():
    tm = st.TMixture(0.05, 0.5)
    assert float(tm.log_e_two_sided(0.0, 1.0, 5)) < 0  # no effect: evidence against a change
    assert float(tm.log_e_two_sided(5 * 0.1, 5 * 0.1**2 + 1e-8, 5)) > math.log(20)


def test_fixed_test_matches_scipy():
    rng = np.random.default_rng(2)
    b, c = rng.normal(0, 0.02, 6), rng.normal(0.03, 0.02, 6)
    ft = st.fixed_test(c, b, 0.05, paired=False)
    ref = sps.ttest_ind(c, b, equal_var=False, alternative="greater")
    assert ft.p_greater == pytest.approx(ref.pvalue)
    assert ft.lower == pytest.approx(ref.confidence_interval(0.95).low)
    assert ft.estimate == pytest.approx(c.mean() - b.mean())
    pt = st.fixed_test(c, b, 0.05, paired=True)
    assert pt.p_greater == pytest.approx(sps.ttest_rel(c, b, alternative="greater").pvalue)
    assert st.fixed_test(c[:1], b[:1], 0.05, paired=False) is None


def test_bh_textbook_example():
    # Benjamini & Hochberg (1995), §4: 15 p-values; BH at q = 0.05 rejects the four smallest
    # (Bonferroni only three); BY, valid under any dependence, rejects three.
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528, 0.7590, 1.000]
    _adj, rej = st.fdr(p, 0.05, "bh")
    assert rej == [True] * 4 + [False] * 11
    _adj, rej = st.fdr(p, 0.05, "by")
    assert sum(rej) == 3
    _adj, rej = st.fdr([0.01, math.nan], 0.05, "bh")
    assert rej == [True, False]


def test_e_bh():
    # K = 4, α = 0.05: reject the k* largest with e_(k) >= K/(αk): 80 >= 80 (k=1), 45 >= 40 (k=2), 20 < 26.7 (k=3), 1 < 20
    assert st.e_bh([1.0, 80.0, 20.0, 45.0], 0.05) == [False, True, False, True]
    assert st.e_bh([1.0, 2.0], 0.05) == [False, False]


def test_intersection_union():
    assert st.intersection_union(True, True, True)
    assert not st.intersection_union(True, False)


def test_variance_components_known_answer():
    from vkit.decide.stats import variance_components

    # Two groups [1, 2, 3] and [4, 5, 6]: MSW = 1, MSB = 13.5, n0 = 3, so between^2 = 12.5 / 3.
    vc = variance_components([[1, 2, 3], [4, 5, 6]])
    assert vc.within == pytest.approx(1.0)
    assert vc.between == pytest.approx(math.sqrt(12.5 / 3))
    assert vc.total == pytest.approx(math.sqrt(1 + 12.5 / 3))
    assert (vc.groups, vc.runs, vc.df_within) == (2, 6, 4)
    # within's 90 % interval: sqrt(SSW / chi2(0.95, 4)) .. sqrt(SSW / chi2(0.05, 4)), SSW = 4
    assert vc.within_ci == pytest.approx((math.sqrt(4 / 9.487729), math.sqrt(4 / 0.710723)), rel=1e-5)
    # two groups give Satterthwaite's df = 12.5² / (13.5² + 1/4) < 1: between's interval is 0 .. what MSB
    # allows, sqrt((13.5 / chi2(0.05, 1) - 1) / 3), chi2(0.05, 1) = 0.00393214
    assert vc.df_between < 1 and vc.between_ci == pytest.approx((0.0, math.sqrt((13.5 / 0.00393214 - 1) / 3)), rel=1e-5)
    # five groups of three, clearly apart: df >= 1 and the interval brackets the estimate
    wide = variance_components([[0, 1, 2], [10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42]])
    assert wide.df_between >= 1 and wide.between_ci[0] < wide.between < wide.between_ci[1]


def test_variance_components_no_between_part_and_bad_input():
    from vkit.decide.stats import variance_components

    vc = variance_components([[1.0, 3.0], [1.0, 3.0], [1.0, 3.0]])  # identical groups: MSB = 0
    assert vc.between == 0.0 and vc.within == pytest.approx(math.sqrt(2.0)) and vc.between_ci[0] == 0.0
    with pytest.raises(ValueError):
        variance_components([[1.0, 2.0]])
    with pytest.raises(ValueError):
        variance_components([[1.0], [2.0]])


def test_the_t_mixture_has_no_bound_before_its_third_observation_even_at_a_zero_spread():
    """Two identical pairs (sd 0): no bound yet is an infinite half-width, not inf x 0 = NaN (an interval of 'n/a'
    that no later rule can compare); from the third pair on, a zero spread is a zero half-width."""
    import math

    from vkit.decide.stats import TMixture

    t = TMixture(alpha=0.05)
    assert math.isinf(float(t.half_width(2, 0.0))) and float(t.half_width(3, 0.0)) == 0.0
    assert math.isinf(float(t.half_width(1, 0.02))) and 0 < float(t.half_width(3, 0.02)) < math.inf
