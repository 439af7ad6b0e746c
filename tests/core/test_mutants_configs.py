"""Model configs, found by mutation testing (``make mutation MODULE=core/configs``).

Pinned against hand-written expectations: the whole messages of
:func:`check_fits_data` and :func:`with_data_shape`, which shapes an MLP (by
feature count) and other models (by shape) accept, and the data set that
:func:`complete_model_configs` passes down into lists.
"""

from __future__ import annotations

import re

import pytest

from wslib.core.configs import (
    check_fits_data,
    complete_model_configs,
    with_data_shape,
)


def _refuses(config: dict, in_shape: tuple, n_classes: int | None, msg: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        check_fits_data(config, in_shape, n_classes, "digits")


def test_an_mlp_needs_the_feature_count_only() -> None:
    config = {"name": "mlp", "in_shape": [64], "n_classes": 10}
    assert check_fits_data(config, (1, 8, 8), 10, "digits") is None
    assert check_fits_data(config, (1, 8, 8), None, "digits") is None


def test_another_model_needs_the_whole_shape() -> None:
    config = {"name": "cnn", "in_shape": [1, 8, 8], "n_classes": 10}
    assert check_fits_data(config, (1, 8, 8), 10, "digits") is None
    _refuses(
        {**config, "in_shape": [64]},
        (1, 8, 8),
        10,
        "model 'cnn' has in_shape [64], but the data set 'digits' has inputs of "
        "shape [1, 8, 8]; give in_shape [1, 8, 8] or leave it out (it follows "
        "from the data set)",
    )


def test_an_mlp_with_the_wrong_feature_count_is_refused_whole() -> None:
    _refuses(
        {"name": "mlp", "in_shape": [1, 8, 9], "n_classes": 10},
        (1, 8, 8),
        10,
        "model 'mlp' has in_shape [1, 8, 9], but the data set 'digits' has inputs "
        "of shape [1, 8, 8]; give in_shape [1, 8, 8] or leave it out (it follows "
        "from the data set)",
    )


def test_a_config_without_in_shape_is_refused() -> None:
    _refuses(
        {"name": "mlp", "n_classes": 10},
        (1, 8, 8),
        10,
        "model 'mlp' has in_shape [], but the data set 'digits' has inputs of "
        "shape [1, 8, 8]; give in_shape [1, 8, 8] or leave it out (it follows "
        "from the data set)",
    )


def test_a_wrong_class_count_is_refused_whole() -> None:
    _refuses(
        {"name": "mlp", "in_shape": [64], "n_classes": 7},
        (1, 8, 8),
        10,
        "model 'mlp' has n_classes 7, but the data set 'digits' has 10 classes; "
        "give n_classes 10 or leave it out (it follows from the data set)",
    )
    _refuses(
        {"name": "mlp", "in_shape": [64]},
        (1, 8, 8),
        10,
        "model 'mlp' has n_classes None, but the data set 'digits' has 10 classes; "
        "give n_classes 10 or leave it out (it follows from the data set)",
    )


def test_an_unknown_data_set_message_lists_keys_and_data_sets() -> None:
    msg = (
        "model config {'name': 'mlp'} has no in_shape or n_classes and the data "
        "set 'toy' has no known shape; give in_shape, n_classes in the config or "
        "train on one of mnist1d, digits, mnist, fashion_mnist, cifar10, cifar100"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        with_data_shape({"name": "mlp"}, {"name": "toy"})


def test_configs_in_a_list_are_completed_from_the_data_given() -> None:
    done = complete_model_configs([{"name": "mlp", "widths": [4]}], {"name": "digits"})
    assert done == [
        {"name": "mlp", "in_shape": [1, 8, 8], "n_classes": 10, "widths": [4]}
    ]
