"""The book's one rule for turning numbers into words, in the chapters and the ledger alike.

A comparison asks whether a quantity measured on independent seeds (a paired
difference of two methods on the same seeds, a ratio, a metric) lies above or
below a reference value, given a smallest effect of practical interest, the
*margin* δ, fixed before any run. On the two-sided ``1 - alpha`` t-interval of
the mean (scipy's ``ttest_1samp``; for two independent samples, Welch's
``ttest_ind``):

- ``ABOVE``: the interval lies entirely above the reference;
- ``BELOW``: it lies entirely below it;
- ``EQUIVALENT``: "no effect of practical size": the equivalence test (TOST,
  statsmodels' ``ttost_mean`` / ``ttost_ind``) at the same ``alpha`` puts the
  mean within reference ± δ; only when a margin is given;
- ``UNDECIDED``: none of these (always so with one seed: no spread is known).

The order matters when a precisely measured effect is also tiny: the interval
clears the reference first, so the words say "above" and the number shows its
size. Values without spread (every seed equal) give a zero-width interval.

The chapters compare within one run (one look): :data:`ALPHA`. The ledger may
look three times as ``make book SEEDS=auto`` adds seeds (:data:`LOOKS`); it uses
:data:`LEDGER_ALPHA`, Bonferroni's correction over those looks, so that adding
seeds until an answer appears does not manufacture answers.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy import stats
from statsmodels.stats.weightstats import DescrStatsW, ttost_ind

ALPHA = 0.05
"""The level of a comparison within one run: a 95% interval."""
LOOKS = (5, 10, 20)
"""The numbers of seeds at which ``make book SEEDS=auto`` looks at the ledger."""
LEDGER_ALPHA = ALPHA / len(LOOKS)
"""The ledger's level: Bonferroni over :data:`LOOKS` (a 98.3% interval)."""

# Smallest effects of practical interest: the book's conventions where a paper
# reports no effect of its own (claims.py cites each claim's source).
LOSS_MARGIN = 0.01
"""0.01 of loss (cross-entropy or MSE): a loss or barrier difference below it is too small to matter."""
POINTS_MARGIN = 1.0
"""1 point of accuracy (in %)."""
RATIO_MARGIN = 0.05
"""5% of a ratio (a speed-up, a loss ratio)."""

EQUIVALENT_WORDS = "no effect of practical size"
UNDECIDED_WORDS = "undecided (the interval reaches both sides)"
ONE_SEED = "(one seed: undecided, spread unknown)"


class Verdict(Enum):
    """Where the interval of the mean lies with respect to the reference."""

    ABOVE = "above"
    BELOW = "below"
    EQUIVALENT = EQUIVALENT_WORDS
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Decision:
    """The verdict, the mean, its interval (None: one seed), n and the rule's settings."""

    verdict: Verdict
    mean: float
    interval: tuple[float, float] | None
    n: int
    reference: float = 0.0
    margin: float | None = None
    alpha: float = ALPHA

    @property
    def difference(self) -> float:
        """The mean's distance from the reference (signed)."""
        return self.mean - self.reference

    def word(
        self,
        above: str,
        below: str,
        equivalent: str = EQUIVALENT_WORDS,
        undecided: str = UNDECIDED_WORDS,
    ) -> str:
        """The verdict in the caller's words; one seed gives the sign's word with
        "(one seed: undecided, spread unknown)"."""
        if self.verdict is Verdict.UNDECIDED and self.interval is None:
            return f"{above if self.difference > 0 else below} {ONE_SEED}"
        return {
            Verdict.ABOVE: above,
            Verdict.BELOW: below,
            Verdict.EQUIVALENT: equivalent,
            Verdict.UNDECIDED: undecided,
        }[self.verdict]

    def interval_text(self, fmt: str = ".3g") -> str:
        """``mean [low, high] (n = k, 95%)``, or the single value for one seed."""
        if self.interval is None:
            return f"{self.mean:{fmt}} (n = 1)"
        low, high = self.interval
        level = f"{100 * (1 - self.alpha):.3g}%"
        return f"{self.mean:{fmt}} [{low:{fmt}}, {high:{fmt}}] (n = {self.n}, {level})"


def _checked(values: Sequence[float], what: str) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(
            f"{what} needs a non-empty list of per-seed values, got shape {v.shape}"
        )
    if not np.isfinite(v).all():
        raise ValueError(f"{what} needs finite values, got {v.tolist()}")
    return v


def _check_settings(margin: float | None, alpha: float) -> None:
    if margin is not None and not margin > 0:
        raise ValueError(f"margin must be a positive number or None, got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha}")


