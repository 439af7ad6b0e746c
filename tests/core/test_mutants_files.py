"""Hashes, digests, entry logs and entry locks, found by mutation testing
(``make mutation MODULE=core/files``).

Pinned against independent references: :func:`stable_hash` and
:func:`tensor_digest` against a flat re-serialisation hashed with
:mod:`hashlib` (default lengths included); the temporary file name of
:func:`atomic_write` against its documented pattern; :func:`process_state`
against hand-written ``/proc`` stat lines (a ``/proc`` under ``tmp_path``) and a
recorded ``os.kill``; :func:`_holder` against its exact messages; and the
waiting loop of ``_acquire`` against a fake clock (every sleep, warning and
message of a held lock, step by step).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from wslib.core import files
from wslib.core.files import (
    ENTRY_LOG,
    atomic_write,
    note_entry,
    process_state,
    stable_hash,
    tensor_digest,
)
from wslib.core.workspace import ENV as WORKSPACE_ENV

# --- hashes and digests ---------------------------------------------------------------


def test_stable_hash_is_a_20_character_sha256_of_sorted_compact_json() -> None:
    obj = {"b": [1, 2.5, "x"], "a": {"z": None, "y": True}}
    text = '{"a":{"y":true,"z":null},"b":[1,2.5,"x"]}'
    assert json.dumps(obj, sort_keys=True, separators=(",", ":")) == text
    full = hashlib.sha256(text.encode()).hexdigest()
    assert stable_hash(obj) == full[:20]
    assert stable_hash(obj, length=7) == full[:7]


def _reference_digest(pairs: list[tuple[str, np.ndarray]], length: int = 16) -> str:
    h = hashlib.sha256()
    for name, arr in pairs:
        h.update(f"{name}:{arr.dtype}:{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:length]


def test_tensor_digest_of_a_bare_array_has_an_empty_name_and_16_characters() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert tensor_digest(arr) == _reference_digest([("", arr)])
    assert len(tensor_digest(arr)) == 16
    assert tensor_digest(arr, length=30) == _reference_digest([("", arr)], 30)


def test_tensor_digest_of_a_state_dict_is_sorted_by_name() -> None:
    a, b = torch.ones(2), torch.zeros(1, 2, dtype=torch.float64)
    expected = _reference_digest([("a", a.numpy()), ("b", b.numpy())])
    assert tensor_digest({"b": b, "a": a}) == expected


def test_tensor_digest_reads_tensors_that_require_grad() -> None:
    """A parameter is detached before it is read (``np.asarray`` refuses it)."""
    weight = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))
    reference = _reference_digest([("", weight.detach().numpy())])
    assert tensor_digest(weight) == reference
    assert tensor_digest({"w": weight}) == _reference_digest(
        [("w", weight.detach().numpy())]
    )


@pytest.mark.parametrize(
    "other",
    [
        np.array([1.0, 2.0, 4.0], dtype=np.float32),  # one element
        np.array([1.0, 2.0, 3.0], dtype=np.float64),  # dtype
        np.array([[1.0, 2.0, 3.0]], dtype=np.float32),  # shape
        np.array([3.0, 2.0, 1.0], dtype=np.float32),  # order
    ],
)
def test_tensor_digest_sees_each_difference(other: np.ndarray) -> None:
    base = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert tensor_digest(base) == tensor_digest(base.copy())
    assert tensor_digest(base) != tensor_digest(other)
    assert tensor_digest({"x": base}) != tensor_digest({"y": base})


# --- atomic writes and the entry log --------------------------------------------------


def test_atomic_write_names_its_temporary_file_by_pid_and_8_hex_digits(
    tmp_path: Path,
) -> None:
    seen: list[Path] = []

    def write(tmp: Path) -> None:
        seen.append(tmp)
        tmp.write_text("x")

    atomic_write(tmp_path / "entry.json", write)
    pattern = rf"\.entry\.json\.{os.getpid()}\.[0-9a-f]{{8}}\.tmp"
    assert len(seen) == 1 and re.fullmatch(pattern, seen[0].name)
    assert seen[0].parent == tmp_path


def test_note_entry_appends_one_resolved_line_per_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "entries.log"
    log.write_text("earlier\n")
    monkeypatch.setenv(ENTRY_LOG, str(log))
    monkeypatch.chdir(tmp_path)
    note_entry("a.pt")
    note_entry(Path("sub") / "b.pt")
    lines = log.read_text().splitlines()
    assert lines == ["earlier", str(tmp_path / "a.pt"), str(tmp_path / "sub/b.pt")]


# --- process states -------------------------------------------------------------------


def _fake_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, proc: bool
) -> list[tuple[Any, Any]]:
    """``/proc`` read under ``tmp_path`` (present or not); ``os.kill`` recorded."""
    real = Path
    monkeypatch.setattr(files, "Path", lambda text: real(str(tmp_path) + str(text)))
    if proc:
        (tmp_path / "proc" / "self").mkdir(parents=True)
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(files.os, "kill", lambda *a: calls.append(a))
    return calls


def _stat(tmp_path: Path, pid: int, line: str) -> None:
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "stat").write_text(line)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("T", "stopped"),
        ("t", "stopped"),
        ("Z", "ended"),
        ("X", "ended"),
        ("z", "running"),
        ("x", "running"),
        ("S", "running"),
        ("R", "running"),
    ],
)
def test_process_state_maps_each_stat_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, expected: str
) -> None:
    calls = _fake_proc(tmp_path, monkeypatch, proc=True)
    _stat(tmp_path, 42, f"42 (python) {state} 1 42 42 0 -1")
    assert process_state(42) == expected
    assert calls == []


def test_process_state_reads_the_field_after_the_last_parenthesis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command name may itself hold ``) T``: only the last ``)`` ends it."""
    _fake_proc(tmp_path, monkeypatch, proc=True)
    _stat(tmp_path, 7, "7 (a) T b) R 1 7 7 0")
    assert process_state(7) == "running"
    _stat(tmp_path, 8, "8 (a) R b) T 1 8 8 0")
    assert process_state(8) == "stopped"


