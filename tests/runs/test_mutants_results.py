"""Results files, found by mutation testing (``make mutation MODULE=runs/results``).

Pinned against independent references: :func:`hardware` against a hand-written
``/proc/cpuinfo`` (read from ``tmp_path``) and a faked CUDA device and
``platform``; :func:`git_commit` against a fake ``git`` script put first on
``PATH`` (its outputs and exit codes chosen per test, its calls recorded) and a
faked :func:`in_checkout`; :func:`environment` against its whole dictionary
written out, with faked package metadata and CUDA; and :func:`write_results`
against the exact text of the file (two-space indent, keys in the order given)
and folders that do or do not exist yet.
"""

from __future__ import annotations

import json
import os
import platform
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from wslib.runs import results
from wslib.runs.results import environment, git_commit, hardware, write_results

# --- hardware -------------------------------------------------------------------------


def _cpu_machine(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    cpuinfo: str | None,
    processor: str = "proc-name",
    machine: str = "machine-name",
) -> None:
    """A machine without CUDA whose ``/proc/cpuinfo`` is ``cpuinfo`` (None: unreadable)."""
    fake = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        fake.write_text(cpuinfo)
    missing = tmp_path / "no-such-file"

    def fake_path(name: str) -> Path:
        return fake if name == "/proc/cpuinfo" else missing

    monkeypatch.setattr(results, "Path", fake_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(platform, "processor", lambda: processor)
    monkeypatch.setattr(platform, "machine", lambda: machine)


def _threads() -> str:
    return f"{torch.get_num_threads()} threads"


def test_hardware_on_cuda_names_device_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {0: "Card Zero", 1: "Card One"}
    asked: list[object] = []

    def device_name(index: object) -> str:
        asked.append(index)
        return names.get(index, "current device")  # type: ignore[arg-type]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", device_name)
    assert hardware() == "GPU Card Zero"
    assert asked == [0]


def test_hardware_reads_the_first_model_name_of_proc_cpuinfo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cpuinfo = (
        "processor\t: 0\n"
        "vendor_id\t: GenuineIntel\n"
        "model name\t: Fancy CPU @ 2.0GHz\n"
        "\n"
        "processor\t: 1\n"
        "model name\t: Second CPU\n"
    )
    _cpu_machine(monkeypatch, tmp_path, cpuinfo)
    assert hardware() == f"CPU Fancy CPU @ 2.0GHz, {_threads()}"


def test_hardware_keeps_colons_inside_the_model_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _cpu_machine(monkeypatch, tmp_path, "model name : Odd: CPU: rev 2 \n")
    assert hardware() == f"CPU Odd: CPU: rev 2, {_threads()}"


def test_hardware_without_a_model_name_falls_back_to_platform_processor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _cpu_machine(monkeypatch, tmp_path, "processor\t: 0\nModel Name: not this\n")
    assert hardware() == f"CPU proc-name, {_threads()}"


def test_hardware_falls_back_to_platform_machine_without_a_processor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _cpu_machine(monkeypatch, tmp_path, None, processor="")
    assert hardware() == f"CPU machine-name, {_threads()}"


def test_hardware_prefers_platform_processor_when_cpuinfo_is_unreadable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _cpu_machine(monkeypatch, tmp_path, None)
    assert hardware() == f"CPU proc-name, {_threads()}"


# --- git_commit -----------------------------------------------------------------------

FAKE_GIT = """#!/bin/sh
echo "$PWD|$*" >> "$FAKE_GIT_DIR/calls"
case "$1" in
  rev-parse) out=head rc=head_rc ;;
  status) out=status rc=status_rc ;;
  *) exit 2 ;;
esac
cat "$FAKE_GIT_DIR/$out"
exit "$(cat "$FAKE_GIT_DIR/$rc")"
"""


class FakeGit:
    """A ``git`` on ``PATH`` that answers rev-parse and status from files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        script = folder / "git"
        script.write_text(FAKE_GIT)
        script.chmod(0o755)
        self.answer("head", "0123456789ab\n")
        self.answer("status", "")

    def answer(self, command: str, out: str, rc: int = 0) -> None:
        (self.folder / command).write_text(out)
        (self.folder / f"{command}_rc").write_text(str(rc))

    def calls(self) -> list[str]:
        log = self.folder / "calls"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def fake_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeGit:
    fake = FakeGit(tmp_path / "fakegit")
    monkeypatch.setenv("PATH", f"{fake.folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GIT_DIR", str(fake.folder))
    return fake


def _calls_in(root: Path) -> list[str]:
    return [
        f"{root}|rev-parse --short=12 HEAD",
        f"{root}|status --porcelain --untracked-files=no",
    ]


def test_git_commit_of_an_explicit_root_runs_outside_a_checkout(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(results, "in_checkout", lambda: False)
    assert git_commit(tmp_path) == "0123456789ab"
    assert fake_git.calls() == _calls_in(tmp_path)


def test_git_commit_marks_a_changed_tree_dirty(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(results, "in_checkout", lambda: True)
    fake_git.answer("status", " M a.txt\n")
    assert git_commit(str(tmp_path)) == "0123456789ab-dirty"


def test_git_commit_without_a_root_outside_a_checkout_is_unknown(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "in_checkout", lambda: False)
    assert git_commit() == "unknown"
    assert fake_git.calls() == []


def test_git_commit_without_a_root_in_a_checkout_reads_the_checkout(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "in_checkout", lambda: True)
    assert git_commit() == "0123456789ab"
    assert fake_git.calls() == _calls_in(results.CHECKOUT)


def test_git_commit_is_unknown_when_rev_parse_fails(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As in a repository without commits: git prints ``HEAD`` and exits 128."""
    monkeypatch.setattr(results, "in_checkout", lambda: True)
    fake_git.answer("head", "HEAD\n", rc=128)
    assert git_commit(tmp_path) == "unknown"


def test_git_commit_is_unknown_when_status_fails(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As with a corrupt index: the commit alone would claim a clean tree."""
    monkeypatch.setattr(results, "in_checkout", lambda: True)
    fake_git.answer("status", "", rc=128)
    assert git_commit(tmp_path) == "unknown"


# --- environment ----------------------------------------------------------------------


def _fake_environment(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    missing = "captum"

    def version(name: str) -> str:
        if name == missing:
            raise metadata.PackageNotFoundError(name)
        return f"{name}-version"

    fake_metadata = types.SimpleNamespace(
        version=version, PackageNotFoundError=metadata.PackageNotFoundError
    )
    monkeypatch.setattr(results, "metadata", fake_metadata)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(results, "git_commit", lambda: "c0ffee")
    monkeypatch.setattr(results, "devices_used", lambda: ["cpu", "cuda"])
    monkeypatch.setattr(results, "hardware", lambda: "a test machine")


def _expected_environment(device: str) -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": "numpy-version",
        "scikit-learn": "scikit-learn-version",
        "POT": "POT-version",
        "captum": "not installed",
        "papermill": "papermill-version",
        "commit": "c0ffee",
        "device": device,
        "devices_used": ["cpu", "cuda"],
        "threads": torch.get_num_threads(),
        "hardware": "a test machine",
    }


def test_environment_on_a_cpu_machine_marks_missing_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_environment(monkeypatch, cuda=False)
    assert environment() == _expected_environment("cpu")


def test_environment_on_a_cuda_machine_says_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_environment(monkeypatch, cuda=True)
    assert environment() == _expected_environment("cuda")


# --- write_results --------------------------------------------------------------------

ENV = {"commit": "c0ffee", "device": "cpu"}


def test_write_results_writes_two_space_json_in_the_given_key_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(results, "environment", lambda: dict(ENV))
    monkeypatch.setattr(results, "time", types.SimpleNamespace(time=lambda: 1234.5))
    path = tmp_path / "nb.json"  # its folder exists already
    write_results(path, {"b": np.float64(1.5), "a": [1, 2]}, {"train": 2.0})
    assert path.read_text() == (
        "{\n"
        '  "metrics": {\n'
        '    "b": 1.5,\n'
        '    "a": [\n'
        "      1,\n"
        "      2\n"
        "    ]\n"
        "  },\n"
        '  "timings_s": {\n'
        '    "train": 2.0\n'
        "  },\n"
        '  "env": {\n'
        '    "commit": "c0ffee",\n'
        '    "device": "cpu"\n'
        "  },\n"
        '  "finished": 1234.5\n'
        "}\n"
    )


def test_write_results_creates_missing_parent_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(results, "environment", lambda: dict(ENV))
    path = tmp_path / "profile" / "group" / "nb.json"
    written = write_results(path, {"acc": 0.5}, {})
    assert json.loads(path.read_text()) == written
    assert written["metrics"] == {"acc": 0.5} and written["env"] == ENV


def test_write_results_overwrites_a_file_in_an_existing_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(results, "environment", lambda: dict(ENV))
    path = tmp_path / "profile" / "nb.json"
    write_results(path, {"acc": 0.25}, {})
    write_results(path, {"acc": 0.75}, {})
    assert json.loads(path.read_text())["metrics"] == {"acc": 0.75}


def test_a_write_that_fails_midway_leaves_the_last_results_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The file is written beside its place and renamed into it: a run
    stopped while writing leaves the previous results, and no partial file."""
    monkeypatch.setattr(results, "environment", lambda: dict(ENV))
    path = tmp_path / "nb.json"
    write_results(path, {"acc": 0.25}, {})
    before = path.read_text()

    def half_then_fail(self: Path, text: str) -> int:
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(KeyboardInterrupt):
        write_results(path, {"acc": 0.75}, {})
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["nb.json"]


def test_git_commit_reads_a_status_that_is_not_utf8(
    fake_git: FakeGit, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A changed file named in Latin-1 (``core.quotePath=false``) still marks
    the tree dirty; decoding the status as text raised UnicodeDecodeError."""
    monkeypatch.setattr(results, "in_checkout", lambda: True)
    (fake_git.folder / "status").write_bytes(b" M caf\xe9.txt\n")
    assert git_commit(tmp_path) == "0123456789ab-dirty"
