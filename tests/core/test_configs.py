"""wslib.core.configs: a model config completed from its data set."""

from __future__ import annotations

import pytest

from wslib.core.configs import (
    DATA_SHAPES,
    build_model,
    complete_model_configs,
    with_data_shape,
)
from wslib.core.data import DATASETS, load_dataset


def test_every_data_set_has_a_shape() -> None:
    assert tuple(DATA_SHAPES) == DATASETS


@pytest.mark.parametrize("name", ["mnist1d", "digits"])
def test_shapes_are_those_of_the_loaded_data_sets(name: str, tmp_path) -> None:
    ds = load_dataset(name, root=tmp_path)
    assert DATA_SHAPES[name] == (ds.in_shape, ds.n_classes)


def test_shape_goes_after_the_name_as_the_book_writes_it() -> None:
    config = with_data_shape({"name": "mlp", "widths": [8]}, {"name": "cifar100"})
    assert list(config.items()) == [
        ("name", "mlp"),
        ("in_shape", [3, 32, 32]),
        ("n_classes", 100),
        ("widths", [8]),
    ]
    assert build_model(config)  # a complete config


def test_a_value_the_config_gives_is_kept() -> None:
    autoencoder = {"name": "mlp", "n_classes": 40, "widths": [8]}
    config = with_data_shape(autoencoder, {"name": "mnist1d"})
    assert (config["in_shape"], config["n_classes"]) == ([1, 40], 40)
    toy = {"name": "mlp", "in_shape": [1, 5], "n_classes": 3}
    assert with_data_shape(toy, None) == toy


def test_an_unknown_data_set_is_named_with_the_fix() -> None:
    with pytest.raises(ValueError, match="no in_shape or n_classes.*'svhn'.*mnist1d"):
        with_data_shape({"name": "mlp"}, {"name": "svhn"})


def test_every_model_config_of_a_chapter_is_completed() -> None:
    params = {
        "data": {"name": "cifar10"},
        "models": {"a": {"name": "vgg11"}, "b": {"name": "mlp", "widths": [4]}},
        "archs": {
            "ae": {"data": {"name": "mnist"}, "model": {"name": "mlp"}},
            "conv": {"model": {"name": "cifar_nv"}, "recipe": {"epochs": 1}},
        },
        "variants": [{"width": 0.5}],
        "n_points": 3,
    }
    done = complete_model_configs(params, None)
    assert done["models"]["a"] == {
        "name": "vgg11",
        "in_shape": [3, 32, 32],
        "n_classes": 10,
    }
    assert done["models"]["b"]["in_shape"] == [3, 32, 32]
    assert done["archs"]["ae"]["model"]["in_shape"] == [1, 28, 28]  # its own data set
    assert done["archs"]["conv"]["model"]["n_classes"] == 10
    assert done["archs"]["conv"]["recipe"] == {"epochs": 1}
    assert done["variants"] == [{"width": 0.5}] and done["n_points"] == 3
    assert params["models"]["a"] == {"name": "vgg11"}  # the input is left as it was
