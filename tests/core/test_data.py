"""Tests of wslib.core.data: loaders (on small files in the real on-disk formats) and splits."""

from __future__ import annotations

import importlib.metadata
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from bookkit import synthetic_data
from tests.fixtures import write_cifar10, write_cifar100
from wslib.core import data
from wslib.core.data import (
    DATASETS,
    DataMissingError,
    Dataset,
    balanced_subset,
    class_counts,
    dirichlet_split,
    iid_split,
    load_dataset,
    shard_split,
    subset,
)


def _assert_standardised_dataset(
    ds: Dataset, n_train: int, n_test: int, shape: tuple
) -> None:
    assert ds.x_train.shape == (n_train, *shape)
    assert ds.x_test.shape == (n_test, *shape)
    assert ds.in_shape == shape
    assert ds.x_train.dtype == ds.x_test.dtype == torch.float32
    assert ds.y_train.dtype == ds.y_test.dtype == torch.int64
    dims = [d for d in range(ds.x_train.ndim) if d != 1]
    std, mean = torch.std_mean(ds.x_train, dim=dims)
    assert torch.allclose(mean, torch.zeros_like(mean), atol=1e-4)
    assert torch.allclose(std, torch.ones_like(std), atol=1e-4)


# --------------------------------------------------------------------------- mnist1d


def test_mnist1d_shapes_determinism_and_cache(tmp_path, monkeypatch):
    ds = load_dataset("mnist1d", root=tmp_path, num_samples=500, seed=3)
    _assert_standardised_dataset(ds, 400, 100, (1, 40))
    assert ds.n_classes == 10
    assert set(ds.y_train.tolist()) == set(range(10))

    (cache,) = (tmp_path / "mnist1d").glob("*.npz")
    version = importlib.metadata.version("mnist1d")
    args = json.loads((tmp_path / "mnist1d" / f"defaults-{version}.json").read_text())
    args.update(num_samples=500, seed=3)
    assert cache == data._mnist1d_cache_path(tmp_path / "mnist1d", args, version)
    mtime = cache.stat().st_mtime_ns

    import mnist1d.data

    def fail(*args, **kwargs):
        raise AssertionError("regenerated despite the cache")

    monkeypatch.setattr(mnist1d.data, "make_dataset", fail)
    again = load_dataset("mnist1d", root=tmp_path, num_samples=500, seed=3)
    assert cache.stat().st_mtime_ns == mtime
    assert torch.equal(ds.x_train, again.x_train) and torch.equal(
        ds.y_test, again.y_test
    )


def test_mnist1d_generation_is_deterministic_and_seeded(tmp_path):
    a = load_dataset("mnist1d", root=tmp_path / "a", num_samples=200, seed=3)
    b = load_dataset("mnist1d", root=tmp_path / "b", num_samples=200, seed=3)
    c = load_dataset("mnist1d", root=tmp_path / "a", num_samples=200, seed=4)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_train, c.x_train)
    assert len(list((tmp_path / "a" / "mnist1d").glob("*.npz"))) == 2


def test_mnist1d_leaves_global_rng_alone(tmp_path):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    load_dataset("mnist1d", root=tmp_path, num_samples=100)
    assert np.random.rand() == expected


# --------------------------------------------------------------------------- digits


def test_digits_shapes_and_stratified_split():
    ds = load_dataset("digits", test_fraction=0.2, seed=0)
    _assert_standardised_dataset(ds, 1437, 360, (1, 8, 8))
    assert ds.n_classes == 10
    train = class_counts(ds.y_train, np.arange(len(ds.y_train)), 10)
    test = class_counts(ds.y_test, np.arange(len(ds.y_test)), 10)
    total = train + test
    assert np.all(np.abs(test - 0.2 * total) <= 1)
    again = load_dataset("digits", test_fraction=0.2, seed=0)
    assert torch.equal(ds.x_test, again.x_test)


def test_unknown_name():
    with pytest.raises(ValueError, match="cifar100"):
        load_dataset("imagenet")
    assert "mnist1d" in DATASETS


# --------------------------------------------------------------------------- torchvision formats


