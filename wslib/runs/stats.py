"""Run statistics: epochs to a threshold, their summary over seeds, speed-ups, learning-rate choice."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def epochs_to(acc: Sequence[float], threshold: float = 0.99) -> int | None:
    """The first epoch (1-based) whose accuracy reaches ``threshold``; None if none does."""
    return next((i + 1 for i, a in enumerate(acc) if a >= threshold), None)


def best_rate(accs: dict[float, Sequence[float]], threshold: float = 0.99) -> float:
    """The learning rate whose run (per-epoch accuracies) reaches ``threshold`` first.

    Ties, and runs that never reach it, are ranked by the higher final accuracy
    (NaN counts as 0); remaining ties go to the rate listed first.
    """

    def score(lr: float) -> tuple[float, float]:
        hit = epochs_to(accs[lr], threshold)
        return (math.inf if hit is None else hit, -float(np.nan_to_num(accs[lr][-1])))

    return min(accs, key=score)


def neighbour_rates(
    lr: float, factors: Sequence[float], exclude: Sequence[float] = ()
) -> list[float]:
    """``lr`` times each of ``factors``, to 3 significant figures, leaving out the rates in ``exclude``."""
    rates = [float(f"{lr * f:.3g}") for f in factors]
    return [r for r in rates if r not in exclude]


def summarise_epochs(
    accs: Sequence[Sequence[float]], threshold: float = 0.99
) -> dict[str, float | int | bool | None]:
    """Epochs to ``threshold`` over seeds: mean, std, how many runs reached it.

    A run that never reaches the threshold counts as its length and makes the
    mean a lower bound (``censored``); the mean is None when no run reaches it.
    """
    hits = [epochs_to(a, threshold) for a in accs]
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
