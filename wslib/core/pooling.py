"""Max pooling over pairs: ``nn.MaxPool1d(2)``'s values and gradients, trained faster on a CPU.

With autograd on, torch's CPU max pooling records the argmax of every window
(``max_pool2d_with_indices``), several times slower than the pooling alone:
about a third of a training step of the book's 1-D conv nets on one thread.
:class:`PairMaxPool1d` pools without the indices and finds the winner of each
pair again in the backward pass, with the kernel's own rule (the second
element wins when it is larger or NaN), so every value and every gradient is
bit-for-bit that of ``nn.MaxPool1d(2)``. It is an ``nn.MaxPool1d``: code that
looks for max pooling finds it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _PairMax(torch.autograd.Function):
    """``max_pool1d(x, 2)`` whose backward recomputes which element of each pair won."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool1d(x, 2)

    @staticmethod
    def setup_context(
        ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor
    ) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        n = grad.shape[-1] * 2  # an odd last element is dropped by the pooling
        pairs = x[..., :n].unflatten(-1, (-1, 2))
        first, second = pairs[..., 0], pairs[..., 1]
        second_wins = (second > first) | second.isnan()
        winners = torch.arange(0, n, 2, device=grad.device) + second_wins
        out = grad.new_zeros((*grad.shape[:-1], n)).scatter(-1, winners, grad)
        return F.pad(out, (0, x.shape[-1] - n))


class PairMaxPool1d(nn.MaxPool1d):
    """``nn.MaxPool1d(2)`` with the faster backward of this module (same numbers)."""

    def __init__(self, kernel_size: int = 2) -> None:
        if kernel_size != 2:
            raise ValueError(
                f"PairMaxPool1d pools pairs: kernel_size 2, got {kernel_size}"
            )
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _PairMax.apply(x)
        return super().forward(x)
