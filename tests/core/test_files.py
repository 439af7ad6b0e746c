"""Hashes and atomic writes shared by every cache (wslib.core.files)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from wslib.core.files import (
    ENTRY_LOG,
    atomic_write,
    code_version,
    entry_lock,
    process_state,
    stable_hash,
    tensor_digest,
)

WRITERS, WRITES = 4, 20
PAYLOAD_BYTES = 256 * 1024  # large enough that a write takes several system calls


def test_stable_hash_ignores_dict_order_only() -> None:
    assert stable_hash({"a": 1, "b": [1, 2]}) == stable_hash({"b": [1, 2], "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})
    assert len(stable_hash({"a": 1}, length=8)) == 8


def test_tensor_digest_sees_content_not_only_size() -> None:
    """Shuffled labels of the same length (what a size-based key misses) change it."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 3, generator=gen), torch.arange(50) % 5
    base = tensor_digest(x, y)
    assert tensor_digest(x.clone(), y.clone()) == base
    assert tensor_digest(x, y[torch.randperm(50, generator=gen)]) != base
    assert tensor_digest(x, y.float()) != base  # dtype
    assert tensor_digest(x.reshape(3, 50), y) != base  # shape
    assert tensor_digest(x.numpy(), y.numpy()) == base  # arrays as tensors
    assert tensor_digest({"w": x}) != tensor_digest({"v": x})  # state-dict names


@pytest.fixture()
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A throw-away package ``<name>`` with one module, importable from ``tmp_path``."""
    name = f"tmp_pkg_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "algo.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, folder
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


def test_code_version_changes_with_any_source_file(package: tuple[str, Path]) -> None:
    """code_version is cached per process (it describes the code imported there);
    ``cache_clear`` stands for the next process."""
    name, folder = package
    before = code_version(name)
    assert code_version(f"{name}.algo") != before  # a module hashes alone
    (folder / "algo.py").write_text("def f():\n    return 2\n")
    assert code_version(name) == before  # same process, same answer
    code_version.cache_clear()
    edited = code_version(name)
    assert edited != before
    (folder / "sub").mkdir()
    (folder / "sub" / "more.py").write_text("X = 1\n")
    code_version.cache_clear()
    assert code_version(name) != edited  # files in sub-folders count


def test_atomic_write_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "entry.json"
    atomic_write(path, lambda tmp: tmp.write_text("one"))
    atomic_write(path, lambda tmp: tmp.write_text("two"))
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]


def test_failed_write_keeps_the_old_entry(tmp_path: Path) -> None:
    path = tmp_path / "entry.json"
    atomic_write(path, lambda tmp: tmp.write_text("good"))

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, fail)
    assert path.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]


def payload(writer: int, write: int) -> bytes:
    """A self-checking entry: a body that names its writer, then the body's SHA-256."""
    body = f"{writer}:{write}:".encode() * (PAYLOAD_BYTES // 8)
    return body + hashlib.sha256(body).hexdigest().encode()


def is_whole(data: bytes) -> bool:
    body, digest = data[:-64], data[-64:]
    return len(data) > 64 and hashlib.sha256(body).hexdigest().encode() == digest


def writer(path: str, index: int, start: multiprocessing.Event) -> None:
    start.wait()
    for write in range(WRITES):
        atomic_write(path, lambda tmp, w=write: tmp.write_bytes(payload(index, w)))


def reader(path: str, start: multiprocessing.Event, bad: multiprocessing.Value) -> None:
    start.wait()
    for _ in range(200):
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            continue
        if not is_whole(data):
            with bad.get_lock():
                bad.value += 1


def test_concurrent_writers_never_leave_a_broken_entry(tmp_path: Path) -> None:
    """4 processes x 20 writes of one entry while another process reads it."""
    # fork: the workers need no fresh interpreter (spawn would import torch in each)
    ctx = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    path = str(tmp_path / "entry.bin")
    start, bad = ctx.Event(), ctx.Value("i", 0)
    procs = [ctx.Process(target=writer, args=(path, i, start)) for i in range(WRITERS)]
    procs.append(ctx.Process(target=reader, args=(path, start, bad)))
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    assert bad.value == 0, f"{bad.value} reads saw a partial entry"
    data = Path(path).read_bytes()
    assert is_whole(data)
    assert data == payload(int(data.split(b":")[0]), WRITES - 1)  # a last write
    assert [p.name for p in tmp_path.iterdir()] == ["entry.bin"]


def test_payload_check_sees_a_torn_entry() -> None:
    whole = payload(0, 0)
    assert is_whole(whole)
    assert not is_whole(whole[: len(whole) // 2] + payload(1, 0)[len(whole) // 2 :])
    assert not is_whole(whole[:-100])


def test_digest_of_numpy_and_torch_agree_for_state_dicts() -> None:
    state = {"w": torch.ones(2, 2), "b": torch.zeros(2)}
    assert tensor_digest(state) == tensor_digest(
        {k: np.asarray(v) for k, v in state.items()}
    )


@pytest.mark.skipif(sys.platform == "win32", reason="entries are locked on POSIX only")
def test_entry_lock_makes_a_second_process_wait(tmp_path: Path) -> None:
    entry, events = tmp_path / "entry.json", []

    def neighbour() -> None:
        with entry_lock(entry):
            events.append(("neighbour", entry.exists()))

    with entry_lock(entry):
        thread = threading.Thread(target=neighbour)
        thread.start()
        time.sleep(0.2)
        events.append(("owner", None))
        entry.write_text("{}")
    thread.join(timeout=5)
    assert events == [("owner", None), ("neighbour", True)]


HOLD = """
import os, signal, sys
from wslib.core.files import entry_lock
with entry_lock(sys.argv[1]):
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="entries are locked on POSIX only")
def test_a_waiting_process_names_the_entry_and_a_stopped_holder(tmp_path: Path) -> None:
    entry = tmp_path / "model.pt"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(entry)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.warns(
                UserWarning, match=r"waiting \d+ s for cache entry .*model.pt"
            ),
            pytest.raises(
                TimeoutError, match=rf"process {holder.pid}, which is stopped"
            ),
        ):
            with entry_lock(entry, report_every=0.2, timeout=1.0):
                pass
    finally:
        holder.kill()
        holder.wait()
    with entry_lock(entry, timeout=5.0):  # the holder ended: the lock is free
        pass


def test_process_state_reads_running_and_ended() -> None:
    assert process_state(os.getpid()) == "running"
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert process_state(int(done.stdout)) == "ended"


def test_entries_are_noted_only_with_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENTRY_LOG, raising=False)
    with entry_lock(tmp_path / "a.pt"):
        pass
    log = tmp_path / "entries.log"
    assert not log.exists()
    monkeypatch.setenv(ENTRY_LOG, str(log))
    for name in ("b.pt", "c.json", "b.pt"):
        with entry_lock(tmp_path / name):
            pass
    assert log.read_text().split() == [
        str(tmp_path / n) for n in ("b.pt", "c.json", "b.pt")
    ]
