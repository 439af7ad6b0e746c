"""The LLPF chapters' shared setup (wslib.llpf.setup)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from wslib.core.data import Dataset
from wslib.core.models import build_model
from wslib.llpf.setup import profile_folder

IN = [1, 8]


MLP = {"name": "mlp", "in_shape": IN, "n_classes": 3, "widths": [6, 5]}


def dataset(n: int = 48, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * n, *IN, generator=g)
    y = torch.randint(0, 3, (2 * n,), generator=g)
    return Dataset("toy", x[:n], y[:n], x[n:], y[n:], 3)


def pair() -> list[torch.nn.Module]:
    models = []
    for s in (0, 1):
        torch.manual_seed(s)
        models.append(build_model(MLP).eval())
    return models


def path_result(losses: list[float], **extra) -> dict:
    """A stand-in for an evaluated path (only what the tables read)."""
    losses = np.array(losses)
    return {
        "train_loss": losses,
        "test_acc": np.linspace(0.9, 0.8, len(losses)),
        "dense_loss": np.array(
            [[0.5 * (a + b) + 0.1] for a, b in zip(losses, losses[1:])]
        ),
        "peak_excess": float(losses.max() - max(losses[0], losses[-1])),
        "peak_loss": float(losses.max()),
        "min_test_acc": 0.8,
        "grad_steps": 10,
        "seconds": 1.5,
        **extra,
    }


def lines_of(losses: list[float]) -> dict:
    losses = np.array(losses)
    return {
        "train_loss": losses,
        "barrier": np.array(losses.max() - losses[[0, -1]].mean()),
    }


def comparison_runs() -> dict:
    return {
        "m": {
            "LLPF": [path_result([0, 1, 0]), path_result([0, 2, 0])],
            "polychain": [path_result([0, 0.5, 0]), path_result([0, 0.5, 0])],
            "AutoNEB": [path_result([0, 3, 0]), path_result([0, 4, 0])],
        },
        "n": {
            "LLPF": [path_result([0, 1, 0])],
            "polychain": [path_result([0, 2, 0])],
            "AutoNEB": [path_result([0, 0.1, 0])],
        },
    }


def test_profile_folder() -> None:
    assert profile_folder(None, "cpu") is None
    assert profile_folder("data/llpf", "cpu") == Path("data/llpf/cpu")
