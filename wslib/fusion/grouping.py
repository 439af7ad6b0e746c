"""Which neurons merge: HF's one-to-one matching and KF's k-means grouping, the
weighted centroids of a grouping and its representation cost.

The grouping runs where the activations are (the models' device): distances,
centroids and costs are computed there. Only per-neuron matrices leave it
(through :func:`to_host`), however many columns (examples x positions) the
activations have: a ``width x width`` cost per pair of models for SciPy's
Hungarian solver, ``n x n`` coordinates of all ``n`` neurons for
scikit-learn's k-means.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans

from wslib.fusion.levels import GroupingName, solve_dtype

Points = np.ndarray | torch.Tensor


def to_host(value: torch.Tensor) -> np.ndarray:
    """A numpy copy of ``value``: the one way grouping data leaves the device."""
    return value.detach().cpu().numpy()


def _tensor(points: Points) -> torch.Tensor:
    """``points`` as a tensor where they are (numpy arrays on the CPU, whatever the default device)."""
    return points if isinstance(points, torch.Tensor) else torch.from_numpy(points)


def _as_solve(points: Points) -> torch.Tensor:
    """``points`` as a tensor on their device, in :func:`~wslib.fusion.levels.solve_dtype` (float64 on the CPU and CUDA)."""
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
