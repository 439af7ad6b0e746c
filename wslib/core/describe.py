"""Plain-language names of models and data sets, for the text of the book.

The chapters quote what a run used ("an MLP 256-256 on MNIST-1D") from its
parameters, so that the prose stays true in every profile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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


def describe_model(config: Mapping[str, Any]) -> str:
    """``"MLP 256-256"``, ``"1-D CNN 32-64-64"``, ``"ResNet-18"``: kind and widths of a model config."""
    label = MODEL_LABELS.get(config["name"], config["name"])
    widths = config.get("widths", config.get("channels"))
    return label if widths is None else f"{label} {'-'.join(map(str, widths))}"


def describe_settings(config: Mapping[str, Any]) -> str:
    """A model config with each of its settings in words, e.g. ``cnn1d (channels [16, 16])``."""
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


def in_words(items: Iterable[Any], last: str = "and") -> str:
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


def describe_data(ds: Dataset) -> str:
    """``"MNIST-1D"`` for the data set ``ds``."""
    return DATA_LABELS.get(ds.name, ds.name)


def input_size(ds: Dataset) -> int:
    """Number of input features of one example (all axes but the batch axis)."""
    size = 1
    for n in ds.in_shape:
        size *= n
    return size
