"""Neuron-centric model fusion: Hungarian Fusion (HF) and K-means Fusion (KF).

Luenam et al., "Model Fusion via Retrofitting". A network is a chain of
*levels*; a level is one affine layer (Linear or Conv) whose output channels
are the level's neurons. A neuron's *activation vector* is its pre-activation
output on the fusion set, with spatial positions counted as extra samples.
Bottom-up, for every hidden level:

1. **Grouping.** The neurons of all base models are grouped (HF: one-to-one
   Hungarian matching of equal-width models; with more than two models, every
   model is matched to model 0; KF: importance-weighted k-means, any number
   of models and widths, ``k`` = fused width). The targets ``T_k`` are the
   importance-weighted centroids of the groups.
2. **Retrofitting.** The fused level, fed with the fused model's *own* outputs
   of the previous levels, is fitted to reproduce ``T_k``: closed-form ridge
   least squares (``"linear"``) or full-batch gradient steps on the mean
   squared error (``"gradient"``, L-BFGS by default, never worse than its
   start; :class:`~wslib.fusion.retrofit.GradientConfig`).

The head is fitted the same way to the average of the base models' logits,
optionally weighted per class by each model's share of that class's data.

**The prior.** The ridge term pulls a level toward the *aligned parents'
weights* ``W0`` (:func:`aligned_prior`), not toward zero: fused neuron ``k``
gets the importance-weighted average, over the members of its group, of
their weights summed over the base inputs grouped into each fused input (the
head: the class-weighted average of the heads). A model fused with an exact
copy of itself then has ``W0`` equal to its own weights, which reproduce the
targets exactly, so it comes back whatever the fusion set, even with neurons
that never fire on it (whose outgoing weights the data do not identify).
The gradient variant starts at ``W0`` too: on chapter 10's models a far
lower error than model 0's weights, and L-BFGS ends as low or lower. A level
without an alignment keeps the zero prior and the gradient variant's start
at the fused model's current weights: in a shallower fused chain (KF across
depths), a level whose input is not its base level's input; a fused layer of
another kernel or input size than the base layer.

ResNets and transformers, whose residual streams are written by several
layers, are fused by :mod:`wslib.fusion.residual` (:func:`fuse` dispatches).

The *representation cost* of a level is ``sum_i w_i ||a_i - F_{c(i)}||^2``
(neuron ``i`` with weight ``w_i`` and activations ``a_i``, fused neuron
``F_{c(i)}`` of its group). Theorem 1 splits it exactly into the clustering
error ``sum_i w_i ||a_i - T_{c(i)}||^2`` and the approximation error
``sum_k W_k ||T_k - F_k||^2`` with ``W_k`` the total weight of group ``k``
(:func:`~wslib.fusion.grouping.cost_decomposition`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from wslib.core.seeds import derive_seed
from wslib.fusion.checks import (
    check_finite,
    check_fusion_set,
    check_same_architecture,
    check_same_classes,
    check_scores,
)
from wslib.fusion.grouping import cost_decomposition, group_labels, weighted_centroids
from wslib.fusion.importance import ImportanceName, example_scores, neuron_importance
from wslib.fusion.levels import (
    GROUPINGS,
    RESIDUAL_ARCHS,
    RETROFITS,
    Affine,
    FusionResult,
    GroupingName,
    RetrofitName,
    chain_levels,
    from_neuron_matrix,
    head_weights,
    layer_io,
    neuron_matrix,
    normalised_scores,
    solve_dtype,
)
from wslib.fusion.residual import fuse_residual
from wslib.fusion.retrofit import (
    GradientConfig,
    retrofit_gradient,
    retrofit_linear,
    set_affine,
)
from wslib.fusion.taps import residual_importance

# --- the prior: the parents' weights, aligned --------------------------------------------------


@dataclass(frozen=True)
class Grouping:
    """Where the base neurons of one level went: ``labels`` of every model's
    neurons (model 0 first, ``sizes[i]`` of model ``i``) among ``k`` fused neurons."""

    labels: np.ndarray
    sizes: Sequence[int]
    k: int

    def of_model(self, i: int) -> np.ndarray:
        """The labels of model ``i``'s neurons."""
        start = sum(self.sizes[:i])
        return self.labels[start : start + self.sizes[i]]


def head_grouping(n_models: int, n_classes: int) -> Grouping:
    """Every model's class ``c`` into fused class ``c``."""
    labels = np.tile(np.arange(n_classes), n_models)
    return Grouping(labels, [n_classes] * n_models, n_classes)


