"""Plain-language names of models, data sets and recipes, for the text of the book.

The chapters quote what a run used ("an MLP 256-256 on MNIST-1D") from its
parameters, so that the prose stays true in every profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from wslib.core.data import Dataset

MODEL_LABELS = {
    "mlp": "MLP",
    "cnn1d": "1-D CNN",
    "cnn2d": "CNN",
    "resnet1d": "1-D ResNet",
    "transformer1d": "1-D transformer",
    "resnet18": "ResNet-18",
    "vgg11": "VGG-11",
    "vit": "ViT",
}
DATA_LABELS = {
    "mnist1d": "MNIST-1D",
    "digits": "scikit-learn digits",
    "mnist": "MNIST",
    "fashion_mnist": "Fashion-MNIST",
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
}


# How describe_model names a model: its kind and widths, its layers and
# options in words, or its config's name with every setting as written.
ModelWords = Literal["label", "details", "settings"]


def describe_model(config: Mapping[str, Any], *, words: ModelWords = "label") -> str:
    """A model config in words, in one of three ``words`` styles.

    - ``"label"``: kind and widths, ``"MLP 256-256"``, ``"1-D CNN 32-64-64"``,
      ``"ResNet-18"``;
    - ``"details"``: the layer sizes and the options that change the network,
      ``"MLP 40-256-256-10, GELU"``, ``"1-D CNN, channels 32-64, BatchNorm"``
      (a kind with no details in words is named by its key);
    - ``"settings"``: the config's name and each of its settings as written,
      ``"cnn1d (channels [16, 16])"``.
    """
    if words == "details":
        return _DETAILS.get(config["name"], lambda c: c["name"])(config)
    if words == "settings":
        return _settings(config)
    label = MODEL_LABELS.get(config["name"], config["name"])
    widths = config.get("widths", config.get("channels"))
    return label if widths is None else f"{label} {'-'.join(map(str, widths))}"


def _settings(config: Mapping[str, Any]) -> str:
    details = [
        f"{k.replace('_', ' ')} {v}"
        for k, v in config.items()
        if k not in ("name", "in_shape", "n_classes")
    ]
    name = str(config["name"])
    return f"{name} ({', '.join(details)})" if details else name


def describe_recipe(recipe: Mapping[str, Any]) -> str:
    """A training recipe in words, e.g. ``100 epochs, lr 0.1, batch size 32``."""
    return ", ".join(
        f"{v} epoch{'s' * (v != 1)}" if k == "epochs" else f"{k.replace('_', ' ')} {v}"
        for k, v in recipe.items()
    )


def in_words(items: Iterable[Any], *, last: Literal["and", "or"] = "and") -> str:
    """``a, b and c`` (``last`` joins the final pair); one item as is, none empty."""
    words = [str(i) for i in items]
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} {last} {words[-1]}"


def describe_models(models: Mapping[str, Mapping[str, Any]]) -> str:
    """The models of a chapter as one English list: ``"MLP 32-32 (mlp) and ViT (vit)"``."""
    return in_words(
        f"{describe_model(config)} ({key})" for key, config in models.items()
    )


def data_label(name: str) -> str:
    """The name of a data set of :data:`wslib.core.data.DATASETS` as written in text."""
    return DATA_LABELS.get(name, name)


def describe_data(ds: Dataset, *, detailed: bool = False) -> str:
    """``"MNIST-1D"`` for the data set ``ds``; ``detailed``: with its size,
    ``"MNIST-1D (4000 training examples of shape 1×40, 10 classes)"``."""
    name = data_label(ds.name)
    if not detailed:
        return name
    shape = "×".join(map(str, ds.in_shape))
    return (
        f"{name} ({len(ds.x_train)} training examples of shape {shape}, "
        f"{ds.n_classes} classes)"
    )


def input_size(ds: Dataset) -> int:
    """Number of input features of one example (all axes but the batch axis)."""
    size = 1
    for n in ds.in_shape:
        size *= n
    return size


def percent(fraction: float) -> str:
    """A fraction as a whole percentage: ``0.99`` -> ``"99%"``."""
    return f"{fraction:.0%}"


def describe_sgd(recipe: Mapping[str, Any]) -> str:
    """A plain-SGD recipe in words: momentum, weight decay, schedule, batch size."""
    return (
        f"momentum {recipe.get('momentum', 0.0):g}, "
        f"weight decay {recipe.get('weight_decay', 0.0):g}, "
        f"{recipe.get('schedule', 'constant')} learning rate, "
        f"batch {recipe['batch_size']}"
    )


def mlp_sizes(config: Mapping[str, Any]) -> str:
    """The layer sizes of an MLP config, input to output: ``"40-256-256-10"``."""
    sizes = [math.prod(config["in_shape"]), *config["widths"], config["n_classes"]]
    return "-".join(map(str, sizes))


def _mlp_details(config: Mapping[str, Any]) -> str:
    act = config.get("activation", "relu")
    return f"MLP {mlp_sizes(config)}" + ("" if act == "relu" else f", {act.upper()}")


def _cnn_details(config: Mapping[str, Any]) -> str:
    name = config["name"]
    parts = [f"{name[-2]}-D CNN, channels {'-'.join(map(str, config['channels']))}"]
    parts += ["average pooling"] if config.get("pool") == "avg" else []
    parts += ["BatchNorm"] if config.get("bn") else []
    parts += ["fully convolutional"] if config.get("fully_conv") else []
    return ", ".join(parts)


def _resnet1d_details(config: Mapping[str, Any]) -> str:
    blocks = config["blocks_per_stage"]
    return (
        f"1-D ResNet with BatchNorm, widths {'-'.join(map(str, config['widths']))}, "
        f"{blocks} block{'s' if blocks > 1 else ''} per stage"
    )


def _width(config: Mapping[str, Any]) -> str:
    width = config.get("width", 1.0)
    return "" if width == 1.0 else f", width {width:g}"


_DETAILS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "mlp": _mlp_details,
    "cnn1d": _cnn_details,
    "cnn2d": _cnn_details,
    "resnet1d": _resnet1d_details,
    "resnet18": lambda c: "ResNet-18 with BatchNorm" + _width(c),
    "vgg11": lambda c: "VGG-11" + (" with BatchNorm" if c.get("bn") else ""),
    "cifar_nv": lambda c: "CIFAR-NV-like net (9 convolutions, max pooling)" + _width(c),
}
