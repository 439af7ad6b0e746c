"""Property tests: least squares, neuron grouping and self-fusion against slow, obvious references.

Each property draws small random problems and checks a function of
:mod:`wslib.fusion` against a reference written here in plain float64 numpy:
the ridge solution by ``numpy.linalg.lstsq`` on the augmented system, the
grouping costs from their definitions and their minima over every possible
assignment, and the model itself for a fusion of copies of it.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.spatial.distance import pdist
from torch import nn

from tests.kit import mlp, seeded_model, toy_tensors
from wslib.fusion.baselines import (
    Ensemble,
    averaging,
    otfusion,
    rebasin_activation_matching,
    rebasin_weight_matching,
)
from wslib.fusion.grouping import (
    cost_decomposition,
    group_labels,
    hf_groups,
    isometric_rows,
    kmeans_groups,
    weighted_centroids,
)
from wslib.fusion.hfkf import fuse
from wslib.fusion.retrofit import ridge_solve

PROPERTY = settings(max_examples=60, deadline=None, database=None)
"""A few seconds per property; no example database (it would write ``.hypothesis/``)."""

COORDINATES = st.floats(-3.0, 3.0).map(lambda v: round(v, 2))
"""Neuron coordinates with 2 decimals: ties and repeated points happen."""
WEIGHTS = st.floats(0.1, 5.0).map(lambda v: round(v, 2))
"""Positive importance weights."""


# --- references -----------------------------------------------------------------------------


def spread(points: np.ndarray, weights: np.ndarray) -> float:
    """``sum_i w_i ||p_i - c||^2`` about the weighted mean ``c`` of the points (0 if none)."""
    if len(points) == 0:
        return 0.0
    centre = (weights[:, None] * points).sum(0) / weights.sum()
    return float((weights * ((points - centre) ** 2).sum(1)).sum())


def weighted_means(
    points: np.ndarray, weights: np.ndarray, labels: np.ndarray, k: int
) -> np.ndarray:
    """Each group's weighted mean, ``(k, D)``, group by group (the groups are not empty)."""
    return np.stack(
        [
            (weights[labels == c, None] * points[labels == c]).sum(0)
            / weights[labels == c].sum()
            for c in range(k)
        ]
    )


def clustering_cost(
    points: np.ndarray, weights: np.ndarray, labels: np.ndarray, k: int
) -> float:
    """The clustering error of an assignment, group by group from the definition."""
    return sum(spread(points[labels == c], weights[labels == c]) for c in range(k))


def brute_force_minimum(points: np.ndarray, weights: np.ndarray, k: int) -> float:
    """The least clustering error over all ``k^n`` assignments of the ``n`` points."""
    return min(
        clustering_cost(points, weights, np.array(labels), k)
        for labels in itertools.product(range(k), repeat=len(points))
    )


def matching_cost(
    a: np.ndarray, b: np.ndarray, wa: np.ndarray, wb: np.ndarray, perm: Sequence[int]
) -> float:
    """Clustering error of the pairs ``{a_i, b_perm[i]}``, each about its weighted centroid."""
    return sum(
        spread(np.stack([a[i], b[j]]), np.array([wa[i], wb[j]]))
        for i, j in enumerate(perm)
    )


def scale_of(points: np.ndarray, weights: np.ndarray) -> float:
    """The size of the costs: ``sum_i w_i ||p_i||^2`` (rounding errors are relative to it)."""
    return float((weights * (points**2).sum(1)).sum()) + 1e-300


# --- 3. ridge least squares in chunks --------------------------------------------------------