def test_process_state_without_a_stat_file_but_with_proc_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_proc(tmp_path, monkeypatch, proc=True)
    assert process_state(99) == "ended"
    assert calls == []


def _raising(exc: type[BaseException], calls: list) -> Callable[..., None]:
    def kill(*args: Any) -> None:
        calls.append(args)
        raise exc

    return kill


@pytest.mark.parametrize(
    ("exc", "expected"),
    [(None, "running"), (ProcessLookupError, "ended"), (PermissionError, "running")],
)
def test_process_state_without_proc_asks_a_signal_0(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    exc: type[BaseException] | None,
    expected: str,
) -> None:
    calls = _fake_proc(tmp_path, monkeypatch, proc=False)
    if exc is not None:
        monkeypatch.setattr(files.os, "kill", _raising(exc, calls))
    assert process_state(1234) == expected
    assert calls == [(1234, 0)]


# --- who holds a lock -----------------------------------------------------------------


def test_holder_without_a_pid_is_another_process() -> None:
    assert files._holder(io.StringIO("")) == "another process"
    assert files._holder(io.StringIO("host:abc\n")) == "another process"


def test_holder_splits_host_and_pid_at_the_last_colon() -> None:
    handle = io.StringIO("some:host:123\n")
    handle.seek(5)  # read from the start whatever the position
    message = "process 123 on host some:host (a shared file system)"
    assert files._holder(handle) == message


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (
            "stopped",
            "process 55, which is stopped (resume it with `kill -CONT 55` or end it)",
        ),
        (
            "ended",
            "process 55, which has ended: a stale lock held by a process it started",
        ),
        ("running", "process 55 (running)"),
    ],
)
def test_holder_on_this_host_names_the_state(
    monkeypatch: pytest.MonkeyPatch, state: str, message: str
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(files, "process_state", lambda pid: asked.append(pid) or state)
    handle = io.StringIO(f"{socket.gethostname()}:55\n")
    assert files._holder(handle) == message
    assert asked == [55]


# --- waiting for a lock, on a fake clock ----------------------------------------------


class _Stop(Exception):
    """Raised by the fake sleep to end a wait that never times out."""


class _Clock:
    def __init__(
        self, start: float, step: float = 0.0625, max_sleeps: int = 50
    ) -> None:
        self.now, self.step = start, step
        self.sleeps: list[float] = []
        self.max_sleeps = max_sleeps
        self.warnings: list[tuple[str, Any]] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) >= self.max_sleeps:
            raise _Stop
        self.now += self.step

    def warn(self, message: str, stacklevel: Any = "unset") -> None:
        self.warnings.append((message, stacklevel))


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """An entry whose lock another handle holds, and a second handle on it."""
    monkeypatch.setenv(WORKSPACE_ENV, str(tmp_path))
    entry = tmp_path / "runs" / "entry.pt"
    entry.parent.mkdir()
    lock = entry.with_name(".entry.pt.lock")
    with open(lock, "a+") as owner, open(lock, "a+") as waiter:
        files.fcntl.flock(owner, files.fcntl.LOCK_EX | files.fcntl.LOCK_NB)
        owner.write(f"{socket.gethostname()}:{os.getpid()}\n")
        owner.flush()
        yield entry, waiter
        files.fcntl.flock(owner, files.fcntl.LOCK_UN)


