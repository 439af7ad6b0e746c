"""The smoke book's pages, read as files: no error output, figures and glued
numbers on every chapter, internal links that resolve, prose that is glued from
the run rather than typed.

Every check here fails on a broken book: a notebook cell that printed a
traceback, a chapter without a figure, a ``{glue}`` reference whose value is
not on the page, a link to a missing page or anchor, a size that is only true
in the cpu profile.
"""

from __future__ import annotations

import json
import re
import tempfile
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
from myst_nb.core.variables import format_plain_text

from bookkit import profiles
from tests.conftest import NOTEBOOKS, ROOT, SMOKE, WORK
from wslib.runs.claim_list import CLAIMS

slow = pytest.mark.slow  # the tests that read the smoke book

EXECUTED = WORK / "build" / SMOKE
# Phrases of chapters 7 and 8 before 0.2 that are true in the cpu profile only.
CPU_ONLY = ("4000 examples", "40-256-32-256-40", "10000 signals")


class Page(HTMLParser):
    """Text, element ids and outgoing references of one HTML file."""

    REFERENCES = {"a": "href", "link": "href", "img": "src", "script": "src"}

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.ids: set[str] = set()
        self.references: list[str] = []
        self.images: list[str] = []
        self._text: list[str] = []
        self._skip = 0
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("id", "name"):
            if values.get(name) and (name == "id" or tag == "a"):
                self.ids.add(values[name])
        if (ref := values.get(self.REFERENCES.get(tag, ""))) is not None:
            self.references.append(ref)
        if tag == "img" and values.get("src"):
            self.images.append(values["src"])
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._text.append(data)

    @property
    def text(self) -> str:
        """The visible text, whitespace collapsed."""
        return re.sub(r"\s+", " ", unescape("".join(self._text)))


@pytest.fixture(scope="module")
def pages(smoke_book: Path) -> dict[Path, Page]:
    """Every HTML page of the built book (Sphinx's own assets left out)."""
    return {
        path: Page(path)
        for path in sorted(smoke_book.rglob("*.html"))
        if not path.relative_to(smoke_book).parts[0].startswith("_")
    }


def chapter(pages: dict[Path, Page], smoke_book: Path, nb: str) -> Page:
    return pages[smoke_book / "chapters" / f"{nb}.html"]


def executed(nb: str) -> nbformat.NotebookNode:
    return nbformat.read(EXECUTED / f"{nb}.ipynb", as_version=4)


# --- executed notebooks -----------------------------------------------------------


@slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_executed_notebook_has_no_error_output(smoke_book: Path, nb: str) -> None:
    """No error output and no traceback printed to a stream (the book hides stderr)."""
    bad = [
        f"cell {i}: {output.get('ename') or output.get('name')}"
        for i, cell in enumerate(executed(nb).cells)
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
        or "Traceback (most recent call last)" in output.get("text", "")
    ]
    assert not bad, bad


# --- glue ---------------------------------------------------------------------------

ROLE = re.compile(r"\{glue(?::(\w*))?\}`([^`]+)`")
DIRECTIVE = re.compile(r"^\s*(?:```+|:::+)\s*\{glue(?::(\w*))?\}\s+(\S+)", re.M)


def glued_values(notebook: nbformat.NotebookNode) -> dict[str, dict]:
    """Key -> mime bundle (``text/plain``, ...) of every value the notebook glued."""
    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if "scrapbook" not in output.get("metadata", {}):
                continue
            record = output.metadata["scrapbook"]
            prefix = record.get("mime_prefix", "")
            values[record["name"]] = {
                mime.removeprefix(prefix): value
                for mime, value in output.get("data", {}).items()
            }
    return values


