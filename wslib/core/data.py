"""Data sets and data splits.

:func:`load_dataset` returns a :class:`Dataset` of standardised tensors for one
of :data:`DATASETS`:

- ``"mnist1d"`` (the book's default): generated offline by the ``mnist1d``
  package and cached as ``.npz`` under ``root/mnist1d/``.
- ``"digits"``: scikit-learn's bundled 8x8 digits.
- ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"``, ``"cifar100"``: read from
  files under ``root/<name>/`` that torchvision downloaded earlier; nothing is
  downloaded here, a missing data set raises :class:`DataMissingError`.

The split functions partition the indices of a label vector (IID, Dirichlet
non-IID, disjoint class shards) or draw a class-balanced subset; every one of
them is deterministic given its ``seed``.
"""

from __future__ import annotations

import importlib.metadata
import json
import pickle
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

import numpy as np
import torch

from wslib.core.files import atomic_write, stable_hash
from wslib.core.workspace import workspace

SYNTHETIC_MARK = (
    "SYNTHETIC"  # a file the synthetic stand-in writer leaves in each folder
)
# The name of a data set :func:`load_dataset` knows (:data:`DATASETS` lists them at run time).
DatasetName = Literal[
    "mnist1d", "digits", "mnist", "fashion_mnist", "cifar10", "cifar100"
]
#: The data sets :func:`load_dataset` knows.
DATASETS: tuple[DatasetName, ...] = get_args(DatasetName)

Labels = np.ndarray | torch.Tensor

_TORCHVISION_CLASS = {
    "mnist": "MNIST",
    "fashion_mnist": "FashionMNIST",
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
}


class DataMissingError(FileNotFoundError):
    """A data set's files are not on disk (they are never downloaded at run time)."""


@dataclass(eq=False)
class Dataset:
    """A train/test pair of standardised inputs and integer labels.

    Attributes
    ----------
    name : str
        Name of the data set (one of :data:`DATASETS`).
    x_train, x_test : torch.Tensor
        Inputs, float32, shape ``(N, C, ...)``.
    y_train, y_test : torch.Tensor
        Labels, int64, shape ``(N,)``.
    n_classes : int
        Number of classes.
    """

    name: str
    x_train: torch.Tensor = field(repr=False)
    y_train: torch.Tensor = field(repr=False)
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    n_classes: int

    @property
    def in_shape(self) -> tuple[int, ...]:
        """Shape of one input example, without the batch dimension."""
        return tuple(self.x_train.shape[1:])


def load_dataset(
    name: DatasetName, *, root: str | Path | None = None, **options
) -> Dataset:
    """Load a data set as standardised tensors.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`.
    root : str or Path, optional
        Data folder; data set ``name`` lives in ``root/name/``. Default: the
        workspace's ``data/`` (:mod:`wslib.core.workspace`); a relative
        folder is taken under the workspace's root.
    **options
        ``"mnist1d"``: ``num_samples`` (package default 5000: 4000 train, 1000 test)
        and ``seed`` of the generator (package default 42), see ``_load_mnist1d``.
        ``"digits"``: ``test_fraction`` (default 0.2) and ``seed`` of the
        stratified split (default 0), see ``_load_digits``.
        The torchvision data sets take none.

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        If ``name`` is not in :data:`DATASETS`.
    DataMissingError
        If a torchvision data set's files are not under ``root/name/``.
    """
    root = _data_root(root)
    if (root / name / SYNTHETIC_MARK).exists():
        warnings.warn(
            f"{root / name} holds synthetic stand-in files (bookkit/synthetic_data.py), "
            "not the real data set: numbers from it mean nothing; replace them with "
            f"make data DATA={name}",
            UserWarning,
            stacklevel=2,
        )
    if name == "mnist1d":
        return _load_mnist1d(root, **options)
    if name == "digits":
        return _load_digits(**options)
    if name in ("mnist", "fashion_mnist"):
        return _load_mnist_like(name, root, **options)
    if name in ("cifar10", "cifar100"):
        return _load_cifar(name, root, **options)
    raise ValueError(f"unknown data set {name!r}; choose one of {DATASETS}")


