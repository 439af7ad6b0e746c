"""The chapters' sources: MyST Markdown notebooks that convert to valid Jupyter
notebooks and back without loss (cells, tags, metadata, kernel spec)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from bookkit import profiles
from tests.conftest import NOTEBOOKS, ROOT, chapter, chapters

# the tags the chapters use: Jupyter Book's hide/remove tags and papermill's
TAGS = {"parameters", "hide-input", "hide-output", "remove-input", "remove-cell"}
CODE_CELL = re.compile(r"^```\{code-cell\}", re.MULTILINE)


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_chapter_is_a_valid_notebook_with_its_kernel(nb: str) -> None:
    notebook = chapter(nb)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec == {
        "display_name": "Python 3",
        "language": "python",
        "name": "python3",
    }
    text = (ROOT / "notebooks" / f"{nb}.md").read_text()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert len(code) == len(CODE_CELL.findall(text))  # no code cell read as text


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_chapter_survives_the_round_trip(nb: str, tmp_path: Path) -> None:
    """Written back, a chapter is the same text: what a review reads is what runs."""
    notebook = chapter(nb)
    copy = tmp_path / f"{nb}.md"
    chapters.write(notebook, copy)
    assert copy.read_text() == (ROOT / "notebooks" / f"{nb}.md").read_text()
    again = chapters.read(copy)
    assert [(c.cell_type, c.source, c.metadata) for c in again.cells] == [
        (c.cell_type, c.source, c.metadata) for c in notebook.cells
    ]
    assert again.metadata == notebook.metadata


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_chapter_has_its_parameters_cell_and_known_tags(nb: str) -> None:
    cells = chapter(nb).cells
    tagged = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert [c.metadata.tags for c in tagged] == [["parameters", "hide-input"]]
    assert tagged[0] is next(c for c in cells if c.cell_type == "code")
    used = {tag for c in cells for tag in c.metadata.get("tags", [])}
    assert used <= TAGS, f"unknown tags {used - TAGS}: a typo, or add them to TAGS"


CELL_PARAMETERS = ["profile", "seed", "results_path"]


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_the_parameters_cell_holds_the_profile_seed_and_results_path_alone(
    nb: str,
) -> None:
    """Every other parameter is written once, in notebooks/params/cpu.yaml,
    and each of them is read by the chapter's code (a typo there would define
    a parameter nothing reads)."""
    assert list(profiles.cell_parameters(nb)) == CELL_PARAMETERS
    cpu = profiles.load_profile("cpu")[nb]
    code = "\n".join(c.source for c in chapter(nb).cells if c.cell_type == "code")
    read = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
    assert sorted(set(cpu) - read) == [], "cpu parameters the chapter never reads"
    assert not set(cpu) & set(CELL_PARAMETERS)


# The cpu values several chapters share are written once in cpu.yaml (YAML
# anchors); they must stay chapter 1's, or the zoo stops sharing the modes.
# Chapter -> {its parameter: chapter 1's parameter, entry or None}.
SHARED = {
    "02_layerwise": {"models": ("models", None), "recipes": ("recipes", None)},
    "03_llpf_m2m": {"models": ("models", None), "recipes": ("recipes", None)},
    "04_llpf_baselines": {"models": ("models", None), "recipes": ("recipes", None)},
    "05_llpf_spheres": {
        "arch": ("models", "mlp"),
        "recipe": ("recipes", "mlp"),
        "norm_arch": ("models", "resnet"),
        "norm_recipe": ("recipes", "resnet"),
    },
    "12_synthesis": {"models": ("models", None), "recipes": ("recipes", None)},
}


@pytest.mark.parametrize("nb", sorted(SHARED))
def test_shared_defaults_are_chapter_1s(nb: str) -> None:
    first, mine = (
        profiles.default_parameters("01_symmetries"),
        profiles.default_parameters(nb),
    )
    assert mine["data"] == first["data"]
    for name, (source, entry) in SHARED[nb].items():
        if entry is not None:
            assert mine[name] == first[source][entry], name
        else:  # chapter 1's entries that the chapter has (chapter 3 adds one)
            shared = {k: v for k, v in mine[name].items() if k in first[source]}
            assert shared == {k: first[source][k] for k in shared}, name


SEED_MENTION = re.compile(r"derive_seeds?\(seed, \"(?P<role>[\w-]+)\"")
SEED_ARITHMETIC = re.compile(r"\$\d+\s*s\b|\bseed\s*[+*]\s*\d|\$s\s*\+\s*\d")


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_prose_on_seeds_names_the_roles_the_code_uses(nb: str) -> None:
    """A sentence that says how a seed is derived names a role of
    ``derive_seed`` that the chapter's code or its library package does use,
    and no chapter describes seeds as arithmetic on ``seed`` (the scheme
    ``derive_seed`` replaced: seeds s and s + 1 share models)."""
    from wslib.core.seeds import ROLES

    notebook = chapter(nb)
    prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    package = {m.group(1) for m in re.finditer(r"from wslib\.(\w+)\.", code)}
    library = "\n".join(
        p.read_text()
        for name in package - {"core", "runs", "plotting"}
        for p in (ROOT / "wslib" / name).glob("*.py")
    )
    for mention in SEED_MENTION.finditer(prose):
        role = mention["role"]
        assert role in ROLES, f"{nb} names the seed role {role!r}, not one of {ROLES}"
        assert f'"{role}"' in code + library, f"{nb}'s prose names {role!r}, unused"
    assert not SEED_ARITHMETIC.search(prose), SEED_ARITHMETIC.search(prose)
