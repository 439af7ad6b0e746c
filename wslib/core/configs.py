"""Model configs: the models they name, and their completion from the data set.

A model config (``{"name": "mlp", "widths": [256, 256]}``) names one of the
book's architectures (:mod:`wslib.core.models`) and its sizes;
:func:`build_model` builds it and :func:`check_sizes` refuses a size that
builds nothing. It also needs the shape of one input and the
number of classes, which follow from the data set the model is trained on.
:func:`with_data_shape` adds them to one config, :func:`complete_model_configs`
to every model config among a chapter's parameters, so a parameter profile
names only what differs between models.

Only the factories import torch (through :mod:`wslib.core.models`), when a
model is built: the book's commands read configs to check a profile, and
start without torch (2.6 CPU-s a process; ``bookkit/speed.py``).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported when a model is built, not before
    from torch import nn

    from wslib.core.models import (
        MLP,
        ActivationName,
        ConvNet,
        PoolName,
        ResNet,
        Transformer,
    )

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
# The channel plans of the published architectures ("P": a pooling step).
_VGG11_PLAN = (64, "P", 128, "P", 256, 256, "P", 512, 512, "P", 512, 512, "P")
_RESNET18_WIDTHS = (64, 128, 256, 512)
_CIFAR_NV_PLAN = (128, 128, 128, "P", 256, 256, 256, "P", 320, 320)


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
    ``wslib.core.configs.MODEL_NAMES``. A mapping's own ``data`` entry
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


# --- factories and build_model ----------------------------------------------------------------


def _check_shape(in_shape: Sequence[int], dims: int, name: str) -> list[int]:
    if len(in_shape) != dims + 1:
        layout = "[C, L]" if dims == 1 else "[C, H, W]"
        raise ValueError(f"{name} expects in_shape {layout}, got {list(in_shape)}")
    return list(in_shape)


def _scaled(widths: Sequence[int], width: float) -> list[int]:
    return [max(1, round(w * width)) for w in widths]


def mlp(
    in_shape: Sequence[int],
    n_classes: int,
    *,
    widths: Sequence[int] = (256, 256),
    activation: ActivationName = "relu",
    output_bias: bool = True,
) -> MLP:
    """Fully connected net on the flattened input (``output_bias``: a bias in the head)."""
    from wslib.core.models import MLP

    return MLP(
        in_shape, n_classes, widths, activation=activation, output_bias=output_bias
    )


def cnn1d(
    in_shape: Sequence[int],
    n_classes: int,
    *,
    channels: Sequence[int] = (32, 32, 32),
    kernel_size: int = 5,
    pool: PoolName | None = "max",
    fully_conv: bool = False,
    bn: bool = False,
) -> ConvNet:
    """1-D CNN: one ``Conv -> ReLU (-> 2x pool)`` stage per entry of ``channels``."""
    shape = _check_shape(in_shape, 1, "cnn1d")
    return _staged_cnn(shape, n_classes, channels, kernel_size, pool, fully_conv, bn)


def cnn2d(
    in_shape: Sequence[int],
    n_classes: int,
    *,
    channels: Sequence[int] = (32, 64, 128),
    kernel_size: int = 3,
    pool: PoolName | None = "max",
    fully_conv: bool = False,
    bn: bool = False,
) -> ConvNet:
    """2-D CNN: one ``Conv -> ReLU (-> 2x pool)`` stage per entry of ``channels``.

    With ``fully_conv=True`` and no BN it is a CIFAR "NV"-like fully
    convolutional net (conv head, global average pooling).
    """
    shape = _check_shape(in_shape, 2, "cnn2d")
    return _staged_cnn(shape, n_classes, channels, kernel_size, pool, fully_conv, bn)


def _staged_cnn(
    shape: list[int],
    n_classes: int,
    channels: Sequence[int],
    kernel_size: int,
    pool: PoolName | None,
    fully_conv: bool,
    bn: bool,
) -> ConvNet:
    plan = [c for ch in channels for c in ((ch, "P") if pool else (ch,))]
    head: Literal["flatten", "conv"] = "conv" if fully_conv else "flatten"
    from wslib.core.models import ConvNet

    return ConvNet(
        shape,
        n_classes,
        plan,
        kernel_size=kernel_size,
        pool=pool or "max",
        bn=bn,
        head=head,
    )


def resnet1d(
    in_shape: Sequence[int],
    n_classes: int,
    *,
    widths: Sequence[int] = (16, 32, 64),
    blocks_per_stage: int = 2,
    kernel_size: int = 3,
) -> ResNet:
    """1-D ResNet of BasicBlocks, one stage per entry of ``widths``."""
    from wslib.core.models import ResNet

    return ResNet(
        _check_shape(in_shape, 1, "resnet1d"),
        n_classes,
        widths,
        blocks_per_stage,
        kernel_size=kernel_size,
    )


def transformer1d(
    in_shape: Sequence[int],
    n_classes: int,
    *,
    patch_size: int = 4,
    embed_dim: int = 64,
    depth: int = 2,
    heads: int = 4,
    mlp_dim: int = 128,
) -> Transformer:
    """Small pre-LN transformer on patches of a 1-D signal."""
    shape = _check_shape(in_shape, 1, "transformer1d")
    from wslib.core.models import Transformer

    return Transformer(shape, n_classes, patch_size, embed_dim, depth, heads, mlp_dim)


def cifar_nv(in_shape: Sequence[int], n_classes: int, *, width: float = 1.0) -> ConvNet:
    """Fully convolutional CIFAR-NV-like net: 9 convolutions, 3x3, ReLU, max pooling.

    Eight ``Conv -> ReLU`` layers in three stages (3, 3, 2 convolutions, 2x max
    pooling after the first two), then a conv head to ``n_classes`` channels and
    global average pooling, the layout of the net PathCond and ENorm use on
    CIFAR-10. The channel counts (``_CIFAR_NV_PLAN``, scaled by ``width``) are
    this library's choice.
    """
    plan = [p if isinstance(p, str) else _scaled([p], width)[0] for p in _CIFAR_NV_PLAN]
    shape = _check_shape(in_shape, 2, "cifar_nv")
    from wslib.core.models import ConvNet

    return ConvNet(
        shape, n_classes, plan, kernel_size=3, pool="max", bn=False, head="conv"
    )


def resnet18(in_shape: Sequence[int], n_classes: int, *, width: float = 1.0) -> ResNet:
    """CIFAR ResNet-18 (3x3 stem, no max pool); ``width`` multiplies all channel counts."""
    shape = _check_shape(in_shape, 2, "resnet18")
    from wslib.core.models import ResNet

    return ResNet(shape, n_classes, _scaled(_RESNET18_WIDTHS, width), 2)


def vgg11(
    in_shape: Sequence[int], n_classes: int, *, width: float = 1.0, bn: bool = False
) -> ConvNet:
    """VGG-11 convolutions (3x3, ReLU, max pool) with a single Linear head."""
    plan = [p if isinstance(p, str) else _scaled([p], width)[0] for p in _VGG11_PLAN]
    from wslib.core.models import ConvNet

    return ConvNet(
        _check_shape(in_shape, 2, "vgg11"),
        n_classes,
        plan,
        kernel_size=3,
        pool="max",
        bn=bn,
    )


def vit(
    in_shape: Sequence[int],
    n_classes: int,
    *,
    patch_size: int = 4,
    embed_dim: int = 128,
    depth: int = 6,
    heads: int = 4,
    mlp_dim: int = 256,
) -> Transformer:
    """Small vision transformer on 2-D patches."""
    shape = _check_shape(in_shape, 2, "vit")
    from wslib.core.models import Transformer

    return Transformer(shape, n_classes, patch_size, embed_dim, depth, heads, mlp_dim)


# The models a config may name (:data:`MODEL_NAMES` lists them at run time).
ModelName = Literal[
    "mlp",
    "cnn1d",
    "cnn2d",
    "resnet1d",
    "transformer1d",
    "cifar_nv",
    "resnet18",
    "vgg11",
    "vit",
]
_FACTORIES: dict[ModelName, Callable[..., nn.Module]] = {
    "mlp": mlp,
    "cnn1d": cnn1d,
    "cnn2d": cnn2d,
    "resnet1d": resnet1d,
    "transformer1d": transformer1d,
    "cifar_nv": cifar_nv,
    "resnet18": resnet18,
    "vgg11": vgg11,
    "vit": vit,
}
MODEL_NAMES: tuple[ModelName, ...] = tuple(_FACTORIES)


def config_keys(name: ModelName) -> tuple[list[str], dict[str, Any]]:
    """Required keys and optional keys (with defaults) of model ``name``, ``"name"`` excluded."""
    params = inspect.signature(_FACTORIES[name]).parameters.values()
    required = [p.name for p in params if p.default is p.empty]
    return required, {p.name: p.default for p in params if p.default is not p.empty}


SIZES = (
    "in_shape", "n_classes", "widths", "channels", "kernel_size", "blocks_per_stage",
    "patch_size", "embed_dim", "depth", "heads", "mlp_dim", "width",
)  # fmt: skip
"""Options that size a model: positive numbers (``width`` a float multiplier,
the rest integers), one each or a list of them."""


def check_sizes(config: dict[str, Any]) -> None:
    """Refuse a model config with a size that is not a positive number (a layer
    of 0 units builds and computes nothing; a negative one ends in torch)."""
    for key in SIZES:
        if key not in config:
            continue
        value = config[key]
        items = value if isinstance(value, list | tuple) else [value]
        kind = numbers.Real if key == "width" else numbers.Integral
        bad = [v for v in items if isinstance(v, bool) or not isinstance(v, kind)]
        if bad or any(v <= 0 for v in items):
            raise ValueError(
                f"model {config.get('name')!r} has {key} {value!r}; give "
                + ("a positive number" if key == "width" else "positive integers")
            )


def build_model(config: dict[str, Any]) -> nn.Module:
    """Build a model from ``{"name": ..., "in_shape": ..., "n_classes": ..., **options}``."""
    name = config.get("name")
    if not isinstance(name, str) or name not in _FACTORIES:
        raise ValueError(
            f"unknown model name {name!r}; valid names: {', '.join(MODEL_NAMES)}"
        )
    required, optional = config_keys(name)
    options = {k: v for k, v in config.items() if k != "name"}
    missing = [k for k in required if k not in options]
    unknown = [k for k in options if k not in required and k not in optional]
    if missing or unknown:
        raise ValueError(
            f"bad config for model {name!r} (missing: {missing}, unknown: {unknown}); "
            f"required keys: name, {', '.join(required)}; optional keys: {optional}"
        )
    check_sizes(config)
    return _FACTORIES[name](**options)
