"""A run's settings, written once: its fields, its checks and its key.

A method's options are the fields of a frozen, keyword-only dataclass derived
from :class:`Settings`. Its ``__post_init__`` checks them, so a wrong value is
refused where it is written, before any work; :meth:`Settings.key` is every
field, so a checkpoint or cache key built from it cannot leave an option out.
A field that cannot change a result (a warning's threshold) is declared with
:func:`not_in_key` and the reason, and stays out of the key.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, get_args, get_origin, get_type_hints

import numpy as np


def not_in_key(default: Any, why: str) -> Any:
    """A field with ``default`` that :meth:`Settings.key` leaves out, because ``why``."""
    return dataclasses.field(default=default, metadata={"why_not_in_key": why})


def plain(value: Any) -> Any:
    """``value`` as JSON-serialisable data: integers as ``int``, other real
    numbers as ``float`` (numpy scalars included), sequences and arrays as
    lists, mappings as dicts, settings as their key, another dataclass as the
    dict of its fields."""
    if isinstance(value, bool):  # an Integral, but kept as a flag
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Settings):
        return value.key()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    return value


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Base of a run's settings (see the module docstring)."""

    @classmethod
    def of(cls, values: Mapping[str, Any] | Self, where: str) -> Self:
        """``values`` (a profile's mapping) as these settings; settings of this
        class are returned as they are. ValueError naming ``where`` and the
        field for an unknown or missing field, or a value the checks refuse."""
        if isinstance(values, cls):
            return values
        if not isinstance(values, Mapping):
            raise TypeError(f"{where}: a mapping or {cls.__name__}, got {values!r}")
        fields = dataclasses.fields(cls)
        names = sorted(f.name for f in fields)
        unknown = sorted(set(map(str, values)) - set(names))
        if unknown:
            raise ValueError(
                f"{where}: unknown setting {', '.join(unknown)}; "
                f"valid: {', '.join(names)}"
            )
        missing = [f.name for f in fields if _required(f) and f.name not in values]
        if missing:
            raise ValueError(f"{where}: missing setting {', '.join(missing)}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {error}") from None

    def key(self) -> dict[str, Any]:
        """Every field but those declared :func:`not_in_key`, by name, as plain
        data (the part of a key the settings give). A field declared ``float``
        (or a sequence of floats) is keyed as floats when given integers, so
        ``momentum=0`` and ``momentum=0.0`` share their key."""
        hints = get_type_hints(type(self))
        return {
            f.name: as_declared(plain(getattr(self, f.name)), hints[f.name])
            for f in dataclasses.fields(self)
            if "why_not_in_key" not in f.metadata
        }


def _required(field: dataclasses.Field) -> bool:
    """Whether ``field`` has no default."""
    return (
        field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    )


def as_declared(value: Any, hint: Any) -> Any:
    """Plain ``value`` with its numbers as floats where ``hint`` declares floats
    (``float``, ``float | None`` or a sequence of ``float``)."""
    if float in (hint, *get_args(hint)) and isinstance(value, int | float):
        return float(value)
    if get_origin(hint) in (Sequence, list, tuple) and isinstance(value, list):
        return [as_declared(v, get_args(hint)[0]) for v in value]
    return value
