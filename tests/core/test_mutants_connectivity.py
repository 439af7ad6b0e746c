"""Chapter 1's protocols, found by mutation testing (``make mutation MODULE=core/connectivity``).

Pinned against independent references: the rescaled weights of
:func:`~wslib.core.connectivity.symmetry_check` recomputed from the seeded
generator's own draws (``randperm`` per group, then ``exp(N(0, 1))`` per
rescalable neuron); its two output columns told apart by a net whose
rescaling is a symmetry in training mode only (BatchNorm on batch statistics)
and not in evaluation mode; the straight lines recomputed with
:func:`~wslib.core.interpolation.linear_path` and weight matching's seed;
what the width sweep asks its zoo for, and that it never touches the test set.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tests.kit import MLP, FakeZoo, drawn_models, mlp, toy_dataset
from wslib.core.connectivity import (
    OUTPUT_DIFFS,
    barrier_sweep,
    lines_between,
    symmetry_check,
)
from wslib.core.data import Dataset
from wslib.core.interpolation import linear_path
from wslib.core.matching import align
from wslib.core.neurons import NeuronGroup, NeuronStructure, Slot

DATA = {"name": "toy"}
DEEP = mlp([8, 6, 4])
"""Three groups: for models drawn after seed 2, weight matching's seed changes the result."""


class ScaleFreeInTraining(nn.Module):
    """``Linear(8, 2)`` then BatchNorm without affine: rescaling the linear's
    rows is invisible on batch statistics, not on the running ones."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)
        self.bn = nn.BatchNorm1d(2, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x.flatten(1)))

    def neuron_structure(self) -> NeuronStructure:
        slots = (Slot("lin.weight", 0, "out"), Slot("lin.bias", 0, "out"))
        return NeuronStructure((NeuronGroup("g", 2, slots),))


def test_symmetry_check_rescales_by_the_seeded_log_normal_draws() -> None:
    """Permutations first, then ``exp(N(0, 1))`` per neuron, from one generator."""
    model = drawn_models(mlp([6, 5]), 1)[0]
    _, states = symmetry_check({"m": model}, toy_dataset().x_test, seed=4)
    gen = torch.Generator().manual_seed(4)
    torch.randperm(6, generator=gen)
    torch.randperm(5, generator=gen)
    lam0 = torch.exp(torch.randn(6, generator=gen, dtype=torch.float64))
    w = model.state_dict()["linears.0.weight"]
    want = (w * lam0.float()[:, None]).double()
    got = states["m"]["rescaling"]["linears.0.weight"].double()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)


def test_symmetry_check_reports_evaluation_and_training_outputs_apart() -> None:
    torch.manual_seed(0)
    model = ScaleFreeInTraining().eval()
    table, _ = symmetry_check({"m": model}, toy_dataset().x_test, seed=0)
    assert list(table.columns) == [
        "model",
        "symmetry",
        "max weight change",
        *OUTPUT_DIFFS,
    ]
    assert list(table.model) == ["m", "m"]
    row = table[table.symmetry == "rescaling"].iloc[0]
    assert row[OUTPUT_DIFFS[0]] > 0.1  # running statistics see the scales
    assert row[OUTPUT_DIFFS[1]] < 1e-3  # batch statistics do not


def deep_pair() -> tuple[nn.Module, nn.Module]:
    a, b = drawn_models(DEEP, 2, seed=2)
    return a, b


def aligned_reference(a: nn.Module, b: nn.Module, seed: int) -> dict:
    ds = toy_dataset()
    end = align(a.state_dict(), b.state_dict(), a.neuron_structure(), seed=seed)
    ts = [0.0, 0.5, 1.0]
    return linear_path(
        a, a.state_dict(), end, ts, ds.x_train, ds.y_train, ds.x_test, ds.y_test
    )


def test_lines_between_matches_with_seed_zero_and_the_test_set_by_default() -> None:
    a, b = deep_pair()
    line, aligned = lines_between(a, b, [0.0, 0.5, 1.0], toy_dataset())
    ref = aligned_reference(a, b, seed=0)
    assert np.array_equal(aligned["train_loss"], ref["train_loss"])
    assert np.array_equal(aligned["test_loss"], ref["test_loss"])
    assert "test_loss" in line


def test_lines_between_passes_its_seed_and_test_flag_on() -> None:
    a, b = deep_pair()
    seeded = aligned_reference(a, b, seed=1)
    assert not np.array_equal(
        seeded["train_loss"], aligned_reference(a, b, 0)["train_loss"]
    )
    line, aligned = lines_between(
        a, b, [0.0, 0.5, 1.0], toy_dataset(), seed=1, test=False
    )
    assert np.array_equal(aligned["train_loss"], seeded["train_loss"])
    assert "test_loss" not in line
    assert "test_loss" not in aligned


def test_barrier_sweep_asks_for_the_data_and_recipe_and_passes_its_seed() -> None:
    ds = toy_dataset()
    zoo = FakeZoo()
    recipe = {"epochs": 1}
    (row,) = barrier_sweep(zoo, DATA, MLP, [6], recipe, [0, 2], [0, 0.5, 1], ds, seed=3)
    assert [c["data"] for c in zoo.requests] == [DATA, DATA]
    assert [c["recipe"] for c in zoo.requests] == [recipe, recipe]
    a, b = (FakeZoo().get(c) for c in zoo.requests)
    end = align(a.state_dict(), b.state_dict(), a.neuron_structure(), seed=3)
    ref = linear_path(a, a.state_dict(), end, [0, 0.5, 1], ds.x_train, ds.y_train)
    assert row["aligned barrier"] == float(ref["barrier"])


def test_barrier_sweep_never_evaluates_the_test_set() -> None:
    """Test inputs of the wrong shape: the training-set barrier does not see them."""
    ds = toy_dataset()
    broken = Dataset(
        ds.name, ds.x_train, ds.y_train, torch.zeros(4, 3), ds.y_test[:4], ds.n_classes
    )
    rows = barrier_sweep(FakeZoo(), DATA, MLP, [4], {}, [0, 1], [0, 1], broken)
    assert np.isfinite(rows[0]["barrier"])


def test_barrier_sweep_matches_with_its_seed_default_0(monkeypatch) -> None:
    """The seed reaches weight matching (``lines_between``); it is 0 when not given."""
    import wslib.core.connectivity as connectivity

    seen = []
    real = connectivity.lines_between

    def recording(*args, **kwargs):
        seen.append(kwargs.get("seed"))
        return real(*args, **kwargs)

    monkeypatch.setattr(connectivity, "lines_between", recording)
    ds = toy_dataset()
    barrier_sweep(FakeZoo(), DATA, MLP, [4], {}, [0, 1], [0, 1], ds, seed=3)
    barrier_sweep(FakeZoo(), DATA, MLP, [4], {}, [0, 1], [0, 1], ds)
    assert seen == [3, 0]