def _verdict(
    interval: tuple[float, float], equivalent: bool, reference: float
) -> Verdict:
    low, high = interval
    if low > reference:
        return Verdict.ABOVE
    if high < reference:
        return Verdict.BELOW
    return Verdict.EQUIVALENT if equivalent else Verdict.UNDECIDED


def decide(
    values: Sequence[float],
    *,
    reference: float = 0.0,
    margin: float | None = None,
    alpha: float = ALPHA,
) -> Decision:
    """The rule on one sample of per-seed values (e.g. paired differences)."""
    _check_settings(margin, alpha)
    v = _checked(values, "decide")
    mean = float(v.mean())
    if v.size == 1:
        return Decision(Verdict.UNDECIDED, mean, None, 1, reference, margin, alpha)
    if np.all(v == v[0]):  # no spread: the interval is the point (no rounding)
        mean = float(v[0])
        interval = (mean, mean)
        equivalent = margin is not None and abs(mean - reference) < margin
    else:
        ci = stats.ttest_1samp(v, reference).confidence_interval(1 - alpha)
        interval = (float(ci.low), float(ci.high))
        equivalent = margin is not None and bool(
            DescrStatsW(v).ttost_mean(reference - margin, reference + margin)[0] < alpha
        )
    verdict = _verdict(interval, equivalent, reference)
    return Decision(verdict, mean, interval, int(v.size), reference, margin, alpha)


def decide_paired(
    values: Sequence[float],
    reference_values: Sequence[float],
    *,
    margin: float | None = None,
    alpha: float = ALPHA,
) -> Decision:
    """The rule on the per-seed differences ``values - reference_values`` (same seeds)."""
    v = _checked(values, "decide_paired")
    r = _checked(reference_values, "decide_paired")
    if v.shape != r.shape:
        raise ValueError(
            "decide_paired needs two equally long lists of per-seed values, got "
            f"{v.size} and {r.size}"
        )
    return decide(v - r, margin=margin, alpha=alpha)


def decide_independent(
    values: Sequence[float],
    reference_values: Sequence[float],
    *,
    margin: float | None = None,
    alpha: float = ALPHA,
) -> Decision:
    """The rule on the difference of means of two independent samples (Welch).

    For cells whose runs are not paired seed by seed; with one value on
    either side the verdict is UNDECIDED (no spread is known).
    """
    _check_settings(margin, alpha)
    a = _checked(values, "decide_independent")
    b = _checked(reference_values, "decide_independent")
    mean = float(a.mean() - b.mean())
    n = int(min(a.size, b.size))
    if n == 1:
        return Decision(Verdict.UNDECIDED, mean, None, 1, 0.0, margin, alpha)
    if a.std() == 0 and b.std() == 0:
        interval = (mean, mean)
        equivalent = margin is not None and abs(mean) < margin
    else:
        with warnings.catch_warnings():  # one side without spread: Welch copes
            warnings.simplefilter("ignore", RuntimeWarning)
            ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(1 - alpha)
            p = ttost_ind(a, b, -margin, margin, usevar="unequal")[0] if margin else 1
        interval = (float(ci.low), float(ci.high))
        equivalent = bool(p < alpha)
    verdict = _verdict(interval, equivalent, 0.0)
    return Decision(verdict, mean, interval, n, 0.0, margin, alpha)


def decide_summary(
    mean: float,
    std: float,
    n: int,
    *,
    reference: float = 0.0,
    margin: float | None = None,
    alpha: float = ALPHA,
) -> Decision:
    """The rule from a sample's mean, sample std (ddof 1) and size, where only
    those were kept (scipy's t-interval; TOST as its ``1 - 2 alpha`` interval
    inside reference ± margin, the same test as :func:`decide`'s)."""
    _check_settings(margin, alpha)
    if n < 1 or math.isnan(mean) or math.isnan(std) or std < 0:
        raise ValueError(
            f"decide_summary needs n >= 1 and a finite mean and std, got {mean}, {std}, {n}"
        )
    if n == 1:
        return Decision(Verdict.UNDECIDED, mean, None, 1, reference, margin, alpha)
    se = std / math.sqrt(n)
    if se == 0:
        interval = (mean, mean)
        equivalent = margin is not None and abs(mean - reference) < margin
    else:
        low, high = stats.t.interval(1 - alpha, n - 1, loc=mean, scale=se)
        interval = (float(low), float(high))
        e_low, e_high = stats.t.interval(1 - 2 * alpha, n - 1, loc=mean, scale=se)
        equivalent = margin is not None and (
            reference - margin < e_low and e_high < reference + margin
        )
    verdict = _verdict(interval, equivalent, reference)
    return Decision(verdict, float(mean), interval, n, reference, margin, alpha)
