"""The claims registry and its verdict rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bookkit import gpu_work
from bookkit import ledger as ledger_page
from tests.conftest import NOTEBOOKS, ROOT
from wslib.runs.claim_list import CLAIMS, PAPERS
from wslib.runs.claims import (
    CENSORED,
    FAILS,
    HOLDS,
    NO_EFFECT,
    NOT_RUN,
    THRESHOLD,
    UNDECIDED,
    Claim,
    claim_stats,
    judge,
    ledger,
    looks,
    seeds_needed,
    sequential,
)
from wslib.runs.verdicts import LEDGER_ALPHA

BELOW = Claim("c", "llpf", "x is small", "nb", "x", "<", 0.1)
BEATS = Claim(
    "b", "fusion", "a beats b", "nb", "gap", ">", 0.0, margin=0.05, margin_source="s"
)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.05], UNDECIDED),  # one seed decides nothing
        ([0.05, 0.06, 0.04], HOLDS),
        ([0.15, 0.16, 0.14], FAILS),
        ([0.09, 0.05, 0.13], UNDECIDED),
        ([0.1, 0.1, 0.1], UNDECIDED),  # on the bound, a threshold claim
    ],
)
def test_a_threshold_claim_reads_the_whole_interval(
    values: list[float], expected: str
) -> None:
    assert judge(BELOW, values)[0] == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.5, 0.6, 0.55], HOLDS),
        ([-0.5, -0.6, -0.55], FAILS),
        ([0.01, -0.01, 0.005, -0.004], NO_EFFECT),  # within ± 0.05
        ([0.2, -0.2, 0.1, -0.1], UNDECIDED),
    ],
)
def test_a_comparative_claim_has_four_verdicts(
    values: list[float], expected: str
) -> None:
    assert judge(BEATS, values)[0] == expected


def test_above_rules_are_mirrored() -> None:
    above = Claim("c", "llpf", "x is large", "nb", "x", ">", 1.0)
    assert judge(above, [1.5, 1.4, 1.6])[0] == HOLDS
    assert judge(above, [0.7, 0.72, 0.68])[0] == FAILS


def test_the_ledger_decides_at_its_corrected_level() -> None:
    # t = 3.88 over 5 seeds: decided at 95%, not at the ledger's 98.3%
    values = [0.1, 0.3, 0.2, 0.05, 0.25]
    word, d = judge(Claim("c", "llpf", "x > 0", "nb", "x", ">", 0.0), values)
    assert d.alpha == pytest.approx(LEDGER_ALPHA) == pytest.approx(0.05 / 3)
    assert word == UNDECIDED


def test_looks_at_5_10_and_20_seeds_then_all() -> None:
    assert looks(3) == [3]
    assert looks(5) == [5]
    assert looks(7) == [5, 7]
    assert looks(10) == [5, 10]
    assert looks(20) == [5, 10, 20]
    assert looks(24) == [5, 10, 20, 24]


def test_a_claim_keeps_the_verdict_of_its_first_deciding_look() -> None:
    decided = [0.5, 0.52, 0.48, 0.51, 0.49]  # decided at 5 seeds
    later = [-2.0, 3.0, -1.0, 2.5, -3.0]  # five wild seeds after it
    word, d, n = sequential(BEATS, decided + later)
    assert (word, n, d.n) == (HOLDS, 5, 5)
    word, d, n = sequential(BEATS, later + decided)  # undecided at 5, then 10
    assert (word, n) == (UNDECIDED, 10)


def test_margins_are_constants_of_the_claim_not_of_the_results(tmp_path: Path) -> None:
    """The same claim over two result sets reports its own margin both times,
    whatever the results hold (a "margin" metric, a spread)."""
    for k, spread in enumerate((0.001, 1.0)):
        folder = tmp_path / str(k)
        for seed in range(4):
            path = folder / f"seed-{seed}" / "nb.json"
            path.parent.mkdir(parents=True)
            value = 0.01 + spread * (seed - 1.5)
            metrics = {"gap": value, "margin": 10.0, "gap_std": spread}
            path.write_text(json.dumps({"params": {"seed": seed}, "metrics": metrics}))
        (row,) = ledger(folder, (BEATS,))
        assert row["decision"].margin == 0.05
    assert row["verdict"] == UNDECIDED  # the wide spread: not "no effect"


def test_every_claim_states_its_margin_and_source() -> None:
    for claim in CLAIMS:
        comparative = claim.minus is not None or claim.bound in (0.0, 1.0)
        assert (claim.margin is not None) == (claim.margin_source != THRESHOLD), (
            claim.id
        )
        if comparative and claim.bound in (0.0, 1.0):
            assert claim.margin is not None and claim.margin > 0, claim.id
    assert sum(c.margin is not None for c in CLAIMS) == 29


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
    assert row["decided_at"] == 3


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
    assert "(n = 2; no value at seed 1, 3)" in ledger_page.value_text(row)


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
    # mean 0.8, std 0.4: the ledger's (98.3%) half-width t(n-1) 0.4 / sqrt(n)
    # drops below the gap 0.2 first at n = 27 (0.1970); at n = 26 it is 0.2013
    stats = {"n": 3, "mean": 0.8, "std": 0.4}
    assert seeds_needed(claim, stats) == 27
    assert seeds_needed(claim, {**stats, "mean": 1.0}) is None  # on the bound
    assert seeds_needed(claim, {**stats, "std": 40.0}) is None  # beyond MAX_SEEDS


def test_an_undecided_ledger_row_carries_its_power_estimate(tmp_path: Path) -> None:
    for seed, x in ((0, 0.02), (1, -0.02), (2, 0.06)):
        path = tmp_path / f"seed-{seed}" / "nb.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"params": {"seed": seed}, "metrics": {"x": x}}))
    (row,) = ledger(tmp_path, (BELOW,))
    assert row["verdict"] == UNDECIDED
    assert row["seeds_needed"] == seeds_needed(BELOW, row["stats"]) > 3


@pytest.mark.parametrize("profile", ["smoke", "gpu-smoke", "gpu"])
def test_every_profile_runs_the_architectures_its_claims_read(profile):
    """A claim that reads ``<arch>/...`` of a chapter's ``models`` in the cpu profile
    finds that architecture in every profile (else its row would be censored)."""
    params_file = ROOT / "notebooks" / "params" / f"{profile}.yaml"
    chapters = sorted({claim.chapter for claim in CLAIMS})  # read each chapter once
    cpu = {
        ch: gpu_work.chapter_params(ch, ROOT / "notebooks/params/cpu.yaml")
        for ch in chapters
    }
    own = {ch: gpu_work.chapter_params(ch, params_file) for ch in chapters}
    missing = []
    for claim in CLAIMS:
        models = cpu[claim.chapter].get("models")
        if not isinstance(models, dict):
            continue
        other = own[claim.chapter].get("models", {})
        for metric in filter(None, (claim.metric, claim.minus, claim.per)):
            arch = metric.split("/")[0]
            if arch in models and arch not in other:
                missing.append(f"{claim.id}: {claim.chapter} has no model {arch!r}")
    assert not missing, missing
