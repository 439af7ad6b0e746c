"""wslib/core/norms.py: the parameters of normalisation layers, named as the model names them."""

from __future__ import annotations

from torch import nn

from wslib.core.norms import norm_parameter_names


def test_norm_parameters_are_named_by_their_full_path_and_only_theirs() -> None:
    block = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model = nn.Sequential(nn.LayerNorm(3), block, nn.Linear(4, 2))
    names = norm_parameter_names(model)
    assert names == {"0.weight", "0.bias", "1.1.weight", "1.1.bias"}
    assert names <= dict(model.named_parameters()).keys()


def test_a_norm_layer_that_is_the_model_names_its_parameters_bare() -> None:
    assert norm_parameter_names(nn.GroupNorm(2, 4)) == {"weight", "bias"}


def test_a_norm_layer_holding_another_layer_names_only_its_own() -> None:
    norm = nn.LayerNorm(3)
    norm.inner = nn.Linear(3, 3)  # a child that is no norm layer
    assert norm_parameter_names(norm) == {"weight", "bias"}
