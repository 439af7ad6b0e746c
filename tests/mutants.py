"""Plant each bug of the planted-bug lists in a copy of the tree and run its tests.

``python tests/mutants.py [LIST ...] [-k TEXT] [--jobs J]`` (``make mutants``):
every ``tests/*/planted_bugs.yaml`` by default. Each bug (a text replacement,
see CONTRIBUTING.md) is applied alone to a scratch copy of the project whose
``wslib`` shadows the installed one; the bug is caught when its tests fail.
Each test target first runs once on the unchanged copy: a target that fails
there cannot catch anything, and its bugs count as unusable. Each verdict is
printed as it comes, numbered (a full run takes hours). The exit status is 1
unless every bug is caught.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[1]
# .git is copied: tests that copy the checkout ask git which files it holds
SKIP_TOP = {".venv", "data", "build", "results", ".pytest_cache"}
SKIP_BOOK = {"_build", "_student", "chapters"}
KEYS = {"name", "file", "old", "new", "tests"}
T = TypeVar("T")


def load(path: Path) -> list[dict]:
    """The bugs of one list, each with the list's path under ``list``."""
    bugs = yaml.safe_load(path.read_text()) or []
    return [{**bug, "list": path.relative_to(ROOT).as_posix()} for bug in bugs]


def all_lists() -> list[Path]:
    return sorted(ROOT.glob("tests/*/planted_bugs.yaml"))


def targets(bug: dict) -> list[str]:
    tests = bug["tests"]
    return tests if isinstance(tests, list) else [tests]


def _ignore(folder: str, names: list[str]) -> list[str]:
    here = Path(folder)
    skip = {"__pycache__", ".ruff_cache", ".mypy_cache"}
    skip |= SKIP_TOP if here == ROOT else SKIP_BOOK if here == ROOT / "book" else set()
    return [n for n in names if n in skip]


def pytest(copy: Path, tests: list[str]) -> tuple[bool, str]:
    """Run ``tests`` in ``copy``: (passed, pytest's last line)."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    r = subprocess.run(
        cmd + tests, cwd=copy, env=env, capture_output=True, text=True, check=False
    )
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    return r.returncode == 0, (lines[-1] if lines else r.stderr.strip()[-160:])


def plant(copy: Path, bug: dict) -> str:
    """Apply ``bug`` in ``copy``, run its tests, undo it: CAUGHT or SURVIVED."""
    path = copy / bug["file"]
    text = path.read_text()
    if text.count(bug["old"]) != 1:
        return "STALE"  # tests/test_planted_bugs.py names the entry
    path.write_text(text.replace(bug["old"], bug["new"]))
    try:
        passed, _ = pytest(copy, targets(bug))
    finally:
        path.write_text(text)
    return "SURVIVED" if passed else "CAUGHT"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lists", nargs="*", type=Path, help="default: every list")
    parser.add_argument("-k", default="", help="only bugs whose name contains this")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    lists = [p.resolve() for p in args.lists] or all_lists()
    bugs = [b for p in lists for b in load(p) if args.k in b["name"]]
    if not bugs:
        parser.error(f"no planted bug's name contains {args.k!r}")
    return report(bugs, *plant_all(bugs, args.jobs))


def plant_all(bugs: list[dict], jobs: int) -> tuple[list[dict], list[str]]:
    """The usable bugs (their tests pass unplanted) and the verdict of each."""
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        free: queue.Queue[Path] = queue.Queue()
        for i in range(max(1, jobs)):
            free.put(
                Path(shutil.copytree(ROOT, Path(tmp) / f"copy{i}", ignore=_ignore))
            )

        def in_a_copy(task: Callable[[Path], T]) -> T:
            copy = free.get()
            try:
                return task(copy)
            finally:
                free.put(copy)

        groups = sorted({tuple(targets(b)) for b in bugs})
        with ThreadPoolExecutor(free.qsize()) as pool:
            clean = pool.map(
                lambda g: in_a_copy(lambda c: pytest(c, list(g))[0]), groups
            )
            control = dict(zip(groups, clean))
            usable = [b for b in bugs if control[tuple(targets(b))]]
            verdicts = []
            planted = pool.map(lambda b: in_a_copy(lambda c: plant(c, b)), usable)
            for i, (bug, verdict) in enumerate(zip(usable, planted), 1):
                verdicts.append(verdict)
                line = f"{verdict:8} {bug['list']}: {bug['name']}"
                print(f"[{i}/{len(usable)}] {line}", flush=True)
    return usable, verdicts


def report(bugs: list[dict], usable: list[dict], verdicts: list[str]) -> int:
    for bug in (b for b in bugs if b not in usable):
        print(f"UNUSABLE {bug['list']}: {bug['name']} (its tests fail unplanted)")
    caught = verdicts.count("CAUGHT")
    print(f"{caught} of {len(bugs)} planted bugs caught")
    return 0 if caught == len(bugs) else 1


if __name__ == "__main__":
    sys.exit(main())
