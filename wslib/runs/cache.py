"""A JSON cache for the results of deterministic runs that do not fit the model zoo.

Some experiments keep only curves and scores of a training run (PathCond's
comparisons train many short runs and never reuse the weights). Their results
are entries of the store (:mod:`wslib.runs.store`): ``<root>/<hash>.json``
under the hash of the run's full description and of the source of the
packages that compute it (``code``); a second build loads them instead of
training again, an edit of that code computes them anew. Cached results
carry the timings measured by the run that produced them. An unreadable
file, one without a result or one written for another description is
recomputed with a warning, never used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from wslib.core.files import code_version
from wslib.runs.results import to_jsonable
from wslib.runs.store import Entry, Payload, cached, keyed
from wslib.runs.units import refuse_compute

Result = TypeVar("Result", dict[str, Any], list[Any])
"""What a run returns: a dict, or a list (of rows), of plain data."""


def cached_run(
    root: str | Path | None,
    key: dict[str, Any],
    compute: Callable[[], Result],
    *,
    code: Sequence[str] = ("wslib",),
) -> Result:
    """``compute()``, stored under ``root`` by the hash of ``key`` and ``code_version(*code)``.

    ``code`` names the packages whose source determines the result (default:
    the whole library). No caching if ``root`` is None.
    """
    if root is None:
        refuse_compute("a run without a cache folder")
        return compute()
    entry = _entry(root, key, code)
    stored = cached(entry, lambda: {"result": to_jsonable(compute())}, _has_result)
    return stored["result"]


def stored_run(
    root: str | Path | None, key: dict[str, Any], *, code: Sequence[str] = ("wslib",)
) -> dict[str, Any] | list[Any] | None:
    """The result :func:`cached_run` would load for ``key``, or None (it would compute).

    Reads without waiting for a lock and without a warning: a caller that
    finds None computes, then stores through :func:`cached_run`, which checks
    again under the lock.
    """
    if root is None:
        return None
    stored = _entry(root, key, code).load(_has_result, quiet=True)
    return None if stored is None else stored["result"]


def _entry(root: str | Path, key: dict[str, Any], code: Sequence[str]) -> Entry:
    """The entry of ``key`` under ``root``, its key holding the code's version."""
    return keyed(
        root,
        to_jsonable({**key, "code": code_version(*code)}),
        "cached run",
        suffix=".json",
    )


def _has_result(stored: Payload) -> str | None:
    return None if isinstance(stored.get("result"), dict | list) else "no result"
