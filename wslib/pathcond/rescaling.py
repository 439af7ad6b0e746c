"""Path-conditioned rescaling (PathCond) of ReLU networks at initialisation.

The path-lifting ``Phi(theta)`` of a ReLU network lists the product of the
parameters along every input-to-output path (bias paths included). The
diagonal ``g = diag(G)`` of ``G = dPhi^T dPhi`` is computed here in one
backward pass, for every architecture of :mod:`wslib.core.models` that is a
composition of Linear / Conv layers, BatchNorm, ReLU, average or max pooling,
means and residual additions:

- every parameter is replaced by its square, every ReLU is active (all-ones
  input, the squared network has no negative value), so the output sum is
  ``S = sum over paths of prod theta^2 = ||Phi||^2`` and ``g_i = dS / d(theta_i^2)``;
- pooling and mean coefficients ``1/k`` are squared too (average pooling and
  global means are exact);
- max pooling keeps the max of the squared path masses: the path-lifting of
  the network with the max routing it has at the all-ones input (approximate);
- GELU / SiLU are treated as the identity (all "active"): the result is the
  path-lifting of the ReLU network with the same parameters (approximate, with
  a warning).

BatchNorm. The rescaling puts the scale of a neuron in BN's gamma and beta,
and the weights before BN are scale-free (BN divides them by their own scale).
We use the path-lifting in which each BN channel is the linear map
``u -> gamma * u / s_c + beta``, with ``s_c^2`` the squared path norm that
reaches the channel (per position, averaged over positions), held constant in
the derivative; the running statistics are not used. So:

- multiplying the pre-BN weights of a channel by ``c`` leaves the ``g`` of all
  other parameters unchanged, as it leaves the train-mode function unchanged;
- rescaling a neuron (gamma, beta times ``lam``, consumers times ``1/lam``)
  leaves ``Phi`` unchanged and multiplies ``g`` by ``exp(B z)`` exactly, with
  pre-BN weights in the zero rows of ``B`` ("free" slots).

PathCond chooses log-scales ``z`` from ``g`` by the convex problem of
:mod:`wslib.pathcond.solver`, then applies the rescaling in place
(:func:`pathcond_rescale`); training then proceeds as usual.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import operator
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from wslib.core.neurons import (
    NeuronStructure,
    neuron_structure,
    rescale_state,
)
from wslib.core.norms import is_batchnorm
from wslib.core.train import model_device
from wslib.pathcond.solver import PathCondResult, RescalingMethod, optimize_rescaling

_HOMOGENEOUS = (nn.ReLU, nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)
_APPROXIMATE = (nn.GELU, nn.SiLU)
_LINEAR = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d)
_NEUTRAL = (nn.Flatten, nn.Identity, nn.Dropout)
_FUNCTIONS = {operator.add, torch.add, F.relu, torch.relu, torch.flatten, getattr}
_METHODS = {"flatten", "mean", "relu", "add", "size", "view", "reshape"}


# --- checks ----------------------------------------------------------------------------------


def check_architecture(model: nn.Module) -> bool:
    """Check that ``model`` has a path-lifting; return True when it is only approximate.

    Raises
    ------
    TypeError
        When the model has no neuron structure or holds a module with no
        path-lifting (LayerNorm, attention, ...); the message names the module.
    """
    neuron_structure(model)
    approximate = False
    for name, module in model.named_modules():
        if list(module.children()):
            continue
        if isinstance(module, _APPROXIMATE):
            approximate = True
        elif not isinstance(module, _HOMOGENEOUS + _LINEAR + _NEUTRAL):
            raise TypeError(
                f"module {name!r} ({type(module).__name__}) has no path-lifting; PathCond "
                "supports Linear/Conv layers, BatchNorm, ReLU (GELU/SiLU approximately), "
                "average/max pooling and residual additions"
            )
        if isinstance(module, (nn.AvgPool1d, nn.AvgPool2d)):
            _check_avg_pool(name, module)
        if is_batchnorm(module) and not module.affine:
            raise TypeError(
                f"BatchNorm {name!r} has no affine parameters to carry a scale"
            )
    if any(isinstance(p, nn.Parameter) for p in model._parameters.values()):
        raise TypeError(
            f"{type(model).__name__} holds top-level parameters {list(model._parameters)} "
            "outside any layer; PathCond cannot place them on paths"
        )
    if approximate:
        warnings.warn(
            "GELU/SiLU are not positively homogeneous: the rescaling changes the function "
            "slightly and diag(G) is that of the ReLU network (the invariance is approximate)",
            UserWarning,
            stacklevel=3,
        )
    return approximate


def _check_avg_pool(name: str, pool: nn.Module) -> None:
    """Refuse average pooling whose divisor is not the kernel size everywhere."""
    bad = [
        option
        for option, value in (
            ("count_include_pad=False", not pool.count_include_pad and _padded(pool)),
            ("ceil_mode=True", pool.ceil_mode),
            ("divisor_override", getattr(pool, "divisor_override", None) is not None),
        )
        if value
    ]
    if bad:
        raise TypeError(
            f"average pooling {name!r} uses {', '.join(bad)}: its divisor then differs "
            "between windows and the one-pass diag(G) would be wrong; use the default "
            "pooling (count_include_pad=True, ceil_mode=False, no divisor_override)"
        )


def _padded(pool: nn.Module) -> bool:
    padding = pool.padding
    return any(padding) if isinstance(padding, tuple) else bool(padding)


def rescalable_structure(model: nn.Module) -> NeuronStructure:
    """The neuron structure with every group rescalable (after :func:`check_architecture`)."""
    structure = neuron_structure(model)
    return NeuronStructure(
        tuple(dataclasses.replace(g, rescalable=True) for g in structure.groups)
    )


# --- diag(G) in one backward pass ------------------------------------------------------------


class _SquaredBN(nn.Module):
    """BN channel of the squared network: ``gamma^2 * u / s^2 + beta^2`` (``s^2`` frozen)."""

    def __init__(
        self, bn: nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d | nn.SyncBatchNorm
    ) -> None:
        super().__init__()
        weight, bias = bn.weight, bn.bias
        if not isinstance(weight, torch.Tensor) or not isinstance(bias, torch.Tensor):
            raise TypeError(
                f"{type(bn).__name__} without a bias (beta) has no path-lifting; PathCond "
                "needs BatchNorm layers with both affine parameters"
            )
        self.weight, self.bias = weight, bias

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        dims = [d for d in range(u.dim()) if d != 1]
        mass = u.detach().mean(dims, keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)
        shape = [1, -1] + [1] * (u.dim() - 2)
        return self.weight.view(shape) * u / mass + self.bias.view(shape)


class _SquaredAvgPool(nn.Module):
    """Average pooling with its coefficient ``1/k`` squared (sum / k^2)."""

    def __init__(self, pool: nn.AvgPool1d | nn.AvgPool2d) -> None:
        super().__init__()
        self.pool = pool
        kernel = pool.kernel_size
        dims = 2 if isinstance(pool, nn.AvgPool2d) else 1
        self.k = math.prod(kernel) if isinstance(kernel, tuple) else kernel**dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x) / self.k


def _squared_mean(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``mean`` with its coefficient squared: ``mean / n`` over the reduced entries."""
    out = x.mean(*args, **kwargs)
    return out * (out.numel() / x.numel())


