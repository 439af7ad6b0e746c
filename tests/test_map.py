"""The library's map names every module: in ``wslib/__init__.py`` and in
``docs/layout.md``.

Both maps are prose written for readers; this test is the one place that
keeps them true to the package tree (a module added, renamed or removed
fails it until both maps say so).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import wslib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(
    p.name for p in (ROOT / "wslib").iterdir() if (p / "__init__.py").is_file()
)


def modules(package: str) -> set[str]:
    return {p.stem for p in (ROOT / "wslib" / package).glob("*.py")} - {"__init__"}


def entry(text: str, start: str, next_entry: str) -> str:
    """The lines of ``text`` from the one starting with ``start`` to the next entry."""
    found = re.search(
        rf"^{re.escape(start)}.*?(?=^{next_entry}|^\S|\Z)", text, re.M | re.S
    )
    assert found, f"no entry {start!r}"
    return found.group(0)


def missing(package: str, text: str) -> list[str]:
    return sorted(m for m in modules(package) if not re.search(rf"\b{m}\b", text))


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_docstring_names_every_module(package: str) -> None:
    doc = wslib.__doc__ or ""
    assert missing(package, entry(doc, f"    wslib.{package} ", r"    wslib\.")) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_the_layout_map_names_every_module(package: str) -> None:
    layout = (ROOT / "docs" / "layout.md").read_text()
    assert missing(package, entry(layout, f"wslib/{package}/", "wslib/")) == []
