"""wslib.core.configs' factories: each config builds the layout its docstring
describes, the published nets with their published channel plans, and a bad
config is named with its model.

The references are the architecture classes built directly with every
argument written out (the factories' defaults and the plans of VGG-11,
ResNet-18 and the CIFAR "NV" net typed here, not read from the library).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from wslib.core.configs import build_model
from wslib.core.models import MLP, ConvNet, ResNet, Transformer

SEQ, IMAGE = [1, 40], [3, 32, 32]
P = "P"  # a 2x pooling step of a ConvNet plan


def layout(model: nn.Module) -> list[tuple[Any, ...]]:
    """Every module's name, type and kernel/stride, then every tensor's name and shape."""
    modules = [
        (
            name,
            type(m).__name__,
            getattr(m, "kernel_size", None),
            getattr(m, "stride", None),
        )
        for name, m in model.named_modules()
    ]
    tensors = [(name, tuple(t.shape)) for name, t in model.state_dict().items()]
    return modules + tensors


CASES: list[tuple[dict[str, Any], Callable[[], nn.Module]]] = [
    (
        {"name": "mlp", "in_shape": SEQ, "n_classes": 10},
        lambda: MLP(SEQ, 10, (256, 256), activation="relu", output_bias=True),
    ),
    (
        {"name": "mlp", "in_shape": SEQ, "n_classes": 10, "output_bias": False},
        lambda: MLP(SEQ, 10, (256, 256), activation="relu", output_bias=False),
    ),
    (
        {"name": "cnn1d", "in_shape": SEQ, "n_classes": 10},
        lambda: ConvNet(SEQ, 10, [32, P, 32, P, 32, P], kernel_size=5, pool="max"),
    ),
    (
        {"name": "cnn1d", "in_shape": SEQ, "n_classes": 10, "channels": [4, 6]}
        | {"pool": None, "fully_conv": True, "bn": True, "kernel_size": 3},
        lambda: ConvNet(SEQ, 10, [4, 6], kernel_size=3, bn=True, head="conv"),
    ),
    (
        {"name": "cnn2d", "in_shape": IMAGE, "n_classes": 10},
        lambda: ConvNet(IMAGE, 10, [32, P, 64, P, 128, P], kernel_size=3, pool="max"),
    ),
    (
        {"name": "cnn2d", "in_shape": IMAGE, "n_classes": 10, "channels": [4, 6]}
        | {"pool": "avg", "fully_conv": True, "bn": True},
        lambda: ConvNet(IMAGE, 10, [4, P, 6, P], pool="avg", bn=True, head="conv"),
    ),
    (
        {"name": "resnet1d", "in_shape": SEQ, "n_classes": 10},
        lambda: ResNet(SEQ, 10, (16, 32, 64), 2, kernel_size=3),
    ),
    (
        {"name": "resnet1d", "in_shape": SEQ, "n_classes": 10, "kernel_size": 5},
        lambda: ResNet(SEQ, 10, (16, 32, 64), 2, kernel_size=5),
    ),
    (
        {"name": "transformer1d", "in_shape": SEQ, "n_classes": 10},
        lambda: Transformer(SEQ, 10, 4, 64, 2, 4, 128),
    ),
    (
        {"name": "vit", "in_shape": IMAGE, "n_classes": 10},
        lambda: Transformer(IMAGE, 10, 4, 128, 6, 4, 256),
    ),
    (
        {"name": "cifar_nv", "in_shape": IMAGE, "n_classes": 10},
        lambda: ConvNet(
            IMAGE,
            10,
            [128, 128, 128, P, 256, 256, 256, P, 320, 320],
            kernel_size=3,
            pool="max",
            head="conv",
        ),
    ),
    (  # width scales every convolution, rounding to the nearest count
        {"name": "cifar_nv", "in_shape": IMAGE, "n_classes": 10, "width": 0.25},
        lambda: ConvNet(IMAGE, 10, [32, 32, 32, P, 64, 64, 64, P, 80, 80], head="conv"),
    ),
    (
        {"name": "resnet18", "in_shape": IMAGE, "n_classes": 10},
        lambda: ResNet(IMAGE, 10, (64, 128, 256, 512), 2),
    ),
    (  # at least one channel: 64 / 128 rounds to 0
        {"name": "resnet18", "in_shape": IMAGE, "n_classes": 10, "width": 1 / 128},
        lambda: ResNet(IMAGE, 10, (1, 1, 2, 4), 2),
    ),
    (
        {"name": "vgg11", "in_shape": IMAGE, "n_classes": 10},
        lambda: ConvNet(
            IMAGE,
            10,
            [64, P, 128, P, 256, 256, P, 512, 512, P, 512, 512, P],
            kernel_size=3,
            pool="max",
        ),
    ),
    (
        {
            "name": "vgg11",
            "in_shape": IMAGE,
            "n_classes": 10,
            "width": 1 / 64,
            "bn": True,
        },
        lambda: ConvNet(IMAGE, 10, [1, P, 2, P, 4, 4, P, 8, 8, P, 8, 8, P], bn=True),
    ),
]


@pytest.mark.parametrize(
    ("config", "reference"),
    CASES,
    ids=[f"{c['name']}-{i}" for i, (c, _) in enumerate(CASES)],
)
def test_each_config_builds_the_documented_layout(
    config: dict[str, Any], reference: Callable[[], nn.Module]
) -> None:
    torch.manual_seed(0)
    assert layout(build_model(config)) == layout(reference())


@pytest.mark.parametrize(
    ("name", "in_shape", "want"),
    [
        ("cnn1d", [1, 4, 40], "[C, L]"),
        ("resnet1d", [1, 4, 40], "[C, L]"),
        ("transformer1d", [1, 4, 40], "[C, L]"),
        ("cnn2d", [32, 32], "[C, H, W]"),
        ("cifar_nv", [32, 32], "[C, H, W]"),
        ("resnet18", [32, 32], "[C, H, W]"),
        ("vgg11", [32, 32], "[C, H, W]"),
        ("vit", [32, 32], "[C, H, W]"),
    ],
)
def test_an_input_of_another_rank_names_the_model_and_its_layout(
    name: str, in_shape: list[int], want: str
) -> None:
    with pytest.raises(ValueError) as error:
        build_model({"name": name, "in_shape": in_shape, "n_classes": 10})
    assert str(error.value) == f"{name} expects in_shape {want}, got {in_shape}"


def test_a_size_that_builds_nothing_names_the_model() -> None:
    config = {"name": "cnn1d", "in_shape": SEQ, "n_classes": 10, "channels": [8, 0]}
    with pytest.raises(ValueError) as error:
        build_model(config)
    assert (
        str(error.value) == "model 'cnn1d' has channels [8, 0]; give positive integers"
    )


def test_a_config_without_its_shape_lists_the_required_keys() -> None:
    with pytest.raises(ValueError) as error:
        build_model({"name": "mlp", "widths": [8]})
    assert "required keys: name, in_shape, n_classes; optional keys:" in str(
        error.value
    )
