"""The levels of a chain net and what the fusion steps share: the levels' widths,
their inputs and outputs, the head's class weights and the fused result.

The steps that fuse one level live beside it: :mod:`wslib.fusion.grouping`
(which neurons merge), :mod:`wslib.fusion.retrofit` (the fused weights) and
:mod:`wslib.fusion.checks` (what every fusion refuses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from wslib.core.models import ResNet, Transformer
from wslib.core.neurons import neuron_structure
from wslib.core.norms import is_batchnorm
from wslib.core.train import batches

# The groupings and retrofits of HF / KF (the tuples below list them at run time).
GroupingName = Literal["hf", "kf"]
RetrofitName = Literal["linear", "gradient"]
GROUPINGS: tuple[GroupingName, ...] = get_args(GroupingName)
RETROFITS: tuple[RetrofitName, ...] = get_args(RetrofitName)
_AFFINE = (nn.Linear, nn.Conv1d, nn.Conv2d)
#: The layers a level is made of (the types of ``_AFFINE``).
Affine = nn.Linear | nn.Conv1d | nn.Conv2d
RESIDUAL_ARCHS = (ResNet, Transformer)  # fused by wslib.fusion.residual


# --- levels ----------------------------------------------------------------------------------


def chain_levels(model: nn.Module) -> list[str]:
    """Names of the affine modules that produce each hidden neuron group, then the head.

    Read from the model's neuron structure. Fusion by levels needs a *chain*:
    each group is produced by one Linear/Conv layer and consumed by the next
    one, with no normalisation layer in between (the MLP and the plain conv
    nets ``cnn1d`` / ``vgg11`` without BatchNorm).

    Raises
    ------
    ValueError
        For architectures that are not such a chain (ResNets, transformers,
        BatchNorm nets), naming the reason; ResNets and transformers are fused
        by :mod:`wslib.fusion.residual` instead.
    """
    if not hasattr(model, "neuron_structure"):
        raise TypeError(
            f"{type(model).__name__} has no neuron_structure(); build it with build_model"
        )
    if any(is_batchnorm(m) for m in model.modules()):
        raise ValueError(
            "neuron-level fusion needs models without BatchNorm (build cnn1d/vgg11 with bn=False)"
        )
    names: list[str] = []
    consumer: str | None = None
    for group in neuron_structure(model).groups:
        out_w = [
            s.name
            for s in group.slots
            if s.role == "out" and s.name.endswith(".weight")
        ]
        ins = [s.name for s in group.slots if s.role == "in"]
        if (
            len(out_w) != 1
            or len(ins) != 1
            or any(s.role == "free" for s in group.slots)
        ):
            raise ValueError(
                f"{type(model).__name__} group {group.name!r} is not one layer feeding one layer; "
                "level-wise fusion supports the chain architectures mlp, cnn1d and vgg11 (no BN)"
            )
        producer = out_w[0].removesuffix(".weight")
        if consumer is not None and producer != consumer:
            raise ValueError(
                f"group {group.name!r}: {producer} does not follow {consumer}"
            )
        names.append(producer)
        consumer = ins[0].removesuffix(".weight")
    if consumer is None:
        raise ValueError(
            f"{type(model).__name__} has no hidden neurons; there is nothing to fuse"
        )
    names.append(consumer)
    for name in names:
        if not isinstance(model.get_submodule(name), _AFFINE):
            raise TypeError(f"level {name!r} is not a Linear or Conv layer")
    return names


def level_widths(model: nn.Module) -> list[int]:
    """Number of neurons of each hidden level."""
    return [g.size for g in neuron_structure(model).groups]


def head_weights(
    class_weights: np.ndarray | None, n_models: int, n_classes: int
) -> np.ndarray:
    """Per-class weights of each model's logits, normalised so every column sums to 1."""
    if class_weights is None:
        return np.full((n_models, n_classes), 1.0 / n_models)
    w = np.asarray(class_weights, dtype=np.float64)
    if w.shape != (n_models, n_classes):
        raise ValueError(
            f"class_weights must have shape {(n_models, n_classes)}, got {w.shape}"
        )
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("class_weights must be finite and non-negative")
    empty = np.flatnonzero(w.sum(0) <= 0)
    if len(empty):
        raise ValueError(
            f"class_weights give classes {empty.tolist()} zero total weight; give every "
            "class a positive weight in some model (class_share does)"
        )
    return w / w.sum(0, keepdims=True)


@torch.no_grad()
def layer_io(
    model: nn.Module,
    names: Sequence[str],
    x: torch.Tensor,
    *,
    kind: Literal["input", "output"] = "output",
    batch_size: int = 512,
) -> dict[str, torch.Tensor]:
    """Inputs (``kind="input"``) or outputs of the named modules on ``x`` (CPU, float32).

    Runs in eval mode and restores the model's mode afterwards.
    """
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    store: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = []
    for n in names:
        mod = model.get_submodule(n)
        if kind == "input":
            handles.append(
                mod.register_forward_pre_hook(
                    lambda m, a, n=n: store[n].append(a[0].cpu())
                )
            )
        else:
            handles.append(
                mod.register_forward_hook(lambda m, a, o, n=n: store[n].append(o.cpu()))
            )
    try:
        for idx in batches(len(x), batch_size):
            model(x[idx].to(dev))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {n: torch.cat(v) for n, v in store.items()}


def neuron_matrix(act: torch.Tensor) -> torch.Tensor:
    """Activations ``(N, C, *positions)`` as ``(C, N * positions)`` float64 rows."""
    return act.movedim(1, 0).reshape(act.shape[1], -1).double()


def from_neuron_matrix(mat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`neuron_matrix` for ``k`` channels, shaped like ``like`` otherwise."""
    shape = (mat.shape[0], like.shape[0], *like.shape[2:])
    return mat.reshape(shape).movedim(0, 1)


def solve_dtype(device: torch.device) -> torch.dtype:
    """float64 for least squares wherever the device supports it (the CPU, CUDA), else float32."""
    return torch.float32 if device.type == "mps" else torch.float64


@dataclass
class FusionResult:
    """The fused model and what happened per level."""

    model: nn.Module
    levels: list[str]
    costs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    block_fits: list[dict[str, Any]] = field(default_factory=list)
    """Per block fitted end to end: its name and the block-output MSE at the start and the end."""


def normalised_scores(scores: torch.Tensor, *, floor: float = 1e-6) -> np.ndarray:
    """Scores scaled to mean 1 (every model weighs the same in total), floored above zero."""
    s = scores.double().cpu().numpy()
    s = s / s.mean() if s.mean() > 0 else np.ones_like(s)
    return np.maximum(s, floor)