def aligned_rows(
    module: Affine, inputs: np.ndarray | None, k_in: int, dtype: torch.dtype
) -> torch.Tensor:
    """One base model's affine layer over the fused inputs, ``(out, fan_in [+ 1])``.

    Column block ``j`` sums the weights from the base inputs labelled ``j`` in
    ``inputs`` (kernel positions and flattened positions kept, in the layer's
    ``(input, *rest)`` order); ``inputs`` None: the data, as they are. The bias
    is the last column.
    """
    w = module.weight.detach().to(dtype)
    if inputs is not None:
        dev = w.device
        onehot = torch.zeros(len(inputs), k_in, dtype=dtype, device=dev)
        onehot[
            torch.arange(len(inputs), device=dev), torch.as_tensor(inputs, device=dev)
        ] = 1
        w = torch.einsum("oir,ij->ojr", w.reshape(len(w), len(inputs), -1), onehot)
    rows = w.reshape(len(w), -1)
    if module.bias is None:
        return rows
    return torch.cat([rows, module.bias.detach().to(dtype)[:, None]], 1)


def aligned_prior(
    modules: Sequence[Affine],
    out: Grouping,
    weights: np.ndarray,
    inputs: Grouping | None,
) -> torch.Tensor:
    """The aligned parents' weights ``W0`` of a level, ``(fan_in [+ 1], k)``.

    ``modules`` are the base models' layers of the level (model 0 first),
    ``out`` the grouping of their neurons and ``weights`` the neurons'
    importance (the head: each model's per-class weight); ``inputs`` the
    grouping of the previous level (None: the data). Row ``k`` of ``W0.T``
    is the ``weights``-weighted average over the members of fused neuron
    ``k`` of their :func:`aligned_rows` (bias included), so ``W0`` is in
    :func:`~wslib.fusion.retrofit.ridge_solve`'s layout, on the layers' device
    in :func:`~wslib.fusion.levels.solve_dtype`.
    """
    dtype = solve_dtype(modules[0].weight.device)
    rows = [
        aligned_rows(
            m,
            None if inputs is None else inputs.of_model(i),
            0 if inputs is None else inputs.k,
            dtype,
        )
        for i, m in enumerate(modules)
    ]
    return weighted_centroids(torch.cat(rows), weights, out.labels, out.k).T


def has_alignment(
    levels: Sequence[str],
    fused_levels: Sequence[str],
    level_map: dict[str, str],
    li: int,
) -> bool:
    """Whether fused level ``li`` reads what its base level reads, grouped.

    True when the previous fused level reproduces the base level just before
    (at the first level: the base level reads the data); a shallower KF chain
    that skips base levels has levels without this alignment.
    """
    base = levels.index(level_map[fused_levels[li]])
    previous = -1 if li == 0 else levels.index(level_map[fused_levels[li - 1]])
    return base == previous + 1


def level_prior(
    models: Sequence[nn.Module],
    name: str,
    module: Affine,
    out: Grouping,
    weights: np.ndarray,
    inputs: Grouping | None,
) -> torch.Tensor | None:
    """:func:`aligned_prior` of base level ``name`` for the fused ``module``; None
    (the zero prior) when its shape is not the fused layer's (another kernel or input size)."""
    layers = [cast(Affine, m.get_submodule(name)) for m in models]
    prior = aligned_prior(layers, out, weights, inputs)
    fan_in = module.weight[0].numel() + (module.bias is not None)
    return prior if prior.shape == (fan_in, module.weight.shape[0]) else None


# --- the fusion -------------------------------------------------------------------------------


