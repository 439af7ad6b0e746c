"""The levels of a chain net and the steps that fuse one level: grouping, targets, retrofitting."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from torch import nn

from wslib.core.models import ResNet, Transformer
from wslib.core.neurons import neuron_structure
from wslib.core.norms import is_batchnorm
from wslib.core.train import batches, model_device
from wslib.fusion.importance import ImportanceName

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


def check_same_architecture(
    models: Sequence[nn.Module], *, same_widths: bool = True
) -> None:
    """Raise a ValueError unless all models share one architecture (and widths)."""
    if not models:
        raise ValueError("need at least one model")
    first = models[0]
    for i, m in enumerate(models[1:], 1):
        if type(m) is not type(first) or list(m.state_dict()) != list(
            first.state_dict()
        ):
            raise ValueError(
                f"model {i} ({type(m).__name__}) has another architecture than model 0 "
                f"({type(first).__name__}); fuse models of one architecture"
            )
        shapes = [t.dim() for t in m.state_dict().values()]
        if shapes != [t.dim() for t in first.state_dict().values()]:
            raise ValueError(f"model {i} has tensors of another rank than model 0")
        if same_widths and any(
            a.shape != b.shape
            for a, b in zip(m.state_dict().values(), first.state_dict().values())
        ):
            raise ValueError(
                f"model {i} has other layer widths than model 0 ({level_widths(m)} vs "
                f"{level_widths(first)}); this method needs equal widths (use KF otherwise)"
            )


def check_finite(
    models: Sequence[nn.Module], x: torch.Tensor, fused: nn.Module | None = None
) -> None:
    """Raise a ValueError naming the first NaN or infinite weight of a model (or
    of the caller's ``fused`` model), or the inputs."""
    named = [(f"model {i}", m) for i, m in enumerate(models)]
    named += [] if fused is None else [("the fused model", fused)]
    for label, m in named:
        for name, t in m.state_dict().items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(
                    f"{label} has NaN or infinite values in {name!r}; fuse trained "
                    "models with finite weights (check the run that produced it)"
                )
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("the fusion set's inputs hold NaN or infinite values")


def check_fusion_set(y: torch.Tensor, n_classes: int) -> None:
    """Raise a ValueError for labels outside ``[0, n_classes)`` or classes the fusion set lacks."""
    y = y if isinstance(y, torch.Tensor) else torch.as_tensor(y, device="cpu")
    if y.numel() and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(
            f"fusion labels must lie in [0, {n_classes}) for models with {n_classes} "
            f"classes, got labels from {int(y.min())} to {int(y.max())}"
        )
    present = set(y.unique().tolist())
    missing = [c for c in range(n_classes) if c not in present]
    if missing:
        raise ValueError(
            f"the fusion set has no examples of classes {missing}; draw a class-balanced "
            "fusion set (wslib.core.data.balanced_subset) from the union of the training data"
        )


def check_fusion_inputs(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Refuse a fusion set the models cannot read: one label per input, inputs of their shape.

    One example goes through ``model`` (eval mode, no gradient, its mode
    restored); a shape the model does not take is named with the fix instead
    of surfacing as a matrix-size error deep in a fusion.
    """
    if len(x) != len(y):
        raise ValueError(
            f"the fusion set has {len(x)} inputs but {len(y)} labels; give one label per input"
        )
    if not len(x):
        raise ValueError(
            "the fusion set is empty; draw one with wslib.core.data.balanced_subset"
        )
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x[:1].to(model_device(model)))
    except RuntimeError as error:
        raise ValueError(
            f"the models cannot read the fusion set's inputs of shape "
            f"{tuple(x.shape[1:])} per example ({str(error).splitlines()[0]}); draw the "
            "fusion set from the data set the models were trained on"
        ) from None
    finally:
        model.train(training)


def check_same_classes(
    models: Sequence[nn.Module], residual: bool, levels: Sequence[str]
) -> int:
    """The common number of classes of ``models`` (heads); a ValueError when they differ."""
    heads = [
        cast(Affine, m.head if residual else m.get_submodule(levels[-1]))
        for m in models
    ]
    counts = [h.weight.shape[0] for h in heads]
    if len(set(counts)) > 1:
        raise ValueError(
            f"the models have {counts} classes; "
            "fuse models with the same output classes"
        )
    return counts[0]


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


def check_scores(
    scores: Sequence[Mapping[str, torch.Tensor]],
    importance: ImportanceName,
    n_models: int,
) -> None:
    """Raise a ValueError when ``scores`` do not belong to ``importance`` or to every model.

    Scores from :func:`~wslib.fusion.importance.neuron_importance` carry the
    method that computed them; plain dicts are checked only for ``"uniform"``
    (all scores equal).
    """
    if len(scores) != n_models:
        raise ValueError(
            f"need importance scores for {n_models} models, got {len(scores)}"
        )
    for i, s in enumerate(scores):
        method = getattr(s, "method", None)
        if method is not None and method != importance:
            raise ValueError(
                f"scores of model {i} were computed with {method!r} but importance="
                f"{importance!r}; pass matching scores or scores=None"
            )
        if importance == "uniform" and any(
            len(v) and not torch.allclose(v.double(), v.double()[0].expand_as(v))
            for v in s.values()
        ):
            raise ValueError(
                f"importance='uniform' but the scores of model {i} are not uniform; "
                "pass the importance they were computed with"
            )


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


# --- grouping and the representation cost -----------------------------------------------------
#
# The grouping runs where the activations are (the models' device): distances,
# centroids and costs are computed there. Only per-neuron matrices leave it
# (through :func:`to_host`), however many columns (examples x positions) the
# activations have: a ``width x width`` cost per pair of models for SciPy's
# Hungarian solver, ``n x n`` coordinates of all ``n`` neurons for
# scikit-learn's k-means.

Points = np.ndarray | torch.Tensor


def to_host(value: torch.Tensor) -> np.ndarray:
    """A numpy copy of ``value``: the one way grouping data leaves the device."""
    return value.detach().cpu().numpy()


def _tensor(points: Points) -> torch.Tensor:
    """``points`` as a tensor where they are (numpy arrays on the CPU, whatever the default device)."""
    return points if isinstance(points, torch.Tensor) else torch.from_numpy(points)


def _as_solve(points: Points) -> torch.Tensor:
    """``points`` as a tensor on their device, in :func:`solve_dtype` (float64 on the CPU and CUDA)."""
    p = _tensor(points)
    return p.to(solve_dtype(p.device))


def weighted_centroids(
    points: Points, weights: np.ndarray, labels: np.ndarray, k: int
) -> torch.Tensor:
    """Importance-weighted centroid ``T_k`` of each group, ``(k, D)``, on the points' device.

    On the CPU a sequential scatter-add (the sums of ``np.add.at``, bit for
    bit); elsewhere a product with the ``(k, n)`` matrix of normalised
    weights, because CUDA's scatter-add is atomic and its sums would vary
    from run to run. Only per-neuron data travels to the device.
    """
    p = _as_solve(points)
    total = np.bincount(labels, weights, minlength=k)
    if (total <= 0).any():
        raise ValueError(
            f"groups {np.flatnonzero(total <= 0).tolist()} are empty or weightless"
        )
    if p.device.type == "cpu":
        return _scatter_centroids(p, weights, labels, total)
    return _product_centroids(p, weights, labels, total)


def _scatter_centroids(
    p: torch.Tensor, weights: np.ndarray, labels: np.ndarray, total: np.ndarray
) -> torch.Tensor:
    w = torch.as_tensor(weights, dtype=p.dtype, device=p.device)
    out = torch.zeros(len(total), p.shape[1], dtype=p.dtype, device=p.device)
    out.index_add_(0, torch.as_tensor(labels, device=p.device), w[:, None] * p)
    return out / torch.as_tensor(total, dtype=p.dtype, device=p.device)[:, None]


def _product_centroids(
    p: torch.Tensor, weights: np.ndarray, labels: np.ndarray, total: np.ndarray
) -> torch.Tensor:
    member = np.zeros((len(total), len(labels)))
    member[labels, np.arange(len(labels))] = weights / total[labels]
    return torch.as_tensor(member, dtype=p.dtype, device=p.device) @ p


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``||a_i - b_j||^2`` for every pair of rows, ``(len(a), len(b))``, clamped at zero."""
    sq = (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T
    return sq.clamp_min(0)


def hungarian_groups(
    a: Points, b: Points, wa: np.ndarray, wb: np.ndarray
) -> np.ndarray:
    """Labels of HF's one-to-one grouping of two equal-size neuron sets.

    The cost of merging ``a_i`` with ``b_j`` is the weighted squared distance
    to their weighted centroid, ``wa_i wb_j / (wa_i + wb_j) ||a_i - b_j||^2``.
    Group ``i`` holds ``a_i`` and its partner; labels are ``[0..n-1, perm]``.
    """
    if a.shape != b.shape:
        raise ValueError(
            f"HF needs two levels of equal width, got {len(a)} and {len(b)} neurons"
        )
    a_t = _as_solve(a)
    sq = to_host(squared_distances(a_t, _as_solve(b).to(a_t.device)))
    cost = (wa[:, None] * wb[None, :]) / (wa[:, None] + wb[None, :]) * sq
    rows, cols = linear_sum_assignment(cost)
    labels_b = np.empty(len(b), dtype=np.int64)
    labels_b[cols] = rows
    return np.concatenate([np.arange(len(a)), labels_b])


def hf_groups(mats: Sequence[Points], weights: Sequence[np.ndarray]) -> np.ndarray:
    """Labels of HF for any number of equal-width models (concatenated, model 0 first).

    Every model's neurons are matched one-to-one to those of the reference,
    model 0 (:func:`hungarian_groups`); group ``i`` holds model 0's neuron
    ``i`` and its partner in every other model. Two models: the paper's HF.
    """
    if len(mats) < 2 or len(mats) != len(weights):
        raise ValueError("HF needs at least two models and one weight vector each")
    labels = [np.arange(len(mats[0]))]
    for a, w in zip(mats[1:], weights[1:]):
        labels.append(hungarian_groups(mats[0], a, weights[0], w)[len(mats[0]) :])
    return np.concatenate(labels)


_GRAM_COLUMNS = 65_536


def isometric_rows(points: Points) -> np.ndarray:
    """Host coordinates of the ``n`` points with the same pairwise distances, ``(n, min(n, D))``.

    With more columns than points: the eigendecomposition of the centred
    points' Gram matrix, computed on their device a block of columns at a
    time (``G = U diag(s) U^T``, rows ``U diag(sqrt(s))``); otherwise the
    points themselves.
    """
    p = _as_solve(points)
    if p.shape[1] <= len(p):
        return to_host(p)
    gram = torch.zeros(len(p), len(p), dtype=p.dtype, device=p.device)
    for block in p.split(_GRAM_COLUMNS, 1):  # centred a block at a time, no full copy
        block = block - block.mean(0)
        gram += block @ block.T
    values, vectors = torch.linalg.eigh(gram)
    return to_host(vectors * values.clamp_min(0).sqrt())


def kmeans_groups(
    points: Points,
    weights: np.ndarray,
    k: int,
    *,
    init_first: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Labels of importance-weighted k-means (squared distances) with ``k`` groups.

    ``init_first`` starts Lloyd's iterations at the first ``k`` points (the
    reference model's neurons); otherwise k-means++ with 4 restarts.
    scikit-learn runs on :func:`isometric_rows`: k-means sees the points only
    through their distances, so it finds the same groups from an ``(n, n)``
    matrix instead of ``(n, D)`` activations, up to rounding: exact ties (two
    identical neurons of the reference model as starting centres) may break
    the other way.
    """
    if k > len(points):
        raise ValueError(f"k={k} groups but only {len(points)} neurons")
    rows = isometric_rows(points)
    km = KMeans(
        k,
        init=rows[:k] if init_first else "k-means++",
        n_init=1 if init_first else 4,
        random_state=seed,
        tol=0.0,
        max_iter=300,
    )
    return km.fit(rows, sample_weight=weights).labels_.astype(np.int64)


def group_labels(
    points: torch.Tensor,
    sizes: Sequence[int],
    weights: np.ndarray,
    k: int,
    grouping: GroupingName,
    *,
    seed: int = 0,
) -> np.ndarray:
    """HF or KF labels of every model's neurons into ``k`` groups.

    ``points`` holds the neurons of all models, model 0 first, ``sizes[i]``
    of model ``i``. KF starts at model 0's neurons when ``k`` is its width,
    else k-means++.
    """
    if grouping == "hf":
        cuts = np.cumsum(sizes)[:-1]
        return hf_groups(list(points.split(list(sizes))), np.split(weights, cuts))
    return kmeans_groups(points, weights, k, init_first=k == sizes[0], seed=seed)


_COST_ROWS = 64


def _weighted_spread(
    p: torch.Tensor, weights: np.ndarray, labels: np.ndarray, centres: torch.Tensor
) -> float:
    """``sum_i w_i ||p_i - centres_{c(i)}||^2`` on the points' device, a block of rows at a time."""
    w = torch.as_tensor(weights, dtype=p.dtype, device=p.device)
    idx = torch.as_tensor(labels, device=p.device)
    total = torch.zeros((), dtype=p.dtype, device=p.device)
    for rows in torch.arange(len(p), device=p.device).split(_COST_ROWS):
        gaps = p[rows] - centres[idx[rows]]
        total += (w[rows] * (gaps**2).sum(1)).sum()
    return float(total)


def cost_decomposition(
    points: Points, weights: np.ndarray, labels: np.ndarray, fused: Points
) -> dict[str, float]:
    """Representation cost ``sum_i w_i ||a_i - F_{c(i)}||^2`` and its Theorem-1 parts
    (clustering + approximation error), on the points' device."""
    p = _as_solve(points)
    fused_t = _tensor(fused).to(p)
    k = len(fused_t)
    targets = weighted_centroids(p, weights, labels, k)
    group_w = torch.as_tensor(
        np.bincount(labels, weights, minlength=k), dtype=p.dtype, device=p.device
    )
    return {
        "cost": _weighted_spread(p, weights, labels, fused_t),
        "clustering": _weighted_spread(p, weights, labels, targets),
        "approximation": float((group_w * ((targets - fused_t) ** 2).sum(1)).sum()),
    }


# --- retrofitting -----------------------------------------------------------------------------


def solve_dtype(device: torch.device) -> torch.dtype:
    """float64 for least squares wherever the device supports it (the CPU, CUDA), else float32."""
    return torch.float32 if device.type == "mps" else torch.float64


def design_matrix(
    module: Affine, inputs: torch.Tensor, *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Rows of the affine map's inputs, ``(samples, fan_in)``, in neuron_matrix's sample order."""
    x = inputs.to(dtype)
    if isinstance(module, nn.Linear):
        return (
            x.reshape(-1, x.shape[-1])
            if x.dim() == 2
            else x.reshape(-1, module.in_features)
        )
    k, s = module.kernel_size, module.stride
    p = cast(tuple[int, ...], module.padding)  # the book's convs pad by numbers
    if isinstance(module, nn.Conv1d):
        x = F.pad(x, (p[0], p[0])).unfold(2, k[0], s[0])  # (N, C, L, k)
        return x.permute(0, 2, 1, 3).reshape(-1, x.shape[1] * k[0])
    cols = F.unfold(x, k, padding=p, stride=s)  # (N, C*kh*kw, L)
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def ridge_solve(
    rows: Callable[[slice], torch.Tensor],
    targets: torch.Tensor,
    n: int,
    ridge: float,
    *,
    chunk: int = 256,
) -> torch.Tensor:
    """Ridge least squares ``A @ sol ~ targets.T`` for ``A = rows(all n examples)``.

    ``rows(slice)`` gives the design rows of those examples (each example has
    ``targets.shape[1] // n`` consecutive rows); the Gram matrix is
    accumulated over ``chunk`` examples at a time, on the device and in the
    dtype of the rows (float64 where the device has it, see
    :func:`solve_dtype`), and ``ridge`` is relative to its mean diagonal.
    """
    if n < 1:
        raise ValueError(f"no examples to fit (n={n})")
    per_example = targets.shape[1] // n
    gram: torch.Tensor | None = None
    rhs: torch.Tensor | None = None
    total_rows = 0
    for start in range(0, n, chunk):
        a = rows(slice(start, start + chunk))
        t = targets[:, start * per_example : start * per_example + len(a)].to(a)
        total_rows += len(a)
        gram = a.T @ a if gram is None else gram + a.T @ a
        rhs = a.T @ t.T if rhs is None else rhs + a.T @ t.T
    assert gram is not None and rhs is not None  # n >= 1: one chunk at least
    if total_rows < len(gram):
        warnings.warn(
            f"least squares with {total_rows} samples for {len(gram)} unknowns per neuron "
            "is underdetermined (the ridge term picks one solution); use a larger "
            "fusion set",
            stacklevel=2,
        )
    lam = ridge * gram.diagonal().mean()
    eye = torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram + lam * eye, rhs)


def set_affine(module: Affine, sol: torch.Tensor) -> None:
    """Write a solution in :func:`ridge_solve`'s layout, ``(fan_in [+ 1], k)``, into an affine layer.

    The last row is the bias when the layer has one.
    """
    bias = module.bias is not None
    with torch.no_grad():
        w = sol[: len(sol) - bias].T.reshape(module.weight.shape)
        module.weight.copy_(w.to(module.weight))
        if module.bias is not None:
            module.bias.copy_(sol[-1].to(module.bias))


@torch.no_grad()
def affine_outputs(
    module: Affine, inputs: torch.Tensor, *, batch_size: int = 512
) -> torch.Tensor:
    """The layer's outputs on ``inputs`` as :func:`neuron_matrix` rows, on its device.

    Computed by the layer itself, in its dtype and in the batches of
    :func:`layer_io`, so they are the values a model holding this layer gives.
    """
    dev = module.weight.device
    out = [module(inputs[idx].to(dev)) for idx in batches(len(inputs), batch_size)]
    return neuron_matrix(torch.cat(out))


def retrofit_linear(
    module: Affine,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    ridge: float = 1e-8,
    prior: torch.Tensor | None = None,
) -> None:
    """Closed-form ridge least squares of an affine layer to ``targets`` (``(k, samples)``).

    The bias, if the layer has one, is fitted through a ones column (see
    :func:`ridge_solve`). With a ``prior`` ``W0`` (``ridge_solve``'s layout,
    bias last) the ridge term pulls toward it instead of zero,
    ``min ||A W - T||^2 + lam ||W - W0||^2``: the layer is set to ``W0`` and
    the step ``W - W0`` is fitted to what its outputs leave of the targets.
    Those outputs come from the layer itself (:func:`affine_outputs`), so a
    prior that reproduces float32 targets leaves exactly zero, and stays.
    The system is solved on the layer's device, in float64 where the device
    supports it (:func:`solve_dtype`).
    """

    bias = module.bias is not None
    dev = module.weight.device
    dtype = solve_dtype(dev)

    def rows(sl: slice) -> torch.Tensor:
        a = design_matrix(module, inputs[sl].to(dev), dtype=dtype)
        if not bias:
            return a
        return torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype, device=dev)], 1)

    if prior is not None:
        set_affine(module, prior)
        targets = targets.to(dev, dtype) - affine_outputs(module, inputs).to(dtype)
    step = ridge_solve(rows, targets, len(inputs), ridge)
    set_affine(module, step if prior is None else prior.to(step) + step)


OPTIMIZERS: tuple[Literal["lbfgs", "adam"], ...] = ("lbfgs", "adam")


@dataclass(frozen=True)
class GradientConfig:
    """Gradient retrofitting of one level: full-batch L-BFGS (default) or Adam.

    ``"lbfgs"``: up to ``max_epochs`` L-BFGS iterations with a strong-Wolfe
    line search and step ``lr`` (1: the quasi-Newton step), stopping early
    once an iteration changes the loss by less than 1e-9 of its start. ``"adam"``: ``max_epochs``
    full-batch Adam steps of size ``lr`` times the RMS of the starting
    parameters (the step scales with the weights), cosine-annealed to zero,
    stopped after ``patience`` epochs without improvement (0: never).
    ``val_fraction`` > 0 holds out that part of the fusion set and selects the
    result on it; 0 fits and selects on the whole set. Either way the result is
    the better of the start and the end of the run (Adam: the best epoch) on
    the selection loss, so it is never worse than the start.

    ``blocks`` (ResNets and transformers only): the Gradient variant fits every
    residual or transformer block end to end, its output against the stream's
    targets, from the least-squares fits of the block's affine steps (the
    paper's level); False: each affine step alone, by this optimiser on its
    least-squares objective.
    """

    lr: float = 1.0
    max_epochs: int = 100
    patience: int = 0
    val_fraction: float = 0.0
    optimizer: Literal["lbfgs", "adam"] = "lbfgs"
    blocks: bool = True

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not isinstance(self.blocks, bool):
            raise TypeError(f"blocks must be True or False, got {self.blocks!r}")
        if self.lr <= 0 or self.max_epochs < 0 or self.patience < 0:
            raise ValueError(
                "GradientConfig needs lr > 0, max_epochs >= 0 and patience >= 0"
            )


def minimise(
    params: Sequence[torch.Tensor],
    train_loss: Callable[[], torch.Tensor],
    select_loss: Callable[[], float],
    config: GradientConfig,
) -> dict[str, float]:
    """Minimise ``train_loss()`` over ``params`` (full batch) and keep the best values.

    The candidates are the starting values and the values the optimiser
    reaches (Adam: after every epoch); the one with the lowest
    ``select_loss()`` is written back. Returns the start's and the result's
    selection loss.
    """
    with torch.no_grad():
        start_loss = select_loss()
    best, best_values = start_loss, [p.detach().clone() for p in params]
    opt: torch.optim.Optimizer

    def consider() -> bool:
        nonlocal best, best_values
        with torch.no_grad():
            current = select_loss()
        if current < best:
            best, best_values = current, [p.detach().clone() for p in params]
            return True
        return False

    if config.optimizer == "lbfgs" and config.max_epochs > 0:
        with torch.no_grad():
            loss_scale = float(train_loss())
        opt = torch.optim.LBFGS(
            params,
            lr=config.lr,
            max_iter=config.max_epochs,
            history_size=20,
            tolerance_grad=1e-12,
            tolerance_change=1e-9 * loss_scale,  # stop once the loss stalls
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = train_loss()
            loss.backward()
            return loss

        opt.step(closure)
        consider()
    elif config.max_epochs > 0:
        with torch.no_grad():
            scale = torch.cat([p.detach().flatten() for p in params]).pow(2).mean()
        step = config.lr * (float(scale.sqrt()) if scale > 0 else 1.0)
        opt = torch.optim.Adam(params, lr=step)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.max_epochs)
        since = 0
        for _ in range(config.max_epochs):
            loss = train_loss()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            since = 0 if consider() else since + 1
            if config.patience and since >= config.patience:
                break
    with torch.no_grad():
        for p, value in zip(params, best_values):
            p.copy_(value)
    return {"start": start_loss, "best": best}


def held_out_split(
    n: int, val_fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the held-out and the training examples, drawn once with ``seed``.

    ``val_fraction`` 0: no held-out part; both index sets are all examples.
    The indices are drawn on the CPU (reproducible on every device); move
    them to the data's device.
    """
    if val_fraction == 0:
        every = torch.arange(n, device="cpu")
        return every, every
    n_val = max(1, round(val_fraction * n))
    if n_val >= n:
        raise ValueError(
            f"fusion set of {n} examples is too small to hold out {n_val}; "
            "lower GradientConfig.val_fraction"
        )
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(n, generator=gen, device="cpu")
    return order[:n_val], order[n_val:]


def retrofit_gradient(
    module: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    config: GradientConfig = GradientConfig(),
    seed: int = 0,
) -> dict[str, float]:
    """Fit a level to ``targets`` (module-output shape) by gradient steps on the MSE.

    Training starts from the module's current weights (see
    :class:`GradientConfig` and :func:`minimise`); the result is never worse
    than the start on the selection loss. Returns the start's and the
    result's selection MSE.
    """
    dev = next(module.parameters()).device
    val, train = (
        i.to(dev) for i in held_out_split(len(inputs), config.val_fraction, seed)
    )
    x, t = inputs.to(dev), targets.to(dev, torch.float32)
    x_tr, t_tr, x_val, t_val = x[train], t[train], x[val], t[val]
    return minimise(
        list(module.parameters()),
        lambda: F.mse_loss(module(x_tr), t_tr),
        lambda: F.mse_loss(module(x_val), t_val).item(),
        config,
    )


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
