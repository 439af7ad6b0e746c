"""PairMaxPool1d: nn.MaxPool1d(2)'s values and gradients, bit for bit."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from tests import kit
from wslib.core.configs import build_model
from wslib.core.pooling import PairMaxPool1d


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float32 tensor (NaN payloads compared too)."""
    return t.contiguous().view(torch.int32)


def hard_input(length: int) -> torch.Tensor:
    """Ties (equal positives and ReLU's zeros), NaN and both infinities in every batch."""
    gen = torch.Generator().manual_seed(length)
    x = torch.relu(torch.randn(8, 4, length, generator=gen))
    x[x > 1.0] = 0.5  # many equal pairs
    flat = x.view(-1)
    flat[::37] = float("nan")
    flat[5::53] = float("inf")
    flat[7::61] = -float("inf")
    return x


@pytest.mark.parametrize("length", [40, 41, 6, 3, 2])
def test_values_and_gradients_equal_max_pool(length):
    x = hard_input(length)
    g = torch.randn(8, 4, length // 2, generator=torch.Generator().manual_seed(1))
    results = []
    for pool in (nn.MaxPool1d(2), PairMaxPool1d()):
        xi = x.clone().requires_grad_(True)
        out = pool(xi)
        (dx,) = torch.autograd.grad(out, xi, g)
        with torch.no_grad():
            plain = pool(x)
        results.append((out.detach(), dx, plain))
    for ours, torchs in zip(results[1], results[0]):
        assert torch.equal(bits(ours), bits(torchs))


def test_the_first_of_equal_elements_takes_the_gradient():
    x = torch.tensor([[[2.0, 2.0, 1.0, 3.0, float("nan"), 1.0, 1.0, float("nan")]]])
    x.requires_grad_(True)
    PairMaxPool1d()(x).sum().backward()
    assert x.grad.tolist() == [[[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]]]


def test_cnn_training_step_is_unchanged():
    cfg = kit.config("cnn1d", [1, 12], 3, channels=[4, 4])
    ours = build_model(cfg)
    theirs = copy.deepcopy(ours)
    theirs.features = nn.Sequential(
        *[
            nn.MaxPool1d(2) if isinstance(m, PairMaxPool1d) else m
            for m in theirs.features
        ]
    )
    assert any(isinstance(m, PairMaxPool1d) for m in ours.features)
    x, y = torch.randn(16, 1, 12), torch.randint(3, (16,))
    for model in (ours, theirs):
        nn.functional.cross_entropy(model(x), y).backward()
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_is_a_max_pool_and_pools_pairs_only():
    assert isinstance(PairMaxPool1d(), nn.MaxPool1d)
    with pytest.raises(ValueError, match="kernel_size 2"):
        PairMaxPool1d(3)


def test_stacked_gradients_match_each_model():
    models = [
        build_model(kit.config("cnn1d", [1, 12], 3, channels=[4])) for _ in range(2)
    ]
    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")
    x, y = torch.randn(8, 1, 12), torch.randint(3, (8,))

    def loss(p, b):
        out = functional_call(skeleton, (p, b), (x,))
        return nn.functional.cross_entropy(out, y)

    grads = vmap(grad(loss))(params, buffers)
    for i, model in enumerate(models):
        nn.functional.cross_entropy(model(x), y).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][i], p.grad)
