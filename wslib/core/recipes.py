"""How a model is trained: a :class:`Recipe`, its choices and their checks.

Apart from :mod:`wslib.core.train`, which trains with it, so that the book's
commands check a profile's recipes without importing torch (2.6 CPU-s a
process; ``bookkit/speed.py``): one rule for library calls and profiles.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

import numpy as np

# The choices of a :class:`Recipe` (the tuples below list them at run time).
OptimizerName = Literal["sgd", "adam"]
ScheduleName = Literal["constant", "cosine"]
PrecisionName = Literal["fp32", "bf16"]
OPTIMIZERS: tuple[OptimizerName, ...] = get_args(OptimizerName)
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)
PRECISIONS: tuple[PrecisionName, ...] = get_args(PrecisionName)


def check_precision(precision: str) -> None:
    """Refuse a precision other than ``"fp32"`` and ``"bf16"``, naming the valid ones."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {PRECISIONS}")


@dataclass(frozen=True)
class Recipe:
    """How a model is trained. Part of every cached model's identity."""

    epochs: int = 30
    batch_size: int = 128
    lr: float = 0.05
    optimizer: OptimizerName = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: ScheduleName = "cosine"
    augment: bool = False
    precision: PrecisionName = (
        "fp32"  # "bf16": forward and loss under bfloat16 autocast
    )

    def __post_init__(self) -> None:
        """Refuse a recipe that cannot train what it says, naming the field and its range."""
        for name, low in (("epochs", 1), ("batch_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"recipe {name} must be an integer, got {value!r}")
            if value < low:
                raise ValueError(
                    f"recipe {name} = {value} trains nothing; give {name} >= {low}"
                )
        for name, lowest, highest, closed in (
            ("lr", 0.0, math.inf, False),
            ("momentum", 0.0, 1.0, True),
            ("weight_decay", 0.0, math.inf, True),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(
                value, int | float | np.number
            ):
                raise ValueError(f"recipe {name} must be a number, got {value!r}")
            inside = (lowest <= value if closed else lowest < value) and value < highest
            if not (math.isfinite(value) and inside):
                bracket = "[" if closed else "("
                raise ValueError(
                    f"recipe {name} = {value!r} is outside {bracket}{lowest:g}, {highest:g}); "
                    + (
                        "an lr of 0 trains nothing"
                        if name == "lr"
                        else "give a value in that range"
                    )
                )
        if not isinstance(self.augment, bool):
            raise ValueError(
                f"recipe augment must be true or false, got {self.augment!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer {self.optimizer!r}; valid: {OPTIMIZERS}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: {SCHEDULES}")
        check_precision(self.precision)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(
                f"unknown recipe keys {sorted(unknown)}; valid: {sorted(known)}"
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
