"""Chapter 5 tables and metrics (wslib.llpf.ch05_spheres)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from wslib.core.data import Dataset
from wslib.core.models import build_model
from wslib.llpf.ch05_spheres import m2o_table, spheres_metrics

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


def test_m2o_table_and_spheres_metrics() -> None:
    on = path_result([1.0, 1.4, 1.2], variance=np.array([1.0, 0.5, 0.2]))
    off = path_result([1.0, 2.0, 1.9], variance=np.array([1.0, 0.6, 0.3]))
    table = m2o_table({"on": on, "off": off})
    assert table.loc["on", "final variance ratio"] == 0.2
    assert table.loc["off", "peak training loss"] == 2.0
    hybrid = path_result([0.1, 0.3, 0.1], dest_variance=0.25)
    sharp = path_result([0.1, 0.2, 0.15])
    metrics = spheres_metrics(on, off, hybrid, sharp)
    assert metrics["m2o_final_variance_ratio"] == 0.2
    assert metrics["m2o_final_variance_ratio_no_compliance"] == 0.3
    assert (
        metrics["m2o_peak_loss"] == 1.4
        and metrics["m2o_peak_loss_no_compliance"] == 2.0
    )
    assert metrics["sphere_variance_ratio"] == 0.25
    assert metrics["hybrid_peak_excess"] == pytest.approx(0.2)
    assert metrics["sharp_peak_excess"] == pytest.approx(0.05)
    assert isinstance(metrics["hybrid_grad_steps"], int)
    assert isinstance(pd.Series(metrics).round(4), pd.Series)
