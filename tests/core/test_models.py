"""Every architecture's neuron structure is valid and its symmetries are exact."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from wslib.core.configs import MODEL_NAMES, build_model, check_sizes
from wslib.core.neurons import (
    NeuronGroup,
    permute_state,
    random_permutations,
    random_scales,
    rescale_state,
    validate_structure,
)

SEQ = {"in_shape": [1, 40], "n_classes": 10}
IMG = {"in_shape": [3, 32, 32], "n_classes": 10}
TINY_TRANSFORMER = {"embed_dim": 16, "depth": 2, "heads": 2, "mlp_dim": 24}
CONFIGS = {
    "mlp": {"name": "mlp", **SEQ, "widths": [16, 12]},
    "mlp_gelu": {"name": "mlp", **SEQ, "widths": [16, 12], "activation": "gelu"},
    "mlp_no_output_bias": {
        "name": "mlp",
        **SEQ,
        "widths": [16, 12],
        "output_bias": False,
    },
    "cnn1d": {"name": "cnn1d", **SEQ, "channels": [6, 8, 5]},
    "cnn1d_avg_bn": {
        "name": "cnn1d",
        **SEQ,
        "channels": [6, 8],
        "pool": "avg",
        "bn": True,
    },
    "cnn1d_fully_conv": {
        "name": "cnn1d",
        **SEQ,
        "channels": [6, 8],
        "pool": None,
        "fully_conv": True,
    },
    "resnet1d": {"name": "resnet1d", **SEQ, "widths": [4, 6, 8], "blocks_per_stage": 2},
    "transformer1d": {
        "name": "transformer1d",
        **SEQ,
        "patch_size": 4,
        **TINY_TRANSFORMER,
    },
    "cnn2d_fully_conv": {
        "name": "cnn2d",
        **IMG,
        "channels": [6, 8],
        "pool": "avg",
        "fully_conv": True,
    },
    "cifar_nv": {"name": "cifar_nv", **IMG, "width": 0.05},
    "resnet18": {"name": "resnet18", **IMG, "width": 0.0625},
    "vgg11": {"name": "vgg11", **IMG, "width": 0.0625},
    "vgg11_bn": {"name": "vgg11", **IMG, "width": 0.0625, "bn": True},
    "vit": {"name": "vit", **IMG, "patch_size": 8, **TINY_TRANSFORMER},
}
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)
BN_CONFIGS = ["cnn1d_avg_bn", "resnet1d", "resnet18", "vgg11_bn"]


def _inputs(config: dict, seed: int, n: int = 8) -> torch.Tensor:
    """Noise with a per-sample offset and scale, so that pooled features differ across samples."""
    g = torch.Generator().manual_seed(seed)
    per_sample = (n, *[1] * len(config["in_shape"]))
    offset = torch.randn(per_sample, generator=g)
    scale = 0.5 + 1.5 * torch.rand(per_sample, generator=g)
    return offset + scale * torch.randn(n, *config["in_shape"], generator=g)


def _model(key: str) -> nn.Module:
    """A seeded model with random norm parameters and non-trivial BN running stats."""
    torch.manual_seed(0)
    model = build_model(CONFIGS[key])
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (*BATCH_NORMS, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.3)
        model.train()
        for seed in range(3):
            model(_inputs(CONFIGS[key], seed))
        for m in model.modules():
            if isinstance(m, BATCH_NORMS):
                m.running_mean.add_(0.3 * torch.randn_like(m.running_mean))
                m.running_var.mul_(torch.empty_like(m.running_var).uniform_(0.5, 2.0))
    return model


def _output(
    model: nn.Module, state: dict, x: torch.Tensor, train: bool
) -> torch.Tensor:
    clone = copy.deepcopy(model)
    clone.load_state_dict(state)
    clone.train(train)
    with torch.no_grad():
        return clone(x)


def _assert_same_function(
    model: nn.Module, x: torch.Tensor, new_state: dict, train: bool
) -> None:
    ref = _output(model, model.state_dict(), x, train)
    out = _output(model, new_state, x, train)
    scale = max(1.0, ref.abs().max().item())
    assert (out - ref).abs().max().item() <= 2e-5 * scale


def _changed(state: dict, new_state: dict, group: NeuronGroup) -> bool:
    return any(not torch.equal(state[s.name], new_state[s.name]) for s in group.slots)


@pytest.fixture(params=list(CONFIGS), scope="module")
def key(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(key: str) -> nn.Module:
    return _model(key)


def test_every_architecture_is_tested():
    assert {c["name"] for c in CONFIGS.values()} == set(MODEL_NAMES)


def test_structure_is_valid(model):
    structure = model.neuron_structure()
    validate_structure(model.state_dict(), structure)
    assert len(set(structure.names)) == len(structure.groups) > 0
    axes = [(s.name, s.axis) for g in structure.groups for s in g.slots]
    assert len(axes) == len(set(axes)), "a tensor axis belongs to two groups"


def test_bn_running_stats_are_nontrivial(key, model):
    bns = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]
    assert bool(bns) == (key in BN_CONFIGS)
    for bn in bns:
        assert bn.running_mean.abs().max() > 1e-3
        assert (bn.running_var - 1).abs().max() > 1e-3


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_permutation_preserves_function(key, model, train):
    structure = model.neuron_structure()
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(2))
    state = model.state_dict()
    new_state = permute_state(state, structure, perms)
    for group in structure.groups:
        assert not torch.equal(perms[group.name], torch.arange(group.size))
        assert _changed(state, new_state, group), group.name
    _assert_same_function(model, _inputs(CONFIGS[key], seed=10), new_state, train)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_rescaling_preserves_function(key, model, train):
    structure = model.neuron_structure()
    scales = random_scales(
        structure, spread=1.0, generator=torch.Generator().manual_seed(3)
    )
    if not scales:
        pytest.skip("no rescalable groups")
    state = model.state_dict()
    new_state = rescale_state(state, structure, scales)
    for name in scales:
        assert _changed(state, new_state, structure[name]), name
    _assert_same_function(model, _inputs(CONFIGS[key], seed=10), new_state, train)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_non_homogeneous_activation_groups_are_not_rescalable(activation):
    model = build_model({**CONFIGS["mlp"], "activation": activation})
    structure = model.neuron_structure()
    assert not any(g.rescalable for g in structure.groups)
    assert random_scales(structure) == {}
    ones = {structure.groups[0].name: torch.ones(structure.groups[0].size)}
    with pytest.raises(ValueError, match="cannot be rescaled"):
        rescale_state(model.state_dict(), structure, ones)


def test_transformer_stream_is_permutation_only():
    structure = build_model(CONFIGS["transformer1d"]).neuron_structure()
    assert not structure["stream"].rescalable
    assert all(g.rescalable for g in structure.groups if g.name != "stream")


def test_cnn1d_flatten_head_uses_blocks():
    structure = build_model(CONFIGS["cnn1d"]).neuron_structure()
    (head,) = [s for s in structure.groups[-1].slots if s.name == "head.weight"]
    assert head.block == 40 // 2**3


@pytest.mark.parametrize(
    "config, message",
    [
        ({"name": "nope", **SEQ}, "valid names: mlp, cnn1d"),
        ({**SEQ}, "valid names"),
        ({"name": "mlp", "in_shape": [1, 40]}, r"missing: \['n_classes'\]"),
        ({"name": "mlp", **SEQ, "depth": 3}, r"unknown: \['depth'\]"),
        ({"name": "mlp", **SEQ, "activation": "tanh"}, "activation"),
        ({"name": "resnet18", **SEQ}, r"in_shape \[C, H, W\]"),
        ({"name": "cnn1d", **SEQ, "pool": "median"}, "pool"),
        ({"name": "transformer1d", **SEQ, "patch_size": 3}, "patches"),
    ],
)
def test_build_model_errors(config, message):
    with pytest.raises(ValueError, match=message):
        build_model(config)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"widths": [8, 0]}, r"has widths \[8, 0\]; give positive integers"),
        ({"widths": [8.5]}, r"has widths \[8.5\]; give positive integers"),
        ({"widths": [True]}, "give positive integers"),
        ({"n_classes": 0}, "has n_classes 0"),
        ({"in_shape": [1, -40]}, "has in_shape"),
    ],
)
def test_a_model_of_no_or_negative_size_is_refused(options, message) -> None:
    config = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10, **options}
    with pytest.raises(ValueError, match=message):
        build_model(config)


def test_sizes_of_numpy_integers_and_a_float_width_multiplier_build() -> None:
    config = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10}
    assert build_model({**config, "widths": [np.int64(4)]})
    with pytest.raises(ValueError, match="has width 0; give a positive number"):
        check_sizes({"name": "resnet18", "width": 0})
    check_sizes({"name": "resnet18", "width": 0.5})
