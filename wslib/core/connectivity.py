"""Two trained modes, their symmetries, and the straight line between them.

The protocols of the first two chapters that every later part builds on:

- :func:`train_modes`: the same architecture trained from several seeds (one
  *mode* per seed), through a model cache such as :class:`wslib.runs.zoo.Zoo`;
- :func:`symmetry_check`: a random permutation and a random positive rescaling
  of every neuron group, and how much weights and outputs change;
- :func:`straight_line`, :func:`lines_between`: the straight line between two modes, before and after
  Git Re-Basin weight matching (:func:`wslib.core.matching.align`);
- :func:`barrier_sweep`: the barrier before and after weight matching for MLPs
  of increasing width.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, get_args

import numpy as np
import pandas as pd
import torch
from torch import nn

from wslib.core.data import Dataset
from wslib.core.interpolation import PathTs, linear_path
from wslib.core.matching import align
from wslib.core.neurons import (
    StateDict,
    neuron_structure,
    permute_state,
    random_permutations,
    random_scales,
    rescale_state,
)
from wslib.core.train import evaluate, float64_outputs

# The two symmetries :func:`symmetry_check` applies.
SymmetryName = Literal["permutation", "rescaling"]
SYMMETRIES: tuple[SymmetryName, ...] = get_args(SymmetryName)
OUTPUT_DIFFS = ("max output diff (eval)", "max output diff (train)")


class ModelSource(Protocol):
    """Anything that returns the trained model of a config (the model zoo)."""

    def get(self, config: dict[str, Any]) -> nn.Module: ...


def mode_config(
    data: dict[str, Any], model: dict[str, Any], recipe: dict[str, Any], seed: int
) -> dict[str, Any]:
    """The zoo config of one mode: data, model, training recipe and seed."""
    return {"data": data, "model": model, "recipe": recipe, "seed": seed}


def train_modes(
    zoo: ModelSource,
    data: dict[str, Any],
    models: Mapping[str, dict[str, Any]],
    recipes: Mapping[str, dict[str, Any]],
    seeds: Sequence[int],
) -> dict[str, list[nn.Module]]:
    """One trained model per seed for every named architecture (``models[name]``, ``recipes[name]``)."""
    return {
        name: [
            zoo.get(mode_config(data, models[name], recipes[name], s)) for s in seeds
        ]
        for name in models
    }


def n_parameters(model: nn.Module) -> int:
    """Number of parameters (entries of all parameter tensors)."""
    return sum(p.numel() for p in model.parameters())


def mode_table(
    modes: Mapping[str, Sequence[nn.Module]], seeds: Sequence[int], ds: Dataset
) -> pd.DataFrame:
    """One row per mode: size, training loss and accuracy, test accuracy."""
    rows = []
    for name, pair in modes.items():
        for s, model in zip(seeds, pair):
            train_loss, train_acc = evaluate(model, ds.x_train, ds.y_train)
            _, test_acc = evaluate(model, ds.x_test, ds.y_test)
            rows.append(
                {
                    "model": name,
                    "seed": s,
                    "parameters": n_parameters(model),
                    "train loss": train_loss,
                    "train acc": train_acc,
                    "test acc": test_acc,
                }
            )
    return pd.DataFrame(rows)


def max_weight_change(a: StateDict, b: StateDict) -> float:
    """Largest absolute difference between two state dicts, over all entries."""
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def max_output_diff(
    model: nn.Module, state: StateDict, x: torch.Tensor, train_mode: bool
) -> float:
    """Largest absolute output difference on ``x`` between ``model`` and ``model`` loaded with ``state``.

    In training mode BatchNorm uses the batch statistics. The outputs are
    computed in float64 (:func:`~wslib.core.train.float64_outputs`): the
    difference is the rounding of the weights, on any device. Neither
    ``model`` nor ``state`` changes.
    """
    other = copy.deepcopy(model)
    other.load_state_dict(state)
    a = float64_outputs(model, x, train_mode=train_mode)
    return (a - float64_outputs(other, x, train_mode=train_mode)).abs().max().item()


def symmetry_check(
    models: Mapping[str, nn.Module], x: torch.Tensor, seed: int
) -> tuple[pd.DataFrame, dict[str, dict[str, StateDict]]]:
    """Permute and, separately, rescale every neuron group of every model at random.

    One generator seeded with ``seed`` draws, model after model, a permutation
    of every group and a log-normal scale (spread 1) of every rescalable
    neuron. Returns a table (model, symmetry, max weight change, max output
    difference on ``x`` in evaluation and training mode) and the transformed
    states, ``{name: {"permutation": state, "rescaling": state}}``.
    """
    gen = torch.Generator().manual_seed(seed)
    rows, states = [], {}
    for name, model in models.items():
        structure = neuron_structure(model)
        state = model.state_dict()
        perms = random_permutations(structure, generator=gen)
        permuted = permute_state(state, structure, perms)
        scales = random_scales(structure, spread=1.0, generator=gen)
        states[name] = {
            "permutation": permuted,
            "rescaling": rescale_state(state, structure, scales),
        }
        for kind, new in states[name].items():
            diffs = [max_output_diff(model, new, x, mode) for mode in (False, True)]
            rows.append(
                {
                    "model": name,
                    "symmetry": kind,
                    "max weight change": max_weight_change(state, new),
                    **dict(zip(OUTPUT_DIFFS, diffs)),
                }
            )
    return pd.DataFrame(rows), states


def largest_output_diff(table: pd.DataFrame, symmetry: SymmetryName) -> float:
    """Largest output difference of one symmetry over all models and both modes."""
    return float(table.loc[table.symmetry == symmetry, list(OUTPUT_DIFFS)].max().max())


def straight_line(
    model: nn.Module,
    start: StateDict,
    end: StateDict,
    ts: PathTs,
    ds: Dataset,
    *,
    test: bool = True,
) -> dict[str, np.ndarray]:
    """:func:`~wslib.core.interpolation.linear_path` from ``start`` to ``end`` on ``ds``.

    Evaluated at ``ts`` on the training set, and on the test set with ``test``.
    """
    test_set = (ds.x_test, ds.y_test) if test else (None, None)
    return linear_path(model, start, end, ts, ds.x_train, ds.y_train, *test_set)


def lines_between(
    a: nn.Module,
    b: nn.Module,
    ts: PathTs,
    ds: Dataset,
    *,
    seed: int = 0,
    test: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The straight line from ``a`` to ``b``, and from ``a`` to ``b`` permuted to match ``a``.

    Both are evaluated at ``ts`` on the training set (and on the test set with
    ``test``); see :func:`wslib.core.interpolation.linear_path`. ``seed`` is
    the seed of weight matching's group order.
    """
    sa, sb = a.state_dict(), b.state_dict()
    aligned = align(sa, sb, neuron_structure(a), seed=seed)
    return (
        straight_line(a, sa, sb, ts, ds, test=test),
        straight_line(a, sa, aligned, ts, ds, test=test),
    )


