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

:func:`enorm_step_pathcond_variant` is the variant used in the PathCond
authors' experiments: once per epoch, biases left unscaled (the function
changes).
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


def enorm_callback(p: float = 2.0) -> Callable[[nn.Module], None]:
    """``on_step`` callback for :func:`wslib.core.train.fit`: one ENorm cycle after every SGD step."""
    return lambda model: enorm_step(model, p)


def enorm_step_pathcond_variant(epoch: int, model: nn.Module) -> None:
    """``on_epoch`` callback: the PathCond authors' ENorm (once per epoch, biases not rescaled)."""
    del epoch
    enorm_step(model, 2.0, rescale_bias=False)
