"""The rule's edges that its main tests leave open: what a Decision carries, the
no-spread and one-seed branches of each entry point, and each bad input's message.

Written against mutmut's survivors of ``wslib/runs/verdicts.py`` (see
``equivalent_mutants.yaml`` for those that change no behaviour).
"""

from __future__ import annotations

import math

import pytest

from wslib.runs.verdicts import (
    Decision,
    Verdict,
    decide,
    decide_independent,
    decide_paired,
    decide_summary,
)

SETTINGS = {"margin": 0.25, "alpha": 0.1}


def carries(d: Decision, *, n: int, reference: float = 0.0) -> None:
    """``d`` keeps n, the reference and the rule's settings it was given."""
    assert (d.n, d.reference, d.margin, d.alpha) == (n, reference, 0.25, 0.1)


@pytest.mark.parametrize("values", [[0.5], [0.5, 0.5, 0.5], [0.4, 0.5, 0.7]])
def test_each_entry_point_returns_its_settings(values: list[float]) -> None:
    n = len(values)
    carries(decide(values, reference=0.3, **SETTINGS), n=n, reference=0.3)
    carries(decide_paired(values, [0.1] * n, **SETTINGS), n=n)
    carries(decide_independent(values, [0.1] * n, **SETTINGS), n=n)
    std = float(sum((v - sum(values) / n) ** 2 for v in values) / max(n - 1, 1)) ** 0.5
    d = decide_summary(sum(values) / n, std, n, reference=0.3, **SETTINGS)
    carries(d, n=n, reference=0.3)


def test_one_seed_is_undecided_everywhere() -> None:
    for d in (
        decide([0.5], **SETTINGS),
        decide_independent([0.5], [0.1, 0.2], **SETTINGS),
        decide_summary(0.5, 0.0, 1, **SETTINGS),
    ):
        assert d.verdict is Verdict.UNDECIDED and d.interval is None
    d = decide_independent([0.5], [0.1, 0.2])
    assert d.mean == pytest.approx(0.35) and d.n == 1


@pytest.mark.parametrize("reference", [0.0, 1.0])
def test_values_without_spread(reference: float) -> None:
    """Every seed equal: a zero-width interval, equivalent only at the reference."""
    at = decide([reference] * 3, reference=reference, margin=0.1)
    assert at.verdict is Verdict.EQUIVALENT and at.interval == (reference, reference)
    assert decide([reference] * 3, reference=reference).verdict is Verdict.UNDECIDED
    above = decide([reference + 0.05] * 3, reference=reference, margin=0.1)
    assert above.verdict is Verdict.ABOVE and above.mean == reference + 0.05
    summary = decide_summary(reference, 0.0, 4, reference=reference, margin=0.1)
    assert summary.verdict is Verdict.EQUIVALENT


def test_independent_samples_without_spread() -> None:
    tie = decide_independent([1.0, 1.0], [1.0, 1.0, 1.0], margin=0.1)
    assert tie.verdict is Verdict.EQUIVALENT and tie.interval == (0.0, 0.0)
    assert decide_independent([1.0, 1.0], [1.0, 1.0]).verdict is Verdict.UNDECIDED
    gap = decide_independent([2.0, 2.0], [1.0, 1.0], margin=0.1)
    assert gap.verdict is Verdict.ABOVE and gap.interval == (1.0, 1.0)


def test_a_one_seed_word_follows_the_sign() -> None:
    assert decide([0.5]).word("up", "down").startswith("up ")
    assert decide([0.0]).word("up", "down").startswith("down ")
    assert decide([2.0], reference=2.5).word("up", "down").startswith("down ")


def test_interval_text_keeps_lower_case_exponents() -> None:
    assert decide([1e-5]).interval_text() == "1e-05 (n = 1)"
    text = decide([1e-5, 2e-5, 3e-5]).interval_text()
    assert text.startswith("2e-05 [") and "E" not in text


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: decide([], margin=0.1), "^decide needs"),
        (lambda: decide_paired([], [1.0]), "^decide_paired needs"),
        (lambda: decide_paired([1.0], []), "^decide_paired needs"),
        (lambda: decide_paired([1.0], [1.0, 2.0]), "^decide_paired needs two equally"),
        (lambda: decide_independent([], [1.0]), "^decide_independent needs"),
        (lambda: decide_independent([1.0], [math.inf]), "^decide_independent needs"),
        (lambda: decide_independent([1.0, 2.0], [1.0, 3.0], margin=-1.0), "margin"),
        (lambda: decide_summary(1.0, 1.0, 3, margin=0.0), "margin"),
        (lambda: decide([1.0, 2.0], alpha=0.0), "alpha must lie"),
        (lambda: decide([1.0, 2.0], alpha=0.5), "alpha must lie"),
        (lambda: decide_summary(math.nan, 1.0, 3), "finite mean and std"),
        (lambda: decide_summary(1.0, math.nan, 3), "finite mean and std"),
        (lambda: decide_summary(1.0, 1.0, 0), "n >= 1"),
    ],
)
def test_each_bad_input_names_its_entry_point(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
