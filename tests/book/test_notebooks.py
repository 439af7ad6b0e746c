"""The source notebooks, their parameters and table of contents, and their smoke-profile runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from tests.conftest import NOTEBOOKS, PROFILES, ROOT, SMOKE


def toc_files() -> set[str]:
    """All ``file`` entries of ``book/_toc.yml``."""
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    return {chapter["file"] for part in toc["parts"] for chapter in part["chapters"]}


def source(nb: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / f"{nb}.ipynb", as_version=4)


def test_there_are_notebooks_and_profiles() -> None:
    assert NOTEBOOKS
    assert {"smoke", "cpu", "gpu"} <= set(PROFILES)


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook_is_in_toc(nb: str) -> None:
    assert f"chapters/{nb}" in toc_files()


@pytest.mark.parametrize("profile", PROFILES)
def test_every_notebook_has_parameters_in_profile(profile: str) -> None:
    params = (
        yaml.safe_load((ROOT / "notebooks" / "params" / f"{profile}.yaml").read_text())
        or {}
    )
    assert sorted(params) == NOTEBOOKS
    assert all(isinstance(value, dict) for value in params.values())


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook_has_one_parameters_cell(nb: str) -> None:
    tagged = [
        cell
        for cell in source(nb).cells
        if "parameters" in cell.get("metadata", {}).get("tags", [])
    ]
    assert len(tagged) == 1
    assert tagged[0].cell_type == "code"


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_source_notebook_has_no_outputs(nb: str) -> None:
    for cell in source(nb).cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], cell.source[:80]
            assert cell.execution_count is None, cell.source[:80]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "nope"], "error: unknown profile 'nope'; valid: "),
        (["--profile", SMOKE, "nope"], "error: unknown notebook 'nope'; valid: "),
    ],
)
def test_run_rejects_unknown_names(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "notebooks/run.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(message)
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_smoke_run_wrote_metrics(smoke_book: Path, nb: str) -> None:
    results = json.loads((ROOT / "results" / SMOKE / f"{nb}.json").read_text())
    assert results["profile"] == SMOKE
    assert isinstance(results["metrics"], dict)


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_smoke_run_is_fast(smoke_book: Path, nb: str) -> None:
    run_times = json.loads((ROOT / "build" / SMOKE / "run_times.json").read_text())
    assert run_times[nb] < 60


@pytest.mark.slow
def test_book_was_built(smoke_book: Path) -> None:
    assert (smoke_book / "index.html").exists()
    for nb in NOTEBOOKS:
        assert (smoke_book / "chapters" / f"{nb}.html").exists()
