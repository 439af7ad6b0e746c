"""Range checks of a profile's values, before any notebook runs.

:func:`bookkit.profiles.section_parameters` (read by ``bookkit run``, ``sweep``,
``part`` and ``gpu-check --params``) already refuses unknown names and
values of the wrong kind. This module refuses values of the right kind that
cannot do what they say: a recipe that trains nothing, a count of zero, a
negative learning rate, NaN.

- Recipes are checked by the library's own :class:`wslib.core.recipes.Recipe`
  and model configs by :func:`wslib.core.configs.check_sizes`: one rule for
  library calls and profiles.
- Whether a model fits its data set is checked where it is trained
  (:func:`wslib.core.configs.check_fits_data`), since a config may keep an
  output size of its own (an autoencoder's).
- The other values follow the rules below, named for the keys they apply to,
  at any depth of a section (``llpf: {mlp: {ticks: 0}}`` is refused as
  ``llpf.mlp.ticks``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from wslib.core.configs import MODEL_NAMES, check_sizes
from wslib.core.recipes import Recipe

POSITIVE = {
    "lr": "a learning rate",
    "lrs": "learning rates",
    "epochs": "epochs",
    "ticks": "LLPF ticks",
    "r_min": "refinement steps",
    "r_max": "refinement steps",
    "record_every": "ticks between records",
    "batch_size": "a batch size",
    "n_eval": "evaluation points",
    "n_init": "initial pivots",
    "cycles": "AutoNEB cycles",
    "max_pivots": "pivots",
}
"""Keys (at any depth) whose values must be > 0, with what they count."""


def recipe_entries(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """The recipes a parameter holds, each with its field name: ``recipe`` and
    ``*_recipe`` are one, ``recipes`` maps model names to one each."""
    if name == "recipe" or name.endswith("_recipe"):
        yield name, value
    elif name == "recipes" and isinstance(value, dict):
        yield from ((f"{name}.{key}", r) for key, r in value.items())


def model_configs(field: str, value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every model config under ``value`` (a mapping whose ``name`` is a model's)."""
    if isinstance(value, dict) and value.get("name") in MODEL_NAMES:
        yield field, value
    elif isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, inner in items:
            yield from model_configs(f"{field}.{key}", inner)


def leaves(field: str, value: Any) -> Iterator[tuple[str, str, Any]]:
    """Every scalar under ``value``: its dotted field, its own key and value."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from leaves(f"{field}.{key}", inner)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from leaves(f"{field}[{i}]", inner)
    else:
        yield field, field.rsplit(".", 1)[-1].split("[")[0], value


def problem(key: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot stand for ``key`` (``default``: the notebook's, at
    the top level), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return f"is {value}; give a finite number"
    if key in POSITIVE and value <= 0:
        return f"counts {POSITIVE[key]}; give a value > 0"
    if isinstance(default, bool) or not isinstance(default, int | float):
        return None
    if isinstance(default, int) and default >= 1 and key != "seed" and value < 1:
        return f"is a count (the notebook's default is {default}); give a value >= 1"
    if default >= 0 and value < 0:
        return f"cannot be negative (the notebook's default is {default})"
    return None


def check_values(params: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Raise ValueError naming the first of ``params`` (a profile's section)
    whose value is out of range, with the range; ``defaults``: the notebook's."""
    for name, value in params.items():
        for field, recipe in recipe_entries(name, value):
            if isinstance(recipe, dict):
                try:
                    Recipe.from_dict(recipe)
                except (TypeError, ValueError) as error:
                    raise ValueError(f"{field}: {error}") from None
        for field, config in model_configs(name, value):
            try:
                check_sizes(config)
            except ValueError as error:
                raise ValueError(f"{field}: {error}") from None
        for field, key, leaf in leaves(name, value):
            top = defaults.get(name) if field == name else None
            why = problem(key, leaf, top)
            if why:
                raise ValueError(f"{field} = {leaf!r} {why}")
