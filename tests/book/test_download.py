"""bookkit/download.py (``make data``): one line, not a traceback, without network."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from urllib.error import URLError

import pytest

import bookkit.download


@pytest.fixture()
def download() -> ModuleType:
    return bookkit.download


@pytest.mark.parametrize(
    "error",
    [
        URLError("[Errno -3] Temporary failure in name resolution"),
        RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried ..."),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=["url-error", "mirrors-failed", "connection-reset"],
)
def test_failed_download_prints_one_line_naming_set_and_folder(
    download: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    error: Exception,
) -> None:
    def offline(name: str, root: Path) -> Path:
        raise error

    monkeypatch.setattr(download, "download_dataset", offline)
    assert download.main(["--root", str(tmp_path), "cifar10"]) == 1
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert "'cifar10'" in lines[0] and str(tmp_path / "cifar10") in lines[0]
    assert "by hand" in lines[0] and type(error).__name__ in lines[0]
    assert "torchvision.datasets.CIFAR10('cifar10', download=True)" in lines[0]
    assert "Traceback" not in out.err + out.out


def test_stops_at_the_first_failure(
    download: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tried = []

    def offline(name: str, root: Path) -> Path:
        tried.append(name)
        raise URLError("no network")

    monkeypatch.setattr(download, "download_dataset", offline)
    assert download.main(["--root", str(tmp_path), "mnist", "cifar100"]) == 1
    assert tried == ["mnist"]


def test_downloads_every_named_set(
    download: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(download, "download_dataset", lambda name, root: root / name)
    assert download.main(["--root", str(tmp_path), "mnist", "fashion_mnist"]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "mnist"),
        str(tmp_path / "fashion_mnist"),
    ]


def test_unknown_name_lists_the_valid_ones(
    download: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    assert download.main(["mnist1d"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: unknown data set 'mnist1d'; valid: mnist fashion_mnist cifar10 "
        "cifar100 (mnist1d and digits need no download)"
    )