def _data_root(root: str | Path | None) -> Path:
    """The absolute data folder: the workspace's ``data/`` or ``root`` under its root."""
    ws = workspace()
    return ws.data if root is None else ws.path(root)


@dataclass(frozen=True)
class DataKey:
    """A data set named by its :func:`load_dataset` arguments, loaded once per process.

    What a job sent to a worker process carries instead of the tensors (a
    pickled :class:`Dataset` would travel through shared memory, the whole of
    CIFAR-10 for each worker: about 740 MB, where a container's ``/dev/shm``
    holds 64 MB by default). ``root`` is absolute, so a worker finds the files
    whatever its working directory.
    """

    name: DatasetName
    root: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, data: dict[str, Any], ds: Dataset | None = None) -> DataKey:
        """The key of ``load_dataset(**data)``; ``ds``, when given, is that data set."""
        options = {k: v for k, v in data.items() if k not in ("name", "root")}
        root = str(_data_root(data.get("root")))
        key = cls(data["name"], root, tuple(sorted(options.items())))
        if ds is not None:
            _LOADED[key] = ds
        return key

    def load(self) -> Dataset:
        """The data set (read from disk on the first call in this process)."""
        if self not in _LOADED:
            _LOADED[self] = load_dataset(
                self.name, root=self.root, **dict(self.options)
            )
        return _LOADED[self]


_LOADED: dict[DataKey, Dataset] = {}


def _load_mnist1d(
    root: Path, num_samples: int | None = None, seed: int | None = None
) -> Dataset:
    """MNIST-1D, generated offline, shape ``(N, 1, 40)``, 10 classes.

    The ``mnist1d`` generator (never its download URL) makes ``num_samples``
    signals, ``num_samples // 10`` per class, and splits them 80 % / 20 % into
    train and test (4000 / 1000 with the package default of 5000). The arrays
    are cached in ``root/mnist1d/`` under a name keyed by all generator
    arguments, so the same arguments give the same data and a second call only
    reads the file. Inputs are standardised with the train set's mean and std
    (one scalar each).

    Parameters
    ----------
    root : Path
        Data folder.
    num_samples : int, optional
        Total number of examples; the package default if None.
    seed : int, optional
        Seed of the generator (it seeds NumPy's and Python's global RNGs, which
        are restored afterwards); the package default if None.

    Returns
    -------
    Dataset
    """
    args = _mnist1d_defaults(root / "mnist1d")
    if num_samples is not None:
        args["num_samples"] = num_samples
    if seed is not None:
        args["seed"] = seed
    arrays = _cached_mnist1d(root / "mnist1d", args)
    x_train = torch.as_tensor(arrays["x"], dtype=torch.float32).unsqueeze(1)
    x_test = torch.as_tensor(arrays["x_test"], dtype=torch.float32).unsqueeze(1)
    return _make_dataset("mnist1d", x_train, arrays["y"], x_test, arrays["y_test"], 10)


def _mnist1d_defaults(folder: Path) -> dict[str, Any]:
    """The ``mnist1d`` generator's default arguments, its download URL left out.

    Importing the package takes over a second (it imports scipy.interpolate),
    paid by every chapter kernel and script that reads the cached arrays; so
    the defaults are read once per installed version of the package and kept
    in ``folder/defaults-<version>.json`` (numbers, lists and booleans: the
    same values after a JSON round trip, so the same cache key).
    """
    path = folder / f"defaults-{importlib.metadata.version('mnist1d')}.json"
    if path.exists():
        return json.loads(path.read_text())
    from mnist1d.data import get_dataset_args

    args = get_dataset_args(as_dict=True)
    args.pop("url")
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(args)))
    return args


