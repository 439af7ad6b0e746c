"""Build the Jupyter Book from the notebooks executed by ``bookkit/run.py``.

Usage::

    bookkit build build/<profile>[/seed-<N>] [--edition full|student]

Replaces ``book/chapters/`` with the executed notebooks of that folder, ends
each with the claims it tests, links the ``wslib`` names of their text to
the API reference (``bookkit/apilinks.py``), points their setup cell's install
at this commit (for Colab and downloaded chapters), writes the claims ledger
(``bookkit/ledger.py``, from every results file of the profile under
``results/``) and the course guide (``bookkit/course.py``), then runs ``jupyter-book build`` strictly (every warning
is an error, all of them are listed) into ``book/_build/html``. The student
edition (``--edition student``) removes every solution and goes to
``book/_student/_build/html``. Exit status: that of jupyter-book, or 2 when
the folder holds no executed notebook.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bookkit.apilinks import link_api
from bookkit.course import strip_solutions, write_guide
from bookkit.ledger import append_claims, write_ledger
from bookkit.profiles import ROOT, read_yaml
from wslib.runs.claim_list import CLAIMS
from wslib.runs.claims import ledger

BOOK = ROOT / "book"
CHAPTERS = BOOK / "chapters"


def copy_chapters(executed: Path) -> list[Path]:
    """Replace ``book/chapters`` with the notebooks in ``executed``."""
    notebooks = sorted(executed.glob("*.ipynb"))
    shutil.rmtree(CHAPTERS, ignore_errors=True)
    CHAPTERS.mkdir()
    for notebook in notebooks:
        shutil.copy2(notebook, CHAPTERS / notebook.name)
    return notebooks


# The default install source of a chapter's setup cell (bookkit/chapters.py).
INSTALL_SOURCE = re.compile(r"git\+https://github\.com/[\w.-]+/[\w.-]+@[\w.-]+")


def install_source() -> str:
    """``git+<repository.url>@<commit>``: the library as it is in this build.

    Outside git, or with uncommitted changes to the library (which that
    commit does not hold), a warning says what the chapters will install.
    """
    config = read_yaml((BOOK / "_config.yml").read_text())
    url = (config.get("repository") or {}).get("url")
    if not url:
        raise SystemExit(
            "error: book/_config.yml has no repository: url: "
            "(see book/running/publishing.md)"
        )
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        print(
            "warning: not a git checkout; Colab installs wslib from main",
            file=sys.stderr,
        )
        return f"git+{url}@main"
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", "wslib", "pyproject.toml"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if changed:
        print(
            "warning: wslib has uncommitted changes; Colab installs the last commit",
            file=sys.stderr,
        )
    return f"git+{url}@{head.stdout.strip()}"


def pin_install(notebook: Path, source: str) -> None:
    """Point the setup cell of ``notebook`` at ``source`` (opened in Colab or downloaded)."""
    text = notebook.read_text()
    notebook.write_text(INSTALL_SOURCE.sub(source, text))


def results_dir(executed: Path) -> Path:
    """``results/<profile>`` for ``build/<profile>[/seed-<N>]``: every seed of the profile."""
    try:
        profile = executed.resolve().relative_to(ROOT / "build").parts[0]
    except ValueError:  # executed copies kept elsewhere: the folder names the profile
        profile = executed.name
    return ROOT / "results" / profile


# Where each edition's HTML goes (jupyter-book writes <path-output>/_build/html).
EDITIONS = {
    "full": BOOK / "_build" / "html",
    "student": BOOK / "_student" / "_build" / "html",
}


def edition_config(edition: str, folder: Path) -> Path:
    """The book's configuration, with plain solutions hidden in the student edition."""
    config = read_yaml((BOOK / "_config.yml").read_text())
    if edition == "student":
        config.setdefault("sphinx", {}).setdefault("config", {})["hide_solutions"] = (
            True
        )
    path = folder / "_config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build_book(edition: str = "full") -> int:
    """Run jupyter-book (from this Python's environment) on ``book/``; return its exit status."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    output = EDITIONS[edition]
    with tempfile.TemporaryDirectory() as folder:
        command = [
            str(jupyter_book),
            "build",
            str(BOOK),
            "--all",
            "--warningiserror",
            "--keep-going",
            "--config",
            str(edition_config(edition, Path(folder))),
        ]
        if edition != "full":
            command += ["--path-output", str(output.parents[1])]
        return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    """Copy the executed notebooks and build the book."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executed", type=Path, help="folder of executed notebooks")
    parser.add_argument("--edition", choices=sorted(EDITIONS), default="full")
    args = parser.parse_args(argv)
    if not copy_chapters(args.executed):
        print(f"error: no executed notebooks in {args.executed}", file=sys.stderr)
        return 2
    results = results_dir(args.executed)
    try:
        rows = ledger(
            results, CLAIMS
        )  # every results file read once for the whole book
    except ValueError as error:  # a results file that is not one
        print(f"error: {error}", file=sys.stderr)
        return 2
    chapters = sorted(CHAPTERS.glob("*.ipynb"))
    source = install_source()
    for chapter in chapters:
        append_claims(chapter, rows)
        pin_install(chapter, source)
        try:
            link_api(chapter)
        except LookupError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if args.edition == "student":
            strip_solutions(chapter)
    write_ledger(rows, results, BOOK)
    write_guide(chapters, args.executed / "run_times.json", BOOK)
    return build_book(args.edition)
