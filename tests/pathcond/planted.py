"""Planted runs and a toy data set for the tests of the PathCond chapters' result assembly."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from wslib.core.data import Dataset
from wslib.pathcond.grid import RunGrid
from wslib.runs.stats import RateSearch

BASE = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10}
RECIPE = {"epochs": 3, "lr": 0.5, "batch_size": 128}
CONFIGS = {
    "const": {"widths": [8, 8], "init_scale": 1.0, "methods": ["baseline", "pathcond"]},
    "low": {
        "widths": [8, 8],
        "init_scale": 0.1,
        "methods": ["baseline", "pathcond", "enorm"],
    },
}
FAST = [0.5, 0.995, 1.0]  # 2 epochs to 0.99
SLOW = [0.5, 0.6, 0.995]  # 3 epochs
NEVER = [0.5, 0.6, 0.7]


def run(acc, test_acc=0.5, loss=None, test_loss=1.0) -> dict:
    loss = loss or [1.0 - a for a in acc]
    return {"acc": acc, "loss": loss, "test_acc": test_acc, "test_loss": test_loss}


def toy_data(n: int = 20) -> Dataset:
    x = torch.zeros(n, 1, 40)
    return Dataset(
        "mnist1d", x, torch.zeros(n, dtype=torch.long), x[:2], x[:2, 0, 0].long(), 10
    )


def empty_grid() -> RunGrid:
    """A grid of :data:`CONFIGS` on :func:`toy_data` with no run yet: tests plant them."""
    return RunGrid(BASE, toy_data(), RECIPE, CONFIGS)


def rate_search(curves: dict[tuple[Hashable, float], list[float]]) -> RateSearch:
    """A finished search (threshold 0.99) in one round: the run of each ``(key, lr)``
    has the accuracies ``curves[(key, lr)]``; each key's rates in the order given."""
    search: RateSearch = RateSearch(0.99)
    plan: dict[Hashable, list[float]] = {}
    for key, lr in curves:
        plan.setdefault(key, []).append(lr)
    search.add(plan, lambda items: [run(curves[key, lr]) for key, lr, _ in items])
    return search
