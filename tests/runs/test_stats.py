"""Run statistics: epochs to a threshold, summaries, speed-ups, the learning-rate search."""

from __future__ import annotations

import math

import pytest

from wslib.runs.stats import (
    RateSearch,
    best_rate,
    epochs_to,
    format_epochs,
    format_mean_std,
    format_speedup,
    mean_std,
    neighbour_rates,
    search_rates,
    speedup,
    summarise_epochs,
)

REACHED = [0.5, 0.995, 1.0]  # reaches 0.99 at epoch 2
MISSED = [0.5, 0.6, 0.7]


def test_epochs_to_is_one_based_and_none_when_never():
    assert epochs_to(REACHED) == 2
    assert epochs_to([0.99]) == 1
    assert epochs_to(MISSED) is None
    assert epochs_to(MISSED, threshold=0.6) == 2


def test_summarise_and_format_epochs_mark_censored_runs():
    assert format_epochs(summarise_epochs([REACHED, REACHED])) == "2.0 ± 0.0"
    assert format_epochs(summarise_epochs([REACHED, MISSED])) == ">2.5 ± 0.5"
    assert format_epochs(summarise_epochs([MISSED])) == "never"
    summary = summarise_epochs([REACHED, MISSED])
    assert summary["n_reached"] == 1 and summary["n_runs"] == 2
    assert summary["censored"] and summary["run_length"] == 3


def test_best_rate_prefers_fewest_epochs_then_final_accuracy():
    runs = {1.0: [0.5, 0.99, 0.99], 0.1: [0.99, 0.5, 0.5], 0.01: [0.3, 0.4, 0.8]}
    assert best_rate(runs) == 0.1
    tie = {1.0: [0.99, 0.991], 0.1: [0.99, 0.995]}
    assert best_rate(tie) == 0.1
    never = {1.0: [0.2, float("nan")], 0.1: [0.2, 0.4], 0.01: [0.2, 0.3]}
    assert best_rate(never) == 0.1


def test_neighbour_rates_round_and_skip_rates_already_tried():
    assert neighbour_rates(0.003, [10**0.25, 10**-0.25]) == [0.00533, 0.00169]
    assert neighbour_rates(1.0, [10**0.5, 10**-0.5], exclude=[3.16]) == [0.316]


def test_speedup_and_its_text_carry_the_censoring():
    fast, slow = summarise_epochs([REACHED]), summarise_epochs([[0.5, 0.6, 0.995]])
    never = summarise_epochs([MISSED])
    plain = speedup(slow, fast)
    assert plain["value"] == pytest.approx(1.5)
    assert format_speedup(plain) == "1.50x"
    assert format_speedup(speedup(never, fast)) == ">= 1.50x"  # base cut: lower bound
    assert format_speedup(speedup(fast, summarise_epochs([REACHED, MISSED]))) == (
        "<= 0.80x"
    )
    both = speedup(
        summarise_epochs([REACHED, MISSED]), summarise_epochs([MISSED, REACHED])
    )
    assert both["both_censored"] and format_speedup(both) == "~ 1.00x"
    assert format_speedup(speedup(fast, never)) == "n/a"
    assert format_speedup(None) == "n/a"


def test_mean_std_and_its_text():
    assert mean_std([1.0, 3.0]) == (2.0, 1.0)
    assert all(type(v) is float for v in mean_std([1, 2]))
    assert format_mean_std([1.0, 3.0]) == "2.000 ± 1.000"
    assert (
        format_mean_std([0.123456, 0.123456], fmt=".4g", std_fmt=".2g") == "0.1235 ± 0"
    )


def _curve(epochs_needed: int, length: int = 10, final: float = 0.5) -> list[float]:
    """An accuracy curve that reaches 0.99 at ``epochs_needed`` (never if > length)."""
    return [0.995 if e >= epochs_needed else final for e in range(1, length + 1)]


def _fake_training(optimum: float, calls: list, length: int = 10):
    """Runs whose epochs to 0.99 grow with the distance of log10(lr) from ``optimum``.

    Each run honours its ``give_up_after``: cut there unless it reached 0.99.
    """

    def train(items):
        calls.append(list(items))
        runs = []
        for _, lr, give_up in items:
            needed = 1 + round(4 * abs(math.log10(lr) - math.log10(optimum)))
            acc = _curve(needed, length)
            stop = needed if needed <= length else length
            if give_up is not None:
                stop = min(stop, give_up)
            runs.append({"acc": acc[:stop]})
        return runs

    return train


