"""The library's layering: contracts in pyproject.toml, no import cycle, no private import."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

from tests.conftest import NOTEBOOKS, chapter

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wslib"


def contracts(kind: str) -> list[dict]:
    """The import-linter contracts of type ``kind`` in pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == kind]


def test_import_contracts_hold() -> None:
    """import-linter checks the layers contract of pyproject.toml."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _cycle(graph: grimp.ImportGraph) -> list[str] | None:
    """One import cycle between modules of ``wslib``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for nxt in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph.modules):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycle() -> None:
    graph = grimp.build_graph("wslib", cache_dir=None)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_cycle_finder_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a")]:
        graph.add_import(importer=a, imported=b)
    assert _cycle(graph) is not None


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wslib")
        for alias in node.names
        if alias.name.startswith("_")
    ]


def test_no_private_name_imported_across_modules() -> None:
    found = [hit for f in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(f)]
    assert not found, "\n".join(found)


def test_no_private_name_imported_in_notebooks() -> None:
    """Chapters use the library's public API only."""
    found = []
    for nb in NOTEBOOKS:
        for cell in chapter(nb).cells:
            if cell.cell_type != "code":
                continue
            source = cell.source
            lines = [
                ln
                for ln in source.splitlines()
                if not ln.lstrip().startswith(("%", "!"))
            ]
            tree = ast.parse("\n".join(lines))
            found += [
                f"{nb}.md: imports {alias.name} from {node.module}"
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("wslib")
                for alias in node.names
                if alias.name.startswith("_")
            ]
    assert not found, "\n".join(found)


def test_package_map_names_every_module() -> None:
    """``wslib/__init__.py``'s map of the package lists every module of every package."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    missing = [
        f"{package.name}.{module.stem}"
        for package in sorted(
            p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
        )
        for module in sorted(package.glob("*.py"))
        if module.stem != "__init__" and not re.search(rf"\b{module.stem}\b", doc)
    ]
    assert not missing, f"not in the map of wslib/__init__.py: {missing}"


def test_contributing_draws_the_contract_s_layers() -> None:
    """CONTRIBUTING's layer diagram is the contract of pyproject.toml, top to bottom."""
    (contract,) = contracts("layers")
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text.split("## The layering rule", 1)[1].split("```")[1]
    drawn = [re.split(r"\s{2,}", line)[0] for line in block.strip().splitlines()]
    assert drawn == contract["layers"]


PAPER_PACKAGES = ("llpf", "pathcond", "fusion", "synthesis")


def test_every_paper_module_is_an_algorithm_or_a_chapter_s() -> None:
    """The forbidden contract sorts every module of the paper packages: a new
    module must be declared an algorithm (reusable) or a chapter's protocol."""
    (contract,) = [
        c for c in contracts("forbidden") if c["name"].startswith("Algorithms")
    ]
    algorithms, protocols = contract["source_modules"], contract["forbidden_modules"]
    assert not set(algorithms) & set(protocols)
    modules = {
        f"wslib.{package}.{path.stem}"
        for package in PAPER_PACKAGES
        for path in (PACKAGE / package).glob("*.py")
        if path.stem != "__init__"
    }
    assert modules == set(algorithms) | set(protocols)


def test_the_library_never_imports_the_tooling() -> None:
    """A contract keeps ``wslib`` usable without ``bookkit`` (lint-imports checks it)."""
    assert any(
        c["source_modules"] == ["wslib"] and c["forbidden_modules"] == ["bookkit"]
        for c in contracts("forbidden")
    )
