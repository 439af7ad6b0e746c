"""Exercises, the student edition and the course guide.

Exercises are sphinx-exercise directives in a chapter's markdown cells::

    ```{exercise} Permute a CNN
    :label: ex-01-permute
    :class: easy
    ...
    ```

with ``:class:`` one of :data:`DIFFICULTIES`. A coding exercise's solution is
a run of cells between a markdown cell holding only a ``{solution-start}``
directive and one holding only ``{solution-end}``: the code cells in between
are executed with the chapter, so every build regenerates their output. The
student edition removes those cells from the executed copies
(:func:`strip_solutions`); plain ``{solution}`` blocks are hidden by
sphinx-exercise's ``hide_solutions`` (it cannot hide gated solutions in an
executed notebook). :func:`write_guide` writes the "Course guide" page from
``book/guide_text.md``, the last run's wall times and the exercises found.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jupytext
import nbformat

DIFFICULTIES = ("easy", "medium", "hard")
EXERCISE = re.compile(
    r"```\{exercise\}\s*(?P<title>[^\n]*)\n(?P<options>(?::[^\n]*\n)*)"
)
START, END = "```{solution-start}", "```{solution-end}"


def option(options: str, name: str) -> str | None:
    """The value of ``:name:`` in a directive's option lines."""
    found = re.search(rf"^:{name}:\s*(\S+)", options, re.MULTILINE)
    return found.group(1) if found else None


def exercises(chapter: Path) -> list[dict[str, Any]]:
    """The exercises of one chapter, its source (``.md``) or an executed copy
    (``.ipynb``): label, title, difficulty, chapter stem."""
    notebook = jupytext.read(chapter)
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for match in EXERCISE.finditer(cell.source):
            found.append(
                {
                    "label": option(match["options"], "label"),
                    "title": match["title"].strip(),
                    "difficulty": option(match["options"], "class"),
                    "chapter": chapter.stem,
                }
            )
    return found


def strip_solutions(chapter: Path) -> int:
    """Remove every gated solution (start cell to end cell); return how many."""
    notebook = nbformat.read(chapter, as_version=4)
    kept, inside, removed = [], False, 0
    for cell in notebook.cells:
        text = cell.source.strip() if cell.cell_type == "markdown" else ""
        if text.startswith(START):
            inside, removed = True, removed + 1
        if not inside:
            kept.append(cell)
        if text.startswith(END):
            inside = False
    notebook.cells = kept
    nbformat.write(notebook, chapter)
    return removed


def write_guide(chapters: list[Path], run_times: Path, book: Path) -> Path:
    """Write ``<book>/guide.md``: the teacher's text, run times, exercises by difficulty."""
    times = json.loads(run_times.read_text()) if run_times.exists() else {}
    lines = [(book / "guide_text.md").read_text().rstrip(), ""]
    lines += [
        "## Run time of each chapter",
        "",
        f"Wall times of the build that made this page ({run_times.parent.name} "
        "profile), each notebook on one CPU thread:",
        "",
        "| chapter | run time | exercises |",
        "|---|---|---|",
    ]
    found = {c.stem: exercises(c) for c in chapters}
    for stem, items in found.items():
        seconds = times.get(stem)
        shown = "–" if seconds is None else f"{seconds / 60:.1f} min"
        lines.append(f"| {{doc}}`chapters/{stem}` | {shown} | {len(items)} |")
    every = [e for items in found.values() for e in items]
    lines += ["", f"## Exercises by difficulty ({len(every)} in all)", ""]
    for level in DIFFICULTIES:
        mine = [e for e in every if e["difficulty"] == level]
        lines += [f"### {level.capitalize()} ({len(mine)})", ""]
        lines += [f"- {{ref}}`{e['label']}` ({e['chapter']})" for e in mine]
        lines.append("")
    path = book / "guide.md"
    path.write_text("\n".join(lines) + "\n")
    return path
