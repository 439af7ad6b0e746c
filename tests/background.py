"""Long runs of the smoke chapters, computed in the background while other tests run.

Most tests compute on one thread, so a serial ``make test`` leaves a core idle
for most of its length. The runs that need nothing else of the session are
jobs here: the smoke book (every chapter at the default seed, then the
build), its student edition, the smoke runs of the seeds after the default
one and the run of the gpu-smoke profile. They start when the tests are
collected, run one after another on half of the cores (the seeds' and the
gpu-smoke run each in a workspace of its own: a seed's results must not
enter the smoke book's ledger), and the fixtures that read them wait for
them; the tests that use those fixtures run last, in the order of the jobs.
Measured on 2 cores, serial, on one machine: with the smoke book built in
the foreground (its tests waited 129 s for it before any other test ran)
907 s and 894 s; with the smoke book here 820 s at 1,500 CPU-s, the second
core busy for nearly all of it, so more jobs here would only move time from
one core to the other. Earlier, more jobs made the suite no faster: 861 s
against 877 s with the split chapters' units here too; 900 s with those,
``plan.py``'s jobs and the gpu check's quick run, the jobs not bound to
their half of the cores (the two sides' processes crowded each other's
core). A timeline of a later run (each test's start, each job's end; 765 s,
1,414 CPU-s) showed the two sides balanced: the jobs ended at 738 s, when
the foreground had just run the smoke book's readers (``test_split``'s
units among them), so only less CPU, not another split, makes it faster.
With less CPU (the commands started without torch: 650 s, 1,155 CPU-s) the
foreground waited 70 s at the end for the gpu-smoke run. Now a job still
waiting in the queue when a test asks for it runs in the asking thread, on
the other half of the cores, and the student edition's readers ask for it
while the background runs the gpu-smoke chapters: both ended at 573 s of a
574 s run (1,061 CPU-s).
Under pytest-xdist a job starts when a fixture first asks for it: a
worker cannot know beforehand which tests it will be given.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

Job = Callable[[Path], Any]
"""A background job: given a fresh folder of its own, it returns its result."""


def use_half_the_cores(upper: bool = True) -> None:
    """Bind the calling thread, and the processes it starts, to the upper (or
    lower) half of the cores this process may use (at least one; Linux only)."""
    if hasattr(os, "sched_setaffinity"):  # pid 0: the calling thread
        cores = sorted(os.sched_getaffinity(0))
        half = len(cores) // 2
        os.sched_setaffinity(0, set(cores[half:] if upper else cores[:half] or cores))


class Background:
    """Named jobs, run one after another in a thread on half the cores."""

    def __init__(self, jobs: dict[str, Job]) -> None:
        self.jobs = jobs
        self.root: Path | None = None  # a temporary folder, made by start()
        self._chosen: list[str] = []
        self._started: set[str] = set()  # taken by the thread or by a caller
        self._results: dict[str, Any] = {}
        self._errors: dict[str, str] = {}
        self._done = {name: threading.Event() for name in jobs}
        self._lock = threading.Lock()  # guards _chosen: a job is run once
        self._thread: threading.Thread | None = None

    def start(self, names: list[str]) -> None:
        """Queue the jobs ``names`` (in this order) that are not queued yet."""
        with self._lock:
            new = [n for n in names if n not in self._chosen]
            self._chosen += new
            if new and self._thread is None:  # one folder for every job
                self.root = self.root or Path(
                    tempfile.mkdtemp(prefix="wslib-tests-background-")
                )
                self._thread = threading.Thread(target=self._run_all, daemon=True)
                self._thread.start()

    def result(self, name: str) -> Any:
        """Job ``name``'s result, once it ended (queued now if it was not).

        A job still waiting in the queue runs at once on the caller's half of
        the cores instead of after the jobs before it: the caller would only
        wait. Raises RuntimeError with the job's error if it failed.
        """
        self.start([name])
        if self._take(name):
            runner = threading.Thread(target=self._run, args=(name, False))
            runner.start()
            runner.join()
        self._done[name].wait()
        if name in self._errors:
            raise RuntimeError(f"background job {name} failed: {self._errors[name]}")
        return self._results[name]

    def stop(self) -> None:
        """Stop the job still running, if one is (every process this one
        started is stopped: the tests are over), and remove the jobs' folders.

        When every job has ended nothing is stopped: another instance's jobs
        (the session's, while a test of this class runs) go on.
        """
        with self._lock:
            running = [n for n in self._chosen if not self._done[n].is_set()]
            self._chosen.clear()
        if (
            self.root is None
        ):  # e.g. pytest-xdist's controller: its children are workers
            return
        for child in psutil.Process().children(recursive=True) if running else []:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def _take(self, name: str) -> bool:
        """Mark job ``name`` as started if it is still waiting; whether it was."""
        with self._lock:
            if name in self._started:
                return False
            self._started.add(name)
            return True

    def _next(self) -> str | None:
        """Take the next waiting job; None, and the thread ends, when none is
        left (a job queued later starts a new thread)."""
        with self._lock:
            waiting = [n for n in self._chosen if n not in self._started]
            if not waiting:
                self._thread = None
                return None
            self._started.add(waiting[0])
            return waiting[0]

    def _run_all(self) -> None:
        while (name := self._next()) is not None:
            self._run(name, upper=True)

    def _run(self, name: str, upper: bool) -> None:
        """Run job ``name`` (already taken) in this thread, bound to the upper
        or lower half of the cores."""
        use_half_the_cores(upper)
        assert self.root is not None
        folder = self.root / name
        try:
            folder.mkdir()
            self._results[name] = self.jobs[name](folder)
        except Exception as error:  # the fixture that waits reports it
            self._errors[name] = str(error) or repr(error)
        finally:
            self._done[name].set()
