"""What the LLPF chapters (2-5) and their units share: the zoo, the data set, the
:class:`~wslib.llpf.protocols.PathSetup` and the derived seeds, so a notebook and
its units (:mod:`wslib.llpf.units`) make the same runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from wslib.core.files import tensor_digest
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


def comparison_key(
    setup: PathSetup,
    model: Mapping[str, Any],
    pair: Sequence[nn.Module],
    methods: Mapping[str, Mapping[str, Any]],
    seed: int,
    *,
    budget: int | None = None,
) -> dict[str, Any]:
    """Everything that determines a run of the chapter (one method or a comparison).

    The setup enters by :meth:`~wslib.llpf.protocols.PathSetup.key` (the
    data by the digest of its content), the two modes by theirs, the model by
    its config (its code enters the cache key through
    :data:`wslib.llpf.protocols.CODE`).
    """
    return {
        "protocol": "compare_at_equal_steps" if budget is None else "method_run",
        "setup": setup.key(),
        "model": dict(model),
        "modes": [tensor_digest(m.state_dict()) for m in pair],
        "path_seed": seed,
        "methods": {label: dict(v) for label, v in methods.items()},
        "budget": budget,
    }
