"""Paired-inference statistics checked against hand-worked cases and independent brute-force references."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from trtllm_dasc.evals import stats
from trtllm_dasc.evals.stats import (PairedResult, compare_arms, holm, instance_means, median_iqr,
                                     paired_bootstrap, paired_differences, spearman, with_holm)


# ---------------------------------------------------------------- Holm

def _holm_by_definition(p_values):
    """Adjusted p_i = the smallest family-wise level alpha at which Holm's step-down procedure rejects H_i.

    The procedure at level alpha walks the p-values in ascending order and rejects while
    p_(k) <= alpha / (m - k + 1). Rejections only change at alpha = (m - k + 1) * p_(k), so trying those
    (and 1) finds the infimum exactly.
    """
    m = len(p_values)
    ranked = sorted(range(m), key=lambda i: p_values[i])
    candidates = sorted({min(1.0, (m - k) * p_values[i]) for k, i in enumerate(ranked)} | {1.0})
    adjusted = [1.0] * m
    for alpha in reversed(candidates):  # descending, so the last level that rejects is the smallest
        for k, i in enumerate(ranked):
            if (m - k) * p_values[i] > alpha:  # p_(k) > alpha / (m - k + 1), without a rounding division
                break
            adjusted[i] = alpha
    return adjusted


def test_holm_hand_worked_example():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_holm_matches_step_down_definition(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 16))
    p = rng.uniform(0, 0.2, size=m)
    p[rng.random(m) < 0.3] = p[0]  # ties
    p = p.tolist()
    assert holm(p) == pytest.approx(_holm_by_definition(p), abs=1e-12)


def test_holm_is_monotone_in_the_raw_p_values_and_capped_at_one():
    rng = np.random.default_rng(3)
    p = rng.uniform(0, 1, size=15)
    adjusted = np.array(holm(p.tolist()))
    order = np.argsort(p)
    assert np.all(np.diff(adjusted[order]) >= 0)
    assert np.all(adjusted >= p)
    assert np.all(adjusted <= 1.0)
    assert holm([0.6, 0.7, 0.9]) == [1.0, 1.0, 1.0]


def test_holm_edge_cases():
    assert holm([]) == []
    assert holm([0.03]) == [0.03]
    with pytest.raises(ValueError):
        holm([0.1, float("nan")])


def test_with_holm_fills_the_family():
    results = [PairedResult(n=10, mean_diff=0.1, ci_low=0.0, ci_high=0.2, p_value=p) for p in (0.01, 0.04)]
    assert [r.p_holm for r in with_holm(results)] == pytest.approx([0.02, 0.04])


# ---------------------------------------------------------------- Spearman, median/IQR

def _spearman_brute_force(x, y):
    """Average rank of v = (#smaller) + (#equal + 1) / 2, then Pearson via np.corrcoef."""
    def ranks(values):
        return np.array([sum(u < v for u in values) + (sum(u == v for u in values) + 1) / 2 for v in values])
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def test_spearman_hand_example_with_ties():
    # ranks x = [1, 2.5, 2.5, 4], y = [1, 2, 3, 4]: centered [-1.5, 0, 0, 1.5] . [-1.5, -.5, .5, 1.5] = 4.5,
    # norms sqrt(4.5) and sqrt(5) -> rho = 4.5 / sqrt(22.5)
    assert spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)


@pytest.mark.parametrize("seed", range(10))
def test_spearman_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, size=25).astype(float)  # many ties
    y = x + rng.normal(0, 2, size=25)
    assert spearman(x, y) == pytest.approx(_spearman_brute_force(x, y), abs=1e-12)


def test_spearman_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is not installed; brute-force reference covers it")
    rng = np.random.default_rng(1)
    for _ in range(10):
        x = rng.integers(0, 5, size=30).astype(float)
        y = np.round(x + rng.normal(0, 1.5, size=30))
        assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)


def test_spearman_constant_or_degenerate_input_is_nan():
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))
    assert math.isnan(spearman([1], [2]))
    assert math.isnan(spearman([1, 2, float("nan")], [1, 2, 3]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])


def test_median_iqr_ignores_nan():
    assert median_iqr([1, 2, float("nan"), 3, 4, 5]) == pytest.approx((3.0, 2.0, 4.0))
    assert all(math.isnan(v) for v in median_iqr([float("nan")]))
    assert all(math.isnan(v) for v in median_iqr([]))