def _write_idx(path: Path, array: np.ndarray) -> None:
    """IDX file: magic (0, 0, 0x08 = uint8, ndim), big-endian int32 dims, then the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(
        f">{array.ndim}i", *array.shape
    )
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _write_mnist_like(
    folder: Path, rng: np.random.Generator, n_train: int, n_test: int
) -> dict:
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        _write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
        arrays[prefix] = (images, labels)
    return arrays


@pytest.mark.parametrize(
    "name, cls_name", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")]
)
def test_mnist_like_from_idx_files(tmp_path, name, cls_name):
    rng = np.random.default_rng(0)
    arrays = _write_mnist_like(tmp_path / name / cls_name / "raw", rng, 12, 7)
    ds = load_dataset(name, root=tmp_path)
    _assert_standardised_dataset(ds, 12, 7, (1, 28, 28))
    assert ds.n_classes == 10
    assert ds.y_train.tolist() == arrays["train"][1].tolist()
    assert ds.y_test.tolist() == arrays["t10k"][1].tolist()
    raw = torch.as_tensor(arrays["train"][0]).float()[:, None] / 255
    expected = (raw - raw.mean()) / raw.std(correction=1)
    assert torch.allclose(ds.x_train, expected, atol=1e-5)


@pytest.mark.parametrize(
    "name, writer, label_key, n_classes",
    [
        ("cifar10", write_cifar10, "labels", 10),
        ("cifar100", write_cifar100, "fine_labels", 100),
    ],
)
def test_cifar_from_pickle_batches(tmp_path, name, writer, label_key, n_classes):
    train, test = writer(tmp_path / name, np.random.default_rng(1))
    ds = load_dataset(name, root=tmp_path)
    n_train = sum(len(b[label_key]) for b in train)
    _assert_standardised_dataset(ds, n_train, len(test[label_key]), (3, 32, 32))
    assert ds.n_classes == n_classes
    assert ds.y_train.tolist() == [y for b in train for y in b[label_key]]
    assert ds.y_test.tolist() == test[label_key]
    # Rows are 1024 red, 1024 green, 1024 blue pixels, each plane row-major.
    raw = np.concatenate([b["data"] for b in train]).reshape(-1, 3, 32, 32)
    raw = torch.as_tensor(raw).float() / 255
    std, mean = torch.std_mean(raw, dim=(0, 2, 3), keepdim=True)
    assert torch.allclose(ds.x_train, (raw - mean) / std, atol=1e-5)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100"])
def test_missing_files_raise_data_missing_error(tmp_path, name):
    with pytest.raises(DataMissingError) as info:
        load_dataset(name, root=tmp_path)
    message = str(info.value)
    assert name in message
    assert str(tmp_path / name) in message
    assert "download=True" in message
    assert f"torchvision.datasets.{data._TORCHVISION_CLASS[name]}(" in message
    assert (
        info.value.__context__ is None or info.value.__suppress_context__
    )  # no deep trace
    assert isinstance(info.value, FileNotFoundError)


# --------------------------------------------------------------------------- splits


def _labels(n_classes: int = 10, per_class: int = 100, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(
        np.repeat(np.arange(n_classes), per_class)
    )


def _assert_partition(parts: list[np.ndarray], n: int) -> None:
    for part in parts:
        assert np.all(np.diff(part) > 0)  # sorted, no repeats
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


SPLITS = {
    "iid": lambda y, seed: iid_split(y, 7, seed),
    "dirichlet": lambda y, seed: dirichlet_split(y, 7, 0.5, seed),
    "shard": lambda y, seed: shard_split(y, 4, seed),
}


@pytest.mark.parametrize("kind", SPLITS)
def test_splits_are_deterministic_partitions(kind):
    y = _labels()
    split = SPLITS[kind]
    parts = split(y, 0)
    _assert_partition(parts, len(y))
    assert all(np.array_equal(a, b) for a, b in zip(parts, split(y, 0)))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, split(y, 1)))
    assert all(
        np.array_equal(a, b) for a, b in zip(parts, split(torch.as_tensor(y), 0))
    )


def test_iid_split_sizes():
    parts = iid_split(_labels(), 7, seed=0)
    assert {len(p) for p in parts} <= {142, 143}


def test_shard_split_disjoint_classes():
    y = _labels()
    parts = shard_split(y, 4, seed=0)
    classes = [set(np.unique(y[p]).tolist()) for p in parts]
    assert sorted(len(c) for c in classes) == [2, 2, 3, 3]
    assert set().union(*classes) == set(range(10))
    assert sum(len(c) for c in classes) == 10
    for part, cls in zip(parts, classes):
        assert len(part) == 100 * len(cls)
    with pytest.raises(ValueError, match="classes"):
        shard_split(y, 11, seed=0)


def test_dirichlet_alpha_controls_skew():
    y = _labels(per_class=500)
    n_parts = 5

    def proportions(alpha: float) -> np.ndarray:
        parts = dirichlet_split(y, n_parts, alpha, seed=0)
        counts = np.stack([class_counts(y, p, 10) for p in parts])  # (part, class)
        return counts / counts.sum(axis=0, keepdims=True)

    assert np.abs(proportions(1e4) - 1 / n_parts).max() < 0.03
    skewed = proportions(0.05)
    assert skewed.max(axis=0).mean() > 0.8


def test_balanced_subset_exact_counts_and_errors():
    y = _labels()
    idx = balanced_subset(y, 7, seed=0)
    assert np.array_equal(class_counts(y, idx, 10), np.full(10, 7))
    assert np.all(np.diff(idx) > 0)
    assert np.array_equal(idx, balanced_subset(y, 7, seed=0))

    pool = iid_split(y, 4, seed=0)[1]
    from_pool = balanced_subset(y, 5, seed=0, indices=pool)
    assert set(from_pool.tolist()) <= set(pool.tolist())
    assert np.array_equal(class_counts(y, from_pool, 10), np.full(10, 5))

    short_y = y.copy()
    short_y[np.flatnonzero(y == 3)[2:]] = 4  # class 3 keeps only 2 examples
    with pytest.raises(ValueError, match=r"\{3: 2\}"):
        balanced_subset(short_y, 5, seed=0)


def test_class_counts_and_subset():
    ds = load_dataset("digits")
    idx = balanced_subset(ds.y_train, 3, seed=1)
    small = subset(ds, idx)
    assert small.x_train.shape == (30, 1, 8, 8)
    assert np.array_equal(
        class_counts(small.y_train, np.arange(30), 10), np.full(10, 3)
    )
    assert torch.equal(small.x_train, ds.x_train[torch.as_tensor(idx)])
    assert small.x_test is ds.x_test and small.n_classes == 10


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda y: iid_split(y, 0, 0), "n_parts"),
        (lambda y: iid_split(y, 10_000, 0), "n_parts"),
        (lambda y: dirichlet_split(y, 0, 1.0, 0), "n_parts"),
        (lambda y: dirichlet_split(y, 3, 0.0, 0), "alpha"),
        (lambda y: dirichlet_split(y, 3, -1.0, 0), "alpha"),
        (lambda y: shard_split(y, 0, 0), "n_parts"),
        (lambda y: balanced_subset(y, 0, 0), "per_class"),
        (lambda y: iid_split(y.reshape(10, -1), 2, 0), "1-D"),
    ],
)
def test_split_argument_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(_labels())


def test_download_rejects_offline_sets() -> None:
    with pytest.raises(ValueError, match="generated or bundled offline"):
        data.download_dataset("mnist1d")


def test_synthetic_stand_ins_are_marked_and_loading_them_warns(tmp_path) -> None:
    """The gpu-smoke files can never pass for the real data sets silently."""

    synthetic_data.write_all(tmp_path)
    with pytest.warns(UserWarning, match="synthetic stand-in files"):
        ds = load_dataset("cifar10", root=tmp_path)
    assert ds.x_train.shape[1:] == (3, 32, 32) and ds.n_classes == 10
    with pytest.raises(FileExistsError, match="already holds"):
        synthetic_data.write_all(tmp_path)


# --- found by mutation testing -----------------------------------------------------------------


def test_a_data_key_carries_the_options_and_the_root(tmp_path: Path) -> None:
    """Two data sets that differ in an option or a folder have different keys."""
    key = data.DataKey.of(
        {"name": "mnist1d", "root": str(tmp_path), "num_samples": 300}
    )
    assert key.options == (("num_samples", 300),)
    assert Path(key.root).resolve() == tmp_path.resolve()
    other = data.DataKey.of({"name": "mnist1d", "root": str(tmp_path / "b")})
    assert other.root != key.root and other.options == ()


def test_a_data_key_given_its_data_set_does_not_read_the_disk(tmp_path: Path) -> None:
    ds = data.Dataset(
        "mnist1d",
        torch.zeros(2, 1),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(1, 1),
        torch.zeros(1, dtype=torch.long),
        10,
    )
    key = data.DataKey.of({"name": "mnist1d", "root": str(tmp_path / "none")}, ds)
    assert key.load() is ds  # a key made without its data set would generate one


def test_the_missing_data_message_names_the_folder(tmp_path: Path) -> None:
    message = data._missing_message("cifar10", tmp_path / "cifar10")
    assert (
        f"torchvision.datasets.CIFAR10({str(tmp_path / 'cifar10')!r}, download=True)"
        in message
    )


def test_download_fetches_both_splits_into_the_data_set_folder(
    tmp_path, monkeypatch
) -> None:
    import torchvision

    calls = []

    class FakeCIFAR10:
        def __init__(self, root: str, train: bool, download: bool) -> None:
            calls.append((root, train, download))

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    folder = data.download_dataset("cifar10", root=tmp_path)
    assert folder == tmp_path / "cifar10"
    assert calls == [(str(folder), True, True), (str(folder), False, True)]
    with pytest.raises(
        ValueError, match=r"\(mnist1d and digits are generated or bundled offline\)"
    ):
        data.download_dataset("mnist1d", root=tmp_path)


def test_split_checks_name_what_is_too_few() -> None:
    y = np.arange(6) % 3
    assert [len(p) for p in data.iid_split(y, 1, 0)] == [6]  # one part is allowed
    assert [len(p) for p in data.iid_split(y, 6, 0)] == [1] * 6  # as many as examples
    assert len(data.shard_split(y, 3, 0)) == 3  # as many parts as classes
    with pytest.raises(
        ValueError, match=r"n_parts=7 exceeds the number of examples \(6\)"
    ):
        data.iid_split(y, 7, 0)
    with pytest.raises(
        ValueError, match=r"n_parts=4 exceeds the number of classes \(3\)"
    ):
        data.shard_split(y, 4, 0)
    with pytest.raises(ValueError, match="n_parts must be >= 1, got 0"):
        data.iid_split(y, 0, 0)


def test_the_test_set_is_standardised_with_the_training_statistics() -> None:
    gen = torch.Generator().manual_seed(0)
    x_train = 3.0 + 2.0 * torch.randn(50, 2, 4, generator=gen)
    x_test = 3.0 + 2.0 * torch.randn(10, 2, 4, generator=gen)
    train, test = data._standardise(x_train, x_test)
    for c in range(2):
        mean, std = x_train[:, c].mean(), x_train[:, c].std()
        torch.testing.assert_close(test[:, c], (x_test[:, c] - mean) / std)
        torch.testing.assert_close(train[:, c], (x_train[:, c] - mean) / std)


def test_a_data_key_loads_its_data_set_once(tmp_path: Path) -> None:
    key = data.DataKey.of(
        {"name": "mnist1d", "root": str(tmp_path), "num_samples": 200}
    )
    first = key.load()
    assert first is key.load()  # read once per process
    direct = data.load_dataset("mnist1d", root=tmp_path, num_samples=200)
    assert first.name == "mnist1d" and torch.equal(first.x_train, direct.x_train)
    assert len(first.y_train) + len(first.y_test) == 200


def test_labels_are_int64_and_a_subset_keeps_the_name_and_test_set(
    tmp_path: Path,
) -> None:
    ds = data.load_dataset("mnist1d", root=tmp_path, num_samples=200)
    assert ds.y_train.dtype == ds.y_test.dtype == torch.int64
    part = data.subset(ds, np.array([3, 1, 2]))
    assert part.name == ds.name and part.y_test is ds.y_test
    assert torch.equal(part.y_train, ds.y_train[[3, 1, 2]])


def test_a_balanced_subset_of_one_per_class_and_of_every_example() -> None:
    y = np.array([0, 0, 1, 1, 2, 2])
    one = data.balanced_subset(y, 1, seed=0)
    assert sorted(y[one].tolist()) == [0, 1, 2]
    every = data.balanced_subset(
        y, 2, seed=0
    )  # a class with exactly per_class examples
    assert sorted(every.tolist()) == list(range(6))
    counts = data.class_counts(torch.tensor(y), [0, 2, 3], 3)
    assert counts.tolist() == [1, 2, 0]
