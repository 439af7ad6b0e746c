"""HF/KF grouping on the models' device: exact distances, same groups, small host copies.

The grouping sees the activations (``neurons x (examples x positions)``,
about a million columns per neuron at chapter 10's gpu scale) only through
matrix products on the device; the host gets per-neuron matrices for SciPy's
Hungarian solver and scikit-learn's k-means.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from sklearn.cluster import KMeans

from tests.devicecheck import DEVICE, DeviceDiscipline, to_device
from tests.test_device_discipline import CNN2D, MLP, RESNET, stand_in_data, trained
from wslib.fusion import grouping
from wslib.fusion.grouping import isometric_rows, kmeans_groups
from wslib.fusion.hfkf import fuse


def _clustered(n_groups: int, per_group: int, columns: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    centres = rng.normal(0, 3, (n_groups, columns))
    noise = rng.normal(0, 1, (n_groups * per_group, columns))
    return np.repeat(centres, per_group, 0) + noise


@pytest.mark.parametrize("columns", [7, 500])
def test_isometric_rows_keep_every_distance(
    columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grouping, "_GRAM_COLUMNS", 64)  # several blocks of columns
    points = _clustered(4, 5, columns) + 100.0  # far from the origin
    rows = isometric_rows(points)
    assert rows.shape == (20, min(20, columns))
    np.testing.assert_allclose(pdist(rows), pdist(points), rtol=1e-9)


@pytest.mark.parametrize("init_first", [False, True])
def test_kmeans_finds_the_groups_of_kmeans_on_the_points(init_first: bool) -> None:
    points = _clustered(6, 4, 300) + 50.0  # far from the origin
    order = np.random.default_rng(0).permutation(len(points))
    points = points[order]  # the first six points are not one per group
    weights = np.random.default_rng(1).uniform(0.5, 2, len(points))
    direct = KMeans(
        6,
        init=points[:6] if init_first else "k-means++",
        n_init=1 if init_first else 4,
        random_state=5,
        tol=0.0,
        max_iter=300,
    ).fit(points, sample_weight=weights)
    got = kmeans_groups(points, weights, 6, init_first=init_first, seed=5)
    np.testing.assert_array_equal(got, direct.labels_)


@pytest.mark.parametrize("centroids", ["scatter", "product"])
@pytest.mark.parametrize(
    "config, method",
    [(MLP, "hf"), (MLP, "kf"), (RESNET, "hf"), (RESNET, "kf")],
)
def test_only_per_neuron_matrices_leave_the_device(
    config: dict, method: str, centroids: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the stand-in GPU, what the grouping copies to the host comes from the
    device and has no more columns than rows (neurons), whatever the fusion set's size.

    The stand-in is a CPU device, so ``"product"`` routes the centroids
    through the sum that non-CPU devices use.
    """
    if centroids == "product":
        monkeypatch.setattr(grouping, "_scatter_centroids", grouping._product_centroids)
    ds = stand_in_data()
    models = [trained(config, s, ds).eval() for s in (0, 1)]
    copies: list[tuple[bool, tuple[int, ...]]] = []
    original = grouping.to_host

    def spy(value: torch.Tensor) -> np.ndarray:
        copies.append((value.device == DEVICE, tuple(value.shape)))
        return original(value)

    monkeypatch.setattr(grouping, "to_host", spy)
    with DeviceDiscipline():
        on_dev = [to_device(copy.deepcopy(m)) for m in models]
        fuse(on_dev, ds.x_train, ds.y_train, method, progress=False)
    assert copies
    assert all(on_device for on_device, _ in copies), copies
    assert all(shape[1] <= shape[0] for _, shape in copies), copies