# ---------------------------------------------------------------- instance means, pairing

def test_instance_means_average_repeats():
    assert instance_means({"a": [1, 0, 1, 1], "b": [0.5]}) == {"a": 0.75, "b": 0.5}
    with pytest.raises(ValueError, match="'c'"):
        instance_means({"c": []})


def test_paired_differences_drops_unpaired_ids_and_says_so():
    a = {"p1": 0.9, "p2": 0.5, "p3": 0.1}
    b = {"p2": 0.25, "p1": 0.4, "p4": 0.7}
    with pytest.warns(UserWarning, match=r"dropped 2 unpaired .*1 only in a, 1 only in b"):
        ids, diffs = paired_differences(a, b)
    assert ids == ["p1", "p2"]
    np.testing.assert_allclose(diffs, [0.5, 0.25])


def test_paired_differences_complete_pairing_is_silent(recwarn):
    ids, diffs = paired_differences({"x": 1.0}, {"x": 0.25})
    assert ids == ["x"] and diffs.tolist() == [0.75]
    assert len(recwarn) == 0


# ---------------------------------------------------------------- bootstrap

def test_bootstrap_large_effect_is_significant():
    diffs = 0.1 + np.random.default_rng(0).normal(0, 0.02, size=200)
    result = paired_bootstrap(diffs)
    assert result.n == 200
    assert result.mean_diff == pytest.approx(diffs.mean())
    assert 0 < result.ci_low < result.mean_diff < result.ci_high
    assert result.p_value < 0.001


def test_bootstrap_null_effect_is_not_significant():
    half = np.random.default_rng(1).normal(0, 0.1, size=100)
    symmetric = np.concatenate([half, -half])  # zero mean up to rounding
    result = paired_bootstrap(symmetric)
    assert result.p_value > 0.2
    assert result.ci_low < 0 < result.ci_high
    # an exactly zero mean: every centered resample is at least as extreme as 0
    assert paired_bootstrap([-1.0, 1.0, -0.5, 0.5]).p_value == 1.0


def test_bootstrap_ci_matches_normal_theory():
    sample = np.random.default_rng(2).normal(0.03, 0.2, size=400)
    result = paired_bootstrap(sample)
    half_width = 1.96 * sample.std(ddof=1) / math.sqrt(sample.size)
    assert (result.ci_high - result.ci_low) / 2 == pytest.approx(half_width, rel=0.10)
    assert abs((result.ci_high + result.ci_low) / 2 - sample.mean()) < 0.10 * half_width


def test_bootstrap_is_deterministic_given_the_seed():
    diffs = np.random.default_rng(4).normal(0.01, 0.1, size=50)
    assert paired_bootstrap(diffs, seed=11) == paired_bootstrap(diffs, seed=11)
    assert paired_bootstrap(diffs, seed=11) != paired_bootstrap(diffs, seed=12)


def test_bootstrap_p_value_and_ci_recomputed_from_the_same_draws():
    # the tail count is redone in exact rational arithmetic: these diffs put many resample means exactly
    # on the boundary (mean 0 or 0.2 around the observed 0.1), where float rounding must not decide
    exact_diffs = [Fraction(3, 10), Fraction(-1, 10), Fraction(2, 10), Fraction(0)]
    diffs = np.array([float(d) for d in exact_diffs])
    resamples, seed = 500, 7
    indices = np.random.default_rng(seed).integers(0, diffs.size, size=(resamples, diffs.size))
    exact_mean = sum(exact_diffs) / 4
    extreme = sum(abs(sum(exact_diffs[i] for i in row) / 4 - exact_mean) >= abs(exact_mean) for row in indices)
    on_boundary = sum(abs(sum(exact_diffs[i] for i in row) / 4 - exact_mean) == abs(exact_mean) for row in indices)
    assert on_boundary > 0  # the case really exercises ties
    result = paired_bootstrap(diffs, resamples=resamples, seed=seed)
    assert result.p_value == (1 + extreme) / (1 + resamples)
    boot_means = diffs[indices].mean(axis=1)
    assert (result.ci_low, result.ci_high) == tuple(np.percentile(boot_means, [2.5, 97.5]))


