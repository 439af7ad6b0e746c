"""Edges of the tuning statistics, the seed summaries and the ledger that the
main tests leave open: a threshold passed through, censoring flags, files
without a field, seed order, the power estimate at its limits.

Written against mutmut's survivors of ``wslib/runs`` (``make mutation``;
``equivalent_mutants.yaml`` lists those that change no behaviour).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from wslib.runs.claims import (
    LEDGER_ALPHA,
    MAX_SEEDS,
    NOT_RUN,
    Claim,
    claim_stats,
    ledger,
    seeds_needed,
)
from wslib.runs.stats import (
    RateSearch,
    best_rate,
    format_mean_std,
    speedup,
    summarise_epochs,
)
from wslib.runs.sweeps import (
    scalar_metrics,
    seed_results,
    summarise_seeds,
    write_summary,
)

SLOW, FAST = [0.2, 0.6, 0.7], [0.6, 0.65, 0.66]  # reach 0.5 at epochs 2 and 1


def test_a_lower_threshold_reaches_every_function() -> None:
    assert best_rate({0.1: SLOW, 0.2: FAST}, threshold=0.5) == 0.2
    assert best_rate({0.1: SLOW, 0.2: FAST}) == 0.1  # neither reaches 0.99: final acc
    summary = summarise_epochs([SLOW, FAST], threshold=0.5)
    assert summary["mean"] == 1.5 and summary["n_reached"] == 2
    search: RateSearch[str] = RateSearch(threshold=0.5)
    search.add({"k": [0.1, 0.2]}, lambda items: [{"acc": SLOW}, {"acc": FAST}])
    assert search.best["k"] == 0.2 and search.hit("k") == 1 and search.reached("k")
    default: RateSearch[str] = RateSearch()  # 0.99: the higher final accuracy wins
    default.add({"k": [0.1, 0.2]}, lambda items: [{"acc": SLOW}, {"acc": FAST}])
    assert default.best["k"] == 0.1 and not default.reached("k")


def test_no_run_reaching_the_threshold_has_no_spread() -> None:
    summary = summarise_epochs([SLOW, FAST])
    assert summary["mean"] is None and summary["std"] is None
    assert summary["censored"] and summary["run_length"] == 3


def test_speedup_flags() -> None:
    never = summarise_epochs([SLOW])
    reached = summarise_epochs([FAST], threshold=0.5)
    assert speedup(reached, never) == {
        "value": None,
        "lower_bound": False,
        "upper_bound": False,
    }
    censored = {"mean": 3.0, "censored": True, "run_length": 3}
    clean = {"mean": 1.5, "censored": False, "run_length": 3}
    s = speedup(censored, clean)
    assert s["lower_bound"] and not s["upper_bound"] and not s["both_censored"]
    s = speedup(clean, censored)
    assert s["upper_bound"] and not s["lower_bound"] and not s["both_censored"]
    assert speedup(censored, censored)["both_censored"]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_mean_std_text_keeps_lower_case() -> None:
    assert format_mean_std([math.inf, math.inf]) == "inf ± nan"


def test_scalar_metrics_keep_names_as_written() -> None:
    assert dict(scalar_metrics({"loss/X": {"maxX": 2}})) == {"loss/X/maxX": 2.0}


def write(path: Path, content: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


def test_a_results_file_without_a_seed_is_named(tmp_path: Path) -> None:
    write(tmp_path / "nb.json", {"metrics": {"a": 1.0}})
    with pytest.raises(
        ValueError, match=r"nb.json: its params.seed is None \(seed must be an integer"
    ):
        seed_results(tmp_path, "nb")


def test_results_without_metrics_are_read(tmp_path: Path) -> None:
    write(tmp_path / "seed-1" / "nb.json", {"params": {"seed": 1}})  # no metrics
    write(tmp_path / "seed-2" / "nb.json", {"params": {"seed": 2}, "metrics": {"a": 2}})
    assert list(seed_results(tmp_path, "nb")) == [1, 2]
    summarised = summarise_seeds(tmp_path, "nb")
    assert summarised["notebook"] == "nb" and summarised["seeds"] == [1, 2]
    assert summarised["metrics"]["a"]["values"] == {"2": 2.0}
    path = write_summary(tmp_path, "nb")
    assert path is not None and json.loads(path.read_text()) == summarised


def test_a_results_file_of_the_wrong_type_names_it_and_the_fix(tmp_path: Path) -> None:
    write(tmp_path / "nb.json", [1, 2])
    with pytest.raises(ValueError) as error:
        seed_results(tmp_path, "nb")
    assert "(a JSON list); delete it and run the chapter again" in str(error.value)
    assert str(error.value).endswith("(make notebook NB=... SEED=...)")


def test_an_unreadable_results_file_names_it_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "nb.json").write_text("{not json")
    with pytest.raises(ValueError) as error:
        seed_results(tmp_path, "nb")
    assert "; delete it and run the chapter again" in str(error.value)
    assert str(error.value).endswith("(make notebook NB=... SEED=...)")


def claim(**kw: object) -> Claim:
    fields = {"id": "c", "paper": "p", "text": "t", "chapter": "nb", "metric": "m"}
    return Claim(**(fields | {"op": ">", "bound": 0.0} | kw))  # type: ignore[arg-type]


def test_satisfied_is_strict_on_each_side() -> None:
    above, below = claim(op=">", bound=1.0), claim(op="<", bound=1.0)
    assert above.satisfied(1.5) and not above.satisfied(1.0)
    assert not above.satisfied(0.5)
    assert below.satisfied(0.5) and not below.satisfied(1.0)
    assert not below.satisfied(1.5)


def test_claim_stats_without_values_or_partner_metrics() -> None:
    metrics = {"m": {"values": {"10": 1.0, "2": 3.0}}, "d": {}}  # seed order, not value
    assert list(claim_stats(claim(), metrics)["values"]) == ["2", "10"]
    assert claim_stats(claim(minus="absent"), metrics) is None
    assert claim_stats(claim(minus="d"), metrics) is None
    assert claim_stats(claim(per="absent"), metrics) is None
    assert claim_stats(claim(per="d"), metrics) is None


def reference_seeds_needed(gap: float, std: float, n_seen: int) -> int | None:
    """The power estimate by its definition, over every n from the seeds seen."""
    for n in range(max(2, n_seen), MAX_SEEDS + 1):
        half = scipy_stats.t.ppf(1 - LEDGER_ALPHA / 2, n - 1) * std / math.sqrt(n)
        if half < gap:
            return n
    return None


def half_width(n: int) -> float:
    return float(scipy_stats.t.ppf(1 - LEDGER_ALPHA / 2, n - 1) / math.sqrt(n))


@pytest.mark.parametrize(
    ("gap", "n_seen"),
    [
        (1.0, 3),  # a gap of exactly 1
        (50.0, 2),  # decided at the first n
        (50.0, 5),  # never fewer seeds than were seen
        (0.9, 3),
        (0.3, 5),  # where the degrees of freedom matter
        (half_width(MAX_SEEDS) * 1.000001, 5),  # needs exactly MAX_SEEDS
        (half_width(MAX_SEEDS + 1) * 1.000001, 5),  # needs one more: None
    ],
)
def test_seeds_needed_by_its_definition(gap: float, n_seen: int) -> None:
    stats = {"mean": 0.5 + gap, "std": 1.0, "n": n_seen}
    expected = reference_seeds_needed(gap, 1.0, n_seen)
    assert seeds_needed(claim(bound=0.5), stats) == expected


def test_seeds_needed_without_spread_or_gap() -> None:
    assert seeds_needed(claim(bound=0.5), {"mean": 1.5, "std": 0.0, "n": 3}) is None
    assert seeds_needed(claim(bound=0.5), {"mean": 0.5, "std": 1.0, "n": 3}) is None


def test_a_claim_not_run_keeps_its_row(tmp_path: Path) -> None:
    (row,) = ledger(tmp_path, (claim(),))
    assert row["claim"] == claim() and row["stats"] is None
    assert row["verdict"] == NOT_RUN
    assert row["decision"] is None and row["decided_at"] is None


# --- the ledger never mixes or drops runs silently --------------------------------------------


def _run(folder: Path, seed: int, value: float, finished: float, **params) -> None:
    name = "nb.json"
    code = params.pop("code", "c1")
    write(
        folder / name,
        {
            "params": {"seed": seed, "results_path": str(folder / name), **params},
            "code": code,
            "metrics": {"a": value},
            "finished": finished,
        },
    )


@pytest.mark.parametrize("seed", ["1", 1.0, True, None])
def test_a_seed_that_is_no_integer_is_named_not_dropped(tmp_path: Path, seed) -> None:
    write(
        tmp_path / "seed-1" / "nb.json", {"params": {"seed": seed}, "metrics": {"a": 1}}
    )
    with pytest.raises(
        ValueError, match=r"its params.seed is .* \(seed must be an integer"
    ):
        summarise_seeds(tmp_path, "nb")


def test_a_file_in_another_seed_s_folder_is_named(tmp_path: Path) -> None:
    _run(tmp_path / "seed-2", 3, 0.1, 1.0)
    with pytest.raises(ValueError, match="it records seed 3, not 2"):
        seed_results(tmp_path, "nb")


@pytest.mark.parametrize("default_newer", [True, False])
def test_of_two_runs_of_one_seed_the_newer_counts(
    tmp_path: Path, default_newer
) -> None:
    """A fresh ``make notebook`` run of seed 0 after a sweep is not hidden by the
    sweep's older ``seed-0`` file (nor the other way round)."""
    _run(tmp_path, 0, 0.301, 20.0 if default_newer else 10.0)
    _run(tmp_path / "seed-0", 0, 0.254, 10.0 if default_newer else 20.0)
    value = summarise_seeds(tmp_path, "nb")["metrics"]["a"]["values"]["0"]
    assert value == (0.301 if default_newer else 0.254)


