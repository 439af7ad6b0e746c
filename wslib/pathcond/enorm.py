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

import functools
import weakref
from collections.abc import Callable

import torch
from torch import nn

from wslib.core.neurons import NeuronGroup, NeuronStructure, neuron_structure


def _is_bias(name: str, state: dict[str, torch.Tensor]) -> bool:
    return name.endswith("bias") and state[name].dim() == 1


def _norm(
    state: dict[str, torch.Tensor], group: NeuronGroup, role: str, p: float
) -> torch.Tensor:
    """Sum of ``|w|^p`` over each neuron's ``role`` slices (float64, on the weights' device).

    ``|w|^p`` is two ``torch._foreach`` operations over all the slices (one
    kernel each on CUDA, the per-tensor operations on the CPU); the sums
    over each slice's neurons add up left to right, slice by slice.
    """
    slots = [s for s in group.slots if s.role == role and not _is_bias(s.name, state)]
    if not slots:
        device = next(iter(state.values())).device
        return torch.zeros(group.size, dtype=torch.float64, device=device)
    weights = [state[s.name].detach().double() for s in slots]
    powered = torch._foreach_pow(torch._foreach_abs(weights), p)
    parts = [
        t.movedim(s.axis, 0).reshape(group.size, s.block, -1).sum((1, 2))
        for t, s in zip(powered, slots, strict=True)
    ]
    return functools.reduce(torch.add, parts)


def _scale(a: torch.Tensor, b: torch.Tensor, p: float) -> torch.Tensor:
    """ENorm's ``lam = (b / a)^(1 / (2p))``; 1 where either norm is zero."""
    ok = (a > 0) & (b > 0)
    return torch.where(
        ok, (b / a.clamp_min(1e-300)).pow(1 / (2 * p)), torch.ones_like(a)
    )


def _rescale_in_place(
    state: dict[str, torch.Tensor],
    group: NeuronGroup,
    lam: torch.Tensor,
    rescale_bias: bool,
) -> None:
    """Multiply ``group``'s producing slices by ``lam`` and consuming ones by ``1 / lam``.

    The same arithmetic as :func:`wslib.core.neurons.rescale_state` (the factor
    cast to each tensor's dtype, then one multiplication), but in place on the
    tensors of ``state`` (a model's ``state_dict()`` shares their storage).
    """
    for slot in group.slots:
        if slot.role == "free" or (
            not rescale_bias and slot.role == "out" and _is_bias(slot.name, state)
        ):
            continue
        t = state[slot.name]
        factor = lam if slot.role == "out" else 1.0 / lam
        factor = factor.to(t.device, t.dtype).repeat_interleave(slot.block)
        shape = [1] * t.dim()
        shape[slot.axis] = -1
        t.mul_(factor.reshape(shape))


def _structure(model: nn.Module) -> NeuronStructure:
    structure = neuron_structure(model)
    if not any(g.rescalable for g in structure.groups):
        raise ValueError(
            f"{type(model).__name__} has no rescalable neuron group (non-homogeneous "
            "activation or normalisation): ENorm does not apply"
        )
    return structure


@torch.no_grad()
def enorm_step(
    model: nn.Module,
    *,
    p: float = 2.0,
    rescale_bias: bool = True,
    structure: NeuronStructure | None = None,
) -> None:
    """One ENorm cycle in place (function-preserving when ``rescale_bias``).

    Norms and scales are computed on the model's device and the tensors are
    rescaled in place: no copy to the CPU, no state-dict reload, no host sync.
    ``structure`` is the model's neuron structure when the caller keeps it
    (read from the model otherwise).
    """
    if p <= 0:
        raise ValueError(f"p must be positive, got {p}")
    if structure is None:
        structure = _structure(model)
    state = model.state_dict()
    for group in structure.groups:
        if not group.rescalable:
            continue
        lam = _scale(_norm(state, group, "out", p), _norm(state, group, "in", p), p)
        _rescale_in_place(state, group, lam, rescale_bias)


@torch.no_grad()
def enorm_step_authors(model: nn.Module, *, p: float = 2.0) -> None:
    """One cycle of the PathCond authors' ENorm in place (see the module docstring).

    All scales ``lam = (b / a)^(1 / (2p))`` come from the state before the
    cycle; the last rescalable group keeps scale 1; biases are not rescaled.
    """
    if p <= 0:
        raise ValueError(f"p must be positive, got {p}")
    structure = _structure(model)
    state = model.state_dict()
    groups = [g for g in structure.groups if g.rescalable][:-1]
    scales = [
        _scale(_norm(state, g, "out", p), _norm(state, g, "in", p), p) for g in groups
    ]
    for group, lam in zip(groups, scales, strict=True):
        _rescale_in_place(state, group, lam, rescale_bias=False)


def enorm_callback(*, p: float = 2.0) -> Callable[[nn.Module], None]:
    """``on_step`` callback for :func:`wslib.core.train.fit`: one ENorm cycle after every SGD step.

    Each model's neuron structure is read at its first step and kept (it
    depends on the architecture only), not rebuilt at every step.
    """
    structures: weakref.WeakKeyDictionary[nn.Module, NeuronStructure] = (
        weakref.WeakKeyDictionary()
    )

    def step(model: nn.Module) -> None:
        if model not in structures:
            structures[model] = _structure(model)
        enorm_step(model, p=p, structure=structures[model])

    return step


def enorm_step_pathcond_variant(epoch: int, model: nn.Module) -> None:
    """``on_epoch`` callback: the PathCond authors' ENorm (:func:`enorm_step_authors`)."""
    del epoch
    enorm_step_authors(model, p=2.0)
