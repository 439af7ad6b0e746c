"""Shared fixtures: every notebook run in the smoke profile and the book built from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
PROFILES = sorted(p.stem for p in (ROOT / "notebooks" / "params").glob("*.yaml"))
SMOKE = "smoke"


@pytest.fixture(scope="session")
def smoke_book() -> Path:
    """Run all notebooks in the smoke profile and build the book, as `make book` does.

    Uses the real folders ``build/smoke``, ``results/smoke`` and ``book/_build``;
    returns the folder of the built HTML.
    """
    for script in (
        ["notebooks/run.py", "--profile", SMOKE],
        ["book/build.py", f"build/{SMOKE}"],
    ):
        done = subprocess.run([sys.executable, *script], cwd=ROOT, check=False)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(script)} failed with exit status {done.returncode}")
    return ROOT / "book" / "_build" / "html"
