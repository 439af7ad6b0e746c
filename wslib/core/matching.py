"""Git Re-Basin weight matching over the neuron structure (Ainsworth et al., 2023).

For each neuron group in turn, the permutation of model B's neurons that
maximises the inner product of all tensor slices touched by the group with
model A's slices is a linear assignment problem (scipy). Sweeping the groups
in random order until no permutation changes gives a local optimum.
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
