"""Tiny networks of the PathCond tests, small enough to lift explicitly (a row per path).

The generic pieces (model configs, seeded models, toy data) are in :mod:`tests.kit`.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.kit import cnn1d, mlp, resnet1d, seeded_model

LIFTED = mlp([4, 2], in_shape=[1, 3], n_classes=2)
"""Chapter 6's network: 3 inputs, hidden layers of 4 and 2, 2 outputs."""

TINY = {
    "mlp": mlp([4, 3], in_shape=[1, 5]),
    "conv_avg": cnn1d([2, 3], kernel_size=3, pool="avg"),
    "fullyconv_bn_avg": cnn1d(
        [2, 2], n_classes=2, kernel_size=3, pool="avg", bn=True, fully_conv=True
    ),
    "conv_bn": cnn1d([2, 2], in_shape=[1, 6], kernel_size=3, pool=None, bn=True),
    "resnet": resnet1d([2], in_shape=[1, 4], blocks_per_stage=1),
}
"""Architectures for brute-force checks of ``diag(G)``, one of each kind."""


def perturbed(
    config: dict, seed: int = 0, noise: float = 0.2, scale: float = 1.0
) -> nn.Module:
    """:func:`~tests.kit.seeded_model` (train mode) in float64, each parameter
    times ``scale`` plus ``noise`` times a standard normal (drawn after the build,
    from the global generator): BN parameters not all 1/0, uneven scales."""
    model = seeded_model(config, seed, train=True).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale).add_(noise * torch.randn_like(p))
    return model
