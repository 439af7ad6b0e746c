"""The tests build and run in their own workspace, never in the reader's folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import READER_FOLDERS, READER_SNAPSHOT, ROOT, WORK, snapshot


@pytest.mark.slow
def test_the_readers_folders_are_untouched(
    smoke_book: Path, student_book: Path, sweep_entries: dict
) -> None:
    """After every other test (it runs last) and every book fixture (smoke
    book, student edition, seeds 0-4), no file under the reader's build/,
    results/, book/_build, book/_student or data/ was added, removed or
    modified since the tests started."""
    assert smoke_book.is_relative_to(WORK) and student_book.is_relative_to(WORK)
    now = snapshot(ROOT)
    changed = sorted(set(now.items()) ^ set(READER_SNAPSHOT.items()))
    assert not changed, f"tests wrote into {READER_FOLDERS}: {changed[:5]}"


def test_the_snapshot_sees_a_change(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    before = snapshot(tmp_path)
    (tmp_path / "data" / "marker").write_text("x")
    assert snapshot(tmp_path) != before
