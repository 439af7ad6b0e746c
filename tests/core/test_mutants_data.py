"""Data sets, found by mutation testing (``make mutation MODULE=core/data``).

The loaders' exact arithmetic (each documented step, bit for bit), the files
they read and never download, their names and messages, and the splits'
handling of empty selections and device tensors.
"""

from __future__ import annotations

import pickle
import re
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from tests.core.test_data import _write_mnist_like
from tests.devicecheck import DEVICE, DeviceDiscipline
from tests.fixtures import cifar_batch
from wslib.core import data
from wslib.core.data import SYNTHETIC_MARK, load_dataset
from wslib.core.workspace import ENV as WORKSPACE_ENV


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace of its own (its default data folder is empty), and no data set
    loaded by an earlier test."""
    monkeypatch.setenv(WORKSPACE_ENV, str(tmp_path / "workspace"))
    monkeypatch.setattr(data, "_LOADED", {})
    return tmp_path / "workspace"


def mark_synthetic(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / SYNTHETIC_MARK).write_text("stand-in files\n")


# --- synthetic stand-ins and data keys ------------------------------------------------


def test_the_synthetic_data_warning_is_whole_and_names_the_callers_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning points at the line that called the loader (stacklevel 2), the
    frame above the function that warns, whatever wraps it."""
    mark_synthetic(tmp_path, "digits")
    callers = []
    warn = warnings.warn

    def spy(message, category=None, stacklevel=1, **kwargs) -> None:  # noqa: ANN001
        frame = sys._getframe(2)  # the caller of the function that warns
        callers.append((frame.f_code.co_filename, frame.f_lineno))
        warn(message, category, stacklevel=stacklevel + 1, **kwargs)

    monkeypatch.setattr(warnings, "warn", spy)
    message = (
        f"{tmp_path / 'digits'} holds synthetic stand-in files "
        "(bookkit/synthetic_data.py), not the real data set: numbers from it "
        "mean nothing; replace them with make data DATA=digits"
    )
    with pytest.warns(UserWarning, match=f"^{re.escape(message)}$") as record:
        load_dataset("digits", root=tmp_path)
    assert [(w.filename, w.lineno) for w in record] == callers


