"""Fixtures of the PathCond tests: a trainable toy grid and a recorder of its jobs."""

from __future__ import annotations

import pytest

from tests.pathcond.toy import BASE, CONFIGS, RECIPE, toy_data
from wslib.pathcond import grid
from wslib.pathcond.grid import RunGrid


@pytest.fixture
def toy_grid() -> RunGrid:
    return RunGrid(BASE, toy_data(), RECIPE, CONFIGS, cache_dir=None, workers=1)


@pytest.fixture
def fake_jobs(monkeypatch: pytest.MonkeyPatch) -> list[list[dict]]:
    """Replace train_runs by a recorder returning the job's arguments as its run."""
    calls: list[list[dict]] = []

    def train_runs(jobs, workers=None, desc="runs", stack=None):
        calls.append(list(jobs))
        return [{**job, "acc": [job["recipe"].lr]} for job in jobs]

    monkeypatch.setattr(grid, "train_runs", train_runs)
    return calls
