"""Names of models and data sets for the book's text."""

from __future__ import annotations

import torch

from wslib.core.data import Dataset
from wslib.core.describe import (
    describe_data,
    describe_model,
    describe_models,
    input_size,
)


def test_describe_model_names_the_kind_and_the_widths() -> None:
    assert describe_model({"name": "mlp", "widths": [256, 128]}) == "MLP 256-128"
    assert describe_model({"name": "cnn1d", "channels": [8, 16]}) == "1-D CNN 8-16"
    assert describe_model({"name": "resnet1d", "widths": [8]}) == "1-D ResNet 8"
    assert describe_model({"name": "resnet18", "width": 1.0}) == "ResNet-18"
    assert describe_model({"name": "newnet"}) == "newnet"


def test_describe_models_is_one_english_list() -> None:
    mlp = {"name": "mlp", "widths": [4]}
    vit = {"name": "vit"}
    assert describe_models({"a": mlp}) == "MLP 4 (a)"
    assert describe_models({"a": mlp, "b": vit}) == "MLP 4 (a) and ViT (b)"
    assert (
        describe_models({"a": mlp, "b": vit, "c": vit})
        == "MLP 4 (a), ViT (b) and ViT (c)"
    )


def test_describe_data_and_input_size() -> None:
    x = torch.zeros(5, 3, 4, 2)
    y = torch.zeros(5, dtype=torch.long)
    ds = Dataset("cifar10", x, y, x, y, 10)
    assert describe_data(ds) == "CIFAR-10"
    assert describe_data(Dataset("other", x, y, x, y, 10)) == "other"
    assert input_size(ds) == 24
