"""The one verdict rule: a difference within the spread between seeds is a tie."""

from __future__ import annotations

import pytest

from wslib.runs.verdicts import Verdict, compare, compare_paired


@pytest.mark.parametrize(
    ("difference", "spread", "verdict"),
    [
        (0.6, 0.5, Verdict.ABOVE),
        (-0.6, 0.5, Verdict.BELOW),
        (0.5, 0.5, Verdict.WITHIN),  # at the edge: not more than the spread
        (-0.4, 0.5, Verdict.WITHIN),
        (0.0, 0.0, Verdict.WITHIN),
        (1e-9, 0.0, Verdict.ABOVE),
        (3.0, None, Verdict.UNKNOWN),  # one seed: no spread to judge by
        (0.0, None, Verdict.UNKNOWN),
    ],
)
def test_the_rule(difference: float, spread: float | None, verdict: Verdict) -> None:
    assert compare(difference, spread).verdict is verdict


def test_paired_differences_are_judged_by_their_own_spread() -> None:
    # per-seed differences 1 and 3: mean 2, std 1.41 -> above
    c = compare_paired([1.0, 3.0], [0.0, 0.0])
    assert c.verdict is Verdict.ABOVE
    assert (c.difference, c.spread) == pytest.approx((2.0, 2**0.5))
    # differences 0 and 4: mean 2, std 2.83 -> within
    assert compare_paired([5.0, 9.0], [5.0, 5.0]).verdict is Verdict.WITHIN
    # two separate means (9.5 vs 7.5) would hide that B wins on every seed by 2
    assert compare_paired([7.0, 12.0], [9.0, 14.0]).verdict is Verdict.BELOW
    assert compare_paired([1.0], [2.0]).verdict is Verdict.UNKNOWN


def test_words() -> None:
    assert compare(2.0, 1.0).word("beats", "loses to") == "beats"
    assert compare(-2.0, 1.0).word("beats", "loses to") == "loses to"
    assert compare(0.5, 1.0).word("beats", "loses to") == (
        "within the spread between seeds"
    )
    assert compare(-2.0, None).word("beats", "loses to") == (
        "loses to (one seed, spread unknown)"
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: compare(float("nan"), 1.0), "NaN difference"),
        (lambda: compare(1.0, -0.1), "spread must be a non-negative"),
        (lambda: compare_paired([1.0], [1.0, 2.0]), "equally long non-empty"),
        (lambda: compare_paired([], []), "equally long non-empty"),
    ],
)
def test_bad_input_is_named(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
