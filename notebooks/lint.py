"""Lint and format the chapters' code cells with ruff.

Usage::

    python notebooks/lint.py          # ruff format --check and ruff check
    python notebooks/lint.py --fix    # ruff format and ruff check --fix, written back

Each chapter ``notebooks/<nb>.md`` is converted to a Jupyter notebook in a
temporary folder, so ruff checks it cell by cell with the settings of
``pyproject.toml``, as it checks any notebook; its messages name the chapter
(``notebooks/<nb>.md:cell N:line:column``). With ``--fix`` the code cells ruff
changed are written back into the chapter, its text untouched. A chapter's
parameters other than its profile, seed and results path are injected by
``run.py`` from the cpu profile; ruff takes their names as defined
(ruff's ``builtins``), so a name the chapter reads and nothing defines is
still an error. Exit status: 0 when every cell is formatted and passes the
rules, else 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import chapters
import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"


def ruff(folder: Path, *args: str) -> int:
    """Run ``ruff *args`` with the repository's settings, naming chapters in its output."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    for text, stream in ((done.stdout, sys.stdout), (done.stderr, sys.stderr)):
        named = text.replace(f"{folder}/", "notebooks/").replace(".ipynb", ".md")
        stream.write(named)
    return done.returncode


def injected(chapter: Path) -> list[str]:
    """The names run.py injects into ``chapter`` beyond its parameters cell: the
    keys of its section of the cpu profile (ruff takes them as defined)."""
    sections = yaml.safe_load(PARAMS.joinpath("cpu.yaml").read_text()) or {}
    return sorted(sections.get(chapter.stem) or {})


def write_back(converted: Path, chapter: Path) -> bool:
    """Copy the code cells of ``converted`` into ``chapter`` where ruff changed them."""
    notebook, fixed = chapters.read(chapter), nbformat.read(converted, as_version=4)
    changed = False
    for cell, new in zip(notebook.cells, fixed.cells, strict=True):
        if cell.cell_type == "code" and cell.source != new.source:
            cell.source, changed = new.source, True
    if changed:
        chapters.write(notebook, chapter)
    return changed


def lint(fix: bool) -> int:
    """Check (or fix) every chapter's code cells; 0 when all pass."""
    with tempfile.TemporaryDirectory(prefix="wslib-lint-") as name:
        folder = Path(name)
        converted = {}
        for chapter in sorted(NOTEBOOKS.glob(f"*{chapters.SUFFIX}")):
            converted[chapter] = folder / f"{chapter.stem}.ipynb"
            nbformat.write(chapters.read(chapter), converted[chapter])
        files = [str(path) for path in converted.values()]
        checking, fixing = ([], ["--fix"]) if fix else (["--check", "--diff"], [])
        statuses = [ruff(folder, "format", *checking, *files)]
        for chapter, path in converted.items():
            names = f"builtins = {injected(chapter)}"
            rules = ["check", *fixing, "--quiet", "--config", names, str(path)]
            statuses.append(ruff(folder, *rules))
        if not fix:
            return int(any(statuses))
        for chapter, path in converted.items():
            if write_back(path, chapter):
                print(f"rewrote {chapter.relative_to(ROOT)}")
        return int(any(statuses))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="format and fix in place")
    return lint(parser.parse_args(argv).fix)


if __name__ == "__main__":
    sys.exit(main())