def barrier_sweep(
    zoo: ModelSource,
    data: dict[str, Any],
    mlp: dict[str, Any],
    widths: Sequence[int],
    recipe: dict[str, Any],
    seeds: Sequence[int],
    ts: PathTs,
    ds: Dataset,
    *,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Training-set barrier before and after weight matching for MLPs of each width.

    For each width, ``mlp`` gets two hidden layers of that width and is trained
    from the first two ``seeds``; returns one ``{"width", "barrier",
    "aligned barrier"}`` per width.
    """
    rows = []
    for width in widths:
        arch = {**mlp, "widths": [width, width]}
        a, b = (zoo.get(mode_config(data, arch, recipe, s)) for s in seeds[:2])
        line, aligned = lines_between(a, b, ts, ds, seed=seed, test=False)
        rows.append(
            {
                "width": width,
                "barrier": float(line["barrier"]),
                "aligned barrier": float(aligned["barrier"]),
            }
        )
    return rows


def connectivity_metrics(
    lines: Mapping[str, Mapping[str, Any]],
    aligned: Mapping[str, Mapping[str, Any]],
    symmetries: pd.DataFrame,
    sweep: list[dict[str, float]],
) -> dict[str, Any]:
    """Chapter 1's metrics: barriers per model, symmetry errors, the width sweep."""
    metrics: dict[str, Any] = {
        name: {
            "linear_barrier": float(lines[name]["barrier"]),
            "aligned_barrier": float(aligned[name]["barrier"]),
        }
        for name in lines
    }
    metrics["permutation_invariance_max_abs_diff"] = largest_output_diff(
        symmetries, "permutation"
    )
    metrics["rescaling_invariance_max_abs_diff"] = largest_output_diff(
        symmetries, "rescaling"
    )
    metrics["width_sweep"] = sweep
    return metrics
