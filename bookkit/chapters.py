"""The chapters' source format: MyST Markdown notebooks (jupytext's ``md:myst``).

A chapter ``notebooks/NN_name.md`` is the reviewed source: text, code cells with
their tags and metadata, and the kernel spec in its front matter. It becomes a
Jupyter notebook only to be run (``run.py``) or linted (``lint.py``).

The setup cell that installs ``wslib`` outside a checkout is written once,
here (:data:`SETUP_CELL`): ``run.py`` adds it to every chapter it runs
(:func:`with_setup_cell`), so the executed chapters the book publishes (Colab,
downloads) carry it, and ``bookkit/build.py`` points its install source at the
commit that built the book.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat

SUFFIX = ".md"
FORMAT = "md:myst"

SETUP_CELL = """\
# Outside a checkout of the book (Colab, a downloaded chapter), install the
# library at the commit that built this page; the chapter then works in the
# current folder. In a checkout (make book), wslib is installed: nothing happens.
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("wslib") is None:
    source = os.environ.get(
        "WSLIB_SOURCE", "git+https://github.com/weight-space/study-book@main"
    )
    requirement = f"wslib[notebook] @ {source}"  # with what the chapter imports
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", requirement], check=True
    )
    importlib.invalidate_caches()"""


def read(path: Path) -> nbformat.NotebookNode:
    """A chapter's source as a Jupyter notebook (cells, tags, metadata, kernel spec)."""
    return jupytext.read(path, fmt=FORMAT)


def write(notebook: nbformat.NotebookNode, path: Path) -> None:
    """Write ``notebook`` as a chapter's source."""
    jupytext.write(notebook, path, fmt=FORMAT)


def with_setup_cell(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` with :data:`SETUP_CELL` (input hidden) right after its
    parameters cell, before any import of ``wslib``."""
    cells = notebook.cells
    first = next(i for i, c in enumerate(cells) if c.cell_type == "code")
    if "parameters" not in cells[first].metadata.get("tags", []):
        raise ValueError("a chapter's first code cell must be its parameters cell")
    setup = nbformat.v4.new_code_cell(SETUP_CELL, metadata={"tags": ["hide-input"]})
    cells.insert(first + 1, setup)
    return notebook