@PROPERTY
@given(
    n=st.integers(1, 30),
    per_example=st.integers(1, 3),
    fan_in=st.integers(1, 5),
    k=st.integers(1, 3),
    chunk=st.integers(1, 8),
    ridge=st.sampled_from([1e-6, 1e-3, 0.1, 1.0]),
    collinear=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_ridge_solve_is_the_direct_ridge_solution(
    n: int,
    per_example: int,
    fan_in: int,
    k: int,
    chunk: int,
    ridge: float,
    collinear: bool,
    seed: int,
):
    """``ridge_solve`` accumulating ``chunk`` examples at a time equals the direct
    float64 solution of ``min ||A X - T^T||^2 + lam ||X||^2`` with
    ``lam = ridge * trace(A^T A) / fan_in``, by ``numpy.linalg.lstsq`` on
    ``[A; sqrt(lam) I] X = [T^T; 0]``, and its own unchunked solution; it reads
    every example once and warns exactly when rows are fewer than unknowns."""
    rng = np.random.default_rng(seed)
    rows_total = n * per_example
    a = rng.normal(size=(rows_total, fan_in)) * rng.uniform(0.1, 10.0, size=fan_in)
    if collinear and fan_in > 1:
        a[:, -1] = 2.0 * a[:, 0]  # a singular Gram matrix: only the ridge term decides
    t = rng.normal(size=(k, rows_total))
    a_t, t_t = torch.from_numpy(a), torch.from_numpy(t)
    read: list[tuple[int, int]] = []

    def rows(sl: slice) -> torch.Tensor:
        read.append((sl.start, min(sl.stop, n)))
        return a_t[sl.start * per_example : min(sl.stop, n) * per_example]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol = ridge_solve(rows, t_t, n, ridge, chunk=chunk).numpy()
        whole = ridge_solve(rows, t_t, n, ridge, chunk=n).numpy()
    underdetermined = [w for w in caught if "underdetermined" in str(w.message)]
    assert len(underdetermined) == (2 if rows_total < fan_in else 0)
    chunks = math.ceil(n / chunk)
    assert read[:chunks] == [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    assert read[chunks:] == [(0, n)]

    lam = ridge * np.trace(a.T @ a) / fan_in
    stacked = np.vstack([a, math.sqrt(lam) * np.eye(fan_in)])
    rhs = np.vstack([t.T, np.zeros((fan_in, k))])
    ref = np.linalg.lstsq(stacked, rhs, rcond=None)[0]
    assert sol.shape == ref.shape == (fan_in, k)
    size = max(1.0, np.abs(ref).max())
    assert np.abs(sol - ref).max() <= 1e-6 * size
    assert np.abs(sol - whole).max() <= 1e-9 * size


# --- 4. neuron grouping against brute force --------------------------------------------------


@st.composite
def neuron_sets(
    draw: st.DrawFn, n_sets: int, n: int, dim: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n_sets`` sets of ``n`` neurons in ``dim`` dimensions, and their weights."""
    points = [
        draw(hnp.arrays(np.float64, (n, dim), elements=COORDINATES))
        for _ in range(n_sets)
    ]
    weights = [
        draw(hnp.arrays(np.float64, (n,), elements=WEIGHTS)) for _ in range(n_sets)
    ]
    return points, weights


@PROPERTY
@given(
    shape=st.tuples(st.integers(2, 3), st.integers(1, 5), st.integers(1, 4)).flatmap(
        lambda s: neuron_sets(*s)
    )
)
def test_hf_matching_is_the_brute_force_optimal_matching(
    shape: tuple[list[np.ndarray], list[np.ndarray]],
):
    """``hf_groups`` matches each model's neurons to model 0's with the least
    pair cost (each pair's weighted spread about its weighted centroid), the
    minimum over every permutation (``itertools.permutations``); the clustering
    error that ``cost_decomposition`` reports for its groups is that of the
    groups recomputed from the definition."""
    mats, weights = shape
    labels = hf_groups(mats, weights)
    n = len(mats[0])
    assert labels.shape == (len(mats) * n,)
    np.testing.assert_array_equal(labels[:n], np.arange(n))
    for j in range(1, len(mats)):
        own = labels[j * n : (j + 1) * n]
        assert sorted(own.tolist()) == list(
            range(n)
        )  # one partner per neuron of model 0
        perm = np.argsort(own)  # group i holds a_i and b_perm[i]
        got = matching_cost(mats[0], mats[j], weights[0], weights[j], perm)
        best = min(
            matching_cost(mats[0], mats[j], weights[0], weights[j], p)
            for p in itertools.permutations(range(n))
        )
        tol = 1e-9 * scale_of(
            np.vstack([mats[0], mats[j]]), np.concatenate([weights[0], weights[j]])
        )
        assert got <= best + tol
    points, w = np.vstack(mats), np.concatenate(weights)
    reported = cost_decomposition(points, w, labels, np.zeros((n, points.shape[1])))
    expected = clustering_cost(points, w, labels, n)
    assert abs(reported["clustering"] - expected) <= 1e-9 * scale_of(points, w)


@PROPERTY
@given(
    problem=st.tuples(st.integers(2, 6), st.integers(1, 10)).flatmap(
        lambda s: st.tuples(
            neuron_sets(1, *s),
            st.integers(1, min(3, s[0])),
            st.booleans(),
            st.integers(0, 3),
        )
    )
)
def test_kmeans_grouping_cost_is_reported_and_at_least_the_brute_force_minimum(
    problem: tuple[tuple[list[np.ndarray], list[np.ndarray]], int, bool, int],
):
    """``kmeans_groups`` (k-means with restarts, or from the first ``k`` points)
    returns ``k`` non-empty groups whose clustering error, recomputed from the
    definition, is the one ``cost_decomposition`` reports, is no lower than the
    minimum over all ``k^n`` assignments (brute force), and is a fixed point of
    Lloyd's iteration: every point is nearest to its own group's weighted mean
    (which ``weighted_centroids`` gives). The rows k-means runs on
    (``isometric_rows``, fewer coordinates than ``D`` when ``D > n``) keep every
    pairwise distance (reference: ``scipy.spatial.distance.pdist``)."""
    (mats, weights), k, init_first, seed = problem
    points, w = mats[0], weights[0]
    assume(len(np.unique(points, axis=0)) >= k)  # k distinct points for k groups
    rows = isometric_rows(points)
    assert rows.shape == (len(points), min(points.shape))
    np.testing.assert_allclose(
        pdist(rows), pdist(points), atol=1e-9 * (1.0 + (points**2).sum(1).max())
    )
    labels = kmeans_groups(points, w, k, init_first=init_first, seed=seed)
    assert labels.shape == (len(points),)
    assert sorted(set(labels.tolist())) == list(range(k))
    scale = scale_of(points, w)
    cost = clustering_cost(points, w, labels, k)
    centres = weighted_means(points, w, labels, k)
    np.testing.assert_allclose(
        weighted_centroids(points, w, labels, k).numpy(), centres, atol=1e-12
    )
    assert (
        abs(cost_decomposition(points, w, labels, centres)["clustering"] - cost)
        <= 1e-9 * scale
    )
    assert cost >= brute_force_minimum(points, w, k) - 1e-9 * scale
    sq = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(2)
    own = sq[np.arange(len(points)), labels]
    assert (own <= sq.min(1) + 1e-9 * (1.0 + (points**2).sum(1).max())).all()
    if init_first:  # KF's rule: start at model 0's neurons when k is its width
        kf = group_labels(
            torch.from_numpy(points), [k, len(points) - k], w, k, "kf", seed=seed
        )
        np.testing.assert_array_equal(kf, labels)


@PROPERTY
@given(
    problem=st.tuples(st.integers(1, 6), st.integers(1, 4)).flatmap(
        lambda s: st.tuples(
            neuron_sets(1, *s),
            st.lists(st.integers(0, s[0] - 1), min_size=s[0], max_size=s[0]),
            hnp.arrays(np.float64, (s[0], s[1]), elements=COORDINATES),
        )
    )
)
def test_cost_decomposition_parts_are_their_definitions(
    problem: tuple[tuple[list[np.ndarray], list[np.ndarray]], list[int], np.ndarray],
):
    """``cost_decomposition`` reports ``sum_i w_i ||a_i - F_c(i)||^2``, the clustering
    error about the weighted centroids and ``sum_k W_k ||T_k - F_k||^2``, each
    recomputed here from its definition, and cost = clustering + approximation."""
    (mats, weights), raw_labels, fused_all = problem
    points, w = mats[0], weights[0]
    used = sorted(set(raw_labels))
    labels = np.array([used.index(v) for v in raw_labels])  # groups 0..k-1, none empty
    k = len(used)
    fused = fused_all[:k]
    parts = cost_decomposition(points, w, labels, fused)
    cost = float((w * ((points - fused[labels]) ** 2).sum(1)).sum())
    centres = weighted_means(points, w, labels, k)
    group_w = np.array([w[labels == c].sum() for c in range(k)])
    approximation = float((group_w * ((centres - fused) ** 2).sum(1)).sum())
    scale = scale_of(points, w) + scale_of(fused, np.ones(k)) * w.sum()
    assert abs(parts["cost"] - cost) <= 1e-9 * scale
    assert (
        abs(parts["clustering"] - clustering_cost(points, w, labels, k)) <= 1e-9 * scale
    )
    assert abs(parts["approximation"] - approximation) <= 1e-9 * scale
    assert (
        abs(parts["cost"] - parts["clustering"] - parts["approximation"])
        <= 1e-9 * scale
    )


# --- 5. a model fused with copies of itself is returned --------------------------------------

Fusion = Callable[[list[nn.Module], torch.Tensor, torch.Tensor], nn.Module]
SELF_FUSIONS: dict[str, Fusion] = {
    "hf_linear": lambda ms, x, y: fuse(ms, x, y, "hf", "linear", progress=False).model,
    "kf_linear": lambda ms, x, y: fuse(ms, x, y, "kf", "linear", progress=False).model,
    "hf_gradient": lambda ms, x, y: (
        fuse(ms, x, y, "hf", "gradient", progress=False).model
    ),
    "kf_gradient": lambda ms, x, y: (
        fuse(ms, x, y, "kf", "gradient", progress=False).model
    ),
    "averaging": lambda ms, x, y: averaging(ms),
    "ensemble": lambda ms, x, y: Ensemble(ms),
    "otfusion_activation": lambda ms, x, y: otfusion(ms, x, cost="activation"),
    "otfusion_weight": lambda ms, x, y: otfusion(ms, None, cost="weight"),
    "rebasin_wm": lambda ms, x, y: rebasin_weight_matching(ms),
    "rebasin_am": lambda ms, x, y: rebasin_activation_matching(ms, x),
}
"""Each fusion method of :mod:`wslib.fusion.hfkf` and :mod:`wslib.fusion.baselines`."""


def correlation_ties(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether two neurons of a hidden layer have perfectly correlated post-ReLU
    activations on ``x`` (standardised rows within 1e-3; two dead neurons too).

    Activation matching sees neurons only through these correlations: tied
    neurons may be matched to each other's copies, and their average is a
    different neuron.
    """
    h = x.flatten(1).double()
    linears = cast(Sequence[nn.Linear], model.linears)
    for layer in linears[:-1]:
        h = F.relu(h @ layer.weight.double().T + layer.bias.double())
        rows = (h - h.mean(0)).T
        rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
        gaps = torch.cdist(rows, rows) + 2 * torch.eye(len(rows), dtype=rows.dtype)
        if bool((gaps < 1e-3).any()):
            return True
    return False


@pytest.mark.parametrize("method", list(SELF_FUSIONS))
@settings(max_examples=10, deadline=None, database=None)
@given(
    widths=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    n_in=st.integers(1, 5),
    n_classes=st.integers(2, 3),
    copies=st.integers(2, 3),
    n=st.integers(6, 24),
    seed=st.integers(0, 2**16),
)
def test_fusing_a_model_with_copies_of_itself_returns_its_function(
    method: str,
    widths: list[int],
    n_in: int,
    n_classes: int,
    copies: int,
    n: int,
    seed: int,
):
    """Every fusion method, given ``copies`` copies of one random MLP, returns the
    model's own function (reference: the model itself; the ensemble: its
    log-softmax) on fresh inputs, to 1e-5 of the outputs' size.

    Activation matching is checked only on models whose neurons it can tell
    apart (:func:`correlation_ties`): it found tied neurons swapped, e.g. a
    4-4 MLP on 6 examples whose neurons fire on one example only."""
    model = seeded_model(mlp(widths, in_shape=[1, n_in], n_classes=n_classes), seed)
    x, y = toy_tensors(n, [1, n_in], n_classes, seed=seed, labels="cyclic")
    assume(method != "rebasin_am" or not correlation_ties(model, x))
    x_test, _ = toy_tensors(32, [1, n_in], n_classes, seed=seed + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fusion sets smaller than a fan-in warn
        fused = SELF_FUSIONS[method](
            [copy.deepcopy(model) for _ in range(copies)], x, y
        )
    with torch.no_grad():
        expected = model(x_test)
        if method == "ensemble":
            expected = F.log_softmax(expected, 1)
        got = fused.eval()(x_test)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-5 * (1.0 + expected.abs().max())
