"""The numpy PathCond solver: the float64 reference of :func:`wslib.pathcond.optimize_rescaling`.

The library's solver runs in torch on the device of ``g``; this is the same
block and neuron coordinate descent written on the host in numpy (the
library's own code before it moved to the device), kept so that the tests
compare the device solver with it on the tests' nets.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from wslib.core.neurons import NeuronGroup, NeuronStructure
from wslib.pathcond.solver import METHODS, PathCondResult, RescalingMethod


@dataclass
class _GroupView:
    """Per-slot 3-D views ``(before, neuron, after)`` of the rescaled ``g`` of one group."""

    group: NeuronGroup
    ins: list[np.ndarray]
    outs: list[np.ndarray]
    n_net: int  # |in entries| - |out entries| per neuron: the column sum of B

    def sums(self) -> tuple[np.ndarray, np.ndarray]:
        bo = sum(v.sum((0, 2)) for v in self.ins)
        c = sum(v.sum((0, 2)) for v in self.outs)
        return np.asarray(bo, dtype=np.float64), np.asarray(c, dtype=np.float64)

    def scale(self, x: np.ndarray | float, index: int | slice = slice(None)) -> None:
        x = np.asarray(x)[..., None] if np.ndim(x) else x
        for v in self.ins:
            v[:, index] *= x
        for v in self.outs:
            v[:, index] /= x


def _group_views(
    g: dict[str, np.ndarray], structure: NeuronStructure
) -> list[_GroupView]:
    views = []
    for group in structure.groups:
        if not group.rescalable:
            continue
        ins: list[np.ndarray] = []
        outs: list[np.ndarray] = []
        n_net = 0
        for slot in group.slots:
            if slot.role == "free" or slot.name not in g:
                continue
            arr = g[slot.name]
            before = math.prod(arr.shape[: slot.axis])
            view = arr.reshape(before, group.size, -1)
            if not np.shares_memory(view, arr):
                raise ValueError(f"g[{slot.name!r}] must be a contiguous array")
            (ins if slot.role == "in" else outs).append(view)
            n_net += (1 if slot.role == "in" else -1) * view[:, 0].size
        views.append(_GroupView(group, ins, outs, n_net))
    return views


def _positive_root(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The positive root of ``a x^2 - b x - c = 0`` (a, c > 0), computed stably."""
    disc = np.sqrt(b * b + 4 * a * c)
    return np.where(b >= 0, (b + disc) / (2 * a), 2 * c / np.maximum(disc - b, 1e-300))


def _block_step(view: _GroupView, total: float, p: int) -> tuple[np.ndarray, float]:
    """Exact minimisation of F over all neurons of one group (they touch disjoint entries).

    Stationarity gives ``Bo_h x_h - C_h / x_h = n T / p`` for every neuron, with
    ``T`` the new total; so ``Bo_h x_h + C_h / x_h = sqrt((n T / p)^2 + 4 Bo_h C_h)``
    and ``T`` is the root of the convex decreasing
    ``phi(T) = D + sum_h sqrt((n T / p)^2 + 4 Bo_h C_h) - T``, found by Newton.
    """
    bo, c = view.sums()
    active = (bo > 0) & (c > 0)
    bo, c = bo[active], c[active]
    rest = total - bo.sum() - c.sum()
    a, four_bc = view.n_net / p, 4 * bo * c
    t = total
    for _ in range(100):
        root = np.sqrt((a * t) ** 2 + four_bc)
        phi = rest + root.sum() - t
        dphi = (a * a * t / root).sum() - 1.0
        t_new = t - phi / dphi
        if abs(t_new - t) <= 1e-15 * abs(t_new):
            t = t_new
            break
        t = t_new
    x = np.ones(view.group.size)
    x[active] = _positive_root(bo, np.full_like(bo, a * t), c)
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
    x = float(
        _positive_root(
            np.array((p - n) * bo), np.array(n * rest), np.array((p + n) * c)
        )
    )
    return x, rest + bo * x + c / x


def reference_rescaling(
    g: Mapping[str, torch.Tensor | np.ndarray],
    structure: NeuronStructure,
    *,
    method: RescalingMethod = "block",
    max_sweeps: int = 1000,
    rtol: float = 1e-12,
) -> PathCondResult:
    """Minimise F(z) by coordinate descent with closed-form steps, in float64.

    Parameters
    ----------
    g
        ``diag(G)`` per parameter tensor (from :func:`diag_g`).
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
    work = {
        k: torch.as_tensor(v).detach().cpu().numpy().astype(np.float64)
        for k, v in g.items()
    }
    if any((v < 0).any() or not np.isfinite(v).all() for v in work.values()):
        raise ValueError("g must be finite and non-negative (compute it with diag_g)")
    p = sum(v.size for v in work.values())
    views = _group_views(work, structure)
    z = {v.group.name: np.zeros(v.group.size) for v in views}

    def value(total: float) -> float:
        return p * math.log(total) - sum(v.n_net * z[v.group.name].sum() for v in views)

    total = float(sum(v.sum() for v in work.values()))
    history = [value(total)]
    converged = False
    x: np.ndarray | float  # a group's scales ("block") or one neuron's ("neuron")
    for _ in range(max_sweeps):
        for view in views:
            zg = z[view.group.name]
            if method == "block":
                x, _ = _block_step(view, total, p)
                view.scale(x)
                zg += np.log(x)
            else:
                for h in range(view.group.size):
                    x, total = _neuron_step(view, h, total, p)
                    view.scale(x, h)
                    zg[h] += math.log(x)
            total = float(sum(v.sum() for v in work.values()))
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
    seconds = time.perf_counter() - start
    return PathCondResult(z, history, seconds, method, converged)
