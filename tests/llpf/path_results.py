"""Stand-ins for the LLPF chapters' evaluated paths and lines (only what the tables read)."""

from __future__ import annotations

import numpy as np


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
    """A stand-in for a straight line's losses and barrier."""
    losses = np.array(losses)
    return {
        "train_loss": losses,
        "barrier": np.array(losses.max() - losses[[0, -1]].mean()),
    }


def comparison_runs() -> dict:
    """Two models' path results per method (LLPF, polychain, AutoNEB)."""
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
