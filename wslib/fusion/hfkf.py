"""Neuron-centric model fusion: Hungarian Fusion (HF) and K-means Fusion (KF).

Luenam et al., "Model Fusion via Retrofitting". A network is a chain of
*levels*; a level is one affine layer (Linear or Conv) whose output channels
are the level's neurons. A neuron's *activation vector* is its pre-activation
output on the fusion set, with spatial positions counted as extra samples.
Bottom-up, for every hidden level:

1. **Grouping.** The neurons of all base models are grouped (HF: one-to-one
   Hungarian matching of two equal-width models; KF: importance-weighted
   k-means, any number of models and widths, ``k`` = fused width). The targets
   ``T_k`` are the importance-weighted centroids of the groups.
2. **Retrofitting.** The fused level, fed with the fused model's *own* outputs
   of the previous levels, is fitted to reproduce ``T_k``: closed-form ridge
   least squares (``"linear"``) or Adam on the mean squared error with early
   stopping on a held-out part of the fusion set (``"gradient"``).

The head is fitted the same way to the average of the base models' logits,
optionally weighted per class by each model's share of that class's data.

ResNets and transformers, whose residual streams are written by several
layers, are fused by :mod:`wslib.fusion.residual` (:func:`fuse` dispatches).

The *representation cost* of a level is ``sum_i w_i ||a_i - F_{c(i)}||^2``
(neuron ``i`` with weight ``w_i`` and activations ``a_i``, fused neuron
``F_{c(i)}`` of its group). Theorem 1 splits it exactly into the clustering
error ``sum_i w_i ||a_i - T_{c(i)}||^2`` and the approximation error
``sum_k W_k ||T_k - F_k||^2`` with ``W_k`` the total weight of group ``k``
(:func:`cost_decomposition`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from wslib.fusion.importance import neuron_importance
from wslib.fusion.levels import (
    GROUPINGS,
    RESIDUAL_ARCHS,
    RETROFITS,
    FusionResult,
    GradientConfig,
    chain_levels,
    check_fusion_set,
    check_same_architecture,
    cost_decomposition,
    from_neuron_matrix,
    hungarian_groups,
    kmeans_groups,
    layer_io,
    neuron_matrix,
    normalised_scores,
    retrofit_gradient,
    retrofit_linear,
    weighted_centroids,
)
from wslib.fusion.residual import fuse_residual, residual_importance

# --- the fusion -------------------------------------------------------------------------------


def class_share(counts: np.ndarray) -> np.ndarray:
    """Per-class data share of each model, ``(n_models, n_classes)``; columns sum to 1.

    A class that no model saw gets equal shares.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(0, keepdims=True)
    uniform = np.full_like(counts, 1.0 / len(counts))
    return np.where(total > 0, counts / np.where(total > 0, total, 1), uniform)


def model_importance(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    progress: bool = True,
) -> dict[str, torch.Tensor]:
    """Importance of the neurons of every hidden level (chains) or neuron group (ResNets, transformers)."""
    if isinstance(model, RESIDUAL_ARCHS):
        return residual_importance(model, x, y, method, progress)
    return neuron_importance(
        model, chain_levels(model)[:-1], x, y, method, progress=progress
    )


