"""Clear errors of the neuron-structure operations."""

import pytest
import torch

from tests.kit import SIGNAL, mlp
from wslib.core.configs import build_model
from wslib.core.neurons import (
    neuron_structure,
    permute_state,
    random_permutations,
    rescale_state,
    validate_structure,
)

MLP = mlp([6, 4], **SIGNAL)


@pytest.fixture()
def model() -> torch.nn.Module:
    return build_model(MLP)


def test_foreign_model_is_rejected() -> None:
    with pytest.raises(TypeError, match="does not describe its neurons"):
        neuron_structure(torch.nn.Linear(3, 2))


def test_bad_permutations_are_rejected(model) -> None:
    structure, state = model.neuron_structure(), model.state_dict()
    with pytest.raises(ValueError, match="shape"):
        permute_state(state, structure, {"layer0": torch.arange(5)})
    with pytest.raises(ValueError, match="not a permutation"):
        permute_state(state, structure, {"layer0": torch.zeros(6, dtype=torch.long)})


def test_bad_scales_are_rejected(model) -> None:
    structure, state = model.neuron_structure(), model.state_dict()
    with pytest.raises(ValueError, match="strictly positive"):
        rescale_state(state, structure, {"layer0": -torch.ones(6)})
    with pytest.raises(ValueError, match="finite"):
        rescale_state(state, structure, {"layer0": torch.full((6,), float("inf"))})
    gelu = build_model({**MLP, "activation": "gelu"})
    with pytest.raises(ValueError, match="cannot be rescaled"):
        rescale_state(
            gelu.state_dict(), gelu.neuron_structure(), {"layer0": torch.ones(6)}
        )


def test_validate_structure_names_the_problem(model) -> None:
    structure, state = model.neuron_structure(), model.state_dict()
    with pytest.raises(KeyError, match="no tensor"):
        validate_structure(
            {k: v for k, v in state.items() if k != "linears.1.weight"}, structure
        )
    wrong = {**state, "linears.0.bias": torch.zeros(7)}
    with pytest.raises(ValueError, match="expected 6"):
        validate_structure(wrong, structure)


def test_permutation_then_inverse_is_identity(model) -> None:
    structure, state = model.neuron_structure(), model.state_dict()
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(0))
    inverse = {k: torch.argsort(p) for k, p in perms.items()}
    back = permute_state(permute_state(state, structure, perms), structure, inverse)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_misspelt_group_names_are_refused(model) -> None:
    structure, state = model.neuron_structure(), model.state_dict()
    with pytest.raises(ValueError, match="unknown group.*'layer_0'.*layer0, layer1"):
        permute_state(state, structure, {"layer_0": torch.arange(6)})
    with pytest.raises(ValueError, match="unknown group.*'Layer1'"):
        rescale_state(state, structure, {"Layer1": torch.ones(4)})


@pytest.mark.parametrize(
    "perm", [[1.7, 0.2, 2.9], [True, False, True], torch.tensor([0.5, 1.0, 2.0])]
)
def test_a_permutation_of_fractions_or_booleans_is_refused(perm) -> None:
    """A cast would cut [1.7, 0.2, 2.9] to the valid [1, 0, 2]: refused instead."""
    model = build_model(mlp([3], **SIGNAL))
    structure = model.neuron_structure()
    (group,) = structure.groups
    with pytest.raises(ValueError, match="entries that are not integers"):
        permute_state(model.state_dict(), structure, {group.name: perm})


def test_a_permutation_of_whole_floats_is_a_permutation() -> None:
    model = build_model(mlp([3], **SIGNAL))
    structure = model.neuron_structure()
    (group,) = structure.groups
    as_floats = permute_state(
        model.state_dict(), structure, {group.name: [2.0, 0.0, 1.0]}
    )
    as_ints = permute_state(model.state_dict(), structure, {group.name: [2, 0, 1]})
    for k, v in as_ints.items():
        assert torch.equal(as_floats[k], v)
