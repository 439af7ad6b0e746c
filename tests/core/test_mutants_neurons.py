"""Neuron structure, found by mutation testing (``make mutation MODULE=core/neurons``).

Pinned against independent references: the entries of a neuron-major axis
written out by hand, rescaled tensors computed in float64 by hand (a neuron
with scale ``lam``: producing slices times ``lam``, consuming slices over
it), the network function unchanged by a permutation or a rescaling of a
group that follows a skipped one, the devices of the results under the
stand-in GPU of :mod:`tests.devicecheck`, the draws of a seeded generator,
and the wording of every refusal (what was refused, and what to do).
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.devicecheck import DEVICE, DeviceDiscipline
from tests.kit import mlp, seeded_model
from wslib.core.neurons import (
    NeuronGroup,
    NeuronStructure,
    Slot,
    StateDict,
    expand_index,
    neuron_structure,
    permute_state,
    random_scales,
    rescale_state,
)

F64 = torch.float64


def one_group(block: int = 1, rescalable: bool = True) -> NeuronStructure:
    """Group ``g`` of 2 neurons: rows of ``w`` (out), columns of ``v`` (in, ``block`` each)."""
    slots = (Slot("w", 0, "out"), Slot("v", 1, "in", block))
    return NeuronStructure((NeuronGroup("g", 2, slots, rescalable),))


def one_group_state(block: int = 1, dtype: torch.dtype = F64) -> StateDict:
    """``w``: 2 x 3, ``v``: 1 x 2*block, entries 1, 2, ... (distinct)."""
    w = torch.arange(1, 7, dtype=dtype).reshape(2, 3)
    v = torch.arange(1, 2 * block + 1, dtype=dtype).reshape(1, -1)
    return {"w": w, "v": v}


# --- expand_index ------------------------------------------------------------------


def test_expand_index_spells_out_neuron_major_blocks() -> None:
    """Neuron ``p`` of block 2 is entries ``2p, 2p + 1``; block 1 is the permutation."""
    perm = torch.tensor([1, 0, 2])
    assert expand_index(perm, 2).tolist() == [2, 3, 0, 1, 4, 5]
    assert expand_index(perm, 3).tolist() == [3, 4, 5, 0, 1, 2, 6, 7, 8]
    assert expand_index(perm, 1).tolist() == [1, 0, 2]


def test_expand_index_stays_on_the_permutations_device() -> None:
    with DeviceDiscipline():
        perm = torch.tensor([1, 0], device=DEVICE)
        got = expand_index(perm, 2)
        assert got.device == DEVICE
    assert got.tolist() == [2, 3, 0, 1]


# --- permute_state -----------------------------------------------------------------


def test_permute_state_permutes_blocks_of_consumers() -> None:
    structure, state = one_group(block=2), one_group_state(block=2)
    out = permute_state(state, structure, {"g": torch.tensor([1, 0])})
    assert out["w"].tolist() == [[4, 5, 6], [1, 2, 3]]
    assert out["v"].tolist() == [[3, 4, 1, 2]]


def test_permute_state_on_the_device_with_a_host_permutation() -> None:
    """A permutation given on the host applies to device tensors (as CUDA needs)."""
    structure = one_group(block=2)
    with DeviceDiscipline():
        state = {k: v.to(DEVICE) for k, v in one_group_state(block=2).items()}
        out = permute_state(state, structure, {"g": torch.tensor([1, 0])})
        assert all(t.device == DEVICE for t in out.values())
    assert out["v"].tolist() == [[3, 4, 1, 2]]


def test_permuting_a_later_group_after_a_skipped_one_keeps_the_function() -> None:
    """Only the second of two groups is permuted: it must be permuted, and the
    network computes the same outputs."""
    model = seeded_model(mlp([4, 3]), 0)
    structure = neuron_structure(model)
    state = model.state_dict()
    out = permute_state(state, structure, {"layer1": torch.tensor([2, 0, 1])})
    assert torch.equal(out["linears.1.weight"], state["linears.1.weight"][[2, 0, 1]])
    assert torch.equal(out["linears.2.weight"], state["linears.2.weight"][:, [2, 0, 1]])
    x = torch.randn(5, 1, 8, generator=torch.Generator().manual_seed(0))
    other = seeded_model(mlp([4, 3]), 1)
    other.load_state_dict(out)
    torch.testing.assert_close(other(x), model(x))


def test_permutation_refusals_say_what_was_wrong() -> None:
    structure, state = one_group(), one_group_state()
    with pytest.raises(ValueError, match="^permutation given for unknown group"):
        permute_state(state, structure, {"h": torch.tensor([0, 1])})
    with pytest.raises(ValueError, match="^permutation for group 'g' has shape"):
        permute_state(state, structure, {"g": torch.tensor([0, 1, 2])})


def test_unknown_groups_are_listed_comma_separated() -> None:
    structure, state = one_group(), one_group_state()
    with pytest.raises(ValueError, match=re.escape("group(s) 'a', 'b'; the model's")):
        permute_state(state, structure, {"b": [0, 1], "a": [0, 1]})


def test_a_non_integer_permutation_shows_four_entries_and_a_remedy() -> None:
    structure = NeuronStructure((NeuronGroup("g", 5, (Slot("w", 0, "out"),)),))
    state = {"w": torch.zeros(5, 1)}
    bad = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError) as info:
        permute_state(state, structure, {"g": bad})
    message = str(info.value)
    assert "([0.5, 1.0, 2.0, 3.0]...)" in message
    assert message.endswith("give neuron indices, e.g. torch.randperm(n)")


# --- rescale_state -----------------------------------------------------------------


def test_rescale_state_computes_its_factors_in_float64() -> None:
    """Scales given in float32 are taken as float64: ``1 / 3`` of a float64
    tensor is float64's third, not float32's."""
    structure, state = one_group(block=2), one_group_state(block=2)
    lam = torch.tensor([3.0, 0.5], dtype=torch.float32)
    out = rescale_state(state, structure, {"g": lam})
    third = torch.tensor(1.0, dtype=F64) / 3.0
    two = torch.tensor(2.0, dtype=F64)
    want_v = state["v"] * torch.stack([third, third, two, two])
    assert torch.equal(out["v"], want_v)
    assert torch.equal(out["w"], state["w"] * torch.tensor([[3.0], [0.5]], dtype=F64))


def test_rescale_state_keeps_the_dtype_of_each_tensor() -> None:
    structure, state = one_group(), one_group_state(dtype=torch.float32)
    out = rescale_state(state, structure, {"g": torch.tensor([3.0, 0.5], dtype=F64)})
    assert out["w"].dtype == torch.float32
    assert out["v"].dtype == torch.float32


def test_rescale_state_stays_on_the_tensors_device() -> None:
    structure = one_group(block=2)
    with DeviceDiscipline():
        state = {k: v.to(DEVICE) for k, v in one_group_state(block=2).items()}
        out = rescale_state(state, structure, {"g": torch.tensor([2.0, 4.0])})
        assert all(t.device == DEVICE for t in out.values())
    assert out["v"].tolist() == [[0.5, 1.0, 0.75, 1.0]]


def test_rescaling_a_later_group_after_a_skipped_one_keeps_the_function() -> None:
    model = seeded_model(mlp([4, 3]), 0)
    structure = neuron_structure(model)
    state = model.state_dict()
    lam = torch.tensor([2.0, 0.5, 4.0])
    out = rescale_state(state, structure, {"layer1": lam})
    assert torch.allclose(out["linears.1.bias"], state["linears.1.bias"] * lam)
    x = torch.randn(5, 1, 8, generator=torch.Generator().manual_seed(0))
    other = seeded_model(mlp([4, 3]), 1)
    other.load_state_dict(out)
    torch.testing.assert_close(other(x), model(x))


def test_a_zero_scale_is_refused_with_the_reason() -> None:
    structure, state = one_group(), one_group_state()
    with pytest.raises(ValueError) as info:
        rescale_state(state, structure, {"g": torch.tensor([0.0, 1.0])})
    assert str(info.value).endswith(
        "must be strictly positive and finite (an infinite scale turns the "
        "model's outputs into NaN)"
    )


def test_rescaling_refusals_say_what_was_wrong() -> None:
    structure, state = one_group(), one_group_state()
    with pytest.raises(ValueError, match="^scale given for unknown group"):
        rescale_state(state, structure, {"h": torch.ones(2)})
    with pytest.raises(ValueError, match="^scale vector for group 'g' has shape"):
        rescale_state(state, structure, {"g": torch.ones(3)})
    with pytest.raises(ValueError) as info:
        rescale_state(state, one_group(rescalable=False), {"g": torch.ones(2)})
    assert str(info.value).endswith(
        "non-homogeneous activation); rescale only groups with rescalable=True"
    )


# --- random_scales, lookups ----------------------------------------------------------


def test_random_scales_are_exp_of_the_generators_normals() -> None:
    """Spread 1 by default, drawn from the generator given (float64 normals)."""
    structure = one_group()
    got = random_scales(structure, generator=torch.Generator().manual_seed(3))
    normals = torch.randn(2, generator=torch.Generator().manual_seed(3), dtype=F64)
    assert torch.equal(got["g"], torch.exp(normals))


def test_lookup_errors_name_the_missing_and_the_remedy() -> None:
    with pytest.raises(KeyError, match="no neuron group 'h'; groups:"):
        one_group()["h"]
    with pytest.raises(TypeError) as info:
        neuron_structure(torch.nn.Linear(2, 2))
    message = str(info.value)
    assert message.startswith("Linear does not describe its neurons")
    assert message.endswith(
        "wslib.core.configs.build_model or add a neuron_structure() method to it."
    )
