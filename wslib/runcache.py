"""A JSON cache for the results of deterministic runs that do not fit the model zoo.

Some experiments keep only curves and scores of a training run (PathCond's
comparisons train many short runs and never reuse the weights). Their results
are stored as ``<root>/<hash>.json`` under the hash of the run's full
description; a second build loads them instead of training again. Cached
results carry the timings measured by the run that produced them. An
unreadable file or one written for another description is recomputed with a
warning, never used.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wslib.results import to_jsonable
from wslib.zoo import config_hash


def cached_run(
    root: str | Path | None, key: dict[str, Any], compute: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``compute()``, stored under ``root`` by the hash of ``key`` (no caching if ``root`` is None)."""
    if root is None:
        return compute()
    key = to_jsonable(key)
    path = Path(root) / f"{config_hash(key)}.json"
    if path.exists():
        try:
            stored = json.loads(path.read_text())
            if stored.get("key") == key:
                return stored["result"]
            warnings.warn(f"cached run {path} was written for another run; recomputing")
        except (json.JSONDecodeError, AttributeError, KeyError):
            warnings.warn(f"cached run {path} is unreadable; recomputing")
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "result": to_jsonable(result)}))
    tmp.replace(path)
    return to_jsonable(result)