def glue_references(notebook: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """(kind, key, format spec) of every glue role and directive in the markdown."""
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for kind, body in ROLE.findall(cell.source):
            key, _, spec = body.partition(":") if kind == "text" else (body, "", "")
            found.append((kind or "any", key, spec))
        found += [(k or "any", key, "") for k, key in DIRECTIVE.findall(cell.source)]
    return found


@slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_every_glue_reference_is_rendered(
    pages: dict[Path, Page], smoke_book: Path, nb: str
) -> None:
    """Each referenced key was glued, and each glued text value is on the page."""
    notebook = executed(nb)
    values = glued_values(notebook)
    text = chapter(pages, smoke_book, nb).text
    assert "{glue" not in text, "a glue reference was left as text"
    missing, absent = [], []
    for kind, key, spec in glue_references(notebook):
        if key not in values:
            missing.append(key)
        elif kind == "text":
            shown = format_plain_text(values[key]["text/plain"], spec or "s")
            if re.sub(r"\s+", " ", shown).strip() not in text:
                absent.append(f"{key} = {shown!r}")
    assert not missing, f"glue keys never glued: {missing}"
    assert not absent, f"glued values not on the page: {absent}"


@slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_chapter_has_glued_numbers_and_a_figure(
    pages: dict[Path, Page], smoke_book: Path, nb: str
) -> None:
    page = chapter(pages, smoke_book, nb)
    assert glue_references(executed(nb)), "the prose glues no number from the run"
    figures = [src for src in page.images if "_static" not in src.split("/")[:2]]
    assert figures, "no figure on the page"


def test_glue_parsing() -> None:
    cell = nbformat.v4.new_markdown_cell(
        "a {glue:text}`loss:.2f` b {glue}`n` c {glue:md}`table`\n"
        "```{glue:figure} fig\n:name: f\n```\n"
    )
    notebook = nbformat.v4.new_notebook(cells=[cell])
    assert glue_references(notebook) == [
        ("text", "loss", ".2f"),
        ("any", "n", ""),
        ("md", "table", ""),
        ("figure", "fig", ""),
    ]


# --- links --------------------------------------------------------------------------


def broken_links(pages: dict[Path, Page], root: Path) -> list[str]:
    """Internal references (href/src) whose file or #fragment does not exist."""
    broken = []
    for path, page in pages.items():
        for ref in page.references:
            parts = urlsplit(ref)
            if parts.scheme or ref.startswith("//"):
                continue  # external (http:, mailto:, data:, ...)
            target = (
                (path.parent / unquote(parts.path)).resolve() if parts.path else path
            )
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(root)}: {ref}"
            if not target.exists():
                broken.append(f"{where} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else Page(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where} (no element with that id)")
    return broken


@slow
def test_every_internal_link_resolves(
    pages: dict[Path, Page], smoke_book: Path
) -> None:
    assert sum(len(page.references) for page in pages.values()) > 0
    broken = broken_links(pages, smoke_book)
    assert not broken, "\n".join(broken)


