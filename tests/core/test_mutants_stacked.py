"""Stacked training, found by mutation testing (``make mutation MODULE=core/stacked``).

Pinned against independent references: the refusals of ``_check`` against their
whole messages; a stack of one run against its solo run (``fit``); ``_rate``
against the hand-computed cosine and constant schedules; ``_sgd`` against a
weight the gradient alone moves; the progress bar against what it writes; the
float64 running loss and the end of training once every run has stopped.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.devicecheck import DEVICE, DeviceDiscipline
from tests.kit import mlp, seeded_models
from wslib.core import stacked
from wslib.core.stacked import fit_stacked
from wslib.core.train import Recipe, fit

MLP = mlp([8], [1, 12])


def _data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 12, generator=gen)
    return x, x[:, 0, :3].argmax(1)


def _models(seeds: list[int], config: dict = MLP) -> list[torch.nn.Module]:
    return seeded_models(config, seeds, train=True)


def _refused(models: list, recipes: list[Recipe], message: str) -> None:
    x, y = _data()
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        fit_stacked(models, x, y, recipes, [0] * len(recipes), progress=False)


def test_models_of_two_architectures_are_refused_whole() -> None:
    models = _models([0]) + _models([1], {**MLP, "widths": [4]})
    _refused(
        models,
        [Recipe(), Recipe()],
        "fit_stacked needs models of one architecture (the same parameter "
        "names and shapes); train differently shaped models apart",
    )


def test_models_with_buffers_are_refused_whole() -> None:
    models = _models([0, 1])
    for m in models:
        m.register_buffer("count", torch.zeros(1))
    _refused(
        models,
        [Recipe(), Recipe()],
        "fit_stacked cannot train models with buffers (BatchNorm statistics); "
        "train them one by one with wslib.core.train.fit",
    )


def test_recipes_differing_beyond_the_rate_are_refused_whole() -> None:
    _refused(
        _models([0, 1]),
        [Recipe(epochs=2), Recipe(epochs=3)],
        "stacked runs may differ in their learning rate only; group the runs "
        "by every other recipe field (wslib.core.stacked.stack_signature)",
    )


@pytest.mark.parametrize("recipe", [Recipe(optimizer="adam"), Recipe(augment=True)])
def test_other_optimizers_and_augmentation_are_refused_whole(recipe: Recipe) -> None:
    _refused(
        _models([0]),
        [recipe],
        "fit_stacked implements SGD without augmentation; train other "
        "recipes with wslib.core.train.fit",
    )


def test_a_stack_of_one_run_follows_its_solo_run() -> None:
    recipe = Recipe(epochs=2, batch_size=16, lr=0.2, momentum=0.5)
    x, y = _data()
    (one,), (solo,) = _models([3]), _models([3])
    (hist,) = fit_stacked([one], x, y, [recipe], [5], progress=False)
    expected = fit(solo, x, y, recipe, seed=5, device="cpu", progress=False)
    torch.testing.assert_close(hist["loss"], expected["loss"], atol=1e-5, rtol=1e-5)
    for p, q in zip(one.parameters(), solo.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)


def test_rates_follow_the_constant_and_cosine_schedules() -> None:
    constant = Recipe(lr=0.3, epochs=4, schedule="constant")
    cosine = Recipe(lr=0.3, epochs=4, schedule="cosine")
    assert [stacked._rate(constant, e) for e in range(4)] == [0.3] * 4
    expected = [0.3, 0.3 * (1 + 2**-0.5) / 2, 0.15, 0.3 * (1 - 2**-0.5) / 2]
    assert [stacked._rate(cosine, e) for e in range(4)] == pytest.approx(expected)


def test_without_weight_decay_the_gradient_alone_moves_a_weight() -> None:
    """No ``0 * p`` term: an infinite weight stays infinite, not NaN."""
    recipe = Recipe(lr=0.1, weight_decay=0.0, momentum=0.0)
    p = torch.tensor([[float("inf"), 1.0]])
    g = torch.tensor([[2.0, 4.0]])
    out = stacked._sgd("w", p, g, recipe, torch.tensor([0.5]), {})
    assert torch.equal(out, torch.tensor([[float("inf"), -1.0]]))


def test_the_progress_bar_is_shown_by_default_and_cleared(
    capsys: pytest.CaptureFixture[str],
) -> None:
    x, y = _data()
    fit_stacked(_models([0]), x, y, [Recipe(epochs=2, batch_size=20)], [0])
    err = capsys.readouterr().err
    assert err.startswith("\rstacked:")
    assert not err.endswith("\n")


def test_no_progress_bar_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    x, y = _data()
    recipe = Recipe(epochs=2, batch_size=20)
    fit_stacked(_models([0]), x, y, [recipe], [0], progress=False)
    assert capsys.readouterr().err == ""


def test_the_running_loss_is_summed_in_float64() -> None:
    x, y = _data()
    recipes = [Recipe(epochs=2, batch_size=16, lr=lr) for lr in (0.1, 0.3)]
    hists = fit_stacked(_models([0, 1]), x, y, recipes, [0, 1], progress=False)
    losses = [v for h in hists for v in h["loss"]]
    assert any(float(np.float32(v)) != v for v in losses)


def test_training_ends_with_the_weights_kept_once_every_run_has_stopped() -> None:
    x, y = _data()
    models = _models([0, 1])
    before = [next(m.parameters()).detach().clone() for m in models]
    recipes = [Recipe(epochs=5, batch_size=16, lr=lr) for lr in (0.1, 0.2)]
    hists = fit_stacked(models, x, y, recipes, [0, 1], progress=False, stop_at=0.0)
    assert [len(h["loss"]) for h in hists] == [1, 1]
    for m, b in zip(models, before, strict=True):
        assert not m.training
        assert not torch.equal(next(m.parameters()), b)


def test_give_up_after_is_checked() -> None:
    x, y = _data()
    with pytest.raises(ValueError, match="give_up_after must be an epoch >= 1"):
        fit_stacked(_models([0]), x, y, [Recipe()], [0], stop_at=0.5, give_up_after=0)


def test_a_stopped_run_stays_stopped() -> None:
    """Its frozen weights may score below ``stop_at`` later: it does not resume."""
    x, y = _data()
    recipes = [
        Recipe(epochs=12, batch_size=8, lr=lr, schedule="constant", momentum=0.0)
        for lr in (2.0, 0.04)
    ]
    models = _models([0, 1])
    hists = fit_stacked(models, x, y, recipes, [0, 1], progress=False, stop_at=0.6)
    for h in hists:
        assert all(a < 0.6 for a in h["acc"][:-1])
    assert hists[0]["acc"][-1] >= 0.6 and len(hists[0]["acc"]) < 12


def test_a_stack_on_the_device_stays_there_while_runs_stop() -> None:
    """The stand-in device refuses host tensors mixed into the stack's state."""
    x, y = _data()
    recipes = [Recipe(epochs=3, batch_size=16, lr=lr) for lr in (2.0, 0.01)]
    models = _models([0, 1])
    with DeviceDiscipline():
        fit_stacked(
            models, x, y, recipes, [0, 1], device=DEVICE, progress=False, stop_at=0.5
        )
        assert all(p.device == DEVICE for m in models for p in m.parameters())
