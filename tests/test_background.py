"""The background jobs of the test session (:mod:`tests.background`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.background import Background


def test_nothing_queued_makes_no_folder():
    """A session whose tests read no background job starts no thread and
    leaves nothing in the temporary folder."""
    jobs = Background({"a": lambda folder: 1})
    jobs.start([])
    assert jobs.root is None
    jobs.stop()


def test_jobs_queued_apart_share_one_folder_and_stop_removes_it():
    """A job queued after the first one ended runs in the same temporary
    folder, each in a subfolder of its own, and ``stop`` removes all of it."""
    jobs = Background({"a": lambda folder: folder, "b": lambda folder: folder})
    first = jobs.result("a")
    thread = jobs._thread
    if thread is not None:  # let the first thread end: "b" then starts another
        thread.join()
    assert jobs._thread is None
    second = jobs.result("b")
    assert jobs.root is not None
    assert first.parent == second.parent == jobs.root
    assert first.name == "a" and second.name == "b"
    jobs.stop()
    assert not jobs.root.exists()


def test_a_failed_job_reports_its_error_and_the_others_still_run():
    def fail(folder: Path) -> None:
        raise ValueError("no data")

    jobs = Background({"bad": fail, "good": lambda folder: 2})
    jobs.start(["bad", "good"])
    with pytest.raises(RuntimeError, match="background job bad failed: no data"):
        jobs.result("bad")
    assert jobs.result("good") == 2
    jobs.stop()


def test_stopping_ended_jobs_leaves_other_processes_alone():
    """A test's own Background, its jobs ended, stops nothing: the session's
    background runs (children of the same process) go on."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        jobs = Background({"a": lambda folder: 1})
        assert jobs.result("a") == 1
        jobs.stop()
        with pytest.raises(subprocess.TimeoutExpired):  # still running
            other.wait(timeout=1)
    finally:
        other.kill()
        other.wait()


def test_every_job_has_its_place_and_the_smoke_book_comes_first():
    """The session's jobs run in :data:`JOB_ORDER`: every job of the session's
    :data:`BACKGROUND` has a place there, every fixture that reads a job names
    one of them, and the student edition (built from the smoke book's run)
    comes after the smoke book."""
    from tests.conftest import BACKGROUND, BACKGROUND_FIXTURES, JOB_ORDER

    assert sorted(JOB_ORDER) == sorted(BACKGROUND.jobs)
    assert set(BACKGROUND_FIXTURES.values()) <= set(JOB_ORDER)
    assert JOB_ORDER[0] == "smoke-book"
    assert JOB_ORDER.index("student-book") > JOB_ORDER.index("smoke-book")
