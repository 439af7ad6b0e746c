"""Build the Jupyter Book from the notebooks executed by ``notebooks/run.py``.

Usage::

    python book/build.py build/<profile>[/seed-<N>]

Replaces ``book/chapters/`` with the executed notebooks of that folder, ends
each with the claims it tests and writes the claims ledger (``book/ledger.py``,
from every results file of the profile under ``results/``), then runs
``jupyter-book build`` strictly (every warning is an error, all of them are
listed) into ``book/_build/html``. Exit status: that of jupyter-book, or 2 when
the folder holds no executed notebook.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from ledger import append_claims, write_ledger

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent
CHAPTERS = BOOK / "chapters"


def copy_chapters(executed: Path) -> list[Path]:
    """Replace ``book/chapters`` with the notebooks in ``executed``."""
    notebooks = sorted(executed.glob("*.ipynb"))
    shutil.rmtree(CHAPTERS, ignore_errors=True)
    CHAPTERS.mkdir()
    for notebook in notebooks:
        shutil.copy2(notebook, CHAPTERS / notebook.name)
    return notebooks


def results_dir(executed: Path) -> Path:
    """``results/<profile>`` for ``build/<profile>[/seed-<N>]``: every seed of the profile."""
    try:
        profile = executed.resolve().relative_to(ROOT / "build").parts[0]
    except ValueError:  # executed copies kept elsewhere: the folder names the profile
        profile = executed.name
    return ROOT / "results" / profile


def build_book() -> int:
    """Run jupyter-book (from this Python's environment) on ``book/``; return its exit status."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [
        str(jupyter_book),
        "build",
        str(BOOK),
        "--all",
        "--warningiserror",
        "--keep-going",
    ]
    return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    """Copy the executed notebooks and build the book."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executed", type=Path, help="folder of executed notebooks")
    args = parser.parse_args(argv)
    if not copy_chapters(args.executed):
        print(f"error: no executed notebooks in {args.executed}", file=sys.stderr)
        return 2
    results = results_dir(args.executed)
    for chapter in sorted(CHAPTERS.glob("*.ipynb")):
        append_claims(chapter, results)
    write_ledger(results, BOOK)
    return build_book()


if __name__ == "__main__":
    sys.exit(main())
