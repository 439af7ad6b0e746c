"""Equi-normalisation (ENorm, Stock et al. 2019) over the neuron structure.

One ENorm cycle visits the rescalable neuron groups in data-flow order and
rescales each hidden neuron so that the p-norm of its incoming weights (the
weight slices that produce it) and of its outgoing weights (the slices that
consume it) are balanced: with ``a = ||in||_p^p`` and ``b = ||out||_p^p`` the
neuron gets the scale ``lam = (b / a)^(1 / (2p))``, which minimises
``lam^p a + lam^-p b``. Biases do not enter the norms; in the original method
they are rescaled with their neuron, so the network function is unchanged.
The original applies one cycle after every SGD step (:func:`enorm_callback`
with ``fit(on_step=...)``).

:func:`enorm_step_authors` is the variant in the PathCond authors'
experiments (their copy of Stock et al.'s ``ENorm._step_fc`` with no biases
registered): every scale is computed from the norms *before* the cycle (the
loop reuses norms it computed one layer earlier), the last hidden layer is
never visited (the loop stops one layer early), and biases are not rescaled
(the function changes). :func:`enorm_step_pathcond_variant` applies it once
per epoch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from wslib.core.neurons import (
    NeuronGroup,
    NeuronStructure,
    neuron_structure,
    rescale_state,
)


def _is_bias(name: str, state: dict[str, torch.Tensor]) -> bool:
    return name.endswith("bias") and state[name].dim() == 1


def _norm(
    state: dict[str, torch.Tensor], group: NeuronGroup, role: str, p: float
) -> torch.Tensor:
    total = torch.zeros(group.size, dtype=torch.float64)
    for slot in group.slots:
        if slot.role != role or _is_bias(slot.name, state):
            continue
        t = state[slot.name].detach().double().abs().pow(p).movedim(slot.axis, 0)
        total += t.reshape(group.size, slot.block, -1).sum((1, 2)).cpu()
    return total


def _structure(model: nn.Module) -> NeuronStructure:
    structure = neuron_structure(model)
    if not any(g.rescalable for g in structure.groups):
        raise ValueError(
            f"{type(model).__name__} has no rescalable neuron group (non-homogeneous "
            "activation or normalisation): ENorm does not apply"
        )
    return structure


@torch.no_grad()
def enorm_step(model: nn.Module, p: float = 2.0, rescale_bias: bool = True) -> None:
    """One ENorm cycle in place (function-preserving when ``rescale_bias``)."""
    if p <= 0:
        raise ValueError(f"p must be positive, got {p}")
    structure = _structure(model)
    state = {k: v for k, v in model.state_dict().items()}
    for group in structure.groups:
        if not group.rescalable:
            continue
        a, b = _norm(state, group, "out", p), _norm(state, group, "in", p)
        ok = (a > 0) & (b > 0)
        lam = torch.where(
            ok, (b / a.clamp_min(1e-300)).pow(1 / (2 * p)), torch.ones_like(a)
        )
        slots = (
            group.slots
            if rescale_bias
            else tuple(
                s
                for s in group.slots
                if not (s.role == "out" and _is_bias(s.name, state))
            )
        )
        single = NeuronStructure((NeuronGroup(group.name, group.size, slots),))
        state = rescale_state(state, single, {group.name: lam})
    model.load_state_dict(state)


@torch.no_grad()
def enorm_step_authors(model: nn.Module, p: float = 2.0) -> None:
    """One cycle of the PathCond authors' ENorm in place (see the module docstring).

    All scales ``lam = (b / a)^(1 / (2p))`` come from the state before the
    cycle; the last rescalable group keeps scale 1; biases are not rescaled.
    """
    if p <= 0:
        raise ValueError(f"p must be positive, got {p}")
    structure = _structure(model)
    state = dict(model.state_dict())
    groups = [g for g in structure.groups if g.rescalable][:-1]
    scales, kept = {}, []
    for group in groups:
        a, b = _norm(state, group, "out", p), _norm(state, group, "in", p)
        ok = (a > 0) & (b > 0)
        scales[group.name] = torch.where(
            ok, (b / a.clamp_min(1e-300)).pow(1 / (2 * p)), torch.ones_like(a)
        )
        slots = tuple(
            s for s in group.slots if not (s.role == "out" and _is_bias(s.name, state))
        )
        kept.append(NeuronGroup(group.name, group.size, slots))
    model.load_state_dict(rescale_state(state, NeuronStructure(tuple(kept)), scales))


def enorm_callback(p: float = 2.0) -> Callable[[nn.Module], None]:
    """``on_step`` callback for :func:`wslib.core.train.fit`: one ENorm cycle after every SGD step."""
    return lambda model: enorm_step(model, p)


def enorm_step_pathcond_variant(epoch: int, model: nn.Module) -> None:
    """``on_epoch`` callback: the PathCond authors' ENorm (:func:`enorm_step_authors`)."""
    del epoch
    enorm_step_authors(model, 2.0)
