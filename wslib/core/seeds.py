"""Every random choice of a chapter, derived from the chapter's ``seed``.

A chapter run with ``seed`` trains models, draws path seeds, tuning seeds,
splits and subsets. Each of these choices is ``derive_seed(seed, role,
index)``: a hash of the three (numpy's ``SeedSequence``), so different
triples give unrelated seeds. Consecutive seeds (``seed, seed + 1, ...``)
would not do: sweep seed 0's second model would be sweep seed 1's first, and
the sweep's seeds would share models, paths and runs, so the ledger's
intervals, which treat them as independent, would be too narrow.

Chapters that deliberately reuse each other's models ask for the same role
and index: chapters 1-5, 9 and 12 ask for ``"mode"`` models, and two of
them share a zoo entry where their data, architecture and recipe agree (the
LLPF chapters and chapter 12 join chapter 1's modes). Two different triples share
a value only if the hash collides (one chance in about 4e9 per pair; a test
checks that sweep seeds 0-4 share no model, path or run in any chapter).
The chapter's ``seed`` itself seeds ``seed_everything`` and the chapter's
illustrations (test inputs, random permutations and scales of a figure),
which no other chapter or seed reuses.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, get_args

import numpy as np

Role = Literal[
    "mode",  # the trained models a chapter joins, compares or fuses
    "model",  # chapter 11's own models (pairs, width variants, students)
    "path",  # LLPF and baseline path seeds
    "tune",  # the seed settings are tuned on, never reported
    "run",  # training runs compared across methods (PathCond, fusion regimes)
    "split",  # data splits (class shards)
    "fusion-set",  # the examples a fusion reads
    "subset",  # evaluation subsets
    "pair",  # chapter 12's study of one pair of modes (paths, fusions, fine-tuning)
    "fusion",  # a fusion of one group of models (chapter 12's gauge study)
    "level",  # one fusion's per-level k-means
    "step",  # one fusion's per-step gradient solves
]
ROLES: tuple[str, ...] = get_args(Role)


MAX_SEED = 2**63 - 1
"""The largest seed: torch keeps a seed in a signed 64-bit integer."""


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as an int; refused unless a whole number from 0 to :data:`MAX_SEED`.

    Every entry point (``bookkit run --seed``, ``bookkit sweep --seeds``, the library's
    seed functions) checks seeds here, so they accept and refuse the same
    values with the same words.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"{what} must be an integer, got {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(
            f"{what} must be a whole number from 0 to {MAX_SEED} (2**63 - 1), got {seed}"
        )
    return int(seed)


def derive_seed(seed: int, role: Role, index: int = 0) -> int:
    """The seed of the ``index``-th random choice of kind ``role`` of a chapter run with ``seed``.

    A 32-bit integer (valid for torch, numpy and scikit-learn), the same on
    every machine.
    """
    if role not in ROLES:
        raise ValueError(f"unknown seed role {role!r}; valid: {', '.join(ROLES)}")
    check_seed(seed)
    check_seed(index, "index")
    code = int.from_bytes(hashlib.sha256(role.encode()).digest()[:4], "little")
    state = np.random.SeedSequence([int(seed), code, int(index)]).generate_state(1)
    return int(state[0])


def derive_seeds(seed: int, role: Role, n: int) -> list[int]:
    """``derive_seed(seed, role, i)`` for ``i = 0, ..., n - 1``."""
    if n < 1:
        raise ValueError(f"need at least one {role} seed, got n = {n}")
    return [derive_seed(seed, role, i) for i in range(n)]
