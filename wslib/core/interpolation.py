"""Straight paths between two models: loss and accuracy along them, and the barrier."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from wslib.core.neurons import StateDict
from wslib.core.norms import has_batchnorm, reset_bn_stats
from wslib.core.train import evaluate, model_device, on_device

PathTs = Sequence[float] | np.ndarray
"""The points ``t`` of a path from one model (0) to another (1): a list, or an
array such as ``np.linspace(0, 1, n)``."""


def check_fraction(t: float) -> float:
    """``t`` as a float; refused unless finite and within [0, 1].

    A point between two models is ``(1 - t) a + t b`` with ``0 <= t <= 1``;
    outside that range the "path" extrapolates past its ends.
    """
    if isinstance(t, bool | str) or not isinstance(t, int | float | np.number):
        raise ValueError(f"interpolation parameter t = {t!r} is not a number in [0, 1]")
    value = float(t)
    if not (0.0 <= value <= 1.0):  # NaN fails too
        raise ValueError(
            f"interpolation parameter t = {t!r} is not in [0, 1]; a point between two "
            "models has 0 <= t <= 1 (0: the first, 1: the second)"
        )
    return value


def check_path_ts(ts: PathTs) -> np.ndarray:
    """The points ``ts`` of a path from ``a`` (0) to ``b`` (1), checked.

    At least two, finite, strictly increasing, the first 0 and the last 1: a
    barrier is measured against the losses at the two ends, so a path that
    misses an end, or runs back, would report a barrier against other points.
    """
    values = np.asarray(ts, dtype=float)
    problem = None
    if values.ndim != 1 or len(values) < 2:
        problem = "a path needs at least two points (its two ends)"
    elif not np.isfinite(values).all():
        problem = "the points must be finite"
    elif values[0] != 0.0 or values[-1] != 1.0:
        problem = "the first point must be 0 and the last 1 (the two models)"
    elif not (np.diff(values) > 0).all():
        problem = "the points must increase"
    if problem is not None:
        raise ValueError(
            f"ts = {np.asarray(ts).tolist()!r}: {problem}; e.g. np.linspace(0, 1, 11)"
        )
    return values


def lerp_state(
    a: StateDict, b: StateDict, t: float, names: Iterable[str] | None = None
) -> StateDict:
    """``(1 - t) a + t b`` for the floating-point tensors in ``names`` (all if ``None``).

    Other tensors (integer buffers, names not listed) are taken from ``a``;
    ``t`` must lie in [0, 1] (:func:`check_fraction`).
    """
    t = check_fraction(t)
    if a.keys() != b.keys():
        raise ValueError(
            "the two models have different tensors "
            f"(only in a: {sorted(a.keys() - b.keys())[:3]}, only in b: {sorted(b.keys() - a.keys())[:3]}); "
            "interpolate models of the same architecture"
        )
    chosen = set(a) if names is None else set(names)
    out = {}
    for k, va in a.items():
        vb = b[k]
        if va.shape != vb.shape:
            raise ValueError(
                f"tensor {k} has shape {tuple(va.shape)} vs {tuple(vb.shape)}"
            )
        out[k] = (
            torch.lerp(va, vb.to(va.device), t)
            if va.is_floating_point() and k in chosen
            else va
        )
    return out


def barrier(losses: Sequence[float] | np.ndarray) -> float:
    """Max loss on the path minus the mean of the two endpoint losses.

    ``losses`` run from one end of the path to the other: at least two.
    """
    values = np.asarray(losses, dtype=float)
    if values.ndim != 1 or len(values) < 2:
        raise ValueError(
            f"a barrier needs the losses along a path, its two ends included; got "
            f"{values.size} value(s)"
        )
    return float(values.max() - 0.5 * (values[0] + values[-1]))


def evaluate_states(
    model: nn.Module,
    states: Sequence[StateDict],
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
    progress: bool = True,
) -> dict[str, np.ndarray]:
    """Loss and accuracy of each state on the full training (and test) set.

    When the model has BatchNorm, its statistics are recomputed on the
    training data for every state before evaluating it. The data are copied
    to the model's device once, not for every state.
    """
    probe = copy.deepcopy(model)
    dev = model_device(probe)  # the data go to the device once, not once a state
    x_train, y_train = on_device(x_train, dev), y_train.to(dev)
    test: tuple[torch.Tensor, torch.Tensor] | None = None
    if x_test is not None:
        if y_test is None:
            raise ValueError("x_test is given without y_test; give both or neither")
        test = (on_device(x_test, dev), y_test.to(dev))
    bn = has_batchnorm(probe)
    keys = ["train_loss", "train_acc"] + (
        ["test_loss", "test_acc"] if test is not None else []
    )
    out: dict[str, list[float]] = {k: [] for k in keys}
    for state in tqdm(states, desc="evaluate path", disable=not progress, leave=False):
        probe.load_state_dict(state)
        if bn:
            reset_bn_stats(probe, x_train)
        loss, acc = evaluate(probe, x_train, y_train)
        out["train_loss"].append(loss)
        out["train_acc"].append(acc)
        if test is not None:
            loss, acc = evaluate(probe, *test)
            out["test_loss"].append(loss)
            out["test_acc"].append(acc)
    return {k: np.array(v) for k, v in out.items()}


def linear_path(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    ts: PathTs,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
    *,
    names: Iterable[str] | None = None,
    progress: bool = True,
) -> dict[str, np.ndarray]:
    """Evaluate the straight path from ``a`` to ``b`` (only ``names`` move, if given).

    ``ts`` run from 0 to 1, increasing (:func:`check_path_ts`). Returns ``ts`` and the arrays of :func:`evaluate_states`, plus the
    training-loss ``barrier``.
    """
    points = check_path_ts(ts)
    names = None if names is None else list(names)
    states = [lerp_state(a, b, float(t), names) for t in points]
    res = evaluate_states(model, states, x_train, y_train, x_test, y_test, progress)
    res["ts"] = points
    res["barrier"] = np.array(barrier(res["train_loss"]))
    return res
