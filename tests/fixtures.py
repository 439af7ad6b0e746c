"""Test data shared by several test packages: one tiny CIFAR-format writer."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def _pickle(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def cifar_batch(rng: np.random.Generator, n: int, label_keys: dict[str, int]) -> dict:
    """One batch in CIFAR's pickle format: random pixels, cyclic labels (every class appears)."""
    batch = {
        "batch_label": "test fixture",
        "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        "filenames": [f"img_{i}.png" for i in range(n)],
    }
    offset = int(rng.integers(0, 100))
    batch.update(
        {key: ((np.arange(n) + offset) % k).tolist() for key, k in label_keys.items()}
    )
    return batch


def write_cifar10(
    folder: Path, rng: np.random.Generator, n_train: int = 3, n_test: int = 4
) -> tuple[list[dict], dict]:
    """CIFAR-10 files under ``folder``: 5 training batches of ``n_train`` images, one test batch."""
    base = folder / "cifar-10-batches-py"
    train = [cifar_batch(rng, n_train, {"labels": 10}) for _ in range(5)]
    for i, batch in enumerate(train, start=1):
        _pickle(base / f"data_batch_{i}", batch)
    test = cifar_batch(rng, n_test, {"labels": 10})
    _pickle(base / "test_batch", test)
    _pickle(base / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    return train, test


def write_cifar100(folder: Path, rng: np.random.Generator) -> tuple[list[dict], dict]:
    """CIFAR-100 files under ``folder``: one training and one test batch."""
    base = folder / "cifar-100-python"
    keys = {"fine_labels": 100, "coarse_labels": 20}
    train, test = cifar_batch(rng, 9, keys), cifar_batch(rng, 5, keys)
    _pickle(base / "train", train)
    _pickle(base / "test", test)
    meta = {
        "fine_label_names": [f"f{i}" for i in range(100)],
        "coarse_label_names": [f"c{i}" for i in range(20)],
    }
    _pickle(base / "meta", meta)
    return [train], test
