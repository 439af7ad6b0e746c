"""Shared fixtures: every notebook run in the smoke profile and the book built from it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
PROFILES = sorted(p.stem for p in (ROOT / "notebooks" / "params").glob("*.yaml"))
SMOKE = "smoke"


def load_script(path: str) -> ModuleType:
    """Import a script of the repository (``notebooks/run.py``, ...) as a fresh module."""
    file = ROOT / path
    name = "script_" + file.stem
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    sys.path.insert(0, str(file.parent))  # a script imports its siblings (run.py)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.parent))
    return module


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


OTHER_SEED = 1  # the smoke book runs each notebook's default seed (0)


@pytest.fixture(scope="session")
def smoke_other_seed(smoke_book: Path) -> Path:
    """Every notebook run again in the smoke profile with ``seed`` = OTHER_SEED.

    Returns the results folder of that run (``results/smoke/seed-<OTHER_SEED>``).
    """
    script = ["notebooks/run.py", "--profile", SMOKE, "--seed", str(OTHER_SEED)]
    done = subprocess.run([sys.executable, *script], cwd=ROOT, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(script)} failed with exit status {done.returncode}")
    return ROOT / "results" / SMOKE / f"seed-{OTHER_SEED}"


@pytest.fixture(scope="session")
def student_book(smoke_book: Path) -> Path:
    """The student edition of the smoke book (every solution removed); its HTML folder."""
    script = ["book/build.py", f"build/{SMOKE}", "--edition", "student"]
    done = subprocess.run([sys.executable, *script], cwd=ROOT, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(script)} failed with exit status {done.returncode}")
    return ROOT / "book" / "_student" / "_build" / "html"