def test_a_data_key_loads_from_its_own_folder(tmp_path: Path) -> None:
    """Not from the workspace's data folder: the key's folder holds stand-ins here."""
    key = data.DataKey.of({"name": "digits", "root": str(tmp_path / "mine")})
    mark_synthetic(tmp_path / "mine", "digits")
    with pytest.warns(UserWarning, match="synthetic stand-in files"):
        ds = key.load()
    assert ds.name == "digits"


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100"])
def test_the_torchvision_data_sets_take_no_options(name: str, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        load_dataset(name, root=tmp_path, seed=3)


# --- mnist1d and digits -----------------------------------------------------------------


def test_the_mnist1d_cache_file_is_named_by_size_seed_and_a_hash_of_every_argument() -> (
    None
):
    """A cache written earlier is found again: the name is part of the cache.
    Another argument or another version of the generator names another file."""
    args = {"num_samples": 200, "seed": 4, "noise": 0.5}
    path = data._mnist1d_cache_path(Path("cache"), args, "0.0.2")
    assert path == Path("cache") / "mnist1d_n200_seed4_2c0948843769.npz"
    other = data._mnist1d_cache_path(Path("cache"), {**args, "noise": 0.25}, "0.0.2")
    assert other.name.startswith("mnist1d_n200_seed4_") and other != path
    newer = data._mnist1d_cache_path(Path("cache"), args, "0.0.3")
    assert newer.name.startswith("mnist1d_n200_seed4_") and newer != path


def test_digits_are_the_documented_pipeline_bit_for_bit() -> None:
    """Pixels / 16, a stratified split (seed 0 by default), train statistics."""
    digits = load_digits()
    x = digits.images.astype(np.float32)[:, None] / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    train, test = data._standardise(torch.as_tensor(x_tr), torch.as_tensor(x_te))
    ds = load_dataset("digits")
    assert ds.name == "digits"
    assert torch.equal(ds.x_train, train) and torch.equal(ds.x_test, test)
    assert ds.y_train.tolist() == y_tr.tolist() and ds.y_test.tolist() == y_te.tolist()


# --- torchvision files ------------------------------------------------------------------


def test_mnist_is_read_from_its_files_never_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pixels / 255 then the train statistics, bit for bit; with the files
    missing the loader names them, and downloads nothing."""
    import torchvision

    name, cls_name = "mnist", "MNIST"

    def no_download(self) -> None:  # noqa: ANN001
        raise AssertionError("the loader tried to download")

    monkeypatch.setattr(
        getattr(torchvision.datasets, cls_name), "download", no_download
    )
    with pytest.raises(data.DataMissingError):
        load_dataset(name, root=tmp_path)
    arrays = _write_mnist_like(
        tmp_path / name / cls_name / "raw", np.random.default_rng(0), 12, 7
    )
    ds = load_dataset(name, root=tmp_path)
    train, test = (
        torch.as_tensor(arrays[part][0]).unsqueeze(1).float() / 255.0
        for part in ("train", "t10k")
    )
    train, test = data._standardise(train, test)
    assert ds.name == name
    assert torch.equal(ds.x_train, train) and torch.equal(ds.x_test, test)


class Python2Pickler(pickle._Pickler):
    """Writes every string as Python 2's ``str`` (bytes that the reader decodes),
    as in the official CIFAR files: arrays' raw bytes included."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_python2_str(self, obj: bytes | str) -> None:
        raw = obj if isinstance(obj, bytes) else obj.encode("latin1")
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = save_python2_str
    dispatch[str] = save_python2_str


def write_python2_cifar10(folder: Path, rng: np.random.Generator) -> list[dict]:
    """CIFAR-10's six batch files (2 images each) pickled as Python 2 wrote them."""
    base = folder / "cifar-10-batches-py"
    base.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = [cifar_batch(rng, 2, {"labels": 10}) for _ in names]
    for name, batch in zip(names, batches):
        with open(base / name, "wb") as f:
            Python2Pickler(f, protocol=2).dump(batch)
    return batches


def test_cifar_reads_python2_pickles_bit_for_bit(tmp_path: Path) -> None:
    """The official files are Python 2 pickles: their byte strings (the pixels)
    are decoded as latin-1. Pixels / 255, then the train statistics."""
    batches = write_python2_cifar10(tmp_path / "cifar10", np.random.default_rng(2))
    assert any(b["data"].max() >= 128 for b in batches)  # not ASCII
    ds = load_dataset("cifar10", root=tmp_path)
    pixels = [
        torch.as_tensor(np.concatenate([b["data"] for b in part]))
        .reshape(-1, 3, 32, 32)
        .float()
        / 255.0
        for part in (batches[:5], batches[5:])
    ]
    train, test = data._standardise(*pixels)
    assert ds.name == "cifar10"
    assert torch.equal(ds.x_train, train) and torch.equal(ds.x_test, test)
    assert ds.y_test.tolist() == batches[5]["labels"]


def test_the_missing_data_message_is_whole(tmp_path: Path) -> None:
    folder = tmp_path / "cifar10"
    call = f"torchvision.datasets.CIFAR10({str(folder)!r}, download=True)"
    message = (
        f"data set 'cifar10' not found in {str(folder)!r}; download it with: "
        f'make data DATA=cifar10 (or python -c "import torchvision; {call}")'
    )
    with pytest.raises(data.DataMissingError, match=f"^{re.escape(message)}$"):
        load_dataset("cifar10", root=tmp_path)


def test_downloading_an_offline_data_set_is_refused_in_whole_words() -> None:
    message = (
        "'digits' is not downloaded: valid names ['cifar10', 'cifar100', "
        "'fashion_mnist', 'mnist'] (mnist1d and digits are generated or bundled "
        "offline)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        data.download_dataset("digits")


# --- labels and selections ------------------------------------------------------------


def test_labels_of_any_integer_type_become_int64() -> None:
    x = torch.randn(4, 1, 3)
    ds = data._make_dataset(
        "toy",
        x,
        np.array([0, 1, 2, 1], dtype=np.uint8),
        x[:2],
        torch.tensor([2, 0], dtype=torch.int32),
        3,
    )
    assert ds.y_train.dtype == ds.y_test.dtype == torch.int64
    assert ds.y_train.tolist() == [0, 1, 2, 1] and ds.y_test.tolist() == [2, 0]


def test_an_empty_selection_is_counted_and_subset_as_empty() -> None:
    """A list of no indices (a Dirichlet part may be empty) selects nothing."""
    y = np.array([0, 1, 1, 2])
    assert data.class_counts(y, [], 3).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"fewer examples \(class: count\): \{0: 0"):
        data.balanced_subset(y, 1, seed=0, indices=[])
    ds = data.Dataset(
        "toy",
        torch.randn(4, 1, 2),
        torch.tensor(y),
        torch.randn(2, 1, 2),
        torch.tensor([0, 1]),
        3,
    )
    empty = data.subset(ds, [])
    assert empty.x_train.shape == (0, 1, 2) and empty.y_train.shape == (0,)


def test_labels_on_a_device_are_split_after_a_copy_to_the_host() -> None:
    with DeviceDiscipline():
        y = torch.tensor([0, 1, 2, 0, 1, 2]).to(DEVICE)
        parts = data.iid_split(y, 2, seed=0)
        counts = data.class_counts(y, np.arange(6), 3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(6))
    assert counts.tolist() == [2, 2, 2]
