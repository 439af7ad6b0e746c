"""Shared fixtures: every notebook run in the smoke profile and the book built from it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from wslib.core.files import ENTRY_LOG

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


def run_smoke(seed: int | None, entry_log: Path) -> None:
    """Every notebook in the smoke profile (``seed`` None: the notebooks' default, 0),
    listing the cache entries it used in ``entry_log``."""
    script = ["notebooks/run.py", "--profile", SMOKE]
    script += [] if seed is None else ["--seed", str(seed)]
    env = {**os.environ, ENTRY_LOG: str(entry_log)}
    done = subprocess.run([sys.executable, *script], cwd=ROOT, env=env, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(script)} failed with exit status {done.returncode}")


@pytest.fixture(scope="session")
def entry_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the smoke runs' entry logs, ``seed-<N>.log`` per seed."""
    return tmp_path_factory.mktemp("entry-logs")


@pytest.fixture(scope="session")
def smoke_book(entry_logs: Path) -> Path:
    """Run all notebooks in the smoke profile and build the book, as `make book` does.

    Uses the real folders ``build/smoke``, ``results/smoke`` and ``book/_build``;
    returns the folder of the built HTML.
    """
    run_smoke(None, entry_logs / "seed-0.log")
    script = ["book/build.py", f"build/{SMOKE}"]
    done = subprocess.run([sys.executable, *script], cwd=ROOT, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(script)} failed with exit status {done.returncode}")
    return ROOT / "book" / "_build" / "html"


OTHER_SEED = 1  # the smoke book runs each notebook's default seed (0)
SWEEP_SEEDS = range(5)  # the seeds whose runs must share no cache entry


@pytest.fixture(scope="session")
def smoke_other_seed(smoke_book: Path, entry_logs: Path) -> Path:
    """Every notebook run again in the smoke profile with ``seed`` = OTHER_SEED.

    Returns the results folder of that run (``results/smoke/seed-<OTHER_SEED>``).
    """
    run_smoke(OTHER_SEED, entry_logs / f"seed-{OTHER_SEED}.log")
    return ROOT / "results" / SMOKE / f"seed-{OTHER_SEED}"


@pytest.fixture(scope="session")
def sweep_entries(smoke_other_seed: Path, entry_logs: Path) -> dict[int, set[str]]:
    """The cache entries (zoo, run cache, LLPF checkpoints) each of SWEEP_SEEDS used."""
    for seed in SWEEP_SEEDS:
        log = entry_logs / f"seed-{seed}.log"
        if not log.exists():
            run_smoke(seed, log)
    return {
        s: set((entry_logs / f"seed-{s}.log").read_text().split()) for s in SWEEP_SEEDS
    }


@pytest.fixture(scope="session")
def student_book(smoke_book: Path) -> Path:
    """The student edition of the smoke book (every solution removed); its HTML folder."""
    script = ["book/build.py", f"build/{SMOKE}", "--edition", "student"]
    done = subprocess.run([sys.executable, *script], cwd=ROOT, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(script)} failed with exit status {done.returncode}")
    return ROOT / "book" / "_student" / "_build" / "html"