def test_link_check_sees_broken_links(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text(
        '<a href="b.html#there">ok</a><a href="b.html#nowhere">x</a>'
        '<img src="missing.png"><a href="https://example.org/">ext</a>'
        '<a href="#top">self</a><p id="top"></p>'
    )
    (tmp_path / "b.html").write_text('<h1 id="there">B</h1>')
    pages = {p: Page(p) for p in sorted(tmp_path.glob("*.html"))}
    assert broken_links(pages, tmp_path) == [
        "a.html: b.html#nowhere (no element with that id)",
        "a.html: missing.png (no file)",
    ]


# --- prose true in every profile ----------------------------------------------------


def smoke_params(nb: str) -> dict:
    """The effective parameters of the smoke run (recorded by bookkit/run.py)."""
    return json.loads((WORK / "results" / SMOKE / f"{nb}.json").read_text())["params"]


def cpu_params(nb: str) -> dict:
    """The notebook's defaults: its cpu profile entry, model configs completed."""
    return profiles.default_parameters(nb)


def n_train(data: dict) -> int:
    from wslib.core.data import load_dataset

    options = {k: v for k, v in data.items() if k != "name"}
    return len(load_dataset(data["name"], root=WORK / "data", **options).x_train)


def number(value: int) -> re.Pattern:
    """``value`` as a whole number in text, with or without thousands separators."""
    forms = {str(value), f"{value:,}", f"{value:,}".replace(",", "\u202f")}
    alternatives = "|".join(re.escape(form) for form in forms)
    return re.compile(rf"(?<![\d.,])(?:{alternatives})(?![\d]|[.,]\d)")


def sizes(nb: str, params: dict) -> dict[str, str]:
    """What chapters 7 and 8 must say about the run's data and models."""
    found = {"training examples": str(n_train(params["data"]))}
    if "cost_data" in params:
        found["cost examples"] = str(n_train(params["cost_data"]))
    if "archs" in params and "autoencoder" in params["archs"]:
        widths = params["archs"]["autoencoder"]["model"]["widths"]
        found["autoencoder widths"] = "-".join(map(str, widths))
    return found


PROSE = ["07_pathcond_mlp", "08_pathcond_conv"]


@slow
@pytest.mark.parametrize("nb", PROSE)
def test_smoke_profile_uses_other_sizes_than_cpu(smoke_book: Path, nb: str) -> None:
    """Otherwise a typed cpu number would also be true in the smoke book."""
    smoke, cpu = sizes(nb, smoke_params(nb)), sizes(nb, cpu_params(nb))
    same = {k: v for k, v in smoke.items() if cpu[k] == v}
    assert not same, f"set other sizes in notebooks/params/smoke.yaml: {same}"


@slow
@pytest.mark.parametrize("nb", PROSE)
def test_prose_states_the_run_sizes(
    pages: dict[Path, Page], smoke_book: Path, nb: str
) -> None:
    """The smoke run's sizes are on the page; the cpu profile's are not."""
    text = chapter(pages, smoke_book, nb).text
    smoke, cpu = sizes(nb, smoke_params(nb)), sizes(nb, cpu_params(nb))
    for what, value in smoke.items():
        pattern = number(int(value)) if value.isdigit() else re.compile(value)
        assert pattern.search(text), (
            f"{what} of the smoke run ({value}) not on the page"
        )
        if cpu[what] != value:
            other = cpu[what]
            pattern = number(int(other)) if other.isdigit() else re.compile(other)
            assert not pattern.search(text), (
                f"{what} of the cpu profile ({other}) typed"
            )


@slow
@pytest.mark.parametrize("nb", PROSE)
def test_no_cpu_only_phrase(pages: dict[Path, Page], smoke_book: Path, nb: str) -> None:
    """The phrases chapters 7 and 8 typed before 0.2, true in the cpu profile only."""
    text = chapter(pages, smoke_book, nb).text
    assert not [phrase for phrase in CPU_ONLY if phrase in text]


def test_number_pattern() -> None:
    pattern = number(4000)
    assert pattern.search("on 4000 examples") and pattern.search("(4,000 signals)")
    assert not pattern.search("14000 or 40000 or 0.4000 or 4000.5")


def key_paths(metrics: object, prefix: str = "") -> set[str]:
    """Every ``/``-joined key path of a results file's metrics, null leaves included."""
    if not isinstance(metrics, dict):
        return {prefix.rstrip("/")}
    return set().union(*(key_paths(v, f"{prefix}{k}/") for k, v in metrics.items()))


@slow
def test_every_claim_names_a_metric_its_chapter_writes(
    pages: dict, smoke_book: Path
) -> None:
    """Each claim's metrics exist in the smoke run (a censored one may be null)."""
    missing = []
    for claim in CLAIMS:
        results = json.loads(
            (WORK / "results" / SMOKE / f"{claim.chapter}.json").read_text()
        )
        paths = key_paths(results["metrics"])
        used = [m for m in (claim.metric, claim.per, claim.minus) if m]
        missing += [f"{claim.id}: {m}" for m in used if m not in paths]
    assert not missing, missing
    text = pages[smoke_book / "ledger.html"].text.replace("\u2019", "'")  # smart quotes
    assert [claim.id for claim in CLAIMS if claim.text not in text] == []


@slow
def test_no_page_shows_a_folder_of_the_build_machine(
    pages: dict[Path, Page], smoke_book: Path
) -> None:
    """Neither the checkout's absolute path, the home folder nor the temporary
    folder of the build machine appears on a page."""
    folders = {str(ROOT), str(WORK), str(Path.home()), tempfile.gettempdir()}
    leaks = [
        f"{path.relative_to(smoke_book)}: {folder}"
        for path in pages
        for folder in folders
        if folder in path.read_text(errors="replace")
    ]
    assert not leaks, leaks
