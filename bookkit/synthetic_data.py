"""Small synthetic CIFAR-10, CIFAR-100, MNIST and Fashion-MNIST files in their real formats.

    bookkit synthetic-data DATA_FOLDER [--force]

The ``gpu-smoke`` profile has the gpu profile's shape (its data sets,
architectures, augmentation and bf16) at a few seconds per chapter. Its data
sets are read by the very readers the gpu profile uses
(:func:`wslib.core.data.load_dataset`): CIFAR's pickled batches
(``cifar-10-batches-py/data_batch_1`` ..., ``cifar-100-python/train``) and
MNIST's IDX files under torchvision's layout (``MNIST/raw/...``). Each class
has its own random template and every image is its template plus noise, so
the models have something to learn. ``make gpu-check`` and the tests write
them into a temporary checkout's ``data/``; they never stand in for the real
data sets of a reader's ``data/``: the writer refuses a folder that already
holds one of them unless ``--force``, and each folder it writes holds a
``SYNTHETIC`` file, so that :func:`~wslib.core.data.load_dataset` warns if
the files are ever read as the real data set.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

from wslib.core.data import SYNTHETIC_MARK

SIZES = {  # data set -> (training, test) examples
    "cifar10": (200, 100),
    "cifar100": (1000, 200),
    "mnist": (300, 100),
    "fashion_mnist": (300, 100),
}
MNIST_FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}


def images(
    rng: np.random.Generator, n: int, n_classes: int, pixels: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 images of ``pixels`` values, class templates plus noise; cyclic labels."""
    labels = np.arange(n) % n_classes
    templates = rng.uniform(40, 215, (n_classes, pixels))
    noisy = templates[labels] + rng.normal(0, 30, (n, pixels))
    return np.clip(noisy, 0, 255).astype(np.uint8), labels


def _pickle(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def write_cifar(root: Path, name: str, seed: int = 0) -> None:
    """CIFAR-10 (5 training batches) or CIFAR-100 under ``root/<name>/``."""
    n_train, n_test = SIZES[name]
    n_classes = 10 if name == "cifar10" else 100
    rng = np.random.default_rng(seed)
    x, y = images(rng, n_train + n_test, n_classes, 3072)
    order = rng.permutation(n_train + n_test)
    x, y = x[order], y[order]
    if name == "cifar10":
        base = root / name / "cifar-10-batches-py"
        per = n_train // 5
        for i in range(5):
            sl = slice(i * per, (i + 1) * per)
            batch = {"data": x[sl], "labels": y[sl].tolist()}
            _pickle(base / f"data_batch_{i + 1}", batch)
        _pickle(
            base / "test_batch", {"data": x[n_train:], "labels": y[n_train:].tolist()}
        )
        _pickle(base / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
        return
    base = root / name / "cifar-100-python"
    for part, sl in (("train", slice(0, n_train)), ("test", slice(n_train, None))):
        batch = {
            "data": x[sl],
            "fine_labels": y[sl].tolist(),
            "coarse_labels": (y[sl] // 5).tolist(),
        }
        _pickle(base / part, batch)
    _pickle(base / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file (MNIST's format): magic (uint8 type, ndim), big-endian sizes, data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, name: str, seed: int = 0) -> None:
    """MNIST or Fashion-MNIST IDX files under ``root/<name>/<Class>/raw/``."""
    n_train, n_test = SIZES[name]
    rng = np.random.default_rng(seed)
    raw = root / name / MNIST_FOLDERS[name] / "raw"
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = images(rng, n, 10, 784)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", x.reshape(n, 28, 28))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)


def write_all(root: str | Path, force: bool = False) -> list[str]:
    """Write every synthetic data set under ``root``; return their names."""
    root = Path(root)
    present = [name for name in SIZES if (root / name).exists()]
    if present and not force:
        raise FileExistsError(
            f"{root} already holds {', '.join(present)}; synthetic files would "
            "replace them: pass another folder (or --force)"
        )
    for name in SIZES:
        (write_cifar if name.startswith("cifar") else write_mnist)(root, name)
        (root / name / SYNTHETIC_MARK).write_text(
            "synthetic stand-in files written by bookkit/synthetic_data.py\n"
        )
    return list(SIZES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="data folder to write into")
    parser.add_argument("--force", action="store_true", help="replace existing sets")
    args = parser.parse_args(argv)
    try:
        names = write_all(args.root, args.force)
    except FileExistsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote synthetic {', '.join(names)} under {args.root}")
    return 0
