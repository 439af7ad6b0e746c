"""A toy data set and MLP grid small enough to train in the PathCond tests."""

from __future__ import annotations

from tests.kit import toy_dataset
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


def toy_data() -> Dataset:
    """96 inputs of 12 steps, labels 0, 1, 2 in turn; the test set: the first 24."""
    return toy_dataset(96, 24, [1, 12], labels="cyclic", test_from_train=True)
