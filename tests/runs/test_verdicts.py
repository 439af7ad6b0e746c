"""The one verdict rule: four classes on the interval of the mean, one level per look.

The intervals below are built by hand (mean ± t * s / sqrt(n) with the t
quantile written out), so a rule that drifts from the textbook shows here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.weightstats import DescrStatsW, ttost_ind

from wslib.runs.verdicts import (
    ALPHA,
    LEDGER_ALPHA,
    LOOKS,
    Verdict,
    decide,
    decide_independent,
    decide_paired,
    decide_summary,
)

T95_3 = 3.182446305284263  # t quantile 0.975, 3 degrees of freedom


def spread_of(values: list[float]) -> float:
    v = np.asarray(values)
    return float(v.std(ddof=1) / math.sqrt(v.size))


def test_the_interval_is_the_textbook_t_interval() -> None:
    values = [1.0, 1.2, 0.8, 1.1]
    d = decide(values)
    half = T95_3 * spread_of(values)
    assert d.interval == pytest.approx((1.025 - half, 1.025 + half))
    assert d.n == 4 and d.mean == pytest.approx(1.025)


@pytest.mark.parametrize(
    ("values", "reference", "margin", "verdict"),
    [
        # holds above: interval [0.84, 1.16] wholly above 0.5
        ([0.9, 1.0, 1.1, 1.0], 0.5, None, Verdict.ABOVE),
        # below: wholly below 1.5
        ([0.9, 1.0, 1.1, 1.0], 1.5, None, Verdict.BELOW),
        # straddles 1.0, no margin: undecided
        ([0.9, 1.0, 1.1, 1.0], 1.0, None, Verdict.UNDECIDED),
        # straddles 1.0; 90% interval [0.904, 1.096] inside 1.0 ± 0.1: no effect
        ([0.9, 1.0, 1.1, 1.0], 1.0, 0.1, Verdict.EQUIVALENT),
        # straddles, and the 90% interval reaches past 1.0 ± 0.09: undecided
        ([0.9, 1.0, 1.1, 1.0], 1.0, 0.09, Verdict.UNDECIDED),
        # no spread: a zero-width interval
        ([2.0, 2.0, 2.0], 1.0, None, Verdict.ABOVE),
        ([1.0, 1.0, 1.0], 1.0, 0.1, Verdict.EQUIVALENT),
        ([1.0, 1.0, 1.0], 1.0, None, Verdict.UNDECIDED),
        # one seed: never decided
        ([5.0], 0.0, 1.0, Verdict.UNDECIDED),
    ],
)
def test_each_verdict_class(
    values: list[float], reference: float, margin: float | None, verdict: Verdict
) -> None:
    assert decide(values, reference=reference, margin=margin).verdict is verdict


def test_the_edges_of_each_class() -> None:
    # mean 1, sample std 0.0816 over 4 values: s / sqrt(n) = 0.0408
    values = [0.9, 1.0, 1.1, 1.0]
    assert spread_of(values) == pytest.approx(0.0408248, rel=1e-5)
    half = T95_3 * spread_of(values)
    low = 1.0 - half
    # a reference just below the interval's low end: above; just above it: undecided
    assert decide(values, reference=low - 1e-6).verdict is Verdict.ABOVE
    assert decide(values, reference=low + 1e-6).verdict is Verdict.UNDECIDED
    # the equivalence test at alpha = 0.05 is the 90% interval inside ± margin
    t90 = stats.t.ppf(0.95, 3)
    edge = t90 * spread_of(values)
    assert (
        decide(values, reference=1.0, margin=edge + 1e-6).verdict is Verdict.EQUIVALENT
    )
    assert (
        decide(values, reference=1.0, margin=edge - 1e-6).verdict is Verdict.UNDECIDED
    )


def test_equivalence_needs_both_sides() -> None:
    """The mean sits near the margin's upper end: the lower one-sided test passes,
    the upper one fails, so the pair (TOST) fails."""
    values = [0.14, 0.15, 0.16, 0.15, 0.17, 0.13]
    d = decide(values, reference=0.0, margin=0.16)
    assert d.verdict is Verdict.ABOVE  # clear of zero first
    near = [-0.02, 0.03, 0.01, 0.05, -0.01, 0.04]  # mean 0.0167, straddles zero
    assert decide(near, margin=0.1).verdict is Verdict.EQUIVALENT
    assert decide(near, margin=0.035).verdict is Verdict.UNDECIDED  # upper side binds
    shifted = [v - 0.03 for v in near]  # mean -0.0133: the lower side now binds
    assert decide(shifted, margin=0.03).verdict is Verdict.UNDECIDED
    assert decide(shifted, margin=0.1).verdict is Verdict.EQUIVALENT


@pytest.mark.parametrize("seed", range(20))
def test_decide_agrees_with_scipy_and_statsmodels(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 12))
    values = rng.normal(rng.normal(0, 0.05), rng.uniform(0.01, 0.2), n)
    margin = float(rng.uniform(0.02, 0.2))
    for alpha in (ALPHA, LEDGER_ALPHA):
        d = decide(values, margin=margin, alpha=alpha)
        ci = stats.ttest_1samp(values, 0.0).confidence_interval(1 - alpha)
        assert d.interval == pytest.approx((ci.low, ci.high))
        p = DescrStatsW(values).ttost_mean(-margin, margin)[0]
        if ci.low > 0:
            assert d.verdict is Verdict.ABOVE
        elif ci.high < 0:
            assert d.verdict is Verdict.BELOW
        else:
            expected = Verdict.EQUIVALENT if p < alpha else Verdict.UNDECIDED
            assert d.verdict is expected
        s = decide_summary(
            float(values.mean()),
            float(values.std(ddof=1)),
            n,
            margin=margin,
            alpha=alpha,
        )
        assert s.verdict is d.verdict
        assert s.interval == pytest.approx(d.interval)


@pytest.mark.parametrize("seed", range(10))
def test_independent_samples_agree_with_welch_and_statsmodels(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    a = rng.normal(0.02 * seed, 0.1, int(rng.integers(3, 8)))
    b = rng.normal(0.0, 0.05, int(rng.integers(3, 8)))
    d = decide_independent(a, b, margin=0.1)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.interval == pytest.approx((ci.low, ci.high))
    p = ttost_ind(a, b, -0.1, 0.1, usevar="unequal")[0]
    if ci.low <= 0 <= ci.high:
        assert (d.verdict is Verdict.EQUIVALENT) == (p < 0.05)


def test_equivalence_of_independent_samples_is_welchs_not_the_pooled_test() -> None:
    """Three spread values against twelve tight ones: the pooled TOST would call
    the means equivalent within 2 (p < 0.001); Welch's, the rule's, does not (p
    about 0.1), and the interval straddles 0, so the verdict is UNDECIDED."""
    a = [0.4, -0.4, 1.9]
    b = [0.02, -0.11, 0.07, 0.26, 0.19, -0.14, -0.25, -0.12, 0.01, -0.47, -0.04, -0.25]
    assert ttost_ind(np.array(a), np.array(b), -2.0, 2.0)[0] < 0.001  # pooled
    assert ttost_ind(np.array(a), np.array(b), -2.0, 2.0, usevar="unequal")[0] > 0.09
    assert decide_independent(a, b, margin=2.0).verdict is Verdict.UNDECIDED


def test_paired_differences_are_judged_by_their_own_spread() -> None:
    # B wins on every seed by 2: two separate means (9.5 vs 7.5) would hide it
    assert decide_paired([7.0, 12.0, 5.0], [9.0, 14.0, 7.0]).verdict is Verdict.BELOW
    assert decide_paired([1.0, 3.0], [0.0, 0.0]).verdict is Verdict.UNDECIDED
    assert decide_paired([1.0], [2.0]).interval is None


def test_the_ledger_level_is_corrected_for_its_looks() -> None:
    assert LOOKS == (5, 10, 20)
    assert LEDGER_ALPHA == pytest.approx(0.05 / 3)
    # decided at 95%, not at the corrected 98.3%: t(0.975, 4) = 2.78, t(0.9917, 4) = 3.96
    values = [0.1, 0.3, 0.2, 0.05, 0.25]  # t = 3.88
    mean, se = float(np.mean(values)), spread_of(values)
    assert 2.78 < mean / se < 3.96
    assert decide(values).verdict is Verdict.ABOVE
    assert decide(values, alpha=LEDGER_ALPHA).verdict is Verdict.UNDECIDED


def test_words() -> None:
    above = decide([2.0, 2.1, 1.9])
    assert above.word("beats", "loses to") == "beats"
    assert decide([-2.0, -2.1, -1.9]).word("beats", "loses to") == "loses to"
    same = decide([0.0, 0.01, -0.01], margin=0.5)
    assert same.word("beats", "loses to", "ties") == "ties"
    assert decide([-1.0, 1.0]).word("beats", "loses to", "ties", "?") == "?"
    assert decide([-2.0]).word("beats", "loses to") == (
        "loses to (one seed: undecided, spread unknown)"
    )
    assert "(n = 3, 95%)" in above.interval_text()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: decide([float("nan"), 1.0]), "finite values"),
        (lambda: decide([]), "non-empty"),
        (lambda: decide([1.0, 2.0], margin=0.0), "margin must be a positive"),
        (lambda: decide([1.0, 2.0], alpha=0.7), "alpha must lie"),
        (lambda: decide_paired([1.0], [1.0, 2.0]), "equally long"),
        (lambda: decide_summary(1.0, -1.0, 3), "finite mean and std"),
    ],
)
def test_bad_input_is_named(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