@pytest.mark.parametrize(
    ("change", "why"),
    [({"lr": 0.1}, "other parameters"), ({"code": "c2"}, "other code")],
)
def test_runs_of_another_setting_are_left_out_and_named(
    tmp_path: Path, change, why
) -> None:
    """After a change, the newest run's setting counts; the others are named."""
    _run(tmp_path / "seed-0", 0, 0.25, 10.0, lr=0.05)
    _run(tmp_path / "seed-1", 1, 0.26, 11.0, lr=0.05)
    newer = {"lr": 0.05, **change}
    _run(tmp_path, 0, 0.30, 30.0, **newer)  # seed 0 again, with the change
    with pytest.warns(UserWarning, match=rf"seeds \[1\] are left out.*{why}"):
        summary = summarise_seeds(tmp_path, "nb")
    assert summary["metrics"]["a"]["values"] == {"0": 0.30}
    assert summary["left_out"] == {"1": why}
    assert summary["seeds"] == [0]


def test_files_without_a_finish_time_are_ordered_by_their_file_time(
    tmp_path: Path,
) -> None:
    import os

    write(tmp_path / "nb.json", {"params": {"seed": 0}, "metrics": {"a": 1.0}})
    write(
        tmp_path / "seed-0" / "nb.json", {"params": {"seed": 0}, "metrics": {"a": 2.0}}
    )
    os.utime(tmp_path / "nb.json", (100, 100))
    os.utime(tmp_path / "seed-0" / "nb.json", (50, 50))
    assert summarise_seeds(tmp_path, "nb")["metrics"]["a"]["values"] == {"0": 1.0}


def test_a_negative_seed_is_named(tmp_path: Path) -> None:
    write(tmp_path / "nb.json", {"params": {"seed": -1}, "metrics": {"a": 1}})
    with pytest.raises(
        ValueError, match=r"its params.seed is -1 \(seed must be a whole number"
    ):
        summarise_seeds(tmp_path, "nb")