def class_share(counts: np.ndarray) -> np.ndarray:
    """Per-class data share of each model, ``(n_models, n_classes)``; columns sum to 1.

    A class that no model saw gets equal shares.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(0, keepdims=True)
    uniform = np.full_like(counts, 1.0 / len(counts))
    return np.where(total > 0, counts / np.where(total > 0, total, 1), uniform)


def attribution_share(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    method: ImportanceName = "conductance",
) -> np.ndarray:
    """Per-class weight of each model's logits by attribution, ``(n_models, n_classes)``.

    The rule of the paper's authors: a model's weight for class ``c`` is the
    total attribution (``method``, target ``c``) of its last hidden level on
    the fusion examples of class ``c``, normalised over the models; the
    alternative is :func:`class_share` (each model's share of the class's
    training data). Chain architectures only.
    """
    n_classes = int(y.max()) + 1
    labels = y.cpu().numpy()
    out = np.zeros((len(models), n_classes))
    for i, m in enumerate(models):
        scores = example_scores(m, chain_levels(m)[-2], x, y, method).sum(1)
        per_example = scores.cpu().numpy()
        for c in np.unique(labels):
            out[i, c] = float(per_example[labels == c].mean())
    total = out.sum(0, keepdims=True)
    return np.where(total > 0, out / np.where(total > 0, total, 1), 1.0 / len(models))


def model_importance(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    method: ImportanceName,
    *,
    progress: bool = True,
) -> dict[str, torch.Tensor]:
    """Importance of the neurons of every hidden level (chains) or neuron group (ResNets, transformers)."""
    if isinstance(model, RESIDUAL_ARCHS):
        return residual_importance(model, x, y, method, progress=progress)
    return neuron_importance(
        model, chain_levels(model)[:-1], x, y, method, progress=progress
    )


def fuse(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    grouping: GroupingName = "kf",
    retrofit: RetrofitName = "linear",
    *,
    importance: ImportanceName = "uniform",
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
        Base models of one architecture: a chain (see :func:`~wslib.fusion.levels.chain_levels`), or
        a ResNet or transformer (see :mod:`wslib.fusion.residual`).
    x, y
        The fusion set; it must contain every class.
    grouping
        ``"hf"`` (models of equal widths, each matched to model 0) or
        ``"kf"`` (any widths).
    retrofit
        ``"linear"`` (ridge least squares) or ``"gradient"`` (see
        :class:`~wslib.fusion.retrofit.GradientConfig`).
    importance
        ``"uniform"``, ``"conductance"`` or ``"deeplift"`` neuron weights.
    fused
        A model of the same architecture whose widths are the fused widths
        (a copy is fitted; HF: the base widths); for KF of chains it may be
        shallower than the base models (:func:`depth_map`); default: a copy
        of ``models[0]``. The result is on ``models[0]``'s device.
    class_weights
        ``(n_models, n_classes)`` non-negative weights of each model's logits
        in the head's target (e.g. :func:`class_share` or
        :func:`attribution_share`); every class needs a positive total;
        default equal weights.
    ridge, gradient
        Settings of the two retrofitting variants; for chains the ridge term
        pulls toward the aligned parents' weights and the gradient variant
        starts there (see the module docstring), for residual nets toward zero.
    scores
        Precomputed importance per model (:func:`model_importance` with the
        same ``importance``); computed when None.
    seed, progress
        Seed of k-means and of the held-out split; progress bars.
    """
    start = time.perf_counter()
    fused, levels, level_map, weights = _checked_inputs(
        models, x, y, grouping, retrofit, fused, class_weights
    )
    scores = _importance(models, x, y, importance, scores, progress)
    if isinstance(models[0], RESIDUAL_ARCHS):
        return fuse_residual(
            models, x, grouping, retrofit, fused, weights, scores, ridge, gradient, seed
        )
    result = _fuse_chain(
        models,
        x,
        fused,
        levels,
        level_map,
        weights,
        scores,
        grouping=grouping,
        retrofit=retrofit,
        ridge=ridge,
        gradient=gradient,
        seed=seed,
        progress=progress,
    )
    result.seconds = time.perf_counter() - start
    return result


def _importance(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    importance: ImportanceName,
    scores: Sequence[dict[str, torch.Tensor]] | None,
    progress: bool,
) -> Sequence[dict[str, torch.Tensor]]:
    """``scores`` (computed with :func:`model_importance` when None), checked to be
    one per model and of the kind ``importance`` names."""
    if scores is None:
        scores = [
            model_importance(m, x, y, importance, progress=progress) for m in models
        ]
    check_scores(scores, importance, len(models))
    return scores


def _checked_inputs(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    grouping: GroupingName,
    retrofit: RetrofitName,
    fused: nn.Module | None,
    class_weights: np.ndarray | None,
) -> tuple[nn.Module, list[str], dict[str, str], np.ndarray]:
    """:func:`fuse`'s inputs checked: the fused model (a copy on the models'
    device), the base chain's levels and the base level each fused level
    reproduces (:func:`depth_map`; none for residual nets), and the head
    weights. Raises ``ValueError`` naming what does not fit."""
    if grouping not in GROUPINGS or retrofit not in RETROFITS:
        raise ValueError(
            f"grouping must be one of {GROUPINGS} and retrofit one of {RETROFITS}"
        )
    if grouping == "hf" and len(models) < 2:
        raise ValueError(f"HF fuses two or more models, got {len(models)}")
    check_same_architecture(models, same_widths=grouping == "hf")
    device = next(models[0].parameters()).device
    check_finite(models, x, fused)
    fused = copy.deepcopy(models[0] if fused is None else fused).to(device).eval()
    residual = isinstance(models[0], RESIDUAL_ARCHS)
    levels = [] if residual else chain_levels(models[0])
    fused_levels = levels if residual else chain_levels(fused)
    if len(fused_levels) == len(levels) or grouping == "hf" or residual:
        check_same_architecture([models[0], fused], same_widths=grouping == "hf")
    elif type(fused) is not type(models[0]):
        raise ValueError(
            f"a fused {type(fused).__name__} for base {type(models[0]).__name__} "
            "models; fuse into a model of the base architecture"
        )
    level_map = {} if residual else depth_map(levels, fused_levels)
    n_classes = check_same_classes([*models], residual, levels)
    fused_head = cast(
        Affine, fused.head if residual else fused.get_submodule(fused_levels[-1])
    )
    if fused_head.weight.shape[0] != n_classes:
        raise ValueError(
            f"the fused model has {fused_head.weight.shape[0]} classes, the models "
            f"{n_classes}; fuse models with the same output classes"
        )
    check_fusion_set(y, n_classes)
    if len(x) != len(y):
        raise ValueError(f"the fusion set has {len(x)} inputs but {len(y)} labels")
    weights = head_weights(class_weights, len(models), n_classes)
    return fused, levels, level_map, weights


