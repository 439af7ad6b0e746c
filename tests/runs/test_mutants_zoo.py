"""wslib.runs.zoo pinned against a reference (survivors of mutation testing).

A model the zoo trains equals the same training written out by hand (seed,
model, recipe, ``fit``), with its history and test metrics; a stored
checkpoint that does not fit the model is named with torch's own first line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.kit import same_state
from tests.runs.test_zoo import CONFIG
from wslib.core.configs import build_model
from wslib.core.train import Recipe, evaluate, fit, seed_everything
from wslib.runs import zoo as zoo_module
from wslib.runs.zoo import Zoo, normalise_config


@pytest.fixture()
def zoo(tmp_path: Path) -> Zoo:
    return Zoo(
        tmp_path / "zoo", data_root=tmp_path / "data", device="cpu", progress=False
    )


def test_a_trained_model_is_the_training_written_out(zoo: Zoo) -> None:
    config = normalise_config(CONFIG)
    ds = zoo.dataset(config["data"])
    seed_everything(config["seed"])
    want = build_model(config["model"])
    untrained = {k: v.clone() for k, v in want.state_dict().items()}
    recipe = Recipe.from_dict(config["recipe"])
    history = fit(
        want, ds.x_train, ds.y_train, recipe, seed=0, device="cpu", progress=False
    )
    got = zoo.get(CONFIG)
    assert same_state(got.state_dict(), want.state_dict())
    assert not same_state(got.state_dict(), untrained)  # training moved it
    stored = torch.load(zoo.path(CONFIG), weights_only=True)
    assert stored["history"] == history
    assert stored["test"] == dict(
        zip(("loss", "acc"), evaluate(want, ds.x_test, ds.y_test))
    )


def test_a_checkpoint_that_does_not_fit_is_named_by_torchs_first_line() -> None:
    model = build_model(normalise_config(CONFIG)["model"])
    wrong = {k: torch.zeros(1) for k in model.state_dict()}
    with pytest.raises(RuntimeError) as error:
        model.load_state_dict(wrong)
    first = str(error.value).splitlines()[0]
    assert zoo_module._fits(model, {"state_dict": wrong}) == (
        f"does not fit the model: {first}"
    )
    assert zoo_module._fits(model, {}) == "does not fit the model: 'state_dict'"