def test_search_rates_trains_the_grid_then_the_neighbours_of_the_best():
    calls: list = []
    keys = [("a", "baseline"), ("a", "pathcond")]
    search = search_rates(
        _fake_training(0.06, calls), keys, [1.0, 0.1, 0.01], [10**0.25, 10**-0.25]
    )
    assert len(calls) == 2  # one call per round
    assert calls[0] == [(k, lr, None) for k in keys for lr in (1.0, 0.1, 0.01)]
    # each neighbour gives up after its key's best epochs so far (0.1: 2)
    assert calls[1] == [(k, lr, 2) for k in keys for lr in (0.178, 0.0562)]
    for key in keys:
        assert search.tried[key] == [1.0, 0.178, 0.1, 0.0562, 0.01]
        assert search.best[key] == 0.0562  # refinement moved the best rate
        assert search.hit(key) == 1 and search.hit(key, 1.0) == 6
        assert search.reached(key)


def test_search_rates_skips_neighbours_that_are_on_the_grid():
    calls: list = []
    search = search_rates(
        _fake_training(0.1, calls), ["k"], [1.0, 0.316, 0.1], [10**0.5, 10**-0.5]
    )
    assert calls[1] == [("k", 0.0316, 1)]  # 0.1 * 10**0.5 = 0.316 is on the grid
    # the neighbour tried is worse: the grid's best stays
    assert search.best["k"] == 0.1


@pytest.mark.parametrize("optimum", [0.06, 0.3, 0.0011, 3.0, 1e-5])
@pytest.mark.parametrize("give_up_first", [1, 3, 5, 10])
def test_giving_up_changes_no_choice_and_saves_epochs(optimum, give_up_first):
    grid, factors = [1.0, 0.1, 0.01, 0.001], [10**0.25, 10**-0.25]
    keys = ["k", "j"]

    def search(give_up: int | None) -> tuple[RateSearch[str], int]:
        calls: list = []
        train = _fake_training(optimum, calls, length=12)
        result = search_rates(train, keys, grid, factors, give_up_first=give_up)
        epochs = sum(len(r["acc"]) for r in result.runs.values())
        return result, epochs

    (full, full_epochs), (cut, cut_epochs) = search(None), search(give_up_first)
    assert cut.best == full.best and cut.tried == full.tried
    for key in keys:
        assert cut.hit(key) == full.hit(key)
        assert cut.final_acc(key) == full.final_acc(key)
        for lr in cut.tried[key]:  # a run that gave up would not have won
            if cut.hit(key, lr) is None:
                assert cut.length(key, lr) >= (cut.hit(key) or 0)
    assert cut_epochs <= full_epochs


def test_a_key_without_a_hit_by_the_give_up_epoch_trains_its_grid_at_full_length():
    calls: list = []
    train = _fake_training(1e-9, calls, length=12)  # no rate reaches 0.99
    search = search_rates(train, ["k"], [1.0, 0.1], [2.0], give_up_first=3)
    assert [c[2] for c in calls[0]] == [3, 3]
    assert calls[1] == [("k", 1.0, None), ("k", 0.1, None)]
    assert all(search.length("k", lr) == 12 for lr in (1.0, 0.1))
    assert calls[2] == [("k", 2.0, None)]  # no best epoch: the neighbour runs fully


def test_a_grid_hit_before_the_give_up_epoch_cuts_the_slower_rates():
    calls: list = []
    train = _fake_training(0.1, calls, length=12)
    search = search_rates(train, ["k"], [1.0, 0.1, 0.001], [], give_up_first=4)
    assert len(calls) == 2  # no second grid round: 0.1 reached it
    assert search.length("k", 0.001) == 4 and search.hit("k", 0.001) is None
    assert search.best["k"] == 0.1


def test_rate_search_without_a_hit_ranks_by_final_accuracy():
    search: RateSearch[str] = RateSearch(0.99)

    def train(items):
        return [{"acc": [0.1, 0.2 + lr]} for _, lr, _ in items]

    search.add({"k": [0.1, 0.3, 0.2]}, train)
    assert search.tried["k"] == [0.3, 0.2, 0.1]
    assert search.best["k"] == 0.3
    assert search.hit("k") is None and not search.reached("k")
    assert search.final_acc("k") == pytest.approx(0.5)
    assert search.final_acc("k", 0.1) == pytest.approx(0.3)


def test_rate_search_add_rejects_a_wrong_number_of_runs():
    search: RateSearch[str] = RateSearch()
    with pytest.raises(ValueError):
        search.add({"k": [0.1, 0.2]}, lambda items: [{"acc": [1.0]}])
