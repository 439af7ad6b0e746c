"""Run statistics: epochs to a threshold, their summary over seeds, speed-ups, learning-rate choice.

The learning-rate tuning protocol (:func:`search_rates`) trains every key on a
grid of rates, then around its best rate, and keeps the rate that reaches the
threshold first (:func:`best_rate`); runs that can no longer win stop early.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np


def epochs_to(acc: Sequence[float], *, threshold: float = 0.99) -> int | None:
    """The first epoch (1-based) whose accuracy reaches ``threshold``; None if none does."""
    return next((i + 1 for i, a in enumerate(acc) if a >= threshold), None)


def best_rate(accs: dict[float, Sequence[float]], *, threshold: float = 0.99) -> float:
    """The learning rate whose run (per-epoch accuracies) reaches ``threshold`` first.

    Ties, and runs that never reach it, are ranked by the higher final accuracy
    (NaN counts as 0); remaining ties go to the rate listed first.
    """

    def score(lr: float) -> tuple[float, float]:
        hit = epochs_to(accs[lr], threshold=threshold)
        return (math.inf if hit is None else hit, -float(np.nan_to_num(accs[lr][-1])))

    return min(accs, key=score)


def neighbour_rates(
    lr: float, factors: Sequence[float], *, exclude: Sequence[float] = ()
) -> list[float]:
    """``lr`` times each of ``factors``, to 3 significant figures, leaving out the rates in ``exclude``."""
    rates = [float(f"{lr * f:.3g}") for f in factors]
    return [r for r in rates if r not in exclude]


def summarise_epochs(
    accs: Sequence[Sequence[float]], *, threshold: float = 0.99
) -> dict[str, float | int | bool | None]:
    """Epochs to ``threshold`` over seeds: mean, std, how many runs reached it.

    A run that never reaches the threshold counts as its length and makes the
    mean a lower bound (``censored``); the mean is None when no run reaches it.
    """
    hits = [epochs_to(a, threshold=threshold) for a in accs]
    values = [h if h is not None else len(a) for h, a in zip(hits, accs, strict=True)]
    reached = sum(h is not None for h in hits)
    return {
        "mean": float(np.mean(values)) if reached else None,
        "std": float(np.std(values)) if reached else None,
        "n_reached": reached,
        "n_runs": len(accs),
        "censored": reached < len(accs),
        "run_length": max(len(a) for a in accs),
    }


def format_epochs(summary: dict[str, Any]) -> str:
    """A :func:`summarise_epochs` result as text: "never", or "mean ± std" (">" when censored)."""
    if summary["mean"] is None:
        return "never"
    return (
        ">" if summary["censored"] else ""
    ) + f"{summary['mean']:.1f} ± {summary['std']:.1f}"


def speedup(
    base: dict[str, Any], other: dict[str, Any]
) -> dict[str, float | bool | None]:
    """Ratio of mean epochs-to-threshold ``base / other`` with its censoring.

    Runs that did not reach the threshold count as the run length, so the
    ratio is a lower bound when only ``base`` is censored, an upper bound when
    only ``other`` is, and undetermined (None) when ``other`` never reaches it.
    """
    length = base["run_length"]
    b = base["mean"] if base["mean"] is not None else float(length)
    if other["mean"] is None:
        return {"value": None, "lower_bound": False, "upper_bound": False}
    return {
        "value": b / other["mean"],
        "lower_bound": bool(base["censored"] and not other["censored"]),
        "upper_bound": bool(other["censored"] and not base["censored"]),
        "both_censored": bool(base["censored"] and other["censored"]),
    }


def format_speedup(s: dict[str, Any] | None) -> str:
    """A :func:`speedup` result as text, its censoring as a prefix.

    ``">= "`` a lower bound, ``"<= "`` an upper bound, ``"~ "`` both runs cut
    by the run length; ``"n/a"`` when the ratio is undetermined (None).
    """
    if s is None or s["value"] is None:
        return "n/a"
    if s["lower_bound"]:
        prefix = ">= "
    elif s["upper_bound"]:
        prefix = "<= "
    elif s.get("both_censored"):
        prefix = "~ "
    else:
        prefix = ""
    return f"{prefix}{s['value']:.2f}x"


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and (population) standard deviation of ``values``, as floats."""
    return float(np.mean(values)), float(np.std(values))


def format_mean_std(
    values: Sequence[float], *, fmt: str = ".3f", std_fmt: str = ""
) -> str:
    """``"mean ± std"`` of ``values``, with ``fmt`` (and ``std_fmt``, default ``fmt``)."""
    mean, std = mean_std(values)
    return f"{mean:{fmt}} ± {std:{std_fmt or fmt}}"


