"""The book's one rule for turning a difference into words.

A difference counts only when it is larger than the spread between seeds:
``|difference| <= spread`` is a tie, said as such ("within the spread between
seeds"), never "beats" or "lower". Without a spread (one seed) nothing is
decided: the verdict is UNKNOWN and the words give the sign with that
caveat. Every chapter's
verdict words come from :func:`compare` (a difference and its spread) or
:func:`compare_paired` (per-seed values of two methods on the same seeds);
tests compare the :class:`Verdict`, not the English.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

SPREAD_WORDS = "within the spread between seeds"
ONE_SEED = "(one seed, spread unknown)"


class Verdict(Enum):
    """Above or below by more than the spread between seeds, within it, or unknown
    (one seed, no spread to judge by)."""

    ABOVE = "above"
    BELOW = "below"
    WITHIN = "within"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Comparison:
    """A difference, the spread it is judged against (None: unknown) and the verdict."""

    verdict: Verdict
    difference: float
    spread: float | None

    def word(
        self,
        above: str,
        below: str,
        within: str = SPREAD_WORDS,
    ) -> str:
        """The verdict in the caller's words; UNKNOWN gives the sign's word and
        "(one seed, spread unknown)"."""
        if self.verdict is Verdict.UNKNOWN:
            return f"{above if self.difference > 0 else below} {ONE_SEED}"
        return {Verdict.ABOVE: above, Verdict.BELOW: below, Verdict.WITHIN: within}[
            self.verdict
        ]


def compare(difference: float, spread: float | None) -> Comparison:
    """The rule: ``|difference| <= spread`` is WITHIN; otherwise the sign decides.

    ``spread`` is the spread between seeds the difference is judged against
    (a standard deviation over seeds); None (one seed) gives UNKNOWN.
    """
    if math.isnan(difference):
        raise ValueError("compare needs a number, got a NaN difference")
    if spread is not None and (math.isnan(spread) or spread < 0):
        raise ValueError(f"spread must be a non-negative number or None, got {spread}")
    if spread is None:
        return Comparison(Verdict.UNKNOWN, float(difference), None)
    if abs(difference) <= spread:
        return Comparison(Verdict.WITHIN, float(difference), spread)
    above = difference > 0
    return Comparison(Verdict.ABOVE if above else Verdict.BELOW, difference, spread)


def compare_paired(values: Sequence[float], reference: Sequence[float]) -> Comparison:
    """:func:`compare` of the per-seed differences ``values - reference``: their mean
    against their standard deviation over seeds (ddof 1; unknown for one seed)."""
    v, r = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    if v.shape != r.shape or v.ndim != 1 or v.size == 0:
        raise ValueError(
            "compare_paired needs two equally long non-empty lists of per-seed "
            f"values, got shapes {v.shape} and {r.shape}"
        )
    d = v - r
    spread = float(d.std(ddof=1)) if d.size > 1 else None
    return compare(float(d.mean()), spread)
