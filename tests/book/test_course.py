"""bookkit/course.py: exercises found, solutions stripped for students, the course guide."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import bookkit.course

EXERCISE = "```{exercise} Try it\n:label: ex-00-try\n:class: easy\n\nDo it.\n```"
START = "```{solution-start} ex-00-try\n:class: dropdown\n```"
END = "```{solution-end}\n```"


@pytest.fixture()
def course(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return bookkit.course


def chapter(path: Path) -> Path:
    cells = [
        new_markdown_cell("# A chapter"),
        new_code_cell("x = 1"),
        new_markdown_cell(EXERCISE),
        new_markdown_cell(START),
        new_code_cell("print('the solution')"),
        new_markdown_cell("Explained."),
        new_markdown_cell(END),
        new_code_cell("write_results()"),
    ]
    nbformat.write(new_notebook(cells=cells), path)
    return path


def test_exercises_are_found_with_label_and_difficulty(
    course: ModuleType, tmp_path: Path
) -> None:
    found = course.exercises(chapter(tmp_path / "00_ch.ipynb"))
    assert found == [
        {
            "label": "ex-00-try",
            "title": "Try it",
            "difficulty": "easy",
            "chapter": "00_ch",
        }
    ]


def test_student_edition_drops_each_gated_solution_and_nothing_else(
    course: ModuleType, tmp_path: Path
) -> None:
    path = chapter(tmp_path / "00_ch.ipynb")
    assert course.strip_solutions(path) == 1
    sources = [c.source for c in nbformat.read(path, as_version=4).cells]
    assert sources == ["# A chapter", "x = 1", EXERCISE, "write_results()"]


def test_guide_lists_run_times_and_exercises_by_difficulty(
    course: ModuleType, tmp_path: Path
) -> None:
    path = chapter(tmp_path / "00_ch.ipynb")
    (tmp_path / "guide_text.md").write_text("# Course guide\n")
    times = tmp_path / "cpu" / "run_times.json"
    times.parent.mkdir()
    times.write_text(json.dumps({"00_ch": 90.0}))
    text = course.write_guide([path], times, tmp_path).read_text()
    assert "| {doc}`chapters/00_ch` | 1.5 min | 1 |" in text
    assert "### Easy (1)" in text and "{ref}`ex-00-try` (00_ch)" in text
    assert "(1 in all)" in text