K = TypeVar("K", bound=Hashable)
Run = dict[str, Any]
# trains (key, lr, give up after) items, in one call; their runs in that order
Train = Callable[[list[tuple[K, float, int | None]]], Sequence[Run]]


@dataclass
class RateSearch(Generic[K]):
    """The learning rates tried per key (e.g. a configuration and a method), and the best.

    A run is a dict with per-epoch accuracies ``"acc"``; ``runs`` maps
    ``(key, lr)`` to it, ``tried`` lists each key's rates (decreasing) and
    ``best`` holds each key's :func:`best_rate` over them.
    """

    threshold: float = 0.99
    runs: dict[tuple[K, float], Run] = field(default_factory=dict)
    tried: dict[K, list[float]] = field(default_factory=dict)
    best: dict[K, float] = field(default_factory=dict)

    def add(
        self,
        plan: Mapping[K, Sequence[float]],
        train: Train[K],
        *,
        give_up: Mapping[K, int | None] | None = None,
    ) -> None:
        """Train every ``(key, lr)`` of ``plan`` in one call of ``train``; update the best rates.

        ``give_up[key]`` goes to ``train`` with each of ``key``'s rates: a run
        that has not reached the threshold by that epoch stops there (missing
        or None: it runs its full length).
        """
        after = give_up or {}
        items = [
            (key, lr, after.get(key)) for key, rates in plan.items() for lr in rates
        ]
        for (key, lr, _), run in zip(items, train(items), strict=True):
            self.runs[(key, lr)] = run
        for key, rates in plan.items():
            self.tried[key] = sorted({*self.tried.get(key, []), *rates}, reverse=True)
            curves = {lr: self.runs[(key, lr)]["acc"] for lr in self.tried[key]}
            self.best[key] = best_rate(curves, threshold=self.threshold)

    def hit(self, key: K, lr: float | None = None) -> int | None:
        """Epochs to the threshold of ``key``'s run at ``lr`` (default: its best rate)."""
        lr = self.best[key] if lr is None else lr
        return epochs_to(self.runs[(key, lr)]["acc"], threshold=self.threshold)

    def final_acc(self, key: K, lr: float | None = None) -> float:
        """Last-epoch accuracy of ``key``'s run at ``lr`` (default: its best rate)."""
        lr = self.best[key] if lr is None else lr
        return float(self.runs[(key, lr)]["acc"][-1])

    def length(self, key: K, lr: float) -> int:
        """The epochs ``key``'s run at ``lr`` trained (fewer than its recipe's when it stopped early)."""
        return len(self.runs[(key, lr)]["acc"])

    def reached(self, key: K) -> bool:
        """Whether any rate tried for ``key`` reached the threshold."""
        return any(self.hit(key, lr) is not None for lr in self.tried[key])


def search_rates(
    train: Train[K],
    keys: Sequence[K],
    grid: Sequence[float],
    factors: Sequence[float],
    *,
    threshold: float = 0.99,
    give_up_first: int | None = None,
) -> RateSearch[K]:
    """The learning-rate tuning protocol: a grid, then a refinement around the best.

    Every key is trained at every rate of ``grid``; then at its best rate times
    each of ``factors`` (:func:`neighbour_rates`, rates of ``grid`` left out),
    and the best of all the rates tried wins (:func:`best_rate`). ``train``
    receives a list of ``(key, lr, give_up_after)``, where a run that has not
    reached ``threshold`` by epoch ``give_up_after`` stops there (None: it
    runs its full length), and returns their runs in that order.

    Runs that can no longer win stop early, which leaves every choice as the
    full-length runs would make it. With ``give_up_first``, the grid's runs
    first give up after that many epochs: a run that has not reached the
    threshold by then cannot beat one that has; a key none of whose grid runs
    reached it trains its grid again at full length (without a hit, the final
    accuracy decides). Each neighbour gives up after its key's best epochs so
    far: later, it would lose.
    """
    search: RateSearch[K] = RateSearch(threshold)
    search.add(
        {key: list(grid) for key in keys},
        train,
        give_up=dict.fromkeys(keys, give_up_first),
    )
    missed = [key for key in keys if not search.reached(key)]
    if give_up_first is not None and missed:
        search.add({key: list(grid) for key in missed}, train)
    refine = {
        key: neighbour_rates(search.best[key], factors, exclude=grid) for key in keys
    }
    search.add(refine, train, give_up={key: search.hit(key) for key in keys})
    return search