class _LayerTracer(fx.Tracer):
    """torch.fx's tracer, with every max pooling (the book's own included) as one layer."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)) or super().is_leaf_module(
            m, module_qualified_name
        )


def _path_relu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """ReLU in the squared network: the identity. Every value there is >= 0 and
    every path counts, also through a neuron whose squared pre-activation is 0,
    where torch's ReLU would have derivative 0 and drop the path's mass."""
    return x


def _squared_network(model: nn.Module) -> fx.GraphModule:
    """A float64 copy of ``model`` traced with torch.fx, coefficients squared, in eval mode."""
    net = copy.deepcopy(model).double().eval()
    try:
        tracer = _LayerTracer()
        gm = fx.GraphModule(net, tracer.trace(net), type(net).__name__)
    except Exception as err:  # fx raises many error types for untraceable code
        raise TypeError(
            f"{type(model).__name__} cannot be traced for PathCond: {err}"
        ) from err
    for node in list(gm.graph.nodes):
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            if is_batchnorm(sub):
                gm.add_submodule(node.target, _SquaredBN(sub))
            elif isinstance(sub, (nn.AvgPool1d, nn.AvgPool2d)):
                gm.add_submodule(node.target, _SquaredAvgPool(sub))
            elif isinstance(sub, (*_APPROXIMATE, nn.ReLU)):
                gm.add_submodule(node.target, nn.Identity())
        elif node.op == "call_method":
            if node.target not in _METHODS:
                raise TypeError(
                    f"{type(model).__name__}: tensor method {node.target!r} has no path-lifting"
                )
            if node.target == "mean":
                node.op, node.target = "call_function", _squared_mean
            elif node.target == "relu":
                node.op, node.target = "call_function", _path_relu
        elif node.op == "call_function" and node.target not in _FUNCTIONS:
            raise TypeError(
                f"{type(model).__name__}: function {node.target} has no path-lifting"
            )
        elif node.op == "call_function" and node.target in (F.relu, torch.relu):
            node.target = _path_relu
    gm.recompile()
    with torch.no_grad():
        for p in gm.parameters():
            p.copy_(p * p)
            p.requires_grad_(True)  # frozen parameters of ``model`` have a g too
    return gm


def diag_g(model: nn.Module, in_shape: Sequence[int]) -> dict[str, torch.Tensor]:
    """``g = diag(dPhi^T dPhi)`` per parameter (float64, keyed like ``named_parameters``).

    One forward and one backward pass of the squared network on an all-ones
    input of shape ``(1, *in_shape)``; see the module docstring for pooling,
    BatchNorm and GELU/SiLU.
    """
    check_architecture(model)
    gm = _squared_network(model)
    names, params = zip(*gm.named_parameters(), strict=True)
    with torch.enable_grad():  # also inside a caller's no_grad block
        ones = torch.ones(1, *in_shape, dtype=torch.float64)
        try:
            out = gm(ones.to(model_device(gm)))
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as error:
            raise ValueError(
                f"in_shape {list(in_shape)} does not fit the model "
                f"({str(error).splitlines()[0]}); give the shape of one input "
                "example without the batch dimension, as in the model's config"
            ) from None
        grads = torch.autograd.grad(out.sum(), params, allow_unused=True)
    return {
        n: (torch.zeros_like(p) if gr is None else gr).detach()
        for n, p, gr in zip(names, params, grads, strict=True)
    }


def _host_array(v: torch.Tensor | np.ndarray) -> np.ndarray:
    """``v`` as a float64 numpy array (a tensor is copied to the host first)."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    return np.asarray(v, dtype=np.float64)


