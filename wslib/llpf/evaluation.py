"""Honest evaluation of a path of models, whatever method found it.

At every recorded point: loss and accuracy on the full training set and on the
test set (BatchNorm statistics recomputed on the training set first, see
:func:`wslib.core.interpolation.evaluate_states`). Between consecutive points: the
training loss at ``dense`` evenly spaced points of the straight segment, so a
path that is low only at its recorded points is caught. Per layer: the
distance to the destination relative to the start's distance.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from wslib.core.interpolation import evaluate_states, lerp_state
from wslib.core.neurons import StateDict
from wslib.llpf.path import LLPFPath
from wslib.llpf.stages import data_flow_stages


def layer_distances(
    states: Sequence[StateDict], dest: StateDict, stages: Sequence[Sequence[str]]
) -> np.ndarray:
    """``(n_points, n_stages)``: ``||P - D|| / ||P_0 - D||`` over each stage's tensors."""

    def dist(state: StateDict, names: Sequence[str]) -> float:
        return float(
            sum(
                ((state[n].float().cpu() - dest[n].float().cpu()) ** 2).sum()
                for n in names
            )
            ** 0.5
        )

    first = [dist(states[0], names) for names in stages]
    return np.array(
        [
            [dist(s, names) / max(d0, 1e-12) for names, d0 in zip(stages, first)]
            for s in states
        ]
    )


def dense_segments(
    model: nn.Module,
    states: Sequence[StateDict],
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    dense: int,
    *,
    progress: bool = True,
) -> np.ndarray:
    """``(n_points - 1, dense)`` training losses strictly inside each straight segment."""
    if dense < 1:
        return np.zeros((len(states) - 1, 0))
    fractions = [(j + 1) / (dense + 1) for j in range(dense)]
    inner = [
        lerp_state(a, b, f) for a, b in itertools.pairwise(states) for f in fractions
    ]
    res = evaluate_states(model, inner, x_train, y_train, progress=progress)
    return res["train_loss"].reshape(len(states) - 1, dense)


def evaluate_path(
    model: nn.Module,
    path: LLPFPath | Sequence[StateDict],
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    dense: int = 1,
    stages: Sequence[Sequence[str]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """All path metrics of the book for one path.

    Returns
    -------
    dict with arrays ``train_loss``, ``train_acc``, ``test_loss``, ``test_acc``
    (per recorded point), ``dense_loss`` (``(n - 1, dense)``), ``position``
    (0..1 along the path, by recorded index), ``distances``
    (``(n, n_stages)``, see :func:`layer_distances`), and floats
    ``peak_excess`` (max training loss over the points and the dense segments
    minus the larger endpoint loss), ``interp_barrier`` (max over the same
    points of the loss minus the straight interpolation of the two endpoint
    losses at that position, see :func:`dense_curve`), ``peak_loss``,
    ``min_test_acc``,
    ``grad_steps`` and ``seconds`` (0 for a plain list of states).
    """
    states = path.states if isinstance(path, LLPFPath) else list(path)
    if len(states) < 2:
        raise ValueError("a path needs at least two states (start and end)")
    res: dict[str, Any] = dict(
        evaluate_states(model, states, x_train, y_train, x_test, y_test, progress)
    )
    res["dense_loss"] = dense_segments(
        model, states, x_train, y_train, dense, progress=progress
    )
    stages = stages or data_flow_stages(model)
    res["distances"] = layer_distances(states, states[-1], stages)
    res["position"] = np.linspace(0.0, 1.0, len(states))
    losses = np.concatenate([res["train_loss"], res["dense_loss"].ravel()])
    ends = max(res["train_loss"][0], res["train_loss"][-1])
    res["peak_loss"] = float(losses.max())
    res["peak_excess"] = float(losses.max() - ends)
    pos, curve = dense_curve(res)
    line = (1 - pos) * curve[0] + pos * curve[-1]
    res["interp_barrier"] = float((curve - line).max())
    res["min_test_acc"] = float(res["test_acc"].min())
    res["grad_steps"] = int(path.total_grad_steps) if isinstance(path, LLPFPath) else 0
    res["seconds"] = float(path.total_seconds) if isinstance(path, LLPFPath) else 0.0
    return res


def dense_curve(res: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Positions and training losses of the points and the dense segments, in path order."""
    n = len(res["train_loss"])
    dense = np.asarray(
        res["dense_loss"], dtype=float
    )  # lists when read from a run cache
    k = dense.shape[1]
    pos, loss = [0.0], [float(res["train_loss"][0])]
    for i in range(n - 1):
        for j in range(k):
            pos.append((i + (j + 1) / (k + 1)) / (n - 1))
            loss.append(float(dense[i, j]))
        pos.append((i + 1) / (n - 1))
        loss.append(float(res["train_loss"][i + 1]))
    return np.array(pos), np.array(loss)
