"""bookkit/engine.py: a running notebook's copy is written at most every
SAVE_EVERY seconds, and always when it ends."""

from __future__ import annotations

import datetime
from pathlib import Path

import nbformat
import pytest

from bookkit import engine

START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture()
def writes(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times (s after START) at which papermill's record wrote its copy."""
    written: list[float] = []

    def save(self: engine.NotebookExecutionManager, **_: object) -> None:
        written.append((self.now() - START).total_seconds())
        self.last_save_time = self.now()

    monkeypatch.setattr(engine.NotebookExecutionManager, "save", save)
    return written


def record_with_clock(folder: Path) -> tuple[engine.SparseSaves, list[float]]:
    """A record whose clock reads ``clock[0]`` seconds after START (set to 0)."""
    clock = [0.0]
    notebook = nbformat.v4.new_notebook(metadata={"papermill": {}})  # as papermill's
    record = engine.SparseSaves(notebook, output_path=str(folder), progress_bar=False)
    record.now = lambda: START + datetime.timedelta(seconds=clock[0])
    record.last_save_time = record.now()
    return record, clock


def test_a_save_within_save_every_of_the_last_is_skipped(
    writes: list[float], tmp_path: Path
) -> None:
    step = engine.SAVE_EVERY
    record, clock = record_with_clock(tmp_path)
    for clock[0] in (0.5, step - 0.1, step, step + 1.0, 2 * step - 0.1, 2 * step):
        record.save()
    assert writes == [step, 2 * step]


def test_the_end_of_a_notebook_is_always_written(
    writes: list[float], tmp_path: Path
) -> None:
    """However it ended: the copy of a notebook whose kernel died has no other write."""
    record, clock = record_with_clock(tmp_path)
    record.notebook_start()
    clock[0] = 1.0
    record.notebook_complete()
    assert writes == [1.0]


def test_the_engine_is_registered_under_its_name() -> None:
    registered = engine.papermill_engines.get_engine(engine.NAME)
    assert registered is engine.ChapterEngine
