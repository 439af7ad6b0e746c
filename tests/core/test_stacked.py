"""Stacked training: each run of a stack follows its solo run."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.core.test_mutants_train import (
    StandIn,
    StandInGenerator,
    StrictDevice,
    stand_in,  # noqa: F401  (a fixture)
)
from tests.devicecheck import DEVICE, DeviceDiscipline
from tests.kit import mlp, resnet1d, seeded_models
from wslib.core.stacked import fit_stacked, stack_signature
from wslib.core.train import Recipe, fit

MLP = mlp([16, 8], [1, 12])
RESNET = resnet1d([4], [1, 12])


def _data(n: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 12, generator=gen)
    return x, (x[:, 0, :3].argmax(1) + (x[:, 0, 5] > 1).long()) % 3


def _models(seeds: list[int], config: dict = MLP) -> list[torch.nn.Module]:
    return seeded_models(config, seeds, train=True)


def _assert_runs_match(recipes, seeds, stop_at=None, tol=1e-5, give_up_after=None):
    x, y = _data()
    stacked, solo = _models(seeds), _models(seeds)
    stop = {"stop_at": stop_at, "give_up_after": give_up_after}
    hists = fit_stacked(
        stacked, x, y, recipes, seeds, device="cpu", progress=False, **stop
    )
    for m, s, r, h in zip(solo, seeds, recipes, hists, strict=True):
        expected = fit(m, x, y, r, seed=s, device="cpu", progress=False, **stop)
        assert len(h["loss"]) == len(expected["loss"])
        torch.testing.assert_close(h["loss"], expected["loss"], atol=tol, rtol=tol)
        assert h["acc"] == pytest.approx(expected["acc"], abs=2 / len(x))
    for a, b in zip(stacked, solo, strict=True):
        for (k, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=tol, rtol=tol, msg=k)


def test_each_stacked_run_equals_its_solo_run():
    base = Recipe(epochs=4, batch_size=16, momentum=0.0, weight_decay=0.0)
    rates = [0.5, 0.1, 0.02]
    recipes = [Recipe(**{**base.to_dict(), "lr": lr}) for lr in rates]
    _assert_runs_match(recipes, [3, 7, 11])


def test_momentum_weight_decay_and_cosine_follow_torch_sgd():
    base = Recipe(epochs=3, batch_size=16, momentum=0.9, weight_decay=5e-3)
    recipes = [Recipe(**{**base.to_dict(), "lr": lr}) for lr in (0.05, 0.01)]
    _assert_runs_match(recipes, [0, 1])


def test_a_run_stops_at_its_threshold_and_the_others_go_on():
    base = Recipe(epochs=30, batch_size=16, momentum=0.0, weight_decay=0.0)
    recipes = [Recipe(**{**base.to_dict(), "lr": lr}) for lr in (1.0, 0.01)]
    x, y = _data()
    hists = fit_stacked(
        _models([0, 1]), x, y, recipes, [0, 1], progress=False, stop_at=0.6
    )
    assert len(hists[0]["acc"]) < len(hists[1]["acc"])  # the fast run stopped first
    _assert_runs_match(recipes, [0, 1], stop_at=0.6, tol=1e-4)


def test_runs_that_have_not_reached_the_threshold_give_up_as_solo_runs_do():
    base = Recipe(epochs=30, batch_size=16, momentum=0.0, weight_decay=0.0)
    recipes = [Recipe(**{**base.to_dict(), "lr": lr}) for lr in (1.0, 0.01)]
    x, y = _data()
    hists = fit_stacked(
        _models([0, 1]),
        x,
        y,
        recipes,
        [0, 1],
        progress=False,
        stop_at=0.6,
        give_up_after=5,
    )
    assert len(hists[0]["acc"]) < 5 and len(hists[1]["acc"]) == 5
    _assert_runs_match(recipes, [0, 1], stop_at=0.6, tol=1e-4, give_up_after=5)


def test_on_a_stand_in_gpu_without_mixing():
    recipes = [Recipe(epochs=2, batch_size=16, lr=lr) for lr in (0.1, 0.05)]
    x, y = _data()
    host, dev = _models([0, 1]), _models([0, 1])
    expected = fit_stacked(host, x, y, recipes, [0, 1], device="cpu", progress=False)
    with DeviceDiscipline():
        got = fit_stacked(dev, x, y, recipes, [0, 1], device=DEVICE, progress=False)
    assert got == expected


@pytest.mark.usefixtures("stand_in")
@pytest.mark.parametrize(("kind", "generators"), [("cuda", "cuda"), ("mps", "cpu")])
def test_on_a_stand_in_device_generators_and_batches_are_placed_right(
    kind: str, generators: str
) -> None:
    """Each run's shuffling generator sits on CUDA (elsewhere on the host), and
    the stacked batch indices are sent to the device (a host index would be
    copied at every use): on another device than CUDA they are drawn on the
    host, so the copy is needed."""
    recipes = [Recipe(epochs=2, batch_size=16, lr=lr) for lr in (0.1, 0.05)]
    x, y = _data()
    host, dev = _models([0, 1]), _models([0, 1])
    expected = fit_stacked(host, x, y, recipes, [0, 1], device="cpu", progress=False)
    StandInGenerator.requested.clear()
    with StrictDevice(), StandIn(kind):
        got = fit_stacked(dev, x, y, recipes, [0, 1], device=kind, progress=False)
    assert got == expected
    assert StandInGenerator.requested == [torch.device(generators)] * 2


def test_the_signature_leaves_out_the_rate_only():
    a, b = Recipe(lr=0.1), Recipe(lr=0.2)
    assert stack_signature(a) == stack_signature(b)
    assert stack_signature(a) != stack_signature(Recipe(lr=0.1, epochs=3))


@pytest.mark.parametrize(
    "models, recipes, match",
    [
        (
            lambda: _models([0]) + _models([1], {**MLP, "widths": [4]}),
            [Recipe(), Recipe()],
            "one architecture",
        ),
        (
            lambda: _models([0, 1]),
            [Recipe(epochs=2), Recipe(epochs=3)],
            "learning rate only",
        ),
        (lambda: _models([0, 1]), [Recipe()], "one recipe per model"),
        (
            lambda: _models([0, 1]),
            [Recipe(optimizer="adam"), Recipe(optimizer="adam")],
            "implements SGD",
        ),
        (
            lambda: _models([0, 1], RESNET),
            [Recipe(), Recipe()],
            "buffers",
        ),
    ],
)
def test_bad_stacks_are_named(models, recipes, match):
    x, y = _data()
    with pytest.raises(ValueError, match=match):
        fit_stacked(models(), x, y, recipes, [0, 1], progress=False)


def test_models_hold_their_trained_weights_afterwards():
    recipes = [Recipe(epochs=1, batch_size=16, lr=0.1)] * 2
    models = _models([0, 1])
    before = copy.deepcopy(models)
    x, y = _data()
    fit_stacked(models, x, y, recipes, [0, 1], progress=False)
    for a, b in zip(models, before, strict=True):
        assert not torch.equal(a.linears[0].weight, b.linears[0].weight)
        assert not a.training
