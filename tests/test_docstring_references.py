"""Every cross-reference in the docstrings of wslib and bookkit resolves.

A name moved to another module leaves ``:func:`name``` behind in the old
module's docstrings; the built API reference shows it unresolved, which
``tests/book/test_reference.py`` finds only in the slow book build. Here, in
the fast suite: a short name must be defined in the module that mentions it
(at top level or in one of its classes), a full ``wslib.`` or ``bookkit.``
path must exist.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wslib.", "bookkit.")
MODULES = sorted(p for name in PACKAGES for p in (ROOT / name[:-1]).rglob("*.py"))
ROLE = re.compile(r":(?:func|class|data|attr|exc|meth):`~?([A-Za-z_][\w.]*)`")


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines: top-level functions, classes and assignments, and
    the methods and attributes of its classes."""
    names: set[str] = set()
    bodies = [tree.body] + [
        n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
    ]
    for body in bodies:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def resolves(path: str) -> bool:
    """Whether the dotted ``wslib.`` (or ``bookkit.``) path names a module or an
    object in one."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_reference_names_an_object_that_exists(path: Path) -> None:
    source = path.read_text()
    own = defined_names(ast.parse(source))
    stale = [
        name
        for name in ROLE.findall(source)
        if not (
            resolves(name) if name.startswith(PACKAGES) else name.split(".")[0] in own
        )
    ]
    assert stale == [], (
        f"references to names not here (give the full package path): {stale}"
    )


def test_a_moved_name_is_found() -> None:
    tree = ast.parse("def kept():\n    ':func:`moved` and :func:`kept`'\n")
    found = [n for n in ROLE.findall(ast.get_docstring(tree.body[0]) or "")]
    assert found == ["moved", "kept"]
    assert [n for n in found if n not in defined_names(tree)] == ["moved"]
    assert resolves("wslib.llpf.ticks.Refine")
    assert not resolves("wslib.llpf.layerwise.no_such_name")
