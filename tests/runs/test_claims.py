"""The claims registry and its verdict rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import NOTEBOOKS, load_script
from wslib.runs.claims import (
    CENSORED,
    CLAIMS,
    FAILS,
    HOLDS,
    MIXED,
    NOT_RUN,
    PAPERS,
    Claim,
    claim_stats,
    ledger,
    seeds_needed,
    verdict,
)

BELOW = Claim("c", "llpf", "x is small", "nb", "x", "<", 0.1)


def stats(mean: float, low: float | None = None, high: float | None = None) -> dict:
    if low is None:
        return {"n": 1, "mean": mean, "std": None, "ci95": None}
    return {"n": 3, "mean": mean, "std": 1.0, "ci95": [low, high]}


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (None, NOT_RUN),
        (stats(0.05), HOLDS),
        (stats(0.15), FAILS),
        (stats(0.05, 0.02, 0.08), HOLDS),
        (stats(0.15, 0.12, 0.18), FAILS),
        (stats(0.09, 0.05, 0.13), MIXED),
    ],
)
def test_verdict_reads_the_whole_interval(summary: dict | None, expected: str) -> None:
    assert verdict(BELOW, summary) == expected


def test_above_rules_are_mirrored() -> None:
    above = Claim("c", "llpf", "x is large", "nb", "x", ">", 1.0)
    assert verdict(above, stats(1.5, 1.2, 1.8)) == HOLDS
    assert verdict(above, stats(0.9, 0.8, 0.95)) == FAILS
    assert verdict(above, stats(1.0, 0.9, 1.1)) == MIXED


def test_a_ratio_claim_divides_seed_by_seed() -> None:
    claim = Claim("r", "llpf", "a/b small", "nb", "a", "<", 0.5, per="b")
    metrics = {
        "a": {"values": {"0": 1.0, "1": 3.0}},
        "b": {"values": {"0": 4.0, "1": 4.0}},
    }
    result = claim_stats(claim, metrics)
    assert result["values"] == {"0": 0.25, "1": 0.75}
    assert result["mean"] == 0.5
    assert claim_stats(claim, {}) is None


def test_ledger_reads_every_seed_present(tmp_path: Path) -> None:
    for seed, x in ((0, 0.01), (1, 0.02), (2, 0.03)):
        path = tmp_path / f"seed-{seed}" / "nb.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"params": {"seed": seed}, "metrics": {"x": x}}))
    (row,) = ledger(tmp_path, (BELOW,))
    assert row["stats"]["n"] == 3
    assert row["verdict"] == HOLDS


def test_the_ledger_names_the_seed_that_lacks_a_value(tmp_path: Path) -> None:
    values = {0: 0.01, 1: float("nan"), 2: 0.03, 3: None}
    for seed, x in values.items():
        path = tmp_path / f"seed-{seed}" / "nb.json"
        path.parent.mkdir()
        metrics = {} if x is None else {"x": x}
        path.write_text(json.dumps({"params": {"seed": seed}, "metrics": metrics}))
    (row,) = ledger(tmp_path, (BELOW,))
    assert row["stats"]["n"] == 2
    assert row["stats"]["missing"] == [1, 3]
    ledger_page = load_script("book/ledger.py")
    assert "(n = 2; no value at seed 1, 3)" in ledger_page.value_text(row["stats"])


def test_a_garbage_results_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "seed-4").mkdir()
    (tmp_path / "seed-4" / "nb.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"seed-4/nb.json is not a results file"):
        ledger(tmp_path, (BELOW,))


def test_a_null_metric_of_a_chapter_that_ran_is_censored(tmp_path: Path) -> None:
    path = tmp_path / "nb.json"
    path.write_text(json.dumps({"params": {"seed": 0}, "metrics": {"x": None}}))
    (row,) = ledger(tmp_path, (BELOW,))
    assert row["verdict"] == CENSORED
    (row,) = ledger(tmp_path / "other-profile", (BELOW,))
    assert row["verdict"] == NOT_RUN


def test_the_registry_is_well_formed() -> None:
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids))
    assert {c.paper for c in CLAIMS} <= set(PAPERS)
    assert {c.chapter for c in CLAIMS} <= set(NOTEBOOKS)
    assert all(c.op in "<>" for c in CLAIMS)


def test_a_difference_claim_subtracts_seed_by_seed() -> None:
    claim = Claim("d", "fusion", "a beats b", "nb", "a", ">", 0.0, minus="b")
    metrics = {"a": {"values": {"0": 0.9, "1": 0.7}}, "b": {"values": {"0": 0.5}}}
    result = claim_stats(claim, metrics)
    assert result["values"] == pytest.approx({"0": 0.4})
    assert claim.quantity == "a - b"


def test_seeds_needed_is_the_first_interval_clear_of_the_bound() -> None:
    claim = Claim("p", "llpf", "x is small", "nb", "x", "<", 1.0)
    # mean 0.8, std 0.4: the t-interval half-width t(n-1) 0.4 / sqrt(n) drops
    # below the gap 0.2 first at n = 18 (t = 2.110: 0.199); at n = 17 it is 0.206
    stats = {"n": 3, "mean": 0.8, "std": 0.4}
    assert seeds_needed(claim, stats) == 18
    assert seeds_needed(claim, {**stats, "mean": 1.0}) is None  # on the bound
    assert seeds_needed(claim, {**stats, "std": 40.0}) is None  # beyond MAX_SEEDS


def test_a_mixed_ledger_row_carries_its_power_estimate(tmp_path: Path) -> None:
    for seed, x in ((0, 0.02), (1, -0.02), (2, 0.06)):
        path = tmp_path / f"seed-{seed}" / "nb.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"params": {"seed": seed}, "metrics": {"x": x}}))
    (row,) = ledger(tmp_path, (BELOW,))
    assert row["verdict"] == MIXED
    assert row["seeds_needed"] == seeds_needed(BELOW, row["stats"]) > 3
