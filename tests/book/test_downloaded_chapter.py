"""A chapter downloaded from the book (or opened in Colab) runs outside a checkout.

Its setup cell installs ``wslib[notebook]`` (here from a wheel of the tests'
checkout copy, through ``WSLIB_SOURCE``; offline) into a Python that does not
have ``wslib``, and the chapter writes its results in the folder it runs in.
What the chapters import besides ``wslib`` must be in wslib's dependencies or
its ``notebook`` extra (checked from the notebooks' imports).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import nbformat

from bookkit import profiles
from tests.conftest import NOTEBOOKS, ROOT, SMOKE, chapter, chapters

CHAPTER = "06_pathlifting"  # a short chapter in the smoke profile
HIDDEN = ("wslib",)  # installed by the setup cell, not seen before


def site_packages(python: Path) -> Path:
    """The ``site-packages`` folder of the Python environment of ``python``."""
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def environment_without_wslib(folder: Path) -> Path:
    """A virtual environment that sees this one's packages but not :data:`HIDDEN`; its python.

    A ``.pth`` file adds a folder of links to every package of the running
    environment except those (their files, metadata, editable hooks).
    """
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    shared = folder / "shared"
    shared.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        hidden = any(name in entry.name.lower() for name in HIDDEN)
        if not hidden and entry.suffix != ".pth":
            (shared / entry.name).symlink_to(entry)
    (site_packages(python) / "shared.pth").write_text(f"{shared}\n")
    return python


def test_downloaded_chapter_installs_wslib_and_runs(
    workspace: Path, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"]
        + ["--no-build-isolation", "-w", str(wheels), str(workspace)],
        check=True,
    )
    (wheel,) = wheels.glob("wslib-*.whl")
    python = environment_without_wslib(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name in HIDDEN:
        missing = subprocess.run(
            [str(python), "-c", f"import {name}"], cwd=tmp_path, env=env, check=False
        )
        assert missing.returncode != 0, f"the test environment must lack {name}"

    folder = tmp_path / "downloaded"
    folder.mkdir()
    source = chapters.read(workspace / "notebooks" / f"{CHAPTER}.md")
    runnable = chapters.with_setup_cell(source)  # as run.py runs it, the book offers it
    nbformat.write(runnable, folder / f"{CHAPTER}.ipynb")
    params = profiles.notebook_parameters(CHAPTER, SMOKE, None)
    (folder / "params.json").write_text(json.dumps(params))
    script = (
        "import json, papermill\n"
        f"papermill.execute_notebook('{CHAPTER}.ipynb', 'out.ipynb', "
        "parameters=json.load(open('params.json')), progress_bar=False)\n"
    )
    done = subprocess.run(
        [str(python), "-c", script],
        cwd=folder,
        env={**env, "WSLIB_SOURCE": wheel.as_uri()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((folder / params["results_path"]).read_text())
    assert results["metrics"], "the chapter wrote no metric"
    assert results["env"]["commit"] == "unknown"  # it ran outside any checkout
    installed = site_packages(python) / "wslib"
    assert installed.is_dir(), "the setup cell did not install wslib"


def chapter_imports() -> set[str]:
    """The top-level modules the chapters' code cells import (the standard library aside)."""
    found = set()
    for nb in NOTEBOOKS:
        for cell in chapter(nb).cells:
            if cell.cell_type == "code":
                for node in ast.walk(ast.parse(cell.source)):
                    if isinstance(node, ast.Import):
                        found |= {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.level == 0:
                        found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"wslib"}


def test_the_notebook_extra_declares_what_the_chapters_import() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["notebook"]
    names = {re.split(r"[<>=\[ ;]", r)[0].lower() for r in declared}
    providers = importlib.metadata.packages_distributions()
    missing = {
        module
        for module in chapter_imports()
        if not {d.lower() for d in providers.get(module, [])} & names
    }
    assert not missing, f"add the packages of {sorted(missing)} to the notebook extra"