def _fuse_chain(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    fused: nn.Module,
    levels: list[str],
    level_map: dict[str, str],
    weights: np.ndarray,
    scores: Sequence[dict[str, torch.Tensor]],
    *,
    grouping: GroupingName,
    retrofit: RetrofitName,
    ridge: float,
    gradient: GradientConfig,
    seed: int,
    progress: bool,
) -> FusionResult:
    """:func:`fuse` for chains: bottom-up, each fused level grouped and
    retrofitted (``levels``: the base chain; ``level_map``: the base level
    each fused level reproduces, in the fused chain's order)."""
    fused_levels = list(level_map)
    device = next(models[0].parameters()).device
    outs = [layer_io(m, levels, x) for m in models]
    result = FusionResult(fused, fused_levels)
    previous: Grouping | None = None  # the first level reads the data
    points: torch.Tensor | None
    labels: np.ndarray | None
    w: np.ndarray | None
    bar = tqdm(fused_levels, desc=grouping, disable=not progress, leave=False)
    for li, fused_name in enumerate(bar):
        name = level_map[fused_name]  # the base models' level it reproduces
        module = cast(Affine, fused.get_submodule(fused_name))
        if li < len(fused_levels) - 1:  # grouped on the models' device
            points = torch.cat([neuron_matrix(o[name]) for o in outs])
            points = points.to(device, solve_dtype(device))
            sizes = [o[name].shape[1] for o in outs]
            w = np.concatenate([normalised_scores(s[name]) for s in scores])
            k = module.weight.shape[0]
            labels = group_labels(points, sizes, w, k, grouping, seed=seed)
            targets = weighted_centroids(points, w, labels, k)
            grouped, member_w = Grouping(labels, sizes, k), w
        else:
            logits = torch.stack(
                [o[name].double() for o in outs]
            )  # (models, N, classes)
            targets = neuron_matrix(
                (torch.from_numpy(weights)[:, None, :] * logits).sum(0)
            )
            points = labels = w = None
            grouped, member_w = head_grouping(*weights.shape), weights.ravel()
        prior = (
            level_prior(models, name, module, grouped, member_w, previous)
            if has_alignment(levels, fused_levels, level_map, li)
            else None
        )
        previous = grouped
        inputs = layer_io(fused, [fused_name], x, kind="input")[fused_name]
        if retrofit == "linear":
            retrofit_linear(module, inputs, targets, ridge=ridge, prior=prior)
        else:
            if prior is not None:
                set_affine(module, prior)  # start at the aligned parents
            with torch.enable_grad():
                like = outs[0][name]
                retrofit_gradient(
                    module,
                    inputs,
                    from_neuron_matrix(targets, like),
                    config=gradient,
                    seed=derive_seed(seed, "level", li),
                )
        if points is not None and w is not None and labels is not None:
            out = neuron_matrix(layer_io(fused, [fused_name], x)[fused_name])
            result.costs.append(
                {"level": fused_name, **cost_decomposition(points, w, labels, out)}
            )
    return result


def depth_map(levels: Sequence[str], fused_levels: Sequence[str]) -> dict[str, str]:
    """The base level that each level of the fused chain reproduces.

    Equal depths: level ``i`` to level ``i``. A shallower fused chain (KF
    across depths): its hidden levels are spread evenly over the base
    model's, the last hidden level to the last, the head to the head, so
    fused level ``j`` stands for the *stage* of base levels after the
    previous mapped one up to ``round((j + 1) n / m) - 1`` (``n`` base and
    ``m`` fused hidden levels). A deeper fused chain is refused.
    """
    n, m = len(levels) - 1, len(fused_levels) - 1
    if m > n:
        raise ValueError(
            f"the fused model has {m} hidden levels, the base models {n}; KF maps a "
            "deeper model into a shallower one, not the reverse"
        )
    out = {
        f: levels[round((j + 1) * n / m) - 1] for j, f in enumerate(fused_levels[:-1])
    }
    out[fused_levels[-1]] = levels[-1]
    return out


def augment_fusion_set(
    x: torch.Tensor,
    y: torch.Tensor,
    copies: int,
    *,
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