def _mnist1d_cache_path(folder: Path, args: dict, version: str) -> Path:
    """Cache file of the MNIST-1D arrays generated with ``args`` by version
    ``version`` of the ``mnist1d`` package (another version may generate
    other arrays from the same arguments: it gets a file of its own)."""
    key = stable_hash({**args, "mnist1d version": version}, length=12)
    return folder / f"mnist1d_n{args['num_samples']}_seed{args['seed']}_{key}.npz"


def _cached_mnist1d(folder: Path, args: dict) -> dict[str, np.ndarray]:
    path = _mnist1d_cache_path(folder, args, importlib.metadata.version("mnist1d"))
    if not path.exists():
        arrays = _generate_mnist1d(args)
        atomic_write(path, lambda tmp: _save_npz(tmp, arrays))
    with np.load(path) as f:
        return {k: f[k] for k in ("x", "y", "x_test", "y_test")}


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to a name
        np.savez(f, **cast(dict[str, Any], arrays))


def _generate_mnist1d(args: dict) -> dict[str, np.ndarray]:
    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(ObjectView(dict(args)))
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return {k: np.asarray(data[k]) for k in ("x", "y", "x_test", "y_test")}


def _load_digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 digits, shape ``(N, 1, 8, 8)``, 10 classes.

    Pixels are scaled to [0, 1], then standardised with the train set's mean
    and std; the train/test split is stratified by class.

    Parameters
    ----------
    test_fraction : float
        Fraction of the 1797 examples held out for testing.
    seed : int
        Seed of the split.

    Returns
    -------
    Dataset
    """
    # imported here: scikit-learn takes about a second to import, paid by
    # every chapter kernel and script that reads data, and only digits needs it
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.images.astype(np.float32)[:, None] / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x,
        digits.target,
        test_size=test_fraction,
        random_state=seed,
        stratify=digits.target,
    )
    return _make_dataset(
        "digits", torch.as_tensor(x_tr), y_tr, torch.as_tensor(x_te), y_te, 10
    )


def _load_mnist_like(name: str, root: Path) -> Dataset:
    """MNIST or Fashion-MNIST through torchvision, shape ``(N, 1, 28, 28)``."""
    import torchvision

    cls_name = _TORCHVISION_CLASS[name]
    cls = getattr(torchvision.datasets, cls_name)
    folder = root / name
    try:
        train = cls(root=str(folder), train=True, download=False)
        test = cls(root=str(folder), train=False, download=False)
    except RuntimeError:
        raise DataMissingError(_missing_message(name, folder)) from None
    return _make_dataset(
        name,
        train.data.unsqueeze(1).float() / 255.0,
        train.targets,
        test.data.unsqueeze(1).float() / 255.0,
        test.targets,
        10,
    )


# CIFAR files are read here, in the documented format of the "python version"
# (https://www.cs.toronto.edu/~kriz/cifar.html): pickled dicts with "data", a
# uint8 array (N, 3072) of 1024 red, 1024 green and 1024 blue pixels row-major,
# and "labels" (CIFAR-10) or "fine_labels" (CIFAR-100). torchvision.datasets.
# CIFAR10/100 would instead demand the md5 of each file at every load, so they
# would reject any file but the official ones (test fixtures, re-pickled
# copies) and the only way around that is overriding its private methods. The
# official files are still checked: torchvision's download=True verifies the
# archive's md5 before extracting, and the folder layout is torchvision's.
_CIFAR_LAYOUT = {
    "cifar10": (
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "labels",
        10,
    ),
    "cifar100": ("cifar-100-python", ("train",), ("test",), "fine_labels", 100),
}


def _load_cifar(name: str, root: Path) -> Dataset:
    """CIFAR-10 or CIFAR-100 from torchvision's download, shape ``(N, 3, 32, 32)``."""
    base, train_files, test_files, label_key, n_classes = _CIFAR_LAYOUT[name]
    folder = root / name
    files = [folder / base / f for f in train_files + test_files]
    if not all(f.is_file() for f in files):
        raise DataMissingError(_missing_message(name, folder))
    x_train, y_train = _read_cifar_batches(files[: len(train_files)], label_key)
    x_test, y_test = _read_cifar_batches(files[len(train_files) :], label_key)
    return _make_dataset(name, x_train, y_train, x_test, y_test, n_classes)


