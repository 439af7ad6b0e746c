"""A chapter's work as independent units, for sweeps over several machines.

A long chapter (the LLPF and PathCond chapters at the gpu profile) is a set of
independent pieces of work: models to train, paths to find, training runs of
a sweep. Each piece already lands in a cache (the model zoo, the run cache, an
LLPF checkpoint). A :class:`Unit` names one piece and computes it, filling its
cache; a paper package lists its chapter's units from the notebook's
parameters (``wslib.<paper>.units``). ``bookkit sweep --split`` sends the
units to separate jobs, stage by stage (a stage's units may read what earlier
stages cached, never each other's), then runs the notebook, which finds every
piece cached and only assembles tables and figures.

``cached_only()`` is the check of that promise: with ``WSLIB_CACHED_ONLY=1``
every cache refuses to compute a missing entry (:class:`NotCached`), so a
notebook run after its units that still computes something fails and names it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CACHED_ONLY = "WSLIB_CACHED_ONLY"

Params = Mapping[str, Any]  # a notebook's effective parameters


class NotCached(RuntimeError):
    """A cache was asked to compute while ``WSLIB_CACHED_ONLY=1``."""


@dataclass(frozen=True)
class Unit:
    """One independent piece of a chapter's work; ``run()`` computes and caches it.

    ``stage`` orders units whose work reads an earlier unit's cache (paths
    after the models they join); units of one stage are independent.
    """

    name: str
    stage: int
    run: Callable[[], object]


def cached_only() -> bool:
    """Whether caches must refuse to compute (``WSLIB_CACHED_ONLY=1``)."""
    return os.environ.get(CACHED_ONLY, "") == "1"


def refuse_compute(what: str) -> None:
    """Raise :class:`NotCached` naming ``what`` when caches must not compute."""
    if cached_only():
        raise NotCached(
            f"{what} is not cached, and {CACHED_ONLY}=1 forbids computing it: "
            "a unit of this chapter is missing (see wslib.runs.units)"
        )


def by_stage(units: Sequence[Unit]) -> list[list[Unit]]:
    """``units`` grouped by stage, lowest first; a clear error for duplicate names."""
    names = [u.name for u in units]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"unit names must be unique; repeated: {', '.join(twice)}")
    stages = sorted({u.stage for u in units})
    return [[u for u in units if u.stage == s] for s in stages]
