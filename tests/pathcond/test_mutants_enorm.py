"""ENorm's corner cases that the main tests leave open (found by mutation testing).

A group whose norm on one side is empty, the factor cast to each tensor's
dtype before the in-place product, the refusal's message, the callbacks'
default ``p``, the fused norms against the per-slice ones, and the
callback's kept structure.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import wslib.pathcond.enorm as enorm_module
from tests.devicecheck import DeviceDiscipline, to_device
from tests.kit import mlp, seeded_model
from tests.pathcond.test_pathcond import ALL_ARCHS, _enorm_reference
from tests.pathcond.tiny import perturbed
from wslib.core.configs import build_model
from wslib.core.neurons import NeuronGroup, NeuronStructure, Slot
from wslib.pathcond.enorm import (
    enorm_callback,
    enorm_step,
    enorm_step_authors,
    enorm_step_pathcond_variant,
)


class BiasSidedNet(nn.Module):
    """``fc -> relu -> out`` whose one group is described by ``slots`` only.

    ``"bias out"``: the producing side is the bias alone (its norm has no
    weight, so it is empty); ``"bias only"``: the group owns nothing but its
    bias, two entries per neuron (``block`` 2), so both norms are empty.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))

    def neuron_structure(self) -> NeuronStructure:
        if self.kind == "bias out":
            slots = (Slot("fc.bias", 0, "out"), Slot("out.weight", 1, "in"))
            return NeuronStructure((NeuronGroup("fc", 4, slots),))
        slots = (Slot("fc.bias", 0, "out", block=2),)
        return NeuronStructure((NeuronGroup("fc", 2, slots),))


@pytest.mark.parametrize("kind", ["bias out", "bias only"])
@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_a_group_with_an_empty_norm_keeps_scale_one(kind: str, on_device: bool):
    """Where a neuron's incoming or outgoing norm has no weight (only a bias),
    its scale is 1: ENorm leaves the model as it is, and on a device the empty
    norm is made there (no host tensor joins the device's)."""
    torch.manual_seed(0)
    model = BiasSidedNet(kind)
    before = copy.deepcopy(model.state_dict())
    if on_device:
        with DeviceDiscipline():
            moved = to_device(model)
            enorm_step(moved)
            enorm_step_authors(moved)  # its last group is never visited: no-op
    else:
        enorm_step(model)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("rescale_bias", [True, False])
def test_a_float32_model_takes_the_factor_cast_to_float32(rescale_bias: bool):
    """In float32 each tensor is multiplied by the float32 factor (cast first,
    then one product), as :func:`wslib.core.neurons.rescale_state` does: the
    result equals the out-of-place reference bit for bit."""
    model = perturbed(mlp([7, 6], in_shape=[1, 5]), seed=3).float()
    with torch.no_grad():  # uneven scales: no lam is 1
        for param in model.parameters():
            param.mul_(torch.exp(0.7 * torch.randn_like(param)))
    expected = _enorm_reference(model, 2.0, rescale_bias, authors=False)
    enorm_step(model, rescale_bias=rescale_bias)
    for name, value in model.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, expected[name]), name


def test_the_refusal_names_the_model_and_why():
    model = build_model(mlp([4], in_shape=[1, 10], n_classes=2, activation="gelu"))
    message = (
        r"^MLP has no rescalable neuron group \(non-homogeneous activation or "
        r"normalisation\): ENorm does not apply$"
    )
    with pytest.raises(ValueError, match=message):
        enorm_step(model)
    with pytest.raises(ValueError, match=message):
        enorm_step_authors(model)


def test_the_callbacks_default_to_p_2():
    """``enorm_callback()`` is ENorm with its default ``p`` = 2, and the
    authors' epoch callback is their ENorm with ``p`` = 2."""
    model = seeded_model(mlp([5, 4], in_shape=[1, 6]), 0).double()
    step, callback = copy.deepcopy(model), copy.deepcopy(model)
    l1 = copy.deepcopy(model)
    enorm_step(step, p=2.0)
    enorm_callback()(callback)
    enorm_step(l1, p=1.0)
    authors, variant = copy.deepcopy(model), copy.deepcopy(model)
    enorm_step_authors(authors, p=2.0)
    enorm_step_pathcond_variant(0, variant)
    for name, value in step.state_dict().items():
        assert torch.equal(callback.state_dict()[name], value), name
        assert torch.equal(variant.state_dict()[name], authors.state_dict()[name])
    assert not torch.allclose(l1.linears[0].weight, step.linears[0].weight)


def _per_tensor_norm(state, group, role, p):
    """ENorm's norm as it was before the ``torch._foreach`` form: one slice at a time."""
    total = None
    for slot in group.slots:
        if slot.role != role or (
            slot.name.endswith("bias") and state[slot.name].dim() == 1
        ):
            continue
        t = state[slot.name].detach().double().abs().pow(p).movedim(slot.axis, 0)
        part = t.reshape(group.size, slot.block, -1).sum((1, 2))
        total = part if total is None else total + part
    return total


@pytest.mark.parametrize("arch", ["mlp", "resnet1d", "cnn_bn", "cnn_max"])
@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_the_fused_norms_are_bit_identical_to_the_per_tensor_ones(arch, p):
    """On the CPU the ``torch._foreach`` norms equal the per-slice ones bit for
    bit, for every group and both sides, so a cycle computes what it did."""
    model = perturbed(ALL_ARCHS[arch], seed=2)
    state = model.state_dict()
    for group in model.neuron_structure().groups:
        for role in ("in", "out"):
            expected = _per_tensor_norm(state, group, role, p)
            got = enorm_module._norm(state, group, role, p)
            assert expected is not None and torch.equal(got, expected), (group, role)


def test_the_callback_reads_each_models_structure_once(monkeypatch):
    """The ``on_step`` callback keeps each model's neuron structure: three steps
    on each of two models read it twice in all, and each step still equals
    one plain ENorm cycle."""
    reads: list[int] = []
    models = [seeded_model(mlp([5, 4], in_shape=[1, 6]), s).double() for s in (0, 1)]
    plain = [copy.deepcopy(m) for m in models]
    for model in models:
        describe = model.neuron_structure
        monkeypatch.setattr(
            model,
            "neuron_structure",
            lambda describe=describe, model=model: (
                reads.append(id(model)) or describe()
            ),
        )
    callback = enorm_callback()
    for _ in range(3):
        for model, reference in zip(models, plain, strict=True):
            callback(model)
            enorm_step(reference)
            for name, value in reference.state_dict().items():
                assert torch.equal(model.state_dict()[name], value), name
    assert sorted(reads) == sorted(id(m) for m in models)
