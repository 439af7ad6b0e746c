"""The console script ``bookkit``: one command per module, errors named."""

from __future__ import annotations

import importlib
import inspect
import sys
import tomllib
from pathlib import Path

import pytest

import bookkit
from bookkit.__main__ import COMMANDS, main, other_checkout
from tests.conftest import ROOT


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_is_a_module_with_a_main_and_is_listed(command: str) -> None:
    module = importlib.import_module(f"bookkit.{COMMANDS[command]}")
    assert list(inspect.signature(module.main).parameters) == ["argv"]
    assert f"``{command}``" in (bookkit.__doc__ or "")


@pytest.mark.parametrize(
    ("argv", "message"), [([], "no command given"), (["rnu"], "unknown command 'rnu'")]
)
def test_a_missing_or_unknown_command_is_named_with_the_commands(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and " ".join(COMMANDS) in err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture) -> None:
    assert main(["--help"]) == 0
    assert " ".join(COMMANDS) in capsys.readouterr().out


def test_a_command_gets_the_other_arguments_under_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    def record(argv: list[str]) -> int:
        calls.append((sys.argv[0], argv))
        return 3

    monkeypatch.setattr("bookkit.sweep.main", record)
    program = sys.argv[0]
    assert main(["sweep", "--seeds", "1"]) == 3  # its exit status
    assert calls == [("bookkit sweep", ["--seeds", "1"])]  # argparse's usage line
    assert sys.argv[0] == program


def test_the_console_script_is_the_dispatcher() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"bookkit": "bookkit.__main__:main"}


def test_another_checkout_without_its_own_bookkit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """From a checkout's root without bookkit/, ``python -m bookkit`` would run the
    installed package on its own repository's files: refused, naming both."""
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path.resolve()} holds chapters but no bookkit/ of its own" in err
    assert f"installed from {ROOT}" in err


def test_the_repository_and_a_folder_without_chapters_may_run_it(
    tmp_path: Path,
) -> None:
    assert other_checkout(ROOT, ROOT) is None
    assert other_checkout(tmp_path, ROOT) is None
