"""Smoke runs of the sweep seeds, computed in the background while other tests run.

Most tests compute on one thread, so a serial ``make test`` leaves a core idle
for most of its length. The smoke runs of the seeds after the default one
(``notebooks/run.py --profile smoke --seed N``) need nothing else of the
session, so they start with the smoke book, run one after another in a
workspace of their own (their runs must not enter the smoke book's ledger
while it is built) on half of the cores, and the fixtures that read them
wait for them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from tests.checkout import copy_checkout
from wslib.core.files import ENTRY_LOG


def use_half_the_cores() -> None:
    """Bind the calling thread, and the processes it starts, to the upper half
    of the cores this process may use (at least one; Linux only)."""
    if hasattr(os, "sched_setaffinity"):  # pid 0: the calling thread
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(cores[len(cores) // 2 :]))


class SeedRuns:
    """The smoke runs of ``seeds`` in a workspace of their own, in a thread."""

    def __init__(self, seeds: Sequence[int], profile: str) -> None:
        self.seeds = tuple(seeds)
        self.profile = profile
        self.root: Path | None = None  # a temporary folder, made by start()
        self.errors: dict[int, str] = {}
        self._done = {seed: threading.Event() for seed in self.seeds}
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen | None = None
        self._stopped = False
        self._lock = threading.Lock()  # no run starts once stop() began

    @property
    def checkout(self) -> Path:
        """The runs' workspace: a copy of the checkout."""
        assert self.root is not None, "the runs have not started"
        return self.root / "checkout"

    def start(self) -> None:
        """Start the runs (once; later calls do nothing)."""
        if self._thread is None:
            self.root = Path(tempfile.mkdtemp(prefix="wslib-tests-seeds-"))
            self._thread = threading.Thread(target=self._run_all, daemon=True)
            self._thread.start()

    def wait(self, seed: int) -> str | None:
        """Wait for ``seed``'s run (starting the runs if need be); its error or None."""
        self.start()
        self._done[seed].wait()
        return self.errors.get(seed)

    def log(self, seed: int) -> Path:
        """The entry log of ``seed``'s run (``WSLIB_ENTRY_LOG``)."""
        return self.checkout.parent / f"seed-{seed}.log"

    def stop(self) -> None:
        """Stop a run still going (its kernels too) and remove the workspace."""
        with self._lock:
            self._stopped = True
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run_all(self) -> None:
        use_half_the_cores()
        try:
            copy_checkout(self.checkout)
            for seed in self.seeds:
                self._run(seed)
                self._done[seed].set()
        except Exception as error:  # a failed copy must not leave a fixture waiting
            for seed in self.seeds:
                if not self._done[seed].is_set():
                    self.errors[seed] = f"the seed runs stopped: {error!r}"
        finally:
            for event in self._done.values():
                event.set()

    def _run(self, seed: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.checkout)}
        env[ENTRY_LOG] = str(self.log(seed))
        script = ["notebooks/run.py", "--profile", self.profile, "--seed", str(seed)]
        with self._lock:
            if self._stopped:
                return
            self._process = subprocess.Popen(
                [sys.executable, *script],
                cwd=self.checkout,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its kernels are stopped with it
            )
        output, _ = self._process.communicate()
        if self._process.returncode != 0:
            self.errors[seed] = (
                f"{' '.join(script)} failed with exit status "
                f"{self._process.returncode}:\n{output[-3000:]}"
            )
