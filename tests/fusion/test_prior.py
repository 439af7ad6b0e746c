"""The retrofit's prior: the aligned parents' weights, and exact self-fusion by construction."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from tests.kit import SIGNAL, class_blocks, cnn1d, mlp, seeded_model
from wslib.core.train import predict
from wslib.fusion.hfkf import (
    Grouping,
    aligned_prior,
    depth_map,
    fuse,
    has_alignment,
    head_grouping,
)
from wslib.fusion.levels import chain_levels, layer_io
from wslib.fusion.retrofit import GradientConfig, retrofit_linear

MLP = mlp([12, 8], **SIGNAL)
CNN = cnn1d([4, 6], **SIGNAL)


def _inputs(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, 1, 40, generator=gen)


def _first_pre_activation(
    model: nn.Module, x: torch.Tensor, neuron: int
) -> torch.Tensor:
    name = chain_levels(model)[0]
    return layer_io(model, [name], x)[name][:, neuron]


def _silenced(model: nn.Module, x: torch.Tensor, neuron: int = 0) -> nn.Module:
    """``model`` with first-level neuron ``neuron`` inactive (ReLU output zero) on all of ``x``."""
    first = model.get_submodule(chain_levels(model)[0])
    top = _first_pre_activation(model, x, neuron).max()
    with torch.no_grad():
        first.bias[neuron] -= top + 0.1
    return model


# --- self-fusion is exact by construction ----------------------------------------------------


# 4 per class: 40 examples, too few to identify every weight (the prior decides
# those); 12 per class: every weight identified except those on a dead neuron
@pytest.mark.filterwarnings("ignore:least squares with 40 samples")
@pytest.mark.parametrize("per_class", [4, 12], ids=["small-set", "ample-set"])
@pytest.mark.parametrize("dead", [False, True], ids=["all-active", "dead-neuron"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("grouping", ["hf", "kf"])
@pytest.mark.parametrize("config", [MLP, CNN], ids=["mlp", "cnn"])
def test_self_fusion_returns_the_model_off_the_fusion_set(
    config, grouping, seed, dead, per_class
):
    x, y = class_blocks(per_class, seed)
    model = seeded_model(config, seed)
    x_test = _inputs(400, seed + 100, scale=3.0)
    if dead:
        model = _silenced(model, x)
        assert (_first_pre_activation(model, x, 0) < 0).all()
        assert (_first_pre_activation(model, x_test, 0) > 0).any()  # it fires here
    fused = fuse([model, copy.deepcopy(model)], x, y, grouping, progress=False).model
    diff = (predict(fused, x_test) - predict(model, x_test)).abs().max().item()
    assert diff < 1e-6


def test_gradient_retrofit_starts_at_the_aligned_parents():
    """No gradient steps: the fused model is the prior, here the model itself."""
    model = seeded_model(MLP, 0)
    x, y = class_blocks(4, 0)
    res = fuse(
        [model, copy.deepcopy(model)],
        x,
        y,
        "hf",
        "gradient",
        fused=seeded_model(MLP, 1),
        gradient=GradientConfig(max_epochs=0),
        progress=False,
    )
    for a, b in zip(res.model.state_dict().values(), model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)


# --- the prior itself -----------------------------------------------------------------------


def _brute_prior(
    layers: list[nn.Linear],
    out: list[np.ndarray],
    weights: list[np.ndarray],
    inputs: list[np.ndarray] | None,
    k: int,
    k_in: int,
) -> np.ndarray:
    """``W0`` as ``(k, fan_in + 1)`` by loops over fused neurons, members and their inputs."""
    fan_in = k_in if inputs is not None else layers[0].in_features
    total, acc = np.zeros(k), np.zeros((k, fan_in + 1))
    for m, layer in enumerate(layers):
        w, b = layer.weight.detach().double().numpy(), layer.bias.detach().double()
        for i in range(layer.out_features):
            row = np.zeros(fan_in + 1)
            for j_base in range(layer.in_features):
                j = j_base if inputs is None else inputs[m][j_base]
                row[j] += w[i, j_base]
            row[-1] = b[i]
            acc[out[m][i]] += weights[m][i] * row
            total[out[m][i]] += weights[m][i]
    return acc / total[:, None]


def test_aligned_prior_is_the_weighted_average_of_summed_incoming_weights():
    tiny = mlp([4, 3], [1, 3], 2)
    models = [seeded_model(tiny, 0), seeded_model(tiny, 1)]
    layers = [[m.linears[i] for m in models] for i in range(3)]
    level0 = [np.array([0, 1, 2, 2]), np.array([1, 0, 2, 0])]  # two into one
    level1 = [np.array([0, 1, 1]), np.array([1, 0, 0])]
    rng = np.random.default_rng(0)
    w0 = [rng.uniform(0.2, 2, 4), rng.uniform(0.2, 2, 4)]
    w1 = [rng.uniform(0.2, 2, 3), rng.uniform(0.2, 2, 3)]
    g0 = Grouping(np.concatenate(level0), [4, 4], 3)
    g1 = Grouping(np.concatenate(level1), [3, 3], 2)
    class_w = np.array([[0.25, 0.9], [0.75, 0.1]])  # (models, classes)
    cases = [
        (layers[0], g0, w0, None, level0, None, 3, 0),
        (layers[1], g1, w1, g0, level1, level0, 2, 3),
        (layers[2], head_grouping(2, 2), list(class_w), g1, None, level1, 2, 2),
    ]
    for mods, out, w, inputs, out_lab, in_lab, k, k_in in cases:
        got = aligned_prior(mods, out, np.concatenate(w), inputs).T.numpy()
        out_lab = out_lab or [np.arange(2), np.arange(2)]
        want = _brute_prior(mods, out_lab, w, in_lab, k, k_in)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_ridge_keeps_unidentified_weights_at_the_prior():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, generator=gen)
    x[:, 2] = 0  # an input that is zero on every example
    t = torch.randn(3, 50, generator=gen, dtype=torch.float64)
    prior = torch.randn(5, 3, generator=gen, dtype=torch.float64)  # bias last
    with_prior, without = nn.Linear(4, 3), nn.Linear(4, 3)
    retrofit_linear(with_prior, x, t, prior=prior)
    retrofit_linear(without, x, t)
    w = prior[:4].T.float()
    assert torch.equal(with_prior.weight[:, 2], w[:, 2])
    assert without.weight[:, 2].abs().max() < 1e-12
    identified = [0, 1, 3]  # there the data decide, whatever the prior
    assert torch.allclose(
        with_prior.weight[:, identified], without.weight[:, identified], atol=1e-5
    )
    assert torch.allclose(with_prior.bias, without.bias, atol=1e-5)


def test_levels_that_skip_base_levels_have_no_alignment():
    base = ["l0", "l1", "l2", "head"]
    fused = ["a", "b", "out"]  # a -> l1 (skips l0), b -> l2, out -> head
    level_map = depth_map(base, fused)
    assert [has_alignment(base, fused, level_map, i) for i in range(3)] == [
        False,
        True,
        True,
    ]
    same = depth_map(base, base)
    assert all(has_alignment(base, base, same, i) for i in range(4))
