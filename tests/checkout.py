"""A copy of the checkout as git sees it, for the tests' workspace and the mutation
runs (a module of its own: ``tests/mutation.py`` runs without pytest)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not
    ignored: what a fresh clone plus the working tree's edits holds) and its
    ``.git``, so results record the commit."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    if (ROOT / ".git").is_dir():
        shutil.copytree(ROOT / ".git", dest / ".git")
    return dest
