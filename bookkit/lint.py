"""Lint, format and type-check the chapters' code cells with ruff and mypy.

Usage::

    bookkit lint          # ruff format --check, ruff check, then mypy
    bookkit lint --fix    # ruff format and ruff check --fix, written back

Each chapter ``notebooks/<nb>.md`` is converted to a Jupyter notebook in a
temporary folder, so ruff checks it cell by cell with the settings of
``pyproject.toml``, as it checks any notebook; its messages name the chapter
(``notebooks/<nb>.md:cell N:line:column``). With ``--fix`` the code cells ruff
changed are written back into the chapter, its text untouched. A chapter's
parameters other than its profile, seed and results path are injected by
``run.py`` from the cpu profile; ruff takes their names as defined
(ruff's ``builtins``), so a name the chapter reads and nothing defines is
still an error.

mypy then checks each chapter as one module: its code cells in order, after a
declaration of every injected name with the type of its cpu value
(:func:`declarations`: a mapping is ``dict[str, Any]``, a list
``list[Any]``), with the settings of ``pyproject.toml``, so a call that does
not fit the library's signatures fails ``make lint``. Its messages name the
chapter's cell and line as ruff's do. Exit status: 0 when every cell is
formatted, passes the rules and type-checks, else 1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat

from bookkit import chapters
from bookkit.profiles import NOTEBOOKS, PARAMS, ROOT, read_yaml


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


def cpu_sections() -> dict[str, Any]:
    """What ``bookkit run`` injects into each chapter beyond its parameters cell:
    its section of the cpu profile (ruff takes the names as defined)."""
    return read_yaml(PARAMS.joinpath("cpu.yaml").read_text()) or {}


def annotation(value: object) -> str:
    """The type mypy assumes for an injected parameter whose cpu value is ``value``."""
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if isinstance(value, kind):
            return name
    if isinstance(value, dict):
        return "dict[str, Any]"
    return "list[Any]" if isinstance(value, list) else "Any"


def declarations(section: dict[str, Any]) -> list[str]:
    """The lines that declare the names of a chapter's cpu ``section``, typed."""
    lines = ["from typing import Any"]
    return lines + [f"{name}: {annotation(section[name])}" for name in sorted(section)]


def as_module(chapter: Path, section: dict[str, Any]) -> tuple[str, list[str]]:
    """``chapter``'s code cells as one module (magics commented out), and the
    place each of its lines comes from (``cell N:line``, N counting every cell)."""
    lines = declarations(section)
    places = [f"injected parameters:{i + 1}" for i in range(len(lines))]
    for number, cell in enumerate(chapters.read(chapter).cells, start=1):
        if cell.cell_type != "code":
            continue
        for i, line in enumerate(cell.source.splitlines(), start=1):
            lines.append("# " + line if line.lstrip().startswith(("%", "!")) else line)
            places.append(f"cell {number}:{i}")
    return "\n".join(lines) + "\n", places


def typecheck(folder: Path, sections: dict[str, Any]) -> int:
    """mypy on every chapter as a module written in ``folder``, its injected names
    typed from ``sections`` (the cpu profile's); 0 when all pass."""
    places = {}
    for chapter in sorted(NOTEBOOKS.glob(f"*{chapters.SUFFIX}")):
        section = sections.get(chapter.stem) or {}
        source, places[chapter.stem] = as_module(chapter, section)
        (folder / f"chapter_{chapter.stem}.py").write_text(source)
    config = ["--config-file", str(ROOT / "pyproject.toml")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            *config,
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(folder),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,  # mypy finds wslib in the repository root
    )

    def named(match: re.Match[str]) -> str:
        place = places[match[1]][int(match[2]) - 1]
        return f"notebooks/{match[1]}{chapters.SUFFIX}:{place}:"

    # any folder: for a module its cache holds, mypy names the path it had then
    pattern = r"\S*/chapter_(\w+)\.py:(\d+):"
    sys.stdout.write(re.sub(pattern, named, done.stdout))
    sys.stderr.write(done.stderr)
    return done.returncode


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
    sections = cpu_sections()  # read once for ruff and mypy
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
            names = f"builtins = {sorted(sections.get(chapter.stem) or {})}"
            rules = ["check", *fixing, "--quiet", "--config", names, str(path)]
            statuses.append(ruff(folder, *rules))
        if not fix:
            typed = typecheck(folder, sections)  # after ruff: both report every problem
            return int(any(statuses) or typed != 0)
        for chapter, path in converted.items():
            if write_back(path, chapter):
                print(f"rewrote {chapter.relative_to(ROOT)}")
        return int(any(statuses))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="format and fix in place")
    return lint(parser.parse_args(argv).fix)
