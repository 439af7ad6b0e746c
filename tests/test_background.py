"""The background jobs of the test session (:mod:`tests.background`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
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


def test_the_readers_ask_for_the_student_edition_before_the_background_reaches_it():
    """The readers run in :data:`READ_ORDER`, which holds every job once: the
    student edition's reader comes before the jobs the background runs ahead
    of it, so the foreground builds it instead of waiting."""
    from tests.conftest import JOB_ORDER, READ_ORDER

    assert sorted(READ_ORDER) == sorted(JOB_ORDER)
    assert READ_ORDER[0] == "smoke-book"
    student = READ_ORDER.index("student-book")
    before_it = JOB_ORDER[: JOB_ORDER.index("student-book")]
    assert any(READ_ORDER.index(job) > student for job in before_it)


def test_a_job_still_waiting_runs_in_the_caller_on_the_other_half_of_the_cores():
    """While the background runs one job, asking for a job behind it runs that
    one at once, in the caller's thread, bound to the lower half of the cores."""
    release = threading.Event()
    ran: dict[str, list] = {"b": []}

    def first(folder: Path) -> str:
        release.wait(timeout=30)
        return "a"

    def second(folder: Path) -> str:
        cores = (
            sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        )
        ran["b"].append((threading.current_thread(), cores))
        return "b"

    jobs = Background({"a": first, "b": second})
    jobs.start(["a", "b"])
    try:
        assert jobs.result("b") == "b"  # "a" is still running
        assert not jobs._done["a"].is_set()
        [(thread, cores)] = ran["b"]
        assert thread is not jobs._thread
        everything = sorted(os.sched_getaffinity(0)) if cores else []
        assert cores == (everything[: len(everything) // 2] or everything)
    finally:
        release.set()
    assert jobs.result("a") == "a"
    assert len(ran["b"]) == 1  # the background did not run it again
    jobs.stop()


def test_a_job_the_background_started_is_waited_for_not_run_again():
    started, release = threading.Event(), threading.Event()
    runs = []

    def slow(folder: Path) -> int:
        runs.append(threading.current_thread())
        started.set()
        release.wait(timeout=30)
        return 1

    jobs = Background({"a": slow})
    jobs.start(["a"])
    assert started.wait(timeout=30)
    threading.Timer(0.2, release.set).start()
    assert jobs.result("a") == 1
    assert len(runs) == 1 and runs[0] is not threading.current_thread()
    jobs.stop()