def _install(monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> None:
    monkeypatch.setattr(
        files,
        "time",
        types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep),
    )
    monkeypatch.setattr(files, "warnings", types.SimpleNamespace(warn=clock.warn))


def test_acquire_reports_each_interval_then_gives_up(
    held: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, waiter = held
    clock = _Clock(start=100.0)
    _install(monkeypatch, clock)
    with pytest.raises(TimeoutError) as caught:
        files._acquire(waiter, entry, 0.0625, 0.25)
    holder = f"process {os.getpid()} (running)"
    assert str(caught.value) == (
        f"gave up after 0 s waiting for cache entry runs/entry.pt, held by {holder}"
    )
    assert clock.sleeps == [0.0625] * 4
    message = f"waiting 0 s for cache entry runs/entry.pt, being computed by {holder}"
    assert clock.warnings == [(message, 4)] * 3


def test_acquire_says_the_seconds_waited(
    held: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, waiter = held
    clock = _Clock(start=1000.0, step=0.25)
    _install(monkeypatch, clock)
    with pytest.raises(TimeoutError, match=r"^gave up after 3 s waiting"):
        files._acquire(waiter, entry, 1.0, 2.75)
    assert clock.sleeps == [0.1] * 11
    said = [m.split(" for ")[0] for m, _ in clock.warnings]
    assert said == ["waiting 1 s", "waiting 2 s"]


def test_acquire_with_a_zero_timeout_gives_up_at_once(
    held: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, waiter = held
    clock = _Clock(start=5.0)
    _install(monkeypatch, clock)
    with pytest.raises(TimeoutError, match=r"^gave up after 0 s"):
        files._acquire(waiter, entry, 30.0, 0)
    assert clock.sleeps == [] and clock.warnings == []


def test_acquire_without_a_timeout_waits_on(
    held: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, waiter = held
    clock = _Clock(start=50.0, max_sleeps=5)
    _install(monkeypatch, clock)
    with pytest.raises(_Stop):
        files._acquire(waiter, entry, 10.0, None)
    assert clock.sleeps == [0.1] * 5 and clock.warnings == []


def test_acquire_takes_a_free_lock_exclusively(tmp_path: Path) -> None:
    lock = tmp_path / ".entry.lock"
    with open(lock, "a+") as mine, open(lock, "a+") as other:
        files._acquire(mine, tmp_path / "entry", 30.0, 0)
        with pytest.raises(BlockingIOError):
            files.fcntl.flock(other, files.fcntl.LOCK_EX | files.fcntl.LOCK_NB)
        files.fcntl.flock(mine, files.fcntl.LOCK_UN)
