"""The book as a reference work: citations, the API reference, links from the
chapters to it, and the Colab launch of every chapter."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import nbformat
import pybtex.database
import pytest
import yaml

import bookkit.apilinks
import wslib
from bookkit import build
from tests.conftest import NOTEBOOKS, ROOT, WORK, chapter, chapters

slow = pytest.mark.slow  # the tests that read the smoke book

BOOK = ROOT / "book"
API = BOOK / "api"
CITE = re.compile(r"\{cite:[tp]\}`([^`]+)`")
AUTOMODULE = re.compile(r"^\.\. automodule:: (\S+)$", re.M)
PACKAGES = ("core", "runs", "plotting", "llpf", "pathcond", "fusion", "synthesis")


def markdown_cells(nb: str) -> str:
    cells = chapter(nb).cells
    return "\n".join(c.source for c in cells if c.cell_type == "markdown")


def cited(text: str) -> list[str]:
    return [key.strip() for keys in CITE.findall(text) for key in keys.split(",")]


def bibliography() -> set[str]:
    return set(pybtex.database.parse_file(BOOK / "references.bib").entries)


@pytest.fixture(scope="module")
def apilinks():
    return bookkit.apilinks


# --- citations ------------------------------------------------------------------------


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_every_chapter_cites_a_work_of_the_bibliography(nb: str) -> None:
    keys = cited(markdown_cells(nb))
    assert keys, f"{nb} cites no work"
    assert set(keys) <= bibliography(), set(keys) - bibliography()


def test_intro_cites_the_three_papers() -> None:
    keys = set(cited((BOOK / "intro.md").read_text()))
    assert {"tian2026llpf", "lebeurrier2026pathcond", "luenam2025fusion"} <= keys


def test_every_entry_is_cited_somewhere() -> None:
    texts = [markdown_cells(nb) for nb in NOTEBOOKS]
    texts += [p.read_text() for p in BOOK.glob("*.md")] + [
        p.read_text() for p in API.glob("*.md")
    ]
    unused = bibliography() - {k for text in texts for k in cited(text)}
    assert not unused, f"entries no page cites: {sorted(unused)}"


def test_entries_have_authors_title_year() -> None:
    for key, entry in pybtex.database.parse_file(
        BOOK / "references.bib"
    ).entries.items():
        assert entry.persons.get("author"), key
        assert entry.fields.get("title") and entry.fields.get("year"), key


# --- API reference -------------------------------------------------------------------


def documented_modules() -> list[str]:
    return [
        m for p in PACKAGES for m in AUTOMODULE.findall((API / f"{p}.md").read_text())
    ]


def test_api_pages_document_every_module_once() -> None:
    modules = {m.name for m in pkgutil.walk_packages(wslib.__path__, "wslib.")}
    documented = documented_modules()
    assert len(documented) == len(set(documented)), "a module is on two pages"
    assert set(documented) == modules, set(modules) ^ set(documented)


def test_api_pages_follow_the_layers_in_the_table_of_contents() -> None:
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text())
    (part,) = [p for p in toc["parts"] if p["caption"] == "Reference"]
    (api,) = [c for c in part["chapters"] if c["file"] == "api/index"]
    assert [s["file"] for s in api["sections"]] == [f"api/{p}" for p in PACKAGES]
    order = [wslib.__doc__.index(f"wslib.{p} ") for p in PACKAGES]
    assert order == sorted(order), "the pages' order differs from wslib's layers"


def test_every_wslib_name_in_a_chapter_resolves(apilinks) -> None:
    for nb in NOTEBOOKS:
        apilinks.link_text(markdown_cells(nb), nb)  # raises on a stale name


def test_a_stale_name_stops_the_build(apilinks) -> None:
    with pytest.raises(LookupError, match="ch9 names wslib.fusion.no_such_function"):
        apilinks.link_text("calls `wslib.fusion.no_such_function`", "ch9")
    with pytest.raises(LookupError, match="'nowhere' is not in wslib"):
        apilinks.link_text("`wslib.nowhere.f`", "ch9")
    with pytest.raises(LookupError, match="no entry in the API reference"):
        apilinks.link_text("`wslib.llpf.ticks._snapshot`", "ch3")


def test_names_link_to_the_module_that_defines_them(apilinks) -> None:
    text = "`wslib.llpf.m2m`, `wslib.core.neurons`, `wslib.runs.zoo.Zoo.get`, `x`"
    assert apilinks.link_text(text, "ch") == (
        "{py:obj}`wslib.llpf.m2m <wslib.llpf.layerwise.m2m>`, "
        "{py:mod}`wslib.core.neurons`, "
        "{py:obj}`wslib.runs.zoo.Zoo.get <wslib.runs.zoo.Zoo.get>`, `x`"
    )
    assert apilinks.link_text("`wslib.core.data.DATASETS`", "ch") == (
        "`wslib.core.data.DATASETS`"
    )


# --- Colab and downloaded chapters ---------------------------------------------------


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_every_chapter_runs_with_the_setup_cell_before_any_import(nb: str) -> None:
    """The setup cell is written once (``chapters.SETUP_CELL``), not in a chapter,
    and the runner puts it right after the parameters cell."""
    assert "WSLIB_SOURCE" not in (ROOT / "notebooks" / f"{nb}.md").read_text()
    code = [
        c for c in chapters.with_setup_cell(chapter(nb)).cells if c.cell_type == "code"
    ]
    assert "parameters" in code[0].metadata["tags"]
    assert code[1].source == chapters.SETUP_CELL
    assert "hide-input" in code[1].metadata["tags"]
    assert not [
        c for c in code[:2] if "import wslib" in c.source or "from wslib" in c.source
    ]


def test_a_chapter_without_a_parameters_cell_first_is_refused() -> None:
    notebook = chapter(NOTEBOOKS[0])
    notebook.cells = [
        c for c in notebook.cells if "parameters" not in c.metadata.get("tags", [])
    ]
    with pytest.raises(ValueError, match="first code cell must be its parameters cell"):
        chapters.with_setup_cell(notebook)


def test_pin_install_points_the_setup_cell_at_a_commit(tmp_path: Path) -> None:
    executed = tmp_path / "ch.ipynb"
    nbformat.write(chapters.with_setup_cell(chapter(NOTEBOOKS[0])), executed)
    build.pin_install(executed, "git+https://github.com/a/b@0123abc")
    text = executed.read_text()
    assert "git+https://github.com/a/b@0123abc" in text
    assert "@main" not in text


# --- the built smoke book --------------------------------------------------------------


@slow
def test_bibliography_page_lists_every_entry(smoke_book: Path) -> None:
    page = (smoke_book / "references.html").read_text()
    entries = re.findall(r'role="doc-biblioentry"', page)  # one per entry
    assert len(entries) == len(bibliography())


@slow
def test_chapter_names_link_to_the_api_reference(smoke_book: Path) -> None:
    page = (smoke_book / "chapters" / "03_llpf_m2m.html").read_text()
    assert 'href="../api/llpf.html#wslib.llpf.layerwise.m2m"' in page
    api = (smoke_book / "api" / "llpf.html").read_text()
    assert 'id="wslib.llpf.layerwise.m2m"' in api


@slow
def test_no_reference_is_left_unresolved(smoke_book: Path) -> None:
    for page in smoke_book.rglob("*.html"):
        text = page.read_text()
        xrefs = text.count('<code class="xref py')
        linked = len(
            re.findall(r'<a class="reference internal"[^>]*><code class="xref py', text)
        )
        assert xrefs == linked, f"{page.name}: {xrefs - linked} unresolved API names"
        assert "[" + "tian2026llpf" not in text  # a citation left as its key


@slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_chapter_opens_in_colab_at_its_commit(smoke_book: Path, nb: str) -> None:
    page = (smoke_book / "chapters" / f"{nb}.html").read_text()
    assert (
        "https://colab.research.google.com/github/weight-space/study-book/blob/"
        f"gh-pages/_sources/chapters/{nb}.ipynb"
    ) in page
    assert (smoke_book / "_sources" / "chapters" / f"{nb}.ipynb").is_file()
    chapter = (WORK / "book" / "chapters" / f"{nb}.ipynb").read_text()
    assert re.search(
        r"git\+https://github\.com/weight-space/study-book@[0-9a-f]{40}", chapter
    )
