"""Sweep seeds are independent: no two of seeds 0-4 share a model, a run or a path."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.conftest import SWEEP_SEEDS

pytestmark = pytest.mark.slow


KINDS = ("zoo", "runs", "llpf")  # the model zoo, the run cache, LLPF checkpoints


def kind(entry: str) -> str | None:
    """The cache an entry belongs to (one of KINDS), None for other locked files."""
    return next((k for k in KINDS if k in Path(entry).parts), None)


def cache_entries(entries: set[str]) -> set[str]:
    return {e for e in entries if kind(e)}


def test_every_seed_used_each_kind_of_entry(sweep_entries: dict[int, set[str]]) -> None:
    for seed, entries in sweep_entries.items():
        assert {kind(e) for e in cache_entries(entries)} == set(KINDS), seed


@pytest.mark.parametrize("pair", list(itertools.combinations(SWEEP_SEEDS, 2)))
def test_two_sweep_seeds_share_no_entry(
    sweep_entries: dict[int, set[str]], pair: tuple[int, int]
) -> None:
    a, b = pair
    shared = sorted(cache_entries(sweep_entries[a]) & cache_entries(sweep_entries[b]))
    assert not shared, (
        f"seeds {a} and {b} share {len(shared)} cache entries, e.g. {shared[:3]}"
    )
