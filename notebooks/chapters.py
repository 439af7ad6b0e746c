"""The chapters' source format: MyST Markdown notebooks (jupytext's ``md:myst``).

A chapter ``notebooks/NN_name.md`` is the reviewed source: text, code cells with
their tags and metadata, and the kernel spec in its front matter. It becomes a
Jupyter notebook only to be run (``run.py``) or linted (``lint.py``).
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat

SUFFIX = ".md"
FORMAT = "md:myst"


def read(path: Path) -> nbformat.NotebookNode:
    """A chapter's source as a Jupyter notebook (cells, tags, metadata, kernel spec)."""
    return jupytext.read(path, fmt=FORMAT)


def write(notebook: nbformat.NotebookNode, path: Path) -> None:
    """Write ``notebook`` as a chapter's source."""
    jupytext.write(notebook, path, fmt=FORMAT)
