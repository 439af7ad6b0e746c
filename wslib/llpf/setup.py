"""What the LLPF chapters (2-5) and their units share: the zoo, the data set, the
:class:`~wslib.llpf.protocols.PathSetup` and the derived seeds, so a notebook and
its units (:mod:`wslib.llpf.units`) make the same runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wslib.core.seeds import derive_seeds
from wslib.core.workspace import workspace
from wslib.llpf.protocols import PathSetup
from wslib.runs.zoo import Zoo

if TYPE_CHECKING:
    from wslib.core.data import Dataset


def profile_folder(root: str | Path | None, profile: str) -> Path | None:
    """``root/profile`` under the workspace's root (None when ``root`` is None: no files)."""
    return None if root is None else workspace().path(root) / profile


def chapter_data(data: Mapping[str, Any]) -> tuple[Zoo, Dataset]:
    """The book's model zoo and the data set ``data`` names."""
    zoo = Zoo()
    return zoo, zoo.dataset(dict(data))


def chapter_setup(
    ds: Dataset,
    batch_size: int,
    r_min: int,
    threshold_margin: float,
    dense: int,
    checkpoint_dir: str | Path | None,
    profile: str,
) -> PathSetup:
    """The :class:`~wslib.llpf.protocols.PathSetup` of a chapter: path checkpoints in
    ``checkpoint_dir/profile`` (none when ``checkpoint_dir`` is None)."""
    checkpoints = profile_folder(checkpoint_dir, profile)
    return PathSetup(ds, batch_size, r_min, threshold_margin, dense, checkpoints)


def mode_seeds(seed: int) -> list[int]:
    """The training seeds of the two modes a chapter joins (role ``"mode"``, shared
    with chapters 1, 2 and 12)."""
    return derive_seeds(seed, "mode", 2)


def path_seed_list(seed: int, n: int) -> list[int]:
    """The ``n`` path seeds of a chapter run with ``seed`` (role ``"path"``)."""
    return derive_seeds(seed, "path", n)


def arch_path_seeds(
    name: str, seed_archs: Sequence[str], seeds: list[int]
) -> list[int]:
    """The path seeds chapter 3 runs for architecture ``name``: all of ``seeds`` when
    it is one of ``seed_archs``, the first alone otherwise (the budget). The
    all-at-once ablation pairs each of its runs with the FDF run of the same seed,
    so it runs on the same seeds."""
    return seeds if name in seed_archs else seeds[:1]
