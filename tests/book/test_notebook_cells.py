"""The chapters read like a book: short cells, no library code, plumbing hidden.

A code cell is one step of a chapter: protocols and result assembly live in the
paper packages (tested there), a notebook defines no function except a
figure-specific drawing helper (``draw_*``), and the cells a reader does not
need (imports, parameters, glue, results writing) carry a Jupyter Book tag that
hides or removes them from the page.
"""

from __future__ import annotations

import ast
import statistics

import nbformat
import pytest

from bookkit import course
from tests.conftest import NOTEBOOKS, ROOT, chapter

MEDIAN_LINES = 8
MAX_LINES = 30
HIDDEN = {"remove-input", "hide-input", "remove-cell", "hide-cell"}


def code_cells(nb: str) -> list[nbformat.NotebookNode]:
    return [cell for cell in chapter(nb).cells if cell.cell_type == "code"]


def tags(cell: nbformat.NotebookNode) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def lines(cell: nbformat.NotebookNode) -> int:
    """Non-blank lines of a cell's source."""
    return sum(1 for line in cell.source.splitlines() if line.strip())


def steps(nb: str) -> list[nbformat.NotebookNode]:
    """Code cells other than the parameters cell."""
    return [cell for cell in code_cells(nb) if "parameters" not in tags(cell)]


def tree(cell: nbformat.NotebookNode) -> ast.Module:
    """The cell's syntax tree (IPython magics and shell lines left out)."""
    source = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line
        for line in cell.source.splitlines()
    )
    return ast.parse(source)


def head(cell: nbformat.NotebookNode) -> str:
    return cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_median_code_cell_is_short(nb: str) -> None:
    sizes = [n for n in map(lines, steps(nb)) if n]
    assert statistics.median(sizes) <= MEDIAN_LINES, sorted(sizes)


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_no_code_cell_is_long(nb: str) -> None:
    long = [f"{lines(c)} lines: {head(c)}" for c in steps(nb) if lines(c) > MAX_LINES]
    assert not long, long


def definitions(module: ast.Module) -> list[str]:
    """Names of functions and classes the cell defines (``def``, ``class``, ``f = lambda``)."""
    names = []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_only_drawing_helpers_are_defined(nb: str) -> None:
    names = [name for cell in code_cells(nb) for name in definitions(tree(cell))]
    assert not [name for name in names if not name.startswith("draw_")], names


def imports_wslib(module: ast.Module) -> bool:
    return any(
        (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wslib"))
        or (
            isinstance(node, ast.Import)
            and any(alias.name.startswith("wslib") for alias in node.names)
        )
        for node in module.body
    )


def calls(module: ast.Module, name: str) -> bool:
    return any(
        isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == name
        for node in ast.walk(module)
    )


def only_glue(module: ast.Module) -> bool:
    """Every statement glues a value (calls to ``glue``, possibly in a loop)."""

    def gluing(node: ast.stmt) -> bool:
        if isinstance(node, ast.For):
            return all(map(gluing, node.body))
        return (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "glue"
        )

    return bool(module.body) and all(map(gluing, module.body))


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_plumbing_cells_are_hidden(nb: str) -> None:
    """The setup cell importing wslib, glue-only cells and write_results."""
    cells = code_cells(nb)
    setup = next((c for c in cells if imports_wslib(tree(c))), None)
    assert setup is not None, "no cell imports wslib"
    plumbing = [setup] + [
        c for c in cells if only_glue(tree(c)) or calls(tree(c), "write_results")
    ]
    shown = [head(c) for c in plumbing if not tags(c) & HIDDEN]
    assert not shown, f"cells without a tag of {sorted(HIDDEN)}: {shown}"


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_parameters_cell_is_collapsed(nb: str) -> None:
    """``hide-input``: collapsed on the page, one click shows the profile and
    seed (the injected cell below it, collapsed too, every other value)."""
    (cell,) = [c for c in code_cells(nb) if "parameters" in tags(c)]
    assert "hide-input" in tags(cell), tags(cell)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def helper():\n    pass", ["helper"]),
        ("def draw_panel(ax):\n    pass", ["draw_panel"]),
        ("class Box:\n    pass", ["Box"]),
        ("f = lambda x: x", ["f"]),
        ("ys = sorted(xs, key=lambda x: -x)", []),
    ],
)
def test_definitions_are_found(source: str, expected: list[str]) -> None:
    assert definitions(ast.parse(source)) == expected


def test_plumbing_detection() -> None:
    cell = nbformat.v4.new_code_cell
    assert only_glue(tree(cell('glue("a", 1, display=False)\nglue("b", 2)')))
    assert only_glue(
        tree(cell("for k, v in d.items():\n    glue(k, v, display=False)"))
    )
    assert not only_glue(tree(cell('x = 1\nglue("a", x)')))
    assert calls(
        tree(cell("write_results(results_path, metrics, timings)")), "write_results"
    )
    assert imports_wslib(
        tree(cell("import numpy as np\nfrom wslib.plotting import set_style"))
    )
    assert not imports_wslib(tree(cell("import numpy as np")))


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_no_chapter_depends_on_its_working_directory(nb: str) -> None:
    """A chapter opened from any folder finds data/ and results/: the library
    takes relative paths under the workspace (tests/core/test_workspace.py), and
    no chapter changes the working directory."""
    source = "\n".join(c.source for c in steps(nb))
    assert "chdir" not in source and "getcwd" not in source, nb


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_chapter_opens_with_goals_and_ends_with_takeaways_and_exercises(
    nb: str,
) -> None:
    text = [c.source for c in chapter(nb).cells if c.cell_type == "markdown"]
    assert "Learning goals" in text[0]
    assert any(t.startswith("## Key takeaways") for t in text)
    exercises = course.exercises(ROOT / "notebooks" / f"{nb}.md")
    assert 3 <= len(exercises) <= 5, [e["label"] for e in exercises]
    assert all(e["label"].startswith(f"ex-{nb[:2]}-") for e in exercises)
    assert all(e["difficulty"] in course.DIFFICULTIES for e in exercises)
    coding = [t for t in text if t.strip().startswith("```{solution-start}")]
    assert coding, "at least one coding exercise with an executed solution"
