"""A toy data set and MLP grid small enough to train in the PathCond tests."""

from __future__ import annotations

import torch

from wslib.core.data import Dataset

BASE = {"name": "mlp", "in_shape": [1, 12], "n_classes": 3}
RECIPE = {
    "epochs": 2,
    "lr": 0.1,
    "batch_size": 16,
    "momentum": 0.0,
    "weight_decay": 0.0,
    "schedule": "constant",
}
CONFIGS = {
    "const": {"widths": [8, 8], "init_scale": 1.0, "methods": ["baseline", "pathcond"]},
    "low": {"widths": [8, 8], "init_scale": 0.1, "methods": ["baseline", "pathcond"]},
}


def toy_data(n: int = 96, length: int = 12, classes: int = 3) -> Dataset:
    x = torch.randn(n, 1, length, generator=torch.Generator().manual_seed(0))
    y = torch.arange(n) % classes
    return Dataset("toy", x, y, x[:24], y[:24], classes)
