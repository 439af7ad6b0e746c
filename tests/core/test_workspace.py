"""The workspace: relative paths are taken under the checkout, whatever the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from wslib.core import workspace as ws
from wslib.core.data import DataKey
from wslib.runs.store import Entry
from wslib.runs.zoo import Zoo

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkout_is_the_root_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    space = ws.workspace()
    assert space.root == ROOT
    assert space.zoo == ROOT / "data" / "zoo" and space.runs == ROOT / "data" / "runs"
    assert space.results == ROOT / "results"
    assert space.path("data/llpf") == space.checkpoints
    assert space.path(tmp_path / "x") == tmp_path / "x"  # absolute: as given


def test_library_calls_take_relative_paths_under_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chapters 7 and 8 load their data set first: from another folder it is the checkout's."""
    monkeypatch.chdir(tmp_path)
    zoo = Zoo()
    assert (zoo.root, zoo.data_root) == (ROOT / "data" / "zoo", ROOT / "data")
    assert Zoo("elsewhere/zoo").root == ROOT / "elsewhere" / "zoo"
    assert DataKey.of({"name": "mnist1d"}).root == str(ROOT / "data")
    assert (
        Entry("data/runs/x.json", {"k": 1}, "a run").path == ROOT / "data/runs/x.json"
    )


def test_outside_a_checkout_the_working_directory_is_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    assert not ws.in_checkout()
    assert ws.workspace().root == tmp_path.resolve()
    assert (
        ws.workspace().path("results/a.json") == tmp_path.resolve() / "results/a.json"
    )


def test_messages_show_paths_under_the_root_relative_to_it(tmp_path: Path) -> None:
    """A warning printed on a page names data/..., not the build machine's folders."""
    space = ws.workspace()
    assert space.show(ROOT / "data" / "llpf" / "x") == str(Path("data/llpf/x"))
    assert space.show(tmp_path / "y") == str(tmp_path / "y")
    assert Entry(ROOT / "data/runs/x.json", {}, "a run").shown == "data/runs/x.json"


def test_the_runner_names_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bookkit/run.py sets WSLIB_WORKSPACE: its chapters write where it reads."""
    monkeypatch.setenv(ws.ENV, str(tmp_path))
    assert ws.workspace().root == tmp_path.resolve()
    assert (
        ws.workspace().path("results/a.json") == tmp_path.resolve() / "results/a.json"
    )
