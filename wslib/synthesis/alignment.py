"""Alignment with both symmetries: permutations and per-neuron rescalings.

Weight matching removes the permutation symmetry between two ReLU networks,
yet the two still differ by positive rescalings of every neuron: a function
has a whole orbit of representatives, and the straight line between two
networks depends on which representatives it joins. :func:`alignment_steps`
builds, for modes A and B, the pairs of representatives the chapter compares:

- ``none``: A and B as trained;
- ``weight matching``: B permuted to match A;
- ``PathCond gauge + WM`` / ``ENorm gauge + WM``: each model first moved to a
  canonical representative (PathCond's F-minimising rescaling, or ENorm's
  balanced norms), then weight matching;
- ``WM + scale matching``: weight matching, then the per-neuron rescaling of
  B closest to A (:func:`wslib.core.matching.match_scales`).

Every step keeps each model's function (checked by
:func:`wslib.core.connectivity.max_output_diff` in eval mode).

The path-lifting representation. A loss barrier needs a network at every
point of the line, and a point on the straight line between two path-lifting
vectors is in general the lifting of no network, so there is no "barrier in
the path-lifting representation" to measure. What the lifting does give is a
rescaling-invariant distance: :func:`lifting_distance` compares the
normalised liftings ``Phi(A) / |Phi(A)|`` and ``Phi(B) / |Phi(B)|``
(computed without listing the paths, :func:`lifting_inner`). It cannot tell
the rescaling steps apart (they differ from weight matching only by
rescalings), only the permutations they end with; that it does not move is a
check, and that the weight-space distance and barrier do move is the point:
they depend on the representative, the function does not. Only MLPs have it
here (max pooling has no fixed lifting; BatchNorm's depends on the scale of
its input).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from wslib.core.connectivity import max_output_diff
from wslib.core.data import Dataset
from wslib.core.interpolation import PathTs, linear_path
from wslib.core.matching import align, match_scales
from wslib.core.models import MLP
from wslib.core.neurons import StateDict, neuron_structure, rescale_state
from wslib.pathcond.enorm import enorm_step
from wslib.pathcond.rescaling import pathcond_rescale

STEPS = (
    "none",
    "weight matching",
    "PathCond gauge + WM",
    "ENorm gauge + WM",
    "WM + scale matching",
)


def with_state(model: nn.Module, state: StateDict) -> nn.Module:
    """A copy of ``model`` holding ``state``."""
    out = copy.deepcopy(model)
    out.load_state_dict(state)
    return out


def pathcond_gauge(model: nn.Module, in_shape: Sequence[int]) -> StateDict:
    """The state of ``model`` rescaled by PathCond (same function)."""
    out = copy.deepcopy(model).double()
    pathcond_rescale(out, in_shape)
    return {k: v.to(model.state_dict()[k].dtype) for k, v in out.state_dict().items()}


def enorm_gauge(
    model: nn.Module, *, cycles: int = 100, rtol: float = 1e-6
) -> StateDict:
    """The state of ``model`` after ENorm cycles until no weight moves by ``rtol``."""
    out = copy.deepcopy(model).double()
    for _ in range(cycles):
        before = {k: v.clone() for k, v in out.state_dict().items()}
        enorm_step(out)
        moved = max(
            float((v - before[k]).abs().max() / before[k].abs().max().clamp_min(1e-300))
            for k, v in out.state_dict().items()
            if v.is_floating_point()
        )
        if moved < rtol:
            break
    return {k: v.to(model.state_dict()[k].dtype) for k, v in out.state_dict().items()}


def scale_matched(a: StateDict, b: StateDict, model: nn.Module) -> StateDict:
    """B rescaled per neuron to lie closest to A (same function as B)."""
    structure = neuron_structure(model)
    scales, _ = match_scales(a, b, structure)
    wide = {k: v.double() if v.is_floating_point() else v for k, v in b.items()}
    rescaled = rescale_state(wide, structure, scales)
    return {k: v.to(b[k].dtype) for k, v in rescaled.items()}


def gauges_of(model: nn.Module, in_shape: Sequence[int]) -> dict[str, StateDict]:
    """``{gauge step: state of model in that gauge}`` for the two gauge steps."""
    gauges: dict[str, Callable[[nn.Module], StateDict]] = {
        "PathCond gauge + WM": lambda m: pathcond_gauge(m, in_shape),
        "ENorm gauge + WM": enorm_gauge,
    }
    return {name: gauge(model) for name, gauge in gauges.items()}


def alignment_steps(
    a: nn.Module,
    b: nn.Module,
    in_shape: Sequence[int],
    seed: int,
    *,
    gauges: tuple[dict[str, StateDict], dict[str, StateDict]] | None = None,
) -> dict[str, tuple[StateDict, StateDict]]:
    """``{step: (state of A's representative, state of B's representative)}``.

    ``gauges``: :func:`gauges_of` A and of B, when already computed.
    """
    structure = neuron_structure(a)
    sa, sb = a.state_dict(), b.state_dict()
    matched = align(sa, sb, structure, seed=seed)
    ga, gb = gauges or (gauges_of(a, in_shape), gauges_of(b, in_shape))
    steps = {"none": (sa, sb), "weight matching": (sa, matched)}
    for name in ga:
        steps[name] = (ga[name], align(ga[name], gb[name], structure, seed=seed))
    steps["WM + scale matching"] = (sa, scale_matched(sa, matched, a))
    return steps


def distance(a: StateDict, b: StateDict) -> float:
    """Euclidean distance between two states over their floating-point tensors."""
    return float(
        sum(
            ((a[k].double() - b[k].double()) ** 2).sum()
            for k in a
            if a[k].is_floating_point()
        )
        ** 0.5
    )


def lifting_inner(model: nn.Module, a: StateDict, b: StateDict) -> float:
    """``<Phi(a), Phi(b)>`` of an MLP without listing its paths.

    A layer's vector holds, per neuron, the sum over the paths ending there of
    the products of both networks' parameters; it starts at one per input and
    each layer multiplies by ``W_a * W_b`` (entrywise) and adds ``b_a * b_b``.
    """
    if not isinstance(model, MLP):
        raise TypeError(
            f"lifting_inner needs an MLP, got {type(model).__name__}; "
            "use wslib.pathcond.lifting.explicit_path_lifting for tiny nets"
        )
    first = a["linears.0.weight"]
    v = torch.ones(first.shape[1], dtype=torch.float64, device=first.device)
    for i in range(len(model.linears)):
        w = f"linears.{i}.weight"
        v = (a[w].double() * b[w].double()) @ v
        if f"linears.{i}.bias" in a:
            v = v + a[f"linears.{i}.bias"].double() * b[f"linears.{i}.bias"].double()
    return float(v.sum())


def lifting_distance(model: nn.Module, a: StateDict, b: StateDict) -> float:
    """``| Phi(a) / |Phi(a)| - Phi(b) / |Phi(b)| |``: 0 for the same function up to rescaling."""
    aa, bb = lifting_inner(model, a, a), lifting_inner(model, b, b)
    cos = lifting_inner(model, a, b) / (aa * bb) ** 0.5
    return float(max(2.0 - 2.0 * cos, 0.0) ** 0.5)


def alignment_study(
    pairs: dict[str, list[tuple[nn.Module, nn.Module]]],
    ds: Dataset,
    ts: PathTs,
    seed: int,
) -> dict[str, dict[str, dict[str, Any]]]:
    """``result[arch][step]``: barrier and distance per pair of modes, and their spread.

    ``pairs[arch]`` lists the (A, B) pairs of independently trained modes. For
    each step the barrier is that of the straight line between the two
    representatives (training set, BatchNorm statistics recomputed), the
    distance is relative to the norm of A's representative, and
    ``function_change`` is the largest output change any step made to A or B;
    for MLPs ``lifting_distance`` (:func:`lifting_distance`) too. Each
    model's gauges are computed once, however many pairs it is in.
    """
    x = ds.x_test
    in_shape = list(ds.x_train.shape[1:])
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for arch, arch_pairs in pairs.items():
        per_step: dict[str, dict[str, list[float]]] = {
            s: {"barrier": [], "distance": [], "function_change": [], "lifting": []}
            for s in STEPS
        }
        gauges: dict[int, dict[str, StateDict]] = {}
        for a, b in arch_pairs:
            for m in (a, b):
                if id(m) not in gauges:
                    gauges[id(m)] = gauges_of(m, in_shape)
            both = (gauges[id(a)], gauges[id(b)])
            for step, (sa, sb) in alignment_steps(
                a, b, in_shape, seed, gauges=both
            ).items():
                line = linear_path(
                    a, sa, sb, ts, ds.x_train, ds.y_train, progress=False
                )
                row = per_step[step]
                row["barrier"].append(float(line["barrier"]))
                row["distance"].append(distance(sa, sb) / distance(sa, zeros(sa)))
                row["function_change"].append(
                    max(
                        max_output_diff(a, sa, x, False),
                        max_output_diff(b, sb, x, False),
                    )
                )
                if isinstance(a, MLP):
                    row["lifting"].append(lifting_distance(a, sa, sb))
        result[arch] = {step: summarise(row) for step, row in per_step.items()}
    return result


def zeros(state: StateDict) -> StateDict:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def summarise(row: dict[str, list[float]]) -> dict[str, Any]:
    """Per-pair values with mean and standard deviation of barrier and distance."""
    return {
        "barriers": row["barrier"],
        "barrier_mean": float(np.mean(row["barrier"])),
        "barrier_std": float(np.std(row["barrier"], ddof=1))
        if len(row["barrier"]) > 1
        else 0.0,
        "distance_mean": float(np.mean(row["distance"])),
        "function_change_max": float(max(row["function_change"])),
        "lifting_distance_mean": float(np.mean(row["lifting"]))
        if row.get("lifting")
        else None,
    }
