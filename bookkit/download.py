"""Download the image data sets of the gpu profile into ``data/`` (``make data``).

Usage::

    bookkit download [--root data] NAME ...

NAME is one of mnist, fashion_mnist, cifar10, cifar100; each goes to
``<root>/<NAME>`` in torchvision's layout, where ``wslib.core.data`` reads it.
Without network (or when a server fails) the script prints one line naming
the data set, the folder and how to place its files there by hand, and exits
with status 1; an unknown name exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bookkit.profiles import ROOT
from wslib.core.data import download_dataset

TORCHVISION_CLASS = {
    "mnist": "MNIST",
    "fashion_mnist": "FashionMNIST",
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
}


def by_hand(name: str, folder: Path, reason: str) -> str:
    """One line: what failed and how to place the files in ``folder`` by hand."""
    call = f"torchvision.datasets.{TORCHVISION_CLASS[name]}('{name}', download=True)"
    return (
        f"error: could not download data set {name!r} into {folder} ({reason}); "
        f'to place it there by hand, run python -c "import torchvision; {call}" '
        f"on a machine with internet and copy the folder {name}/ it makes to {folder}"
    )


def first_line(error: BaseException) -> str:
    """The error's type and message on one line (its first and last lines when longer)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    message = " ... ".join(lines[:1] + lines[1:][-1:])
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def main(argv: list[str] | None = None) -> int:
    """Download each named data set; stop at the first failure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", metavar="NAME")
    parser.add_argument("--root", type=Path, default=ROOT / "data")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in TORCHVISION_CLASS]
    if unknown:
        print(
            f"error: unknown data set {unknown[0]!r}; valid: "
            f"{' '.join(TORCHVISION_CLASS)} (mnist1d and digits need no download)",
            file=sys.stderr,
        )
        return 2
    for name in args.names:
        folder = args.root / name
        try:
            print(download_dataset(name, root=args.root), flush=True)
        except (OSError, RuntimeError) as error:  # URLError is an OSError
            print(by_hand(name, folder, first_line(error)), file=sys.stderr)
            return 1
    return 0