def _read_cifar_batches(
    paths: list[Path], label_key: str
) -> tuple[torch.Tensor, np.ndarray]:
    xs, ys = [], []
    for path in paths:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="latin1")
        xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch[label_key], dtype=np.int64))
    x = torch.as_tensor(np.concatenate(xs)).float() / 255.0
    return x, np.concatenate(ys)


def _missing_message(name: str, folder: Path) -> str:
    call = f"torchvision.datasets.{_TORCHVISION_CLASS[name]}({str(folder)!r}, download=True)"
    return (
        f"data set {name!r} not found in {str(folder)!r}; download it with: make data DATA={name} "
        f'(or python -c "import torchvision; {call}")'
    )


def download_dataset(name: DatasetName, *, root: str | Path | None = None) -> Path:
    """Download a torchvision data set into ``root/<name>`` (default: the
    workspace's ``data/``; needs the internet)."""
    if name not in _TORCHVISION_CLASS:
        raise ValueError(
            f"{name!r} is not downloaded: valid names {sorted(_TORCHVISION_CLASS)} "
            "(mnist1d and digits are generated or bundled offline)"
        )
    import torchvision

    folder = _data_root(root) / name
    cls = getattr(torchvision.datasets, _TORCHVISION_CLASS[name])
    for train in (True, False):
        cls(root=str(folder), train=train, download=True)
    return folder


def _make_dataset(
    name: str,
    x_train: torch.Tensor,
    y_train: Labels,
    x_test: torch.Tensor,
    y_test: Labels,
    n_classes: int,
) -> Dataset:
    """Standardise per channel with train statistics and fix the dtypes."""
    x_train, x_test = _standardise(x_train.float(), x_test.float())
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=torch.as_tensor(np.asarray(y_train), dtype=torch.int64),
        x_test=x_test,
        y_test=torch.as_tensor(np.asarray(y_test), dtype=torch.int64),
        n_classes=n_classes,
    )


def _standardise(
    x_train: torch.Tensor, x_test: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract the train mean and divide by the train std of each channel (axis 1)."""
    dims = [d for d in range(x_train.ndim) if d != 1]
    std, mean = torch.std_mean(x_train, dim=dims, keepdim=True)
    return (x_train - mean) / std, (x_test - mean) / std


# --------------------------------------------------------------------------- splits


def iid_split(y: Labels, n_parts: int, seed: int) -> list[np.ndarray]:
    """Split indices into random parts of near-equal size.

    Parameters
    ----------
    y : array or tensor of int, shape (N,)
        Labels (only their number is used).
    n_parts : int
        Number of parts, 1 <= n_parts <= N.
    seed : int
        Seed of the shuffle.

    Returns
    -------
    list of np.ndarray
        Sorted index arrays, a partition of ``range(N)``.
    """
    n = len(_labels(y))
    _check_n_parts(n_parts, n, "examples")
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(part) for part in np.array_split(perm, n_parts)]


def dirichlet_split(
    y: Labels, n_parts: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Non-IID split: each class is shared out in Dirichlet(alpha) proportions.

    For every class, proportions ``p ~ Dirichlet(alpha * ones(n_parts))`` are
    drawn and the class's shuffled indices are cut at ``cumsum(p) * n_c``.
    Large ``alpha`` gives near-IID parts, small ``alpha`` parts dominated by a
    few classes (parts may then be small or even empty).

    Parameters
    ----------
    y : array or tensor of int, shape (N,)
        Labels.
    n_parts : int
        Number of parts, >= 1.
    alpha : float
        Concentration, > 0.
    seed : int
        Seed of the shuffles and proportions.

    Returns
    -------
    list of np.ndarray
        Sorted index arrays, a partition of ``range(N)``.
    """
    y = _labels(y)
    _check_n_parts(n_parts)
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive number, got {alpha}")
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_parts)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(np.full(n_parts, float(alpha)))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
        for part, chunk in zip(parts, np.split(idx, cuts)):
            part.append(chunk)
    return [np.sort(np.concatenate(part)) for part in parts]


