"""A JSON cache for the results of deterministic runs that do not fit the model zoo.

Some experiments keep only curves and scores of a training run (PathCond's
comparisons train many short runs and never reuse the weights). Their results
are stored as ``<root>/<hash>.json`` under the hash of the run's full
description and of the source of the packages that compute it (``code``); a
second build loads them instead of training again, an edit of that code
computes them anew. Cached
results carry the timings measured by the run that produced them. An
unreadable file, one of the wrong shape or one written for another
description is recomputed with a warning, never used.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from wslib.core.files import atomic_write, code_version, entry_lock, stable_hash
from wslib.runs.results import to_jsonable
from wslib.runs.units import refuse_compute


def cached_run(
    root: str | Path | None,
    key: dict[str, Any],
    compute: Callable[[], dict[str, Any]],
    code: Sequence[str] = ("wslib",),
) -> dict[str, Any]:
    """``compute()``, stored under ``root`` by the hash of ``key`` and ``code_version(*code)``.

    ``code`` names the packages whose source determines the result (default:
    the whole library). No caching if ``root`` is None.
    """
    if root is None:
        refuse_compute("a run without a cache folder")
        return compute()
    path, key = _entry(root, key, code)
    with entry_lock(path):  # a neighbour computing the same run: wait, then read it
        stored = _read(path)
        if stored is not None:
            if stored.get("key") == key and isinstance(stored.get("result"), dict):
                return stored["result"]
            warnings.warn(
                f"cached run {path} was written for another run or is incomplete; "
                "recomputing"
            )
        refuse_compute(f"run {path}")
        result = to_jsonable(compute())
        text = json.dumps({"key": key, "result": result})
        atomic_write(path, lambda tmp: tmp.write_text(text))
    return result


def stored_run(
    root: str | Path | None, key: dict[str, Any], code: Sequence[str] = ("wslib",)
) -> dict[str, Any] | None:
    """The result :func:`cached_run` would load for ``key``, or None (it would compute).

    Reads without waiting for a lock: a caller that finds None computes, then
    stores through :func:`cached_run`, which checks again under the lock.
    """
    if root is None:
        return None
    path, key = _entry(root, key, code)
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        return None
    result = stored.get("result")
    return result if isinstance(result, dict) else None


def _entry(
    root: str | Path, key: dict[str, Any], code: Sequence[str]
) -> tuple[Path, dict[str, Any]]:
    """The file of ``key`` under ``root`` and the full key stored in it."""
    key = to_jsonable({**key, "code": code_version(*code)})
    return Path(root) / f"{stable_hash(key)}.json", key


def _read(path: Path) -> dict[str, Any] | None:
    """The stored entry, or None (with a warning when a file exists but cannot be used)."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        stored = None
    if isinstance(stored, dict):
        return stored
    warnings.warn(f"cached run {path} is unreadable; recomputing")
    return None
