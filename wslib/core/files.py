"""Stable hashes and atomic file writes, shared by every cache of the book.

Every cache (generated data, the model zoo, the run cache, LLPF checkpoints)
names its entries by :func:`stable_hash` of everything that determines them,
including :func:`code_version` of the packages that compute them and
:func:`tensor_digest` of the data they read. Entries are written with
:func:`atomic_write`: a uniquely named temporary file in the same folder,
renamed into place, so concurrent writers (worker processes, cluster jobs)
never leave half a file and never clobber each other's temporary file.
:func:`entry_lock` lets a second process wait for an entry that another one is
computing instead of computing it twice (two notebooks run side by side).
:func:`note_entry` lists the entries a run used in the file named by
``WSLIB_ENTRY_LOG`` (worker processes inherit it), so a test can check that
two sweep seeds share no model, run or path.

These helpers live in ``core`` (not ``runs``) because the generated-data cache
of :mod:`wslib.core.data` needs them and ``core`` imports nothing above it.
The caches and checkpoints of ``runs`` and the paper packages use them
through one keyed store, :mod:`wslib.runs.store`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wslib.core.workspace import workspace

try:  # POSIX; elsewhere entries are not locked (a second process computes its own copy)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:  # torch is imported by the digest of tensors, not before
    import torch


def stable_hash(obj: Any, *, length: int = 20) -> str:
    """A short SHA-256 of a JSON-serialisable object, independent of dict order."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def tensor_digest(
    *items: torch.Tensor | np.ndarray | Mapping[str, Any], length: int = 16
) -> str:
    """SHA-256 of the contents of tensors, arrays or state dicts (names, shapes, values)."""
    import torch  # here, not above: the book's commands use this module without torch

    h = hashlib.sha256()
    for item in items:
        named = sorted(item.items()) if isinstance(item, Mapping) else [("", item)]
        for name, value in named:
            arr = (
                value.detach().cpu().numpy()
                if torch.is_tensor(value)
                else np.asarray(value)
            )
            h.update(f"{name}:{arr.dtype}:{arr.shape}".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:length]


@functools.cache
def code_version(*packages: str) -> str:
    """Hash of the source files of the named packages or modules (e.g. ``"wslib.core"``).

    A cache entry keyed by it is recomputed after any edit of the code that
    computed it.
    """
    h = hashlib.sha256()
    for name in sorted(packages):
        module = importlib.import_module(name)
        if module.__file__ is None:
            raise ValueError(f"{name} has no source file (a namespace package?)")
        root = Path(module.__file__)
        files = (
            sorted(root.parent.rglob("*.py")) if root.name == "__init__.py" else [root]
        )
        for f in files:
            h.update(f.relative_to(root.parent).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` on a unique temporary file next to ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


ENTRY_LOG = "WSLIB_ENTRY_LOG"


def note_entry(path: str | Path) -> None:
    """Append cache entry ``path`` to the file named by ``WSLIB_ENTRY_LOG``, if set.

    One line per use (loaded or computed), written in one ``write`` call in
    append mode, so processes writing side by side do not interleave lines.
    """
    log = os.environ.get(ENTRY_LOG)
    if log:
        with open(log, "a") as handle:
            handle.write(f"{Path(path).resolve()}\n")


LOCK_REPORT_S = 30.0
"""How often a process waiting for an entry says what it waits for."""


def process_state(pid: int) -> str:
    """``running``, ``stopped`` or ``ended`` for process ``pid`` of this machine.

    Read from ``/proc`` where there is one (Linux: stopped processes are seen);
    elsewhere a signal 0 tells only whether the process exists.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self").exists():
            return "ended"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "ended"
        except PermissionError:
            return "running"
        return "running"
    state = stat.rsplit(")", 1)[1].split()[0]  # the field after the command name
    return {"T": "stopped", "t": "stopped", "Z": "ended", "X": "ended"}.get(
        state, "running"
    )


def _holder(handle: Any) -> str:
    """Who holds the lock of ``handle``: the ``host:pid`` its holder wrote, and its state."""
    handle.seek(0)
    host, _, pid_text = handle.read().strip().rpartition(":")
    if not pid_text.isdigit():
        return "another process"
    pid = int(pid_text)
    if host != socket.gethostname():
        return f"process {pid} on host {host} (a shared file system)"
    state = process_state(pid)
    if state == "stopped":
        return (
            f"process {pid}, which is stopped (resume it with `kill -CONT {pid}` "
            "or end it)"
        )
    if state == "ended":
        return (
            f"process {pid}, which has ended: a stale lock held by a process it started"
        )
    return f"process {pid} (running)"


def _acquire(
    handle: Any, path: Path, report_every: float, timeout: float | None
) -> None:
    """Lock ``handle``, saying every ``report_every`` s what it waits for; give up after ``timeout``."""
    start = last = time.monotonic()
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        waited = now - start
        if timeout is not None and waited >= timeout:
            raise TimeoutError(
                f"gave up after {waited:.0f} s waiting for cache entry "
                f"{workspace().show(path)}, "
                f"held by {_holder(handle)}"
            )
        if now - last >= report_every:
            last = now
            warnings.warn(
                f"waiting {waited:.0f} s for cache entry {workspace().show(path)}, being "
                f"computed by "
                f"{_holder(handle)}",
                stacklevel=4,
            )
        time.sleep(min(0.1, report_every))


@contextmanager
def entry_lock(
    path: str | Path,
    *,
    report_every: float = LOCK_REPORT_S,
    timeout: float | None = None,
) -> Iterator[None]:
    """Hold an exclusive lock on cache entry ``path`` (a hidden ``.lock`` file beside it).

    Check for the entry inside the lock: a process that waited finds the file
    its neighbour wrote and loads it. The entry is noted (:func:`note_entry`).
    The holder writes its host and process id in the lock file; a process that waits
    says every ``report_every`` seconds for which entry and for which process
    (stopped or ended holders named as such), and gives up with a
    ``TimeoutError`` after ``timeout`` seconds (default: never).
    """
    path = Path(path)
    note_entry(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a+") as handle:
        if fcntl is not None:
            _acquire(handle, path, report_every, timeout)
            handle.seek(0)
            handle.truncate()
            handle.write(f"{socket.gethostname()}:{os.getpid()}\n")
            handle.flush()
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)
