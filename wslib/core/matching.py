"""Git Re-Basin weight matching over the neuron structure (Ainsworth et al., 2023).

For each neuron group in turn, the permutation of model B's neurons that
maximises the inner product of all tensor slices touched by the group with
model A's slices is a linear assignment problem (scipy). Sweeping the groups
in random order until no permutation changes gives a local optimum.

ReLU networks also differ by positive per-neuron rescalings, which weight
matching leaves alone: :func:`match_scales` finds the rescaling of B (same
function) closest to A.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from wslib.core.neurons import (
    NeuronGroup,
    NeuronStructure,
    Slot,
    StateDict,
    expand_index,
    permute_state,
    rescale_state,
)


def _rows(t: torch.Tensor, slot: Slot, size: int) -> torch.Tensor:
    """The tensor seen as ``(size, -1)``: one row per neuron of ``slot``'s group."""
    return t.movedim(slot.axis, 0).reshape(size, -1).double()


def _permuted_except(
    b: StateDict,
    structure: NeuronStructure,
    perms: dict[str, torch.Tensor],
    name: str,
    skip: NeuronGroup,
) -> torch.Tensor:
    """Tensor ``name`` of B with every group's permutation applied except ``skip``'s."""
    t = b[name]
    for group in structure.groups:
        if group is skip:
            continue
        for slot in group.slots:
            if slot.name == name:
                t = t.index_select(
                    slot.axis, expand_index(perms[group.name], slot.block)
                )
    return t


def _similarity(
    a: StateDict,
    b: StateDict,
    structure: NeuronStructure,
    perms: dict[str, torch.Tensor],
    group: NeuronGroup,
) -> np.ndarray:
    sim = torch.zeros(group.size, group.size, dtype=torch.float64)
    for slot in group.slots:
        wa = _rows(a[slot.name], slot, group.size)
        wb = _rows(
            _permuted_except(b, structure, perms, slot.name, group), slot, group.size
        )
        sim += wa @ wb.T
    return sim.numpy()


def weight_matching(
    a: StateDict,
    b: StateDict,
    structure: NeuronStructure,
    *,
    max_sweeps: int = 100,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Permutations of B's neurons that align B to A (apply with :func:`align`)."""
    a = {k: v.detach().cpu() for k, v in a.items()}
    b = {k: v.detach().cpu() for k, v in b.items()}
    perms = {g.name: torch.arange(g.size) for g in structure.groups}
    rng = np.random.default_rng(seed)
    for _ in range(max_sweeps):
        changed = False
        for gi in rng.permutation(len(structure.groups)):
            group = structure.groups[gi]
            sim = _similarity(a, b, structure, perms, group)
            _, cols = linear_sum_assignment(sim, maximize=True)
            rows = np.arange(group.size)
            new_score = sim[rows, cols].sum()
            old_score = sim[rows, perms[group.name].numpy()].sum()
            if new_score > old_score + 1e-9 * abs(old_score):
                perms[group.name] = torch.as_tensor(cols, dtype=torch.long)
                changed = True
        if not changed:
            break
    return perms


def align(
    a: StateDict, b: StateDict, structure: NeuronStructure, **kwargs: int
) -> StateDict:
    """B's state with its neurons permuted to match A (same function as B)."""
    perms = weight_matching(a, b, structure, **kwargs)
    return permute_state(b, structure, perms)


def scale_distance(a: StateDict, b: StateDict, structure: NeuronStructure) -> float:
    """Squared distance between A and B over the tensors the neuron groups touch."""
    names = {slot.name for group in structure.groups for slot in group.slots}
    return float(sum(((a[n].double() - b[n].double()) ** 2).sum() for n in names))


def _best_multiplier(p2: float, pa: float, q2: float, qa: float) -> float:
    """The ``mu > 0`` minimising ``mu^2 p2 - 2 mu pa + q2 / mu^2 - 2 qa / mu``.

    Its stationary points solve ``p2 mu^4 - pa mu^3 + qa mu - q2 = 0``; with
    ``p2, q2 > 0`` the objective tends to +inf at 0 and at infinity, so a
    positive root exists; the best one is kept. A neuron with no producing or
    no consuming weight (``p2`` or ``q2`` zero) keeps its scale.
    """
    if p2 <= 0 or q2 <= 0:
        return 1.0
    roots = np.roots([p2, -pa, 0.0, qa, -q2])
    positive = [r.real for r in roots if abs(r.imag) < 1e-9 * abs(r) and r.real > 0]
    cost = [m * m * p2 - 2 * m * pa + q2 / (m * m) - 2 * qa / m for m in positive]
    return positive[int(np.argmin(cost))] if positive else 1.0


def _group_multipliers(a: StateDict, b: StateDict, group: NeuronGroup) -> np.ndarray:
    """The best extra scale of each neuron of ``group``, the other groups fixed."""
    sums = np.zeros((4, group.size))  # p2, pa, q2, qa per neuron
    for slot in group.slots:
        if slot.role == "free":
            continue
        ra, rb = (_rows(t[slot.name], slot, group.size) for t in (a, b))
        row = 0 if slot.role == "out" else 2
        sums[row] += (rb * rb).sum(1).numpy()
        sums[row + 1] += (rb * ra).sum(1).numpy()
    return np.array([_best_multiplier(*sums[:, h]) for h in range(group.size)])


def match_scales(
    a: StateDict,
    b: StateDict,
    structure: NeuronStructure,
    *,
    max_sweeps: int = 200,
    tol: float = 1e-10,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Positive per-neuron scales of B that bring it closest to A (same function as B).

    Block coordinate descent: each rescalable group in data-flow order gets,
    for each neuron, the exact minimiser of the squared distance over its
    producing and consuming slices with the other groups fixed (a quartic in
    one variable); sweeps stop when the distance falls by less than ``tol``
    (relative). Returns the scales (apply with ``rescale_state(b, structure,
    scales)``) and the distance after each sweep, the first entry before any.
    The distance never increases.
    """
    a = {k: v.detach().cpu().double() for k, v in a.items()}
    b = {k: v.detach().cpu().double() for k, v in b.items()}
    groups = [g for g in structure.groups if g.rescalable]
    scales = {g.name: torch.ones(g.size, dtype=torch.float64) for g in groups}
    history = [scale_distance(a, b, structure)]
    for _ in range(max_sweeps):
        for group in groups:
            current = rescale_state(b, structure, scales)
            mu = _group_multipliers(a, current, group)
            scales[group.name] = scales[group.name] * torch.as_tensor(mu)
        history.append(
            scale_distance(a, rescale_state(b, structure, scales), structure)
        )
        if history[-2] - history[-1] <= tol * max(history[-2], 1e-300):
            break
    return scales, history