def am_over_gm(g: dict[str, torch.Tensor] | np.ndarray) -> float:
    """Arithmetic over geometric mean of the positive entries of ``g`` (1 when uniform)."""
    values = g.values() if isinstance(g, dict) else [g]
    flat = np.concatenate([_host_array(v).ravel() for v in values])
    flat = flat[flat > 0]
    return float(np.exp(np.log(flat.mean()) - np.log(flat).mean()))


def pathcond_rescale(
    model: nn.Module,
    in_shape: Sequence[int],
    *,
    method: RescalingMethod = "block",
    max_sweeps: int = 1000,
    rtol: float = 1e-12,
) -> PathCondResult:
    """Rescale ``model`` in place by PathCond; its function does not change.

    Computes ``g = diag(G)`` (:func:`diag_g`), minimises F
    (:func:`~wslib.pathcond.solver.optimize_rescaling`) and applies neuron scales ``exp(z/2)`` with
    :func:`wslib.core.neurons.rescale_state` (BatchNorm gamma/beta carry the scale,
    so the function is unchanged in train and eval mode). GELU/SiLU networks
    are rescaled too, with a warning (their function changes slightly).
    """
    g = diag_g(model, in_shape)
    structure = rescalable_structure(model)
    result = optimize_rescaling(
        g, structure, method=method, max_sweeps=max_sweeps, rtol=rtol
    )
    state = model.state_dict()
    wide = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    rescaled = rescale_state(wide, structure, result.scales)
    changed = {k: v for k, v in rescaled.items() if v is not wide[k]}
    check_range(state, changed, result.scales)
    model.load_state_dict(rescaled)
    return result


def check_range(
    state: dict[str, torch.Tensor],
    rescaled: dict[str, torch.Tensor],
    scales: dict[str, torch.Tensor],
) -> None:
    """Check that ``scales`` and the rescaled tensors (float64) fit the dtypes of ``state``.

    Raises
    ------
    ValueError
        When a scale or a rescaled tensor is not finite, overflows the tensor's
        dtype or a non-zero entry falls below its smallest normal number; the
        message names the layer and suggests float64 or a larger init scale.
    """
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), None)
    fix = (
        "; compute in float64 (model.double()) or use a larger initial scale, "
        "which makes the rescaling milder"
    )
    for name, lam in scales.items():
        info = torch.finfo(dtype or torch.float64)
        lam = torch.as_tensor(lam, dtype=torch.float64)
        if not bool(torch.isfinite(lam).all()) or not _inside(lam, info):
            raise ValueError(
                f"PathCond's scales of layer {name!r} (from {float(lam.min()):.3g} to "
                f"{float(lam.max()):.3g}) leave the {info.dtype} range{fix}"
            )
    for name, new in rescaled.items():
        old = state[name]
        if not old.is_floating_point():
            continue
        info = torch.finfo(old.dtype)
        if not bool(torch.isfinite(new).all()) or not _inside(new, info):
            raise ValueError(
                f"PathCond's rescaling makes {name!r} overflow or underflow "
                f"{old.dtype} (|entries| up to {float(new.abs().max()):.3g}){fix}"
            )


def _inside(t: torch.Tensor, info: torch.finfo) -> bool:
    """Whether the non-zero entries of ``t`` lie between the smallest normal and max of ``info``."""
    mag = t.abs()
    mag = mag[mag > 0]
    return not mag.numel() or bool((mag <= info.max).all() and (mag >= info.tiny).all())
