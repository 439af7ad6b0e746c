"""Pair max pooling, found by mutation testing (``make mutation MODULE=core/pooling``).

The backward pass of :class:`~wslib.core.pooling.PairMaxPool1d` must build
its indices on the gradient's device. Pinned on torch's ``meta`` device (no
GPU needed: mixing a CPU tensor into a meta computation is refused, as CUDA
refuses it), and against ``nn.MaxPool1d(2)``'s gradient on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from wslib.core.pooling import PairMaxPool1d


def test_backward_stays_on_the_inputs_device() -> None:
    x = torch.randn(2, 3, 7, device="meta", requires_grad=True)
    PairMaxPool1d()(x).sum().backward()
    assert x.grad is not None
    assert x.grad.device.type == "meta"
    assert x.grad.shape == (2, 3, 7)


def test_backward_matches_max_pool_on_the_cpu() -> None:
    x = torch.tensor([[[1.0, 3.0, 2.0, 2.0, float("nan"), 0.0, 5.0]]])
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    weights = torch.tensor([[[1.0, 2.0, 3.0]]])
    (PairMaxPool1d()(mine) * weights).sum().backward()
    (nn.MaxPool1d(2)(ref) * weights).sum().backward()
    assert torch.equal(mine.grad, ref.grad)
    assert mine.grad.tolist() == [[[0.0, 1.0, 2.0, 0.0, 3.0, 0.0, 0.0]]]
