"""The explicit path-lifting's corners that the main tests leave open (found by
mutation testing): chains that start on a diagonal, the path cap, kernels,
pooling and means whose coefficients are not binary fractions, two-block
ResNets, the layout of a ResNet's ``Phi`` and the refusals' messages."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.kit import cnn1d, mlp, resnet1d, transformer1d
from tests.pathcond.tiny import perturbed
from wslib.core.configs import build_model
from wslib.pathcond import lifting
from wslib.pathcond.lifting import (
    Factor,
    PathLifting,
    chain_paths,
    explicit_path_lifting,
    path_lifting,
)
from wslib.pathcond.rescaling import diag_g


def _agrees_with_diag_g(model: nn.Module, in_shape: list[int], rtol: float) -> None:
    """The explicit lifting's ``diag(G)`` equals the one-pass ``diag_g`` (float64)."""
    brute = explicit_path_lifting(model, in_shape).diag_g()
    fast = diag_g(model, in_shape)
    assert brute.keys() == fast.keys()
    for name, value in brute.items():
        torch.testing.assert_close(value, fast[name], rtol=rtol, atol=0.0, msg=name)


# --- chains ----------------------------------------------------------------------------------


def test_a_chain_that_starts_on_a_diagonal_is_that_diagonal_matrix():
    torch.manual_seed(0)
    d, b0 = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    w, b1 = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    diagonal = chain_paths([Factor(d, b0, diagonal=True), Factor(w, b1)])
    dense = chain_paths([Factor(torch.diag(d), b0), Factor(w, b1)])
    assert diagonal.shape == (2, 3 * 3 + 3 + 1)
    assert torch.equal(diagonal, dense)


def test_the_path_cap_allows_exactly_max_paths(monkeypatch: pytest.MonkeyPatch):
    """A chain of 16 path entries (2 outputs x (2 x 3 input paths + 2 bias
    paths)) passes a cap of 16 and is refused, with the cap named, at 15."""
    factors = [Factor(torch.ones(2, 3), torch.ones(2)), Factor(torch.ones(2, 2))]
    monkeypatch.setattr(lifting, "MAX_PATHS", 16)
    assert chain_paths(factors).numel() == 16
    monkeypatch.setattr(lifting, "MAX_PATHS", 15)
    with pytest.raises(
        ValueError, match=r"^more than 15 path entries: use a smaller network$"
    ):
        chain_paths(factors)