def shard_split(y: Labels, n_parts: int, seed: int) -> list[np.ndarray]:
    """Split by disjoint class shards.

    The classes are shuffled and dealt into ``n_parts`` groups of (nearly)
    equal size; each part gets every example of its group's classes.

    Parameters
    ----------
    y : array or tensor of int, shape (N,)
        Labels.
    n_parts : int
        Number of parts, 1 <= n_parts <= number of classes present in ``y``.
    seed : int
        Seed of the class shuffle.

    Returns
    -------
    list of np.ndarray
        Sorted index arrays, a partition of ``range(N)``.
    """
    y = _labels(y)
    classes = np.unique(y)
    _check_n_parts(n_parts, len(classes), "classes")
    groups = np.array_split(np.random.default_rng(seed).permutation(classes), n_parts)
    return [np.flatnonzero(np.isin(y, group)) for group in groups]


def balanced_subset(
    y: Labels, per_class: int, seed: int, *, indices: np.ndarray | None = None
) -> np.ndarray:
    """Draw ``per_class`` examples of every class, without replacement.

    Parameters
    ----------
    y : array or tensor of int, shape (N,)
        Labels; every class present in ``y`` is drawn from.
    per_class : int
        Examples per class, >= 1.
    seed : int
        Seed of the draw.
    indices : array of int, optional
        Draw only from these indices of ``y`` (default: all).

    Returns
    -------
    np.ndarray
        Sorted indices into ``y``, ``per_class * n_classes`` of them.

    Raises
    ------
    ValueError
        If some class has fewer than ``per_class`` examples among ``indices``.
    """
    y = _labels(y)
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    pool = np.arange(len(y)) if indices is None else np.asarray(indices, dtype=np.int64)
    by_class = {int(c): pool[y[pool] == c] for c in np.unique(y)}
    short = {c: len(idx) for c, idx in by_class.items() if len(idx) < per_class}
    if short:
        raise ValueError(
            f"per_class={per_class} but these classes have fewer examples (class: count): {short}"
        )
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(idx, per_class, replace=False) for idx in by_class.values()]
    return np.sort(np.concatenate(chosen))


def class_counts(y: Labels, indices: np.ndarray, n_classes: int) -> np.ndarray:
    """Number of examples of each class among ``y[indices]``, shape ``(n_classes,)``."""
    return np.bincount(
        _labels(y)[np.asarray(indices, dtype=np.int64)], minlength=n_classes
    )


def subset(ds: Dataset, train_idx: np.ndarray) -> Dataset:
    """The data set restricted to the training examples ``train_idx``; same test set."""
    idx = torch.as_tensor(np.asarray(train_idx), dtype=torch.long)
    return Dataset(
        name=ds.name,
        x_train=ds.x_train[idx],
        y_train=ds.y_train[idx],
        x_test=ds.x_test,
        y_test=ds.y_test,
        n_classes=ds.n_classes,
    )


def _labels(y: Labels) -> np.ndarray:
    """Labels as a 1-D NumPy int array."""
    y = y.cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    return y.astype(np.int64, copy=False)


def _check_n_parts(n_parts: int, limit: int | None = None, what: str = "") -> None:
    if n_parts < 1:
        raise ValueError(f"n_parts must be >= 1, got {n_parts}")
    if limit is not None and n_parts > limit:
        raise ValueError(f"n_parts={n_parts} exceeds the number of {what} ({limit})")
