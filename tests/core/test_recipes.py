"""wslib/core/recipes.py: a recipe that cannot train is refused, naming its field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wslib.core.recipes import OPTIMIZERS, PRECISIONS, SCHEDULES, Recipe


def test_recipe_errors() -> None:
    with pytest.raises(ValueError, match="unknown optimizer"):
        Recipe(optimizer="lbfgs")
    with pytest.raises(ValueError, match="unknown recipe keys"):
        Recipe.from_dict({"epochz": 3})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epochs", 0, "recipe epochs = 0 trains nothing; give epochs >= 1"),
        ("epochs", -3, "recipe epochs = -3 trains nothing"),
        ("epochs", 2.5, "recipe epochs must be an integer"),
        ("epochs", True, "recipe epochs must be an integer"),
        ("batch_size", 0, "recipe batch_size = 0 trains nothing"),
        (
            "lr",
            0.0,
            r"recipe lr = 0.0 is outside \(0, inf\); an lr of 0 trains nothing",
        ),
        ("lr", -0.1, r"recipe lr = -0.1 is outside \(0, inf\)"),
        ("lr", float("nan"), "recipe lr = nan is outside"),
        ("lr", "0.1", "recipe lr must be a number"),
        ("momentum", 1.0, r"recipe momentum = 1.0 is outside \[0, 1\)"),
        ("momentum", -0.5, "recipe momentum = -0.5 is outside"),
        ("weight_decay", -1e-4, r"recipe weight_decay = -0.0001 is outside \[0, inf\)"),
        ("augment", "yes", "recipe augment must be true or false"),
    ],
)
def test_a_recipe_that_cannot_train_is_refused(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        Recipe(**{field: value})


def test_edge_recipes_that_train_are_accepted() -> None:
    Recipe(epochs=1, batch_size=1, lr=1e-9, momentum=0.0, weight_decay=0.0)
    Recipe(epochs=np.int64(2), lr=np.float32(0.1), momentum=0.999)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "momentum",
            1.5,
            r"^recipe momentum = 1.5 is outside \[0, 1\); give a value in that range$",
        ),
        (
            "lr",
            0.0,
            r"^recipe lr = 0.0 is outside \(0, inf\); an lr of 0 trains nothing$",
        ),
        ("schedule", "step", r"^unknown schedule 'step'; valid: "),
    ],
)
def test_recipe_messages_are_whole(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        Recipe(**{field: value})


@given(
    epochs=st.integers(1, 500),
    batch_size=st.integers(1, 4096),
    lr=st.floats(1e-6, 10.0),
    momentum=st.floats(0.0, 0.999),
    optimizer=st.sampled_from(OPTIMIZERS),
    schedule=st.sampled_from(SCHEDULES),
    precision=st.sampled_from(PRECISIONS),
    augment=st.booleans(),
)
def test_a_recipe_round_trips_through_its_dict(**fields: object) -> None:
    recipe = Recipe(**fields)  # type: ignore[arg-type]
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert recipe.to_dict() == {**Recipe().to_dict(), **fields}
