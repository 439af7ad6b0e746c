"""Ctrl-C stops bookkit run and bookkit sweep: their kernels end, nothing half-written stays.

Each test runs the real script in a temporary repository root holding one
slow chapter (it writes its results file, then sleeps), sends SIGINT to the
script's process group as a terminal's Ctrl-C does, and checks that the
script exits within :data:`LIMIT_S` with status 130 and one line saying what
stopped, that the chapter's kernel is gone, and that no results file of the
stopped chapter is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, script_repo, write_notebook

LIMIT_S = 10.0
SLOW = "00_slow"
PARAMETERS = "profile = 'cpu'\nresults_path = 'results/cpu/00_slow.json'\nseed = 0"
BODY = """\
import os, time
from pathlib import Path
from wslib.runs.results import write_results
Path('kernel.pid').write_text(str(os.getpid()))
write_results(results_path, {"a": 1.0}, {})  # as if the chapter were done...
time.sleep(300)  # ...but it is not
"""

pytestmark = pytest.mark.skipif(
    not hasattr(os, "killpg"), reason="process groups are POSIX"
)


def _root(tmp_path: Path) -> Path:
    """A repository root with bookkit, an empty cpu profile and the slow chapter."""
    write_notebook(script_repo(tmp_path) / f"{SLOW}.md", PARAMETERS, BODY)
    return tmp_path


def _interrupt(
    root: Path, command: list[str]
) -> tuple[subprocess.CompletedProcess, float]:
    """Start ``command``, wait until the chapter's kernel sleeps, Ctrl-C; (result, seconds)."""
    proc = subprocess.Popen(
        [sys.executable, *command],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as from a terminal: a parent that ignores SIGINT (a background job of
        # a script) hands the ignoring on, and Python then never raises
        # KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pid_file = root / "kernel.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the chapter's kernel never started"
    time.sleep(1.0)  # the results file is written
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - start
    kernel = int(pid_file.read_text())
    assert not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == "zombie"
    return subprocess.CompletedProcess(command, proc.returncode, out, err), seconds


def test_ctrl_c_stops_run_py_and_its_kernel(tmp_path: Path) -> None:
    root = _root(tmp_path)
    done, seconds = _interrupt(root, ["-m", "bookkit", "run", "--profile", "cpu", SLOW])
    assert done.returncode == 130, done.stderr
    assert seconds < LIMIT_S
    lines = [
        line for line in done.stderr.splitlines() if line.startswith("interrupted")
    ]
    assert lines == [
        f"interrupted: stopped {SLOW}; finished chapters keep their results; the "
        "same command runs the others again"
    ]
    assert "Traceback" not in done.stderr
    assert not (root / "results" / "cpu" / f"{SLOW}.json").exists()


def test_ctrl_c_stops_a_sweep_and_its_jobs(tmp_path: Path) -> None:
    root = _root(tmp_path)
    command = ["-m", "bookkit", "sweep", "--seeds", "1", "--profile", "cpu", SLOW]
    done, seconds = _interrupt(root, command)
    assert done.returncode == 130, done.stderr
    assert seconds < LIMIT_S
    assert f"interrupted: stopped {SLOW} seed 1;" in done.stderr
    assert "the same command runs only what is missing" in done.stderr
    assert not (root / "results" / "cpu" / "seed-1" / f"{SLOW}.json").exists()
