"""Normalisation layers: which modules they are, their parameters, BatchNorm statistics."""

from __future__ import annotations

from typing import TypeGuard

import torch
from torch import nn

from wslib.core.train import device_slices, model_device

BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
NORM_TYPES = (*BN_TYPES, nn.LayerNorm, nn.GroupNorm)


def is_batchnorm(
    module: nn.Module,
) -> TypeGuard[nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d | nn.SyncBatchNorm]:
    """Whether ``module`` is a BatchNorm layer (any dimension)."""
    return isinstance(module, BN_TYPES)


def has_batchnorm(model: nn.Module) -> bool:
    """Whether any submodule of ``model`` is a BatchNorm layer."""
    return any(is_batchnorm(m) for m in model.modules())


def norm_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters of normalisation layers (BatchNorm, LayerNorm, GroupNorm)."""
    return {
        f"{prefix}.{n}" if prefix else n
        for prefix, m in model.named_modules()
        if isinstance(m, NORM_TYPES)
        for n, _ in m.named_parameters(recurse=False)
    }


@torch.no_grad()
def reset_bn_stats(model: nn.Module, x: torch.Tensor, *, batch_size: int = 512) -> None:
    """Recompute BatchNorm running statistics as exact averages over ``x``."""
    bns = [m for m in model.modules() if is_batchnorm(m)]
    if not bns:
        return
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over all batches
    dev = model_device(model)
    model.train()
    for xb in device_slices(x, batch_size, dev):
        model(xb)
    for m, mom in zip(bns, momenta):
        m.momentum = mom
    model.eval()
