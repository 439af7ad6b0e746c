"""bookkit lint: ruff and mypy on the chapters' code cells, named by chapter and
cell, fixed in place."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, chapters, script_repo, write_notebook

BAD = "import os\nx = [1,2]\nprint( x )"


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A repository root with bookkit, the ruff and mypy settings and one chapter."""
    notebooks = script_repo(tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (notebooks / "params" / "cpu.yaml").write_text("00_tiny: {depth: 2}\n")
    write_notebook(notebooks / "00_tiny.md", "width = 3", "print(width, depth)")
    return tmp_path


def lint(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookkit", "lint", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_clean_chapter_passes(repo: Path) -> None:
    done = lint(repo)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_name_no_cell_and_no_cpu_parameter_defines_fails(repo: Path) -> None:
    write_notebook(repo / "notebooks/00_tiny.md", "width = 3", "print(dpeth)")
    done = lint(repo)
    assert done.returncode == 1
    assert "F821" in done.stdout and "dpeth" in done.stdout


def test_a_badly_formatted_cell_fails_and_is_named(repo: Path) -> None:
    write_notebook(repo / "notebooks/00_tiny.md", "width = 3", "print( width )")
    done = lint(repo)
    assert done.returncode == 1
    assert "notebooks/00_tiny.md" in done.stdout + done.stderr
    assert "print(width)" in done.stdout  # the diff


def test_a_broken_rule_fails_and_is_named(repo: Path) -> None:
    write_notebook(repo / "notebooks/00_tiny.md", "width = 3", "import os")
    done = lint(repo)
    assert done.returncode == 1
    assert "notebooks/00_tiny.md:cell" in done.stdout and "F401" in done.stdout


def test_fix_rewrites_the_code_cells_and_keeps_the_text(repo: Path) -> None:
    path = repo / "notebooks/00_tiny.md"
    write_notebook(path, "width = 3", BAD)
    done = lint(repo, "--fix")
    assert "rewrote notebooks/00_tiny.md" in done.stdout
    notebook = chapters.read(path)
    assert notebook.cells[0].source == "# A tiny chapter"
    assert notebook.cells[1].metadata.tags == ["parameters"]
    assert notebook.cells[2].source == "x = [1, 2]\nprint(x)"
    assert lint(repo).returncode == 0


def test_a_call_that_does_not_fit_a_signature_fails_mypy_and_names_the_cell(
    repo: Path,
) -> None:
    body = 'import math\n\nmath.gcd(depth, "x")'  # mypy: gcd takes whole numbers
    write_notebook(repo / "notebooks/00_tiny.md", "width = 3", body)
    done = lint(repo)
    assert done.returncode == 1
    assert "notebooks/00_tiny.md:cell 3:3: error:" in done.stdout, done.stdout
    assert '"gcd" has incompatible type "str"' in done.stdout, done.stdout


def test_an_injected_parameter_has_the_type_of_its_cpu_value(repo: Path) -> None:
    (repo / "notebooks/params/cpu.yaml").write_text(
        "00_tiny: {depth: 2, rate: 0.5, name: a, flag: true, model: {w: 1}, ws: [1]}\n"
    )
    fits = ["a: int = depth", "b: float = rate", "c: str = name", "d: bool = flag"]
    fits += ["e: dict[str, int] = model", "f: list[int] = ws"]
    misfits = ["g: str = depth", "h: str = rate", "i: int = name", "j: str = flag"]
    misfits += ["k: int = model", "m: int = ws"]
    body = "\n".join(fits + misfits)
    write_notebook(repo / "notebooks/00_tiny.md", "width = 3", body)
    done = lint(repo)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    lines = [int(e.split("cell 3:")[1].split(":")[0]) for e in errors]
    assert lines == list(range(len(fits) + 1, len(fits + misfits) + 1)), done.stdout
