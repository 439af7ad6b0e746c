"""PathCond's convex problem and its solver.

Log-scales ``z`` (one per hidden neuron; scale ``lam = exp(z/2)``) change
``g = diag(G)`` (:func:`wslib.pathcond.rescaling.diag_g`) into
``g * exp(B z)``, with ``B`` the parameter x neuron incidence
(:func:`incidence_matrix`: +1 on "in" slots, the consumer weights; -1 on
"out" slots, the producer weights and biases). PathCond minimises the convex
``F(z) = p log(sum_i g_i exp((Bz)_i)) - sum_i (Bz)_i`` (:func:`objective`) by
coordinate descent with closed-form steps (:func:`optimize_rescaling`): one
group of neurons at a time, or one neuron at a time.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from wslib.core.neurons import (
    NeuronGroup,
    NeuronStructure,
    neuron_structure,
)

# The solvers of :func:`optimize_rescaling` (:data:`METHODS` lists them at run time).
RescalingMethod = Literal["block", "neuron"]
METHODS: tuple[RescalingMethod, ...] = get_args(RescalingMethod)
PAPER_SWEEPS = 10  #: the authors stop their solver after 10 sweeps


# --- incidence and objective -----------------------------------------------------------------


def incidence_matrix(
    model: nn.Module, *, structure: NeuronStructure | None = None
) -> tuple[sp.csr_matrix, list[str], list[tuple[str, int]]]:
    """The sparse parameter x neuron incidence ``B`` (+1 "in" slots, -1 "out" slots).

    Returns ``B`` (rows: entries of ``named_parameters`` in order, flattened;
    columns: hidden neurons), the parameter names and the ``(group, index)`` of
    each column. Non-rescalable groups and "free" slots give zero entries.
    """
    structure = structure or neuron_structure(model)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    offsets, total = {}, 0
    for n, shape in shapes.items():
        offsets[n], total = total, total + math.prod(shape)
    rows, cols, vals = [], [], []
    neurons: list[tuple[str, int]] = []
    for group in structure.groups:
        if not group.rescalable:
            continue
        base = len(neurons)
        neurons += [(group.name, i) for i in range(group.size)]
        for slot in group.slots:
            if slot.role == "free" or slot.name not in shapes:
                continue
            shape = shapes[slot.name]
            idx = np.arange(math.prod(shape)).reshape(shape)
            neuron = np.indices(shape)[slot.axis] // slot.block
            rows.append(offsets[slot.name] + idx.ravel())
            cols.append(base + neuron.ravel())
            vals.append(np.full(idx.size, 1.0 if slot.role == "in" else -1.0))
    b = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(total, len(neurons)),
    )
    return b, list(shapes), neurons


def objective(g: np.ndarray, bz: np.ndarray) -> float:
    """``F(z) = p log(sum g e^{Bz}) - sum Bz`` in float64 (``bz = B @ z``)."""
    g, bz = np.asarray(g, dtype=np.float64), np.asarray(bz, dtype=np.float64)
    return float(g.size * np.log(np.sum(g * np.exp(bz))) - bz.sum())


# --- block coordinate descent ----------------------------------------------------------------


@dataclass
class PathCondResult:
    """Outcome of :func:`optimize_rescaling`.

    ``z[g]`` are the log-scales of group ``g`` (neuron scale ``exp(z/2)``),
    ``objective`` the value of F before the first sweep and after each sweep,
    ``converged`` whether the last sweep met the tolerance (False when the
    solver stopped at ``max_sweeps``).
    """

    z: dict[str, np.ndarray]
    objective: list[float]
    seconds: float
    method: RescalingMethod
    converged: bool = True

    @property
    def scales(self) -> dict[str, torch.Tensor]:
        """Neuron scales ``lam = exp(z/2)`` per group."""
        return {k: torch.from_numpy(np.exp(v / 2)) for k, v in self.z.items()}

    @property
    def sweeps(self) -> int:
        return len(self.objective) - 1


@dataclass
class _GroupView:
    """Per-slot 3-D views ``(before, neuron, after)`` of the rescaled ``g`` of one group."""

    group: NeuronGroup
    ins: list[torch.Tensor]
    outs: list[torch.Tensor]
    n_net: int  # |in entries| - |out entries| per neuron: the column sum of B
    device: torch.device

    def sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per neuron: the sum of ``g`` over its "in" slots, and over its "out" slots."""
        bo, c = (
            torch.zeros(self.group.size, dtype=torch.float64, device=self.device)
            for _ in range(2)
        )
        for v in self.ins:
            bo += v.sum((0, 2))
        for v in self.outs:
            c += v.sum((0, 2))
        return bo, c

    def scale(self, x: torch.Tensor | float, index: int | slice = slice(None)) -> None:
        x = x[:, None] if isinstance(x, torch.Tensor) else x
        for v in self.ins:
            v[:, index] *= x
        for v in self.outs:
            v[:, index] /= x


