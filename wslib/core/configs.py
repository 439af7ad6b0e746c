"""Model configs completed from their data set: ``in_shape`` and ``n_classes``.

A model config (``{"name": "mlp", "widths": [256, 256]}``, see
:func:`wslib.core.models.build_model`) needs the shape of one input and the
number of classes, which follow from the data set the model is trained on.
:func:`with_data_shape` adds them to one config, :func:`complete_model_configs`
to every model config among a chapter's parameters, so a parameter profile
names only what differs between models.
"""

from __future__ import annotations

import math
from typing import Any

from wslib.core.models import MODEL_NAMES

#: Shape of one input and number of classes of each data set of
#: :data:`wslib.core.data.DATASETS` (as :func:`wslib.core.data.load_dataset` returns it).
DATA_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "mnist1d": ((1, 40), 10),
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion_mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
}
SHAPE_KEYS = ("in_shape", "n_classes")


def with_data_shape(
    config: dict[str, Any], data: dict[str, Any] | None
) -> dict[str, Any]:
    """``config`` with the ``in_shape`` and ``n_classes`` of data set ``data``
    where it gives none.

    They go right after ``name``, where the book's configs write them; a value
    the config gives is kept (a toy network, an autoencoder's output size).

    Raises
    ------
    ValueError
        If a key is missing and ``data`` names no data set of :data:`DATA_SHAPES`.
    """
    missing = [key for key in SHAPE_KEYS if key not in config]
    if not missing:
        return dict(config)
    name = (data or {}).get("name")
    if name not in DATA_SHAPES:
        raise ValueError(
            f"model config {config} has no {' or '.join(missing)} and the data set "
            f"{name!r} has no known shape; give {', '.join(missing)} in the config "
            f"or train on one of {', '.join(DATA_SHAPES)}"
        )
    in_shape, n_classes = DATA_SHAPES[name]
    derived = {"in_shape": list(in_shape), "n_classes": n_classes}
    shape = {key: config.get(key, derived[key]) for key in SHAPE_KEYS}
    rest = {k: v for k, v in config.items() if k not in ("name", *SHAPE_KEYS)}
    return {"name": config["name"], **shape, **rest}


def complete_model_configs(value: Any, data: dict[str, Any] | None) -> Any:
    """``value`` with every model config in it completed by :func:`with_data_shape`.

    ``value`` is a chapter's parameters or any part of them (mappings and lists
    are searched); a model config is a mapping whose ``name`` is one of
    ``wslib.core.models.MODEL_NAMES``. A mapping's own ``data`` entry
    names the data set of the configs it holds, ``data`` the one of the rest.
    """
    if isinstance(value, list):
        return [complete_model_configs(item, data) for item in value]
    if not isinstance(value, dict):
        return value
    if value.get("name") in MODEL_NAMES:
        return with_data_shape(value, data)
    data = value.get("data", data)
    return {key: complete_model_configs(item, data) for key, item in value.items()}


def check_fits_data(
    config: dict[str, Any],
    in_shape: tuple[int, ...],
    n_classes: int | None,
    data_name: str,
) -> None:
    """Refuse a model config that does not fit the data set it is trained on.

    ``in_shape`` is the data set's shape of one input; ``n_classes`` its number
    of classes when the model classifies it (None: another task, such as an
    autoencoder, whose output size is its own). An MLP flattens its input, so
    for it the number of features must agree. Without this check a wrong
    ``in_shape`` ends in a matrix-size error deep in torch, too few classes in
    "Target 6 is out of bounds", and too many trains silently on outputs no
    label uses.
    """
    given = list(config.get("in_shape", []))
    flattens = config.get("name") == "mlp"  # an MLP reads the flattened input
    same = (
        math.prod(given) == math.prod(in_shape) if flattens else given == list(in_shape)
    )
    if not same:
        raise ValueError(
            f"model {config.get('name')!r} has in_shape {given}, but the data set "
            f"{data_name!r} has inputs of shape {list(in_shape)}; give in_shape "
            f"{list(in_shape)} or leave it out (it follows from the data set)"
        )
    if n_classes is not None and config.get("n_classes") != n_classes:
        raise ValueError(
            f"model {config.get('name')!r} has n_classes {config.get('n_classes')!r}, "
            f"but the data set {data_name!r} has {n_classes} classes; give n_classes "
            f"{n_classes} or leave it out (it follows from the data set)"
        )
