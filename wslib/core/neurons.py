"""The neuron structure: which tensor slices belong to each hidden neuron.

A *neuron group* is a set of hidden units that share one permutation (a layer,
or a residual stream whose channels are tied through skip connections). Each
group lists the state-dict tensors it touches as :class:`Slot` s:

- ``"out"``: the tensor *produces* the neuron (weight rows, bias, BN gamma and
  beta). Permuted with the neuron; multiplied by ``lam`` under rescaling.
- ``"in"``: the tensor *consumes* the neuron (weight columns of the next layer).
  Permuted; multiplied by ``1 / lam`` under rescaling.
- ``"free"``: permuted only, left alone by rescaling (pre-BatchNorm weights,
  which BatchNorm makes scale-free; BN running statistics; LayerNorm affine
  parameters in a stream that cannot be rescaled).

Permutations and positive rescalings of a group leave the network function
unchanged; every method of the book (weight matching, OTFusion, HF/KF,
PathCond, ENorm) is written against this structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch

Role = Literal["out", "in", "free"]
StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Slot:
    """One tensor slice of a neuron group.

    ``block`` > 1 means the axis holds ``size * block`` entries laid out
    neuron-major (a linear layer after flattening ``(channels, length)``).
    """

    name: str
    axis: int
    role: Role
    block: int = 1


@dataclass(frozen=True)
class NeuronGroup:
    """Hidden neurons that share one permutation / one scale each."""

    name: str
    size: int
    slots: tuple[Slot, ...]
    rescalable: bool = True


@dataclass(frozen=True)
class NeuronStructure:
    """All neuron groups of one architecture, in data-flow order."""

    groups: tuple[NeuronGroup, ...] = field(default_factory=tuple)

    def __getitem__(self, name: str) -> NeuronGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(
            f"no neuron group {name!r}; groups: {[g.name for g in self.groups]}"
        )

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.groups]


def neuron_structure(model: torch.nn.Module) -> NeuronStructure:
    """Return the neuron structure of a model built by :mod:`wslib.core.models`."""
    if not hasattr(model, "neuron_structure"):
        raise TypeError(
            f"{type(model).__name__} does not describe its neurons; build the model with "
            "wslib.core.configs.build_model or add a neuron_structure() method to it."
        )
    structure: NeuronStructure = cast(Any, model).neuron_structure()
    return structure


def expand_index(perm: torch.Tensor, block: int) -> torch.Tensor:
    """Expand a neuron permutation to the entries of a neuron-major axis."""
    if block == 1:
        return perm
    offsets = torch.arange(block, device=perm.device)
    return (perm[:, None] * block + offsets[None, :]).reshape(-1)


def _permute_slot(t: torch.Tensor, slot: Slot, perm: torch.Tensor) -> torch.Tensor:
    return t.index_select(slot.axis, expand_index(perm.to(t.device), slot.block))


def _scale_slot(t: torch.Tensor, slot: Slot, lam: torch.Tensor) -> torch.Tensor:
    if slot.role == "free":
        return t
    factor = lam if slot.role == "out" else 1.0 / lam
    factor = factor.to(t.device, t.dtype).repeat_interleave(slot.block)
    shape = [1] * t.dim()
    shape[slot.axis] = -1
    return t * factor.reshape(shape)


def _check_vector(group: NeuronGroup, v: torch.Tensor, what: str) -> None:
    if v.shape != (group.size,):
        raise ValueError(
            f"{what} for group {group.name!r} has shape {tuple(v.shape)}, expected ({group.size},)"
        )


def _integer_index(values: Any, group: NeuronGroup) -> torch.Tensor:
    """``values`` as a long tensor; refused unless every entry is an integer.

    A cast alone would cut ``[1.7, 0.2, 2.9]`` to the valid ``[1, 0, 2]`` and
    apply a permutation nobody gave.
    """
    raw = torch.as_tensor(values)
    if (
        raw.dtype == torch.bool
        or raw.is_complex()
        or (raw.is_floating_point() and not bool((raw == raw.round()).all()))
    ):
        raise ValueError(
            f"permutation for group {group.name!r} has entries that are not integers "
            f"({raw.flatten()[:4].tolist()}...); give neuron indices, e.g. "
            "torch.randperm(n)"
        )
    return raw.to(torch.long)


def _check_names(structure: NeuronStructure, given: dict, what: str) -> None:
    """Refuse names in ``given`` that are no group of ``structure`` (a typo would do nothing)."""
    names = [g.name for g in structure.groups]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(
            f"{what} given for unknown group(s) {', '.join(map(repr, unknown))}; "
            f"the model's groups are {', '.join(names)}"
        )


def permute_state(
    state: StateDict, structure: NeuronStructure, perms: dict[str, torch.Tensor]
) -> StateDict:
    """Return a copy of ``state`` with the neurons of each named group permuted.

    ``perms[g]`` is an index tensor: new neuron ``i`` is old neuron ``perms[g][i]``.
    Groups not in ``perms`` stay as they are; a name that is no group is an error.
    """
    _check_names(structure, perms, "permutation")
    out = dict(state)
    for group in structure.groups:
        if group.name not in perms:
            continue
        perm = _integer_index(perms[group.name], group)
        _check_vector(group, perm, "permutation")
        if not torch.equal(torch.sort(perm).values, torch.arange(group.size)):
            raise ValueError(
                f"permutation for group {group.name!r} is not a permutation"
            )
        for slot in group.slots:
            out[slot.name] = _permute_slot(out[slot.name], slot, perm)
    return out


def rescale_state(
    state: StateDict, structure: NeuronStructure, scales: dict[str, torch.Tensor]
) -> StateDict:
    """Return a copy of ``state`` with each named group rescaled by positive ``scales[g]``.

    A neuron with scale ``lam`` has its producing slices multiplied by ``lam``
    and its consuming slices by ``1 / lam``. Scales must be finite; a name
    that is no group is an error.
    """
    _check_names(structure, scales, "scale")
    out = dict(state)
    for group in structure.groups:
        if group.name not in scales:
            continue
        if not group.rescalable:
            raise ValueError(
                f"group {group.name!r} cannot be rescaled (it feeds a normalisation or a "
                "non-homogeneous activation); rescale only groups with rescalable=True"
            )
        lam = torch.as_tensor(scales[group.name], dtype=torch.float64)
        _check_vector(group, lam, "scale vector")
        if not bool(((lam > 0) & torch.isfinite(lam)).all()):
            raise ValueError(
                f"scales for group {group.name!r} must be strictly positive and "
                "finite (an infinite scale turns the model's outputs into NaN)"
            )
        for slot in group.slots:
            out[slot.name] = _scale_slot(out[slot.name], slot, lam)
    return out


def random_permutations(
    structure: NeuronStructure, *, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """One uniformly random permutation per group."""
    return {
        g.name: torch.randperm(g.size, generator=generator) for g in structure.groups
    }


def random_scales(
    structure: NeuronStructure,
    *,
    spread: float = 1.0,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Log-normal positive scales (``exp(spread * N(0, 1))``) for every rescalable group."""
    return {
        g.name: torch.exp(
            spread * torch.randn(g.size, generator=generator, dtype=torch.float64)
        )
        for g in structure.groups
        if g.rescalable
    }


def validate_structure(state: StateDict, structure: NeuronStructure) -> None:
    """Check that every slot names an existing tensor whose axis has the group's size."""
    for group in structure.groups:
        for slot in group.slots:
            if slot.name not in state:
                raise KeyError(
                    f"group {group.name!r}: no tensor {slot.name!r} in the state dict"
                )
            n = state[slot.name].shape[slot.axis]
            if n != group.size * slot.block:
                raise ValueError(
                    f"group {group.name!r}: {slot.name} axis {slot.axis} has {n} entries, "
                    f"expected {group.size} x {slot.block}"
                )
