"""Every planted-bug list stays usable: each ``old`` text occurs once in its file.

A reformatted line would otherwise disable its planted bug without a word
(``make mutants`` reports such an entry as STALE, this test names it first).
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.mutants import KEYS, ROOT, all_lists, load, targets

BUGS = [bug for path in all_lists() for bug in load(path)]


def test_every_package_has_a_list() -> None:
    lists = {path.parent.name for path in all_lists()}
    packages = {
        p.name for p in (ROOT / "wslib").iterdir() if (p / "__init__.py").exists()
    }
    assert packages <= lists | {"__pycache__"}, packages - lists


def test_names_are_unique_within_a_list() -> None:
    counts = Counter((bug["list"], bug["name"]) for bug in BUGS)
    assert [key for key, n in counts.items() if n > 1] == []


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: f"{bug['list']}: {bug['name']}")
def test_the_bug_applies_once(bug: dict) -> None:
    assert set(bug) - {"list"} == KEYS, f"entry keys: {sorted(bug)}"
    assert bug["old"] != bug["new"], "the bug changes nothing"
    text = (ROOT / bug["file"]).read_text()
    assert text.count(bug["old"]) == 1, (
        f"`old` occurs {text.count(bug['old'])} times in {bug['file']}: "
        "update the entry to the file's current text"
    )
    for target in targets(bug):
        assert (ROOT / target.split("::")[0]).exists(), f"no test target {target}"