def fuse(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    grouping: str = "kf",
    retrofit: str = "linear",
    importance: str = "uniform",
    fused: nn.Module | None = None,
    class_weights: np.ndarray | None = None,
    ridge: float = 1e-8,
    gradient: GradientConfig = GradientConfig(),
    scores: Sequence[dict[str, torch.Tensor]] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> FusionResult:
    """Fuse ``models`` into one network with HF or KF grouping and retrofitting.

    Parameters
    ----------
    models
        Base models of one architecture: a chain (see :func:`chain_levels`), or
        a ResNet or transformer (see :mod:`wslib.fusion.residual`).
    x, y
        The fusion set; it must contain every class.
    grouping
        ``"hf"`` (two models of equal widths) or ``"kf"`` (any).
    retrofit
        ``"linear"`` (ridge least squares) or ``"gradient"`` (Adam, early stopping).
    importance
        ``"uniform"``, ``"conductance"`` or ``"deeplift"`` neuron weights.
    fused
        A model of the same architecture whose widths are the fused widths
        (its weights are overwritten); default: a copy of ``models[0]``.
    class_weights
        ``(n_models, n_classes)`` weights of each model's logits in the head's
        target (e.g. :func:`class_share`); default equal weights.
    ridge, gradient
        Settings of the two retrofitting variants.
    scores
        Precomputed importance per model (:func:`model_importance`); computed
        with ``importance`` when None.
    seed, progress
        Seed of k-means and of the held-out split; progress bars.
    """
    start = time.perf_counter()
    if grouping not in GROUPINGS or retrofit not in RETROFITS:
        raise ValueError(
            f"grouping must be one of {GROUPINGS} and retrofit one of {RETROFITS}"
        )
    if grouping == "hf" and len(models) != 2:
        raise ValueError(
            f"HF fuses exactly two models, got {len(models)}; use KF for more"
        )
    check_same_architecture(models, same_widths=grouping == "hf")
    device = next(models[0].parameters()).device
    fused = copy.deepcopy(models[0] if fused is None else fused).to(device).eval()
    check_same_architecture([models[0], fused], same_widths=False)
    residual = isinstance(models[0], RESIDUAL_ARCHS)
    levels = [] if residual else chain_levels(models[0])
    n_classes = (
        models[0].head if residual else models[0].get_submodule(levels[-1])
    ).weight.shape[0]
    check_fusion_set(y, n_classes)
    weights = (
        np.ones((len(models), n_classes))
        if class_weights is None
        else np.asarray(class_weights)
    )
    if weights.shape != (len(models), n_classes):
        raise ValueError(
            f"class_weights must have shape {(len(models), n_classes)}, got {weights.shape}"
        )
    weights = weights / weights.sum(0, keepdims=True)
    if scores is None:
        scores = [model_importance(m, x, y, importance, progress) for m in models]
    if residual:
        return fuse_residual(
            models, x, grouping, retrofit, fused, weights, scores, ridge, gradient, seed
        )
    outs = [layer_io(m, levels, x) for m in models]
    result = FusionResult(fused, levels)
    for li, name in enumerate(
        tqdm(levels, desc=f"{grouping}-{retrofit}", disable=not progress, leave=False)
    ):
        module = fused.get_submodule(name)
        if li < len(levels) - 1:
            mats = [neuron_matrix(o[name]).numpy() for o in outs]
            points = np.concatenate(mats)
            w = np.concatenate([normalised_scores(s[name]) for s in scores])
            k = module.weight.shape[0]
            if grouping == "hf":
                labels = hungarian_groups(
                    mats[0], mats[1], w[: len(mats[0])], w[len(mats[0]) :]
                )
            else:
                init = mats[0] if k == len(mats[0]) else None
                labels = kmeans_groups(points, w, k, init, seed)
            targets = weighted_centroids(points, w, labels, k)
        else:
            logits = torch.stack(
                [o[name].double() for o in outs]
            )  # (models, N, classes)
            targets = neuron_matrix(
                (torch.as_tensor(weights)[:, None, :] * logits).sum(0)
            ).numpy()
            points = labels = w = None
        inputs = layer_io(fused, [name], x, "input")[name]
        target_t = torch.as_tensor(targets)
        if retrofit == "linear":
            retrofit_linear(module, inputs, target_t, ridge)
        else:
            with torch.enable_grad():
                like = outs[0][name]
                retrofit_gradient(
                    module,
                    inputs,
                    from_neuron_matrix(target_t, like),
                    gradient,
                    seed + li,
                )
        if points is not None:
            out = neuron_matrix(layer_io(fused, [name], x)[name]).numpy()
            result.costs.append(
                {"level": name, **cost_decomposition(points, w, labels, out)}
            )
    result.seconds = time.perf_counter() - start
    return result


def augment_fusion_set(
    x: torch.Tensor,
    y: torch.Tensor,
    copies: int,
    shift: int = 3,
    noise: float = 0.1,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fusion set plus ``copies`` augmented copies of it.

    Each copy is circularly shifted along the last axis (signal positions,
    image columns) by a random integer in ``[-shift, shift]`` per example and
    gets Gaussian noise of std ``noise``.
    """
    if copies < 0 or x.dim() < 3:
        raise ValueError(
            "augment_fusion_set needs copies >= 0 and inputs of shape (N, C, ..., L)"
        )
    gen = torch.Generator().manual_seed(seed)
    xs, ys = [x], [y]
    length = x.shape[-1]
    for _ in range(copies):
        shifts = torch.randint(-shift, shift + 1, (len(x),), generator=gen)
        pos = (torch.arange(length)[None, :] - shifts[:, None]) % length
        pos = pos.reshape(len(x), *([1] * (x.dim() - 2)), length).expand_as(x)
        xs.append(
            torch.gather(x, -1, pos) + noise * torch.randn(x.shape, generator=gen)
        )
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)
