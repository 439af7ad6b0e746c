"""The chapters a change touches, as a job matrix for the pull-request workflow.

Usage::

    bookkit affected FILE [FILE ...]
    git diff --name-only origin/main... | bookkit affected -

prints ``{"include": [{"nb": ...}, ...], "jobs": n}`` (one JSON line): the
chapters whose smoke run a change of ``FILE`` (paths relative to the
checkout) can alter, so that a pull request runs those chapters, as
QuantEcon's lectures are run on every pull request. A chapter is touched when

- its source (``notebooks/NN_name.md``) changed;
- a module of ``wslib`` it imports changed, directly or through the modules
  those import (the import graph of ``grimp``, which ``import-linter`` builds
  too);
- the runner changed: ``run.py`` and the scripts and ``wslib`` modules it
  imports, the smoke profile, the cpu profile (every chapter's defaults,
  which the smoke profile keeps where it sets no value), or the package's
  dependencies (every chapter).

Other files (the book's text, the tests, the docs) touch no chapter: the
fast tests and ``make test`` cover them.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterable

import grimp

from bookkit import chapters
from bookkit.profiles import NOTEBOOKS, ROOT

PACKAGE = ROOT / "bookkit"
RUNNER = (
    "__main__.py",
    "run.py",
    "engine.py",
    "speed.py",
    "profiles.py",
    "chapters.py",
    "kernels.py",
    "profile_values.py",
)
"""The modules of :mod:`bookkit` every chapter's run goes through."""
EVERY_CHAPTER = {
    "notebooks/params/smoke.yaml",
    "notebooks/params/cpu.yaml",  # the defaults every profile inherits
    "pyproject.toml",
    "environment.yml",
}
"""Files whose change touches every chapter (besides the runner)."""


def chapter_stems() -> list[str]:
    """The chapters, in book order (``NN_name``)."""
    return sorted(p.stem for p in NOTEBOOKS.glob(f"[0-9][0-9]_*{chapters.SUFFIX}"))


def imported_modules(source: str, known: set[str]) -> set[str]:
    """The ``wslib`` modules of ``known`` that Python ``source`` imports by name
    (``from wslib.a import b`` names ``wslib.a.b`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def chapter_source(stem: str) -> str:
    """The code cells of a chapter, joined (magics and shell lines left out)."""
    notebook = chapters.read(NOTEBOOKS / f"{stem}{chapters.SUFFIX}")
    return "\n".join(
        line
        for cell in notebook.cells
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if not line.lstrip().startswith(("%", "!"))
    )


def reach(graph: grimp.ImportGraph, modules: Iterable[str]) -> set[str]:
    """``modules`` and every module they import, directly or not."""
    reached = set(modules)
    for module in list(reached):
        reached |= graph.find_upstream_modules(module)
    return reached


def module_of(path: str) -> str | None:
    """The ``wslib`` module a file path holds (None: not a module of ``wslib``)."""
    if not (path.startswith("wslib/") and path.endswith(".py")):
        return None
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def affected(paths: Iterable[str]) -> list[str]:
    """The chapters (stems, book order) a change of ``paths`` touches."""
    paths = set(paths)
    stems = chapter_stems()
    graph = grimp.build_graph("wslib")
    known = set(graph.modules)
    runner_modules = reach(
        graph,
        set().union(
            *(imported_modules((PACKAGE / s).read_text(), known) for s in RUNNER)
        ),
    )
    changed = {m for m in map(module_of, paths) if m is not None}
    runner_files = {f"bookkit/{s}" for s in RUNNER} | EVERY_CHAPTER
    if paths & runner_files or changed & runner_modules:
        return stems
    return [
        stem
        for stem in stems
        if f"notebooks/{stem}{chapters.SUFFIX}" in paths
        or changed & reach(graph, imported_modules(chapter_source(stem), known))
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: bookkit affected FILE [FILE ...]  (or - to read them from stdin)")
        return 2
    paths = sys.stdin.read().split() if args == ["-"] else args
    stems = affected(p.strip() for p in paths)
    print(json.dumps({"include": [{"nb": s} for s in stems], "jobs": len(stems)}))
    return 0
