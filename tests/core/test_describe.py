"""Names of models, data sets and recipes for the book's text."""

from __future__ import annotations

import torch

from wslib.core.data import Dataset
from wslib.core.describe import (
    data_label,
    describe_data,
    describe_model,
    describe_models,
    describe_sgd,
    input_size,
    mlp_sizes,
    percent,
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


def test_detailed_descriptions_of_data_models_and_recipes() -> None:
    assert percent(0.99) == "99%"
    assert data_label("cifar10") == "CIFAR-10" and data_label("other") == "other"
    x = torch.zeros(20, 1, 40)
    ds = Dataset("mnist1d", x, torch.zeros(20, dtype=torch.long), x, x[:, 0, 0], 10)
    assert describe_data(ds, detailed=True) == (
        "MNIST-1D (20 training examples of shape 1×40, 10 classes)"
    )
    mlp = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10}
    assert mlp_sizes({**mlp, "widths": [256, 32]}) == "40-256-32-10"
    assert describe_model({**mlp, "widths": [4]}, words="details") == "MLP 40-4-10"
    gelu = {**mlp, "widths": [4], "activation": "gelu"}
    assert describe_model(gelu, words="details") == "MLP 40-4-10, GELU"
    cnn = {"name": "cnn1d", "channels": [32, 64], "pool": "avg", "fully_conv": True}
    assert (
        describe_model(cnn, words="details")
        == "1-D CNN, channels 32-64, average pooling, fully convolutional"
    )
    assert describe_model(
        {"name": "cnn2d", "channels": [8], "bn": True}, words="details"
    ) == ("2-D CNN, channels 8, BatchNorm")
    resnet = {"name": "resnet1d", "widths": [16, 32], "blocks_per_stage": 1}
    assert (
        describe_model(resnet, words="details")
        == "1-D ResNet with BatchNorm, widths 16-32, 1 block per stage"
    )
    assert describe_model({**resnet, "blocks_per_stage": 2}, words="details").endswith(
        "2 blocks per stage"
    )
    resnet18 = {"name": "resnet18"}
    assert describe_model(resnet18, words="details") == "ResNet-18 with BatchNorm"
    assert describe_model({**resnet18, "width": 0.25}, words="details").endswith(
        ", width 0.25"
    )
    assert (
        describe_model({"name": "vgg11", "bn": True}, words="details")
        == "VGG-11 with BatchNorm"
    )
    assert describe_model({"name": "vgg11"}, words="details") == "VGG-11"
    assert describe_model({"name": "vit"}, words="details") == "vit"
    nv = {"name": "cifar_nv", "in_shape": [3, 32, 32], "n_classes": 10}
    assert describe_model(nv, words="details") == (
        "CIFAR-NV-like net (9 convolutions, max pooling)"
    )
    assert describe_model({**nv, "width": 0.5}, words="details").endswith(", width 0.5")
    recipe = {
        "batch_size": 64,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "schedule": "cosine",
    }
    assert describe_sgd(recipe) == (
        "momentum 0.9, weight decay 0.0005, cosine learning rate, batch 64"
    )
    assert describe_sgd({"batch_size": 128}) == (
        "momentum 0, weight decay 0, constant learning rate, batch 128"
    )
