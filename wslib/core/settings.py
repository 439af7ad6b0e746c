"""A run's settings, written once: its fields, its checks and its key.

A method's options are the fields of a frozen, keyword-only dataclass derived
from :class:`Settings`. Its ``__post_init__`` checks them, so a wrong value is
refused where it is written, before any work; :meth:`Settings.key` is every
field, so a checkpoint or cache key built from it cannot leave an option out.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any


def plain(value: Any) -> Any:
    """``value`` as JSON-serialisable data: integers as ``int``, other real
    numbers as ``float``, sequences as lists (numpy scalars included)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Base of a run's settings (see the module docstring)."""

    def key(self) -> dict[str, Any]:
        """Every field, by name, as plain data (the part of a key the settings give)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