# --- dense layers ----------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [1, 3, 5])
def test_the_dense_conv_is_the_same_padding_convolution(kernel: int):
    torch.manual_seed(kernel)
    w = torch.randn(3, 2, kernel, dtype=torch.float64)
    x = torch.randn(2, 7, dtype=torch.float64)
    dense = lifting._dense_conv(w, 7)
    expected = F.conv1d(x[None], w, padding=kernel // 2).reshape(-1)
    torch.testing.assert_close(dense @ x.reshape(-1), expected, rtol=1e-14, atol=0.0)


def test_pooling_and_mean_by_three_are_exact_in_float64():
    """A fully convolutional net with a pooling of 3 and a mean over 3
    positions (coefficients 1/3, not exact in float32; 2 channels, 3 classes):
    the lifting's ``diag(G)`` equals the one-pass ``diag_g`` to rounding."""
    config = cnn1d([2], in_shape=[1, 9], n_classes=3, pool="avg", fully_conv=True)
    model = perturbed(config)
    assert isinstance(model.features[2], nn.AvgPool1d)
    model.features[2] = nn.AvgPool1d(3)  # 9 positions -> 3
    phi = explicit_path_lifting(model, config["in_shape"]).phi
    assert phi.dtype == torch.float64
    _agrees_with_diag_g(model, config["in_shape"], rtol=1e-12)


def test_a_layer_without_a_path_lifting_is_named():
    config = cnn1d([2], in_shape=[1, 4], pool=None)
    model = build_model(config)
    assert isinstance(model.features[1], nn.ReLU)
    model.features[1] = nn.GELU()
    with pytest.raises(
        TypeError, match=r"^explicit path-lifting: unsupported layer GELU$"
    ):
        explicit_path_lifting(model, config["in_shape"])


# --- ResNets ---------------------------------------------------------------------------------


def test_a_three_block_resnet_counts_each_bias_path_once():
    """Three blocks of one channel on 3 positions (eight routes, means over 3):
    each bias path counted once in the streams that set the later blocks'
    BatchNorms, and the head's bias once, so ``diag(G)`` equals the one-pass
    ``diag_g``."""
    config = resnet1d([1], in_shape=[1, 3], n_classes=2, blocks_per_stage=3)
    model = perturbed(config)
    _agrees_with_diag_g(model, config["in_shape"], rtol=1e-10)


def test_a_resnet_lists_the_all_shortcut_route_first_with_the_head_bias():
    """One block, width C = 2 on L = 3 positions: each output's ``Phi`` starts
    with the shortcut route, its C * (C L) * L input paths and C * (C L) paths
    from the stem's biases, then the output's own bias; then the body's route."""
    config = resnet1d([2], in_shape=[1, 3], blocks_per_stage=1, n_classes=2)
    model = perturbed(config)
    phi = explicit_path_lifting(model, config["in_shape"]).phi.reshape(2, -1)
    c, length = 2, 3
    first = c * (c * length) * length + c * (c * length)
    assert torch.equal(phi[:, first], model.head.bias.detach())
    assert not torch.isin(model.head.bias.detach(), phi[:, first + 1 :]).any()


def test_a_resnet_with_two_stages_is_refused():
    model = build_model(resnet1d([2, 2], in_shape=[1, 4], blocks_per_stage=1))
    message = (
        r"^explicit path-lifting supports single-stage ResNets \(identity shortcuts\)$"
    )
    with pytest.raises(ValueError, match=message):
        explicit_path_lifting(model, [1, 4])


# --- refusals --------------------------------------------------------------------------------


def test_max_pooling_is_refused():
    model = build_model(cnn1d([2], in_shape=[1, 4], pool="max"))
    message = r"^max pooling has no fixed path-lifting; use pool='avg' or None$"
    with pytest.raises(ValueError, match=message):
        path_lifting(model, [1, 4])


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (transformer1d([1, 8], patch_size=2, embed_dim=4, depth=1, heads=1), "Tr"),
        (resnet1d([2], in_shape=[1, 4], blocks_per_stage=1), "ResNet"),
        (mlp([2], in_shape=[1, 4]), None),
    ],
    ids=["transformer", "resnet", "mlp"],
)
def test_a_model_without_an_explicit_lifting_is_named(config: dict, name: str | None):
    """A transformer on a 1-D signal, a ResNet on 2-D input: refused, naming the
    class and the input; an MLP is lifted whatever the input's shape."""
    model = build_model(config)
    shape = [1, 2, 2] if name == "ResNet" else config["in_shape"]
    if name is None:
        assert path_lifting(model, [1, 2, 2]) is not None
        return
    kind = type(model).__name__
    message = (
        rf"^no explicit path-lifting for {kind} with input "
        rf"{re.escape(str(shape))}; use a tiny MLP, 1-D ConvNet or "
        r"single-stage 1-D ResNet$"
    )
    with pytest.raises(ValueError, match=message):
        path_lifting(model, shape)


def test_diag_g_refuses_names_that_do_not_fit_the_shapes():
    jac = torch.ones(2, 3, dtype=torch.float64)
    ok = PathLifting(torch.ones(2), jac, ["a", "b"], [torch.Size([2]), torch.Size([])])
    assert {k: v.shape for k, v in ok.diag_g().items()} == {
        "a": torch.Size([2]),
        "b": torch.Size([]),
    }
    bad = PathLifting(torch.ones(2), jac, ["a", "b", "c"], ok.shapes)
    with pytest.raises(ValueError):
        bad.diag_g()