def _group_views(
    g: dict[str, torch.Tensor], structure: NeuronStructure, device: torch.device
) -> list[_GroupView]:
    views = []
    for group in structure.groups:
        if not group.rescalable:
            continue
        ins: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        n_net = 0
        for slot in group.slots:
            if slot.role == "free" or slot.name not in g:
                continue
            arr = g[slot.name]
            before = math.prod(arr.shape[: slot.axis])
            view = arr.view(before, group.size, -1)  # shares g's memory
            (ins if slot.role == "in" else outs).append(view)
            n_net += (1 if slot.role == "in" else -1) * view[:, 0].numel()
        views.append(_GroupView(group, ins, outs, n_net, device))
    return views


def _positive_root(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The positive root of ``a x^2 - b x - c = 0`` (a, c > 0), computed stably."""
    disc = torch.sqrt(b * b + 4 * a * c)
    return torch.where(
        b >= 0, (b + disc) / (2 * a), 2 * c / torch.clamp_min(disc - b, 1e-300)
    )


def _block_step(view: _GroupView, total: float, p: int) -> tuple[torch.Tensor, float]:
    """Exact minimisation of F over all neurons of one group (they touch disjoint entries).

    Stationarity gives ``Bo_h x_h - C_h / x_h = n T / p`` for every neuron, with
    ``T`` the new total; so ``Bo_h x_h + C_h / x_h = sqrt((n T / p)^2 + 4 Bo_h C_h)``
    and ``T`` is the root of the convex decreasing
    ``phi(T) = D + sum_h sqrt((n T / p)^2 + 4 Bo_h C_h) - T``, found by Newton
    (each iteration reads one number back from the device, for its stop test).
    """
    bo, c = view.sums()
    active = (bo > 0) & (c > 0)
    bo, c = bo[active], c[active]
    rest = total - bo.sum() - c.sum()
    a, four_bc = view.n_net / p, 4 * bo * c
    t = total
    for _ in range(100):
        root = torch.sqrt((a * t) ** 2 + four_bc)
        phi = rest + root.sum() - t
        dphi = (a * a * t / root).sum() - 1.0
        t_new = t - float(phi / dphi)
        if abs(t_new - t) <= 1e-15 * abs(t_new):
            t = t_new
            break
        t = t_new
    x = torch.ones(view.group.size, dtype=torch.float64, device=view.device)
    x[active] = _positive_root(bo, torch.full_like(bo, a * t), c)
    return x, t


def _neuron_step(view: _GroupView, h: int, total: float, p: int) -> tuple[float, float]:
    """Closed-form minimisation of F over one neuron (plain Gauss-Seidel)."""
    bo = float(sum(v[:, h].sum() for v in view.ins))
    c = float(sum(v[:, h].sum() for v in view.outs))
    if bo <= 0 or c <= 0:
        return 1.0, total
    n = view.n_net
    rest = total - bo - c
    # (p - n) Bo x^2 - n D x - (p + n) C = 0, one positive root since |n| < p
    coefficients = torch.tensor(
        [(p - n) * bo, n * rest, (p + n) * c], dtype=torch.float64
    )
    x = float(_positive_root(*coefficients))
    return x, rest + bo * x + c / x


def optimize_rescaling(
    g: Mapping[str, torch.Tensor | np.ndarray],
    structure: NeuronStructure,
    *,
    method: RescalingMethod = "block",
    max_sweeps: int = 1000,
    rtol: float = 1e-12,
) -> PathCondResult:
    """Minimise F(z) by coordinate descent with closed-form steps, in float64 on g's device.

    The solver runs where ``g`` lies (:func:`~wslib.pathcond.rescaling.diag_g` computes it on the
    model's device), so the rescaling's cost is timed on the device that
    trains the model; ``tests/pathcond/reference_solver.py`` keeps a numpy
    version as the float64 reference the tests compare it with.

    Parameters
    ----------
    g
        ``diag(G)`` per parameter tensor (from :func:`~wslib.pathcond.rescaling.diag_g`).
    structure
        The neuron structure; only rescalable groups get a scale.
    method
        ``"block"``: exact minimisation over each group at once (vectorised),
        groups in data-flow order; ``"neuron"``: plain Gauss-Seidel over single
        neurons (the reference scheme).
    max_sweeps, rtol
        Stop after ``max_sweeps`` sweeps or when one sweep lowers F by at most
        ``rtol * |F|``. Stopping at ``max_sweeps`` warns, unless ``rtol`` is 0
        (a fixed number of sweeps, as the paper's ``max_sweeps=PAPER_SWEEPS``).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {METHODS}")
    if max_sweeps < 0 or rtol < 0:
        raise ValueError("max_sweeps and rtol must be non-negative")
    start = time.perf_counter()
    work = _working_copy(g)
    p = sum(v.numel() for v in work.values())
    device = next(iter(work.values())).device
    views = _group_views(work, structure, device)
    z = {v.group.name: torch.zeros_like(v.sums()[0]) for v in views}

    def value(total: float) -> float:
        bz = sum(float(v.n_net * z[v.group.name].sum()) for v in views)
        return p * math.log(total) - bz

    def current_total() -> float:
        return float(sum(v.sum() for v in work.values()))

    total = current_total()
    history = [value(total)]
    converged = False
    for _ in range(max_sweeps):
        for view in views:
            total = _group_step(view, z[view.group.name], total, p, method)
            total = current_total()
        history.append(value(total))
        if history[-2] - history[-1] <= rtol * abs(history[-1]):
            converged = True
            break
    if not converged and rtol > 0:
        warnings.warn(
            f"PathCond's solver stopped at max_sweeps={max_sweeps} before F changed by "
            f"less than rtol={rtol:g} per sweep; raise max_sweeps for the optimum",
            UserWarning,
            stacklevel=2,
        )
    host = {k: v.cpu().numpy() for k, v in z.items()}
    seconds = time.perf_counter() - start
    return PathCondResult(host, history, seconds, method, converged)


def _working_copy(
    g: Mapping[str, torch.Tensor | np.ndarray],
) -> dict[str, torch.Tensor]:
    """``g`` in float64, a copy the solver rescales in place; checked finite and
    non-negative."""
    work = {
        k: torch.as_tensor(v).detach().to(torch.float64, copy=True).contiguous()
        for k, v in g.items()
    }
    if any(
        bool((v < 0).any()) or not bool(torch.isfinite(v).all()) for v in work.values()
    ):
        raise ValueError("g must be finite and non-negative (compute it with diag_g)")
    return work


def _group_step(
    view: _GroupView, zg: torch.Tensor, total: float, p: int, method: RescalingMethod
) -> float:
    """One step on a group: its neurons' scales applied to ``g`` and added to their
    log-scales ``zg`` (in place); the total of ``g`` as the step tracked it."""
    if method == "block":
        x, _ = _block_step(view, total, p)
        view.scale(x)
        zg += torch.log(x)
        return total
    for h in range(view.group.size):
        xh, total = _neuron_step(view, h, total, p)
        view.scale(xh, h)
        zg[h] += math.log(xh)
    return total
