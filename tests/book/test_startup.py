"""The book's commands start without torch, SciPy or statsmodels.

``make test`` starts about 80 ``bookkit`` processes and a reader's sweep one
per job; importing torch costs each 2.6 CPU-s and the statistics 2.5 more,
while the chapters' kernels (which compute) import them anyway. A module
that imports one of them at its top again, on a command's path, fails here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("torch", "scipy", "statsmodels", "pandas", "matplotlib")
COMMANDS = ("run", "sweep", "part", "lint")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_imports_no_heavy_library(command: str) -> None:
    probe = (
        f"import sys, bookkit.{command}\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_refused_run_and_sweep_end_before_any_heavy_import() -> None:
    """The arguments are checked first: a typo costs no import of torch."""
    probe = (
        "import sys\n"
        "from bookkit import run, sweep\n"
        "for main, args in ((run.main, ['--profile', 'nope']), "
        "(sweep.main, ['--seeds', 'one'])):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
