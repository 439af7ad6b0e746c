"""bookkit/affected.py: the chapters a change touches (the pull-request matrix)."""

from __future__ import annotations

import io
import json

import pytest

from bookkit import affected

ALL = affected.chapter_stems()
FUSION = ["09_fusion_cost", "10_fusion_regimes", "11_fusion_beyond", "12_synthesis"]


def test_the_chapters_are_the_twelve_sources_in_book_order() -> None:
    assert len(ALL) == 12 and ALL == sorted(ALL) and ALL[0] == "01_symmetries"


@pytest.mark.parametrize(
    ("paths", "want"),
    [
        (["notebooks/06_pathlifting.md"], ["06_pathlifting"]),
        # only the fusion chapters (and the synthesis, which fuses) import levels
        (["wslib/fusion/levels.py"], FUSION),
        # chapter 4's methods, and the chapters importing the package (which imports it)
        (["wslib/llpf/curves.py"], [ALL[1], ALL[3], ALL[4], "12_synthesis"]),
        # imported by run.py (seeds are checked there): every chapter runs it
        (["wslib/core/seeds.py"], ALL),
        (["bookkit/run.py"], ALL),
        (["bookkit/engine.py"], ALL),
        (["bookkit/profiles.py"], ALL),
        (["notebooks/params/smoke.yaml"], ALL),
        (["pyproject.toml"], ALL),
        (["README.md", "tests/core/test_data.py", "book/intro.md"], []),
        # every chapter's defaults: the smoke profile keeps those it does not set
        (["notebooks/params/cpu.yaml"], ALL),
    ],
)
def test_a_change_touches_the_chapters_that_import_it(paths, want) -> None:
    assert affected.affected(paths) == want


def test_a_package_init_is_the_package_module() -> None:
    assert affected.module_of("wslib/fusion/__init__.py") == "wslib.fusion"
    assert affected.module_of("wslib/fusion/hfkf.py") == "wslib.fusion.hfkf"
    assert affected.module_of("bookkit/run.py") is None
    assert affected.module_of("wslib/py.typed") is None


def test_imports_are_read_by_module_and_by_imported_submodule() -> None:
    known = {"wslib.core", "wslib.core.seeds", "wslib.fusion", "wslib.fusion.hfkf"}
    source = (
        "import os\nfrom wslib.core import seeds\nfrom wslib.fusion import fuse\n"
        "import wslib.fusion.hfkf as h\nfrom .local import x\n"
    )
    assert affected.imported_modules(source, known) == {
        "wslib.core",
        "wslib.core.seeds",
        "wslib.fusion",
        "wslib.fusion.hfkf",
    }


def test_every_chapter_reaches_the_modules_it_imports_and_theirs() -> None:
    """Chapter 1 imports wslib.core.matching, which imports wslib.core.neurons."""
    graph = affected.grimp.build_graph("wslib")
    known = set(graph.modules)
    direct = affected.imported_modules(affected.chapter_source(ALL[0]), known)
    assert "wslib.core.matching" in direct
    assert "wslib.core.neurons" in affected.reach(graph, direct)


def test_the_matrix_is_one_json_line_read_from_arguments_or_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert affected.main(["notebooks/01_symmetries.md"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    assert json.loads(line) == {"include": [{"nb": "01_symmetries"}], "jobs": 1}
    monkeypatch.setattr(
        "sys.stdin", io.StringIO("README.md\nnotebooks/02_layerwise.md\n")
    )
    assert affected.main(["-"]) == 0
    assert json.loads(capsys.readouterr().out)["include"] == [{"nb": "02_layerwise"}]
    assert affected.main([]) == 2
