"""One keyed store for every cache and checkpoint of the book.

Every result the book keeps on disk is an *entry*: a trained model of the
zoo (:mod:`wslib.runs.zoo`), a run's results (:mod:`wslib.runs.cache`) and
the checkpoint of a resumable run (:mod:`wslib.runs.resumable`: LLPF paths,
Bezier / PolyChain curves, AutoNEB chains). An :class:`Entry` is a file and
the key it is written for: everything that determines its content, the
version of the code that computes it included
(:func:`wslib.core.files.code_version`, and
:func:`wslib.core.files.tensor_digest` of the data it reads). A cache names
the file by the hash of the key (:func:`keyed`); a checkpoint's file is named
by its caller and guarded by the key.

The file holds the payload (a dict) with the key and a checksum of the
payload's tensors. A ``.json`` entry is JSON text (no tensors, no checksum);
any other is written with ``torch.save`` and read with
``torch.load(weights_only=True)``. Every file is written atomically
(:func:`wslib.core.files.atomic_write`). :meth:`Entry.load` is the one place
that judges a stored file: one that cannot be read, was written for another
key, fails the caller's check or fails its checksum is never used; it warns
with the file's name and the caller computes the entry again. :func:`cached`
computes a missing entry under the entry's lock
(:func:`wslib.core.files.entry_lock`: a neighbour computing the same entry
is waited for, then read) and refuses to compute under
``WSLIB_CACHED_ONLY=1`` (:mod:`wslib.runs.units`).

Parts. An entry may list *parts* (the payload's ``"parts"``: name ->
payload): files written beside it, each once, before it, their checksums
listed in it. An LLPF checkpoint is such an entry (``index.pt`` in the
checkpoint's folder, one part per recorded point): a path has hundreds of
points at the gpu profile, and rewriting them all at every save would cost
time quadratic in the path's length, so each point is written once and only
the small index is rewritten. The index is written last, so a run killed
mid-save leaves the previous checkpoint whole: the index on disk lists only
parts that were complete when it was written. An entry with parts owns its
folder (:meth:`Entry.folder`): after the index is written, every other file
of the folder that it does not list is deleted. A folder becomes an entry's
only when it is new or empty, or holds its index (a mark file says so
before any part is written): a folder that already holds other files is
refused, never emptied. Parts rather than a folder
of entries: a part means nothing alone, and one key, one index and one
judgement keep a checkpoint whole or reject it whole.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from wslib.core.files import atomic_write, entry_lock, stable_hash, tensor_digest
from wslib.core.workspace import workspace
from wslib.runs.units import refuse_compute

KEY, CHECKSUM, PARTS = "key", "checksum", "parts"
INDEX = "index.pt"
MARK = ".wslib-entry"  # in a folder an entry with parts owns, written before them
Payload = dict[str, Any]
Check = Callable[[Payload], str | None]


class Rejected(Exception):
    """Why a stored file cannot be used (said in the warning)."""


def checksum(payload: object) -> str:
    """Digest of the content of every tensor in ``payload`` (nested dicts and lists)."""
    return tensor_digest(dict(_tensors(payload, "")))


def _tensors(item: object, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    if torch.is_tensor(item):
        yield name, item
    elif isinstance(item, Mapping):
        for k, v in item.items():
            yield from _tensors(v, f"{name}/{k}")
    elif isinstance(item, list | tuple):
        for i, v in enumerate(item):
            yield from _tensors(v, f"{name}/{i}")


class Entry:
    """One stored entry: the file ``path``, the ``key`` it holds, ``what`` it is (for messages).

    ``key`` is JSON-serialisable; it is compared as JSON reads it back
    (tuples as lists). ``owns_folder``: the entry may have parts, and every
    other file of its folder is its own (see the module docstring).
    """

    def __init__(
        self, path: str | Path, key: object, what: str, *, owns_folder: bool = False
    ) -> None:
        self.path = workspace().path(path)
        self.key = json.loads(json.dumps(key, sort_keys=True))
        self.what = what
        self.owns_folder = owns_folder
        self.parts: dict[str, str] = {}  # the parts the file on disk lists: checksums

    @classmethod
    def folder(cls, folder: str | Path, key: object, what: str) -> Entry:
        """An entry with parts: ``folder/index.pt``, its parts beside it."""
        return cls(Path(folder) / INDEX, key, what, owns_folder=True)

    @property
    def shown(self) -> str:
        """The entry's file as messages name it (:meth:`~wslib.core.workspace.Workspace.show`)."""
        return workspace().show(self.path)

    def lock(self) -> AbstractContextManager[None]:
        """The entry's lock (:func:`wslib.core.files.entry_lock`)."""
        return entry_lock(self.path)

    def load(
        self, check: Check | None = None, *, quiet: bool = False
    ) -> Payload | None:
        """The stored payload, its parts loaded under ``"parts"``; None when there is none.

        A file that cannot be used gives None with a warning naming it (none
        when ``quiet``): unreadable, written for another key, ``check(payload)``
        names a problem, or the checksum of its tensors or of a part differs.
        """
        self._check_place()
        if not self.path.exists():
            return None
        try:
            return self._read(check)
        except Rejected as problem:
            if not quiet:
                warnings.warn(
                    f"{self.what} {self.shown} {problem}; computing it again",
                    stacklevel=3,
                )
            return None

    def save(self, payload: Payload) -> None:
        """Write ``payload`` under the key, atomically; its parts first.

        ``payload["parts"]`` (name -> payload, or None for a part the entry
        on disk lists, kept as it is) are the parts the entry lists; the
        others of its folder are deleted once it is written.
        """
        self._check_place()
        payload = dict(payload)
        parts = payload.pop(PARTS, None)
        stored = {**payload, KEY: self.key}
        if self.path.suffix == ".json":
            atomic_write(self.path, _text_writer(json.dumps(stored)))
            return
        stored[CHECKSUM] = checksum(payload)
        if parts is not None:
            stored[PARTS] = self._write_parts(parts)
        atomic_write(self.path, _torch_writer(stored))
        if parts is not None:
            self.parts = stored[PARTS]
            self._drop_unlisted()

    def _check_place(self) -> None:
        if self.path.is_dir():
            raise FileExistsError(
                f"{self.what} {self.shown} is a folder, not a file of the store; pass "
                "another path or move the folder"
            )
        if self.path.parent.is_file():
            raise FileExistsError(
                f"{self.what} {workspace().show(self.path.parent)} is a file, not a folder "
                "of the store; "
                "pass another path or move the file"
            )

    def _read(self, check: Check | None) -> Payload:
        stored = self._file(self.path)
        if not isinstance(stored, dict) or stored.get(KEY) != self.key:
            raise Rejected("was written for another run (its key differs)")
        payload = {k: v for k, v in stored.items() if k not in (KEY, CHECKSUM, PARTS)}
        listed = stored.get(PARTS)
        if listed is not None:
            if not isinstance(listed, dict) or not self.owns_folder:
                raise Rejected("is incomplete (its list of parts is not one)")
            payload[PARTS] = {n: self._part(n, c) for n, c in listed.items()}
        problem = None if check is None else check(payload)
        if problem is not None:
            raise Rejected(f"is incomplete ({problem})")
        own = {k: v for k, v in payload.items() if k != PARTS}
        if self.path.suffix != ".json" and checksum(own) != stored.get(CHECKSUM):
            raise Rejected("fails its checksum (it changed after it was written)")
        self.parts = dict(listed or {})
        return payload

    def _part(self, name: str, digest: str) -> object:
        part = self._file(self.path.parent / name)
        if checksum(part) != digest:
            raise Rejected(
                f"fails its checksum (part {name} changed after it was written)"
            )
        return part

    def _file(self, path: Path) -> object:
        try:
            if path.suffix == ".json":
                return json.loads(path.read_text())
            return torch.load(path, weights_only=True, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - any unreadable file is computed again
            name = "" if path == self.path else f" (part {path.name})"
            raise Rejected(f"is unreadable{name}: {type(err).__name__}") from err

    def _write_parts(self, parts: Mapping[str, Payload | None]) -> dict[str, str]:
        if not self.owns_folder:
            raise ValueError(
                f"{self.what} {self.shown} has no folder of its own for parts"
            )
        self._claim_folder()
        listed: dict[str, str] = {}
        for name, part in parts.items():
            if part is None:
                listed[name] = self.parts[name]
                continue
            atomic_write(self.path.parent / name, _torch_writer(part))
            listed[name] = checksum(part)
        return listed

    def _claim_folder(self) -> None:
        """Mark the entry's folder as its own; refuse one that holds other files."""
        folder = self.path.parent
        if (folder / MARK).exists() or self.path.exists():
            return
        if folder.is_dir() and any(
            not f.name.startswith(".") for f in folder.iterdir()
        ):
            raise FileExistsError(
                f"{self.what} {workspace().show(folder)} is a folder that already holds "
                "other files; "
                "the checkpoint would delete them: pass a new or empty folder"
            )
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARK).touch()

    def _drop_unlisted(self) -> None:
        for old in self.path.parent.iterdir():
            if old.name.startswith(".") or old.name == self.path.name:
                continue
            if old.is_file() and old.name not in self.parts:
                old.unlink(missing_ok=True)


def _torch_writer(item: object) -> Callable[[Path], None]:
    """A writer for :func:`~wslib.core.files.atomic_write`: ``torch.save(item, tmp)``."""
    return lambda tmp: torch.save(item, tmp)


def _text_writer(text: str) -> Callable[[Path], None]:
    """A writer for :func:`~wslib.core.files.atomic_write` of ``text``."""

    def write(tmp: Path) -> None:
        tmp.write_text(text)

    return write


def keyed(root: str | Path, key: object, what: str, *, suffix: str = ".pt") -> Entry:
    """The entry of ``key`` under ``root``: a file named by the key's hash."""
    return Entry(Path(root) / f"{stable_hash(key)}{suffix}", key, what)


def cached(
    entry: Entry, compute: Callable[[], Payload], check: Check | None = None
) -> Payload:
    """The payload stored in ``entry``, or ``compute()``'s, stored there.

    Under the entry's lock: a neighbour computing the same entry is waited
    for, then read. Computing refuses under ``WSLIB_CACHED_ONLY=1``.
    """
    with entry.lock():
        payload = entry.load(check)
        if payload is None:
            refuse_compute(f"{entry.what} {entry.path}")
            payload = compute()
            entry.save(payload)
    return payload
