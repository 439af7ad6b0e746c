"""bookkit/engine.py: a running notebook's copy is written at most every SAVE_EVERY s."""

from __future__ import annotations

import datetime
from pathlib import Path

import nbformat
import pytest

from bookkit import engine


@pytest.fixture()
def writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The times (s) at which papermill's record wrote its copy."""
    written: list[float] = []

    def save(self: engine.NotebookExecutionManager, **_: object) -> None:
        written.append((self.now() - START).total_seconds())
        self.last_save_time = self.now()

    monkeypatch.setattr(engine.NotebookExecutionManager, "save", save)
    return written


START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_a_save_within_save_every_of_the_last_is_skipped(
    writes: list[float], tmp_path: Path
) -> None:
    step = engine.SAVE_EVERY
    clock = [0.0]
    record = engine.SparseSaves(
        nbformat.v4.new_notebook(), output_path=str(tmp_path), progress_bar=False
    )
    record.now = lambda: START + datetime.timedelta(seconds=clock[0])
    record.last_save_time = record.now()
    for clock[0] in (0.5, step - 0.1, step, step + 1.0, 2 * step - 0.1, 2 * step):
        record.save()
    assert writes == [step, 2 * step]


def test_the_engine_is_registered_under_its_name() -> None:
    registered = engine.papermill_engines.get_engine(engine.NAME)
    assert registered is engine.ChapterEngine