def test_both_centroid_sums_agree() -> None:
    """The CPU's scatter-add and the product used on other devices give the same centroids."""
    rng = np.random.default_rng(4)
    points = torch.from_numpy(rng.standard_normal((30, 50)))
    weights, labels = rng.uniform(0.1, 2, 30), rng.integers(0, 6, 30)
    total = np.bincount(labels, weights, minlength=6)
    scatter = grouping._scatter_centroids(points, weights, labels, total)
    product = grouping._product_centroids(points, weights, labels, total)
    torch.testing.assert_close(scatter, product, rtol=1e-12, atol=1e-12)
    expected = np.stack(
        [
            np.average(points.numpy()[labels == g], 0, weights[labels == g])
            for g in range(6)
        ]
    )
    np.testing.assert_allclose(scatter.numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize(
    "config, grouping, importance",
    [(MLP, "hf", "uniform"), (MLP, "kf", "conductance"), (CNN2D, "kf", "uniform")],
)
def test_chain_fusion_makes_no_tensor_off_the_models_device(
    config: dict, grouping: str, importance: str
) -> None:
    """With the default device set to 'meta', a tensor made without a device breaks the fusion.

    (A reader's ``torch.set_default_device("cuda")`` would do the same to
    CPU-resident data.) The fused weights must equal those of a plain run.
    """
    ds = stand_in_data(config["in_shape"])
    models = [trained(config, s, ds).eval() for s in (0, 1)]
    kwargs = {"grouping": grouping, "importance": importance, "progress": False}
    plain = fuse(copy.deepcopy(models), ds.x_train, ds.y_train, **kwargs).model
    with torch.device("meta"):
        fused = fuse(models, ds.x_train, ds.y_train, **kwargs).model
    for (key, a), b in zip(plain.state_dict().items(), fused.state_dict().values()):
        assert torch.equal(a, b), key


def test_hungarian_groups_minimise_the_merge_cost_by_brute_force() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(5, 9)), rng.normal(size=(5, 9)) + 0.3
    wa, wb = rng.uniform(0.2, 3, 5), rng.uniform(0.2, 3, 5)
    sq = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    cost = wa[:, None] * wb[None, :] / (wa[:, None] + wb[None, :]) * sq
    best = min(itertools.permutations(range(5)), key=lambda p: cost[range(5), p].sum())
    labels = grouping.hungarian_groups(a, b, wa, wb)
    partner = np.empty(5, dtype=int)
    partner[labels[5:]] = np.arange(5)  # a_i's partner in b
    assert tuple(partner) == best
    torch.testing.assert_close(
        grouping.squared_distances(torch.from_numpy(a), torch.from_numpy(b)),
        torch.from_numpy(sq),
    )


def test_cost_decomposition_over_several_blocks_of_rows() -> None:
    """More neurons than one block of rows: every row counts."""
    rng = np.random.default_rng(6)
    points = rng.normal(size=(3 * grouping._COST_ROWS + 5, 11))
    weights, labels = rng.uniform(0.5, 2, len(points)), rng.integers(0, 7, len(points))
    fused = rng.normal(size=(7, 11))
    targets = np.stack(
        [np.average(points[labels == g], 0, weights[labels == g]) for g in range(7)]
    )
    group_w = np.bincount(labels, weights, minlength=7)
    expected = {
        "cost": (weights * ((points - fused[labels]) ** 2).sum(1)).sum(),
        "clustering": (weights * ((points - targets[labels]) ** 2).sum(1)).sum(),
        "approximation": (group_w * ((targets - fused) ** 2).sum(1)).sum(),
    }
    got = grouping.cost_decomposition(points, weights, labels, fused)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_chain_grouping_sees_float64_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU (and CUDA) the grouping's distances and centroids are float64."""
    from wslib.fusion import hfkf

    ds = stand_in_data()
    models = [trained(MLP, s, ds).eval() for s in (0, 1)]
    dtypes: list[torch.dtype] = []
    original = hfkf.group_labels

    def spy(points: torch.Tensor, *args, **kwargs) -> np.ndarray:
        dtypes.append(points.dtype)
        return original(points, *args, **kwargs)

    monkeypatch.setattr(hfkf, "group_labels", spy)
    fuse(models, ds.x_train, ds.y_train, "kf", progress=False)
    assert dtypes and set(dtypes) == {torch.float64}


def test_cpu_centroids_are_the_sums_of_np_add_at_bit_for_bit() -> None:
    """The cpu book's numbers rest on it: the earlier numpy centroids, exactly."""
    rng = np.random.default_rng(7)
    points = rng.normal(size=(40, 300))
    weights, labels = rng.uniform(0.1, 2, 40), rng.integers(0, 5, 40)
    sums = np.zeros((5, 300))
    np.add.at(sums, labels, weights[:, None] * points)
    expected = sums / np.bincount(labels, weights, minlength=5)[:, None]
    got = grouping.weighted_centroids(points, weights, labels, 5).numpy()
    assert np.array_equal(got, expected)
