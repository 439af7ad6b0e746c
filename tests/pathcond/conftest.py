"""Fixtures of the PathCond tests: a trainable toy grid, a recorder of its jobs and
chapter 6's lifted network."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.pathcond.tiny import LIFTED
from tests.pathcond.toy import BASE, CONFIGS, RECIPE, toy_data
from wslib.pathcond import grid
from wslib.pathcond.ch06_pathlifting import TinyLifting, tiny_lifting
from wslib.pathcond.grid import RunGrid


@pytest.fixture
def toy_grid() -> RunGrid:
    return RunGrid(BASE, toy_data(), RECIPE, CONFIGS, cache_dir=None, workers=1)


def given(settings: Any) -> dict[str, Any]:
    """A run's settings by field name (a stand-in run reports them)."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}


@pytest.fixture
def fake_jobs(monkeypatch: pytest.MonkeyPatch) -> list[list[dict]]:
    """Replace train_runs by a recorder of each job's settings (by field name),
    which it also returns as the job's run, with the rate as its accuracy."""
    calls: list[list[dict]] = []

    def train_runs(jobs, workers=None, desc="runs", stack=None):
        calls.append([given(job["settings"]) for job in jobs])
        return [{**run, "acc": [run["recipe"].lr]} for run in calls[-1]]

    monkeypatch.setattr(grid, "train_runs", train_runs)
    return calls


@pytest.fixture(scope="module")
def lifted() -> TinyLifting:
    """:data:`~tests.pathcond.tiny.LIFTED` badly scaled (spread 1, seed 0), then
    rescaled by PathCond, both lifted explicitly."""
    return tiny_lifting(LIFTED, spread=1.0, seed=0)
