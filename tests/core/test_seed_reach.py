"""Each seed reaches its generator: the same seed draws the same, another seed otherwise.

Determinism tests show that one seed gives one result; these show that the
seed is the one that decides it (a generator seeded with a constant passes
the first kind and fails these).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from tests.kit import mlp
from wslib.core.configs import build_model
from wslib.core.data import _load_digits, balanced_subset
from wslib.core.matching import weight_matching
from wslib.core.train import seed_everything

MLP = mlp([8, 8, 8], [1, 10])


def test_seed_everything_seeds_python_numpy_and_torch() -> None:
    def draws(seed: int) -> tuple[float, float, float]:
        seed_everything(seed)
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    assert draws(1) == draws(1)
    assert all(a != b for a, b in zip(draws(1), draws(2), strict=True))


def test_the_digits_split_follows_its_seed() -> None:
    first, again, other = (_load_digits(seed=s).y_train for s in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_a_balanced_subset_follows_its_seed() -> None:
    y = np.arange(400) % 4
    first, again, other = (balanced_subset(y, 5, s) for s in (1, 1, 2))
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_weight_matching_visits_the_layers_in_its_seed_s_order() -> None:
    """One sweep from unrelated models: the order of the layers (the seed's) shows."""
    torch.manual_seed(0)
    a, b = (build_model(MLP).state_dict() for _ in range(2))
    structure = build_model(MLP).neuron_structure()
    orders = {s: tuple(np.random.default_rng(s).permutation(3)) for s in range(20)}
    s1 = 0
    s2 = next(s for s in orders if orders[s][0] != orders[s1][0])

    def match(seed: int) -> list[torch.Tensor]:
        perms = weight_matching(a, b, structure, max_sweeps=1, seed=seed)
        return [perms[g.name] for g in structure.groups]

    assert all(torch.equal(p, q) for p, q in zip(match(s1), match(s1), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(match(s1), match(s2), strict=True))
