"""make publish on a temporary clone: branch gh-pages holds the built HTML only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

GHP_IMPORT = Path(sys.executable).parent / "ghp-import"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def make_publish(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "-C", str(clone), "publish", f"GHP_IMPORT={GHP_IMPORT}", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_publish_commits_the_html_to_gh_pages(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shutil.copy(ROOT / "Makefile", clone / "Makefile")  # the Makefile under test
    for name in ("user.email", "user.name"):
        git(clone, "config", name, "book@example.org")
    head = git(clone, "rev-parse", "HEAD")
    missing = make_publish(clone, "EDITION=student")
    assert missing.returncode != 0
    assert "run make book EDITION=student first" in missing.stderr
    html = clone / "book" / "_build" / "html"
    html.mkdir(parents=True)
    (html / "index.html").write_text("<h1>Weight space</h1>")
    done = make_publish(clone)
    assert done.returncode == 0, done.stderr
    files = git(clone, "ls-tree", "--name-only", "gh-pages").split()
    assert sorted(files) == [".nojekyll", "index.html"]
    assert git(clone, "rev-parse", "HEAD") == head  # the working branch is untouched
    assert "Publish the full edition" in git(clone, "log", "-1", "gh-pages")