def test_bootstrap_p_value_by_enumerating_a_two_instance_case():
    # diffs [1, 0]: mean 0.5; a resample's mean is 0, 0.5 or 1, so it is as extreme as 0.5 from the
    # center exactly when both draws hit the same instance
    resamples, seed = 200, 3
    indices = np.random.default_rng(seed).integers(0, 2, size=(resamples, 2))
    same_instance_twice = int(np.sum(indices[:, 0] == indices[:, 1]))
    result = paired_bootstrap([1.0, 0.0], resamples=resamples, seed=seed)
    assert result.p_value == (1 + same_instance_twice) / (1 + resamples)


def test_bootstrap_p_value_approaches_the_exact_bootstrap_p_value():
    # all 4^4 = 256 equally likely resamples of four instances, enumerated: the exact centered-bootstrap
    # tail probability; 10,000 random resamples land within a few Monte Carlo standard errors of it
    exact_diffs = [Fraction(4, 10), Fraction(-2, 10), Fraction(1, 10), Fraction(3, 10)]
    diffs = np.array([float(d) for d in exact_diffs])
    mean = sum(exact_diffs) / 4
    exact = float(np.mean([abs(sum(exact_diffs[i] for i in pick) / 4 - mean) >= abs(mean)
                           for pick in itertools.product(range(4), repeat=4)]))
    p_value = paired_bootstrap(diffs, resamples=10_000, seed=0).p_value
    assert 0.05 < exact < 0.95  # a case where the comparison means something
    assert p_value == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 10_000) + 1e-4)


def test_bootstrap_chunking_keeps_the_draws(monkeypatch):
    diffs = np.random.default_rng(5).normal(0, 1, size=37)
    whole = paired_bootstrap(diffs, resamples=1000, seed=9)
    monkeypatch.setattr(stats, "_MAX_DRAWS_PER_CHUNK", 37 * 7 + 3)  # 7 rows per chunk, a short last one
    assert paired_bootstrap(diffs, resamples=1000, seed=9) == whole


def test_bootstrap_degenerate_inputs():
    with pytest.raises(ValueError):
        paired_bootstrap([])
    with pytest.raises(ValueError):
        paired_bootstrap([0.1, float("nan")])
    single = paired_bootstrap([0.25], resamples=100)
    assert (single.n, single.ci_low, single.ci_high) == (1, 0.25, 0.25)
    # one instance is no evidence: never significant (it was the smallest p, 1 / 101, and Holm marked it)
    assert single.p_value == 1.0
    same = paired_bootstrap([0.25] * 4, resamples=100)
    assert same.p_value == pytest.approx(1 / 101)
    zeros = paired_bootstrap([0.0] * 5, resamples=100)
    assert (zeros.mean_diff, zeros.ci_low, zeros.ci_high, zeros.p_value) == (0.0, 0.0, 0.0, 1.0)


# ---------------------------------------------------------------- end to end

def test_compare_arms_averages_then_pairs_then_bootstraps():
    arm_a = {"q1": [1, 1, 0], "q2": [0, 0], "q3": [1], "only_a": [1]}
    arm_b = {"q1": [0, 1, 0], "q2": [0, 1], "q3": [0, 0, 0, 0]}
    with pytest.warns(UserWarning, match="1 only in a"):
        result = compare_arms(arm_a, arm_b, resamples=500, seed=1)
    expected_diffs = [2 / 3 - 1 / 3, 0 - 0.5, 1 - 0]
    assert result == PairedResult(**{**vars(paired_bootstrap(expected_diffs, resamples=500, seed=1)),
                                     "n_dropped": 1})
    assert result.n == 3 and result.n_dropped == 1


def test_format_pp():
    result = PairedResult(n=200, mean_diff=0.032, ci_low=0.011, ci_high=0.05, p_value=0.004, p_holm=0.012)
    assert result.format_pp() == "+3.2 pp [+1.1, +5.0], p=0.0040, Holm p=0.0120, n=200"


def test_the_bootstrap_does_not_depend_on_the_arms_dict_order():
    """compare_arms paired in a's insertion order, so the same scores in another order drew other resamples
    (a review helper: p 0.16188 against 0.16238 on 40 instances)."""
    rng = np.random.default_rng(5)
    a = {f"q{i}": [float(x)] for i, x in enumerate(rng.integers(0, 2, 40))}
    b = {f"q{i}": [float(x)] for i, x in enumerate(rng.integers(0, 2, 40))}
    forward = compare_arms(a, b, resamples=2000, seed=3)
    backward = compare_arms(dict(reversed(list(a.items()))), dict(reversed(list(b.items()))), resamples=2000, seed=3)
    assert forward == backward
