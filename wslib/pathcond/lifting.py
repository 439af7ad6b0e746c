"""The path-lifting made explicit, for networks small enough to list their paths.

For a ReLU network with all neurons active, each input-to-output path (from
an input coordinate, or from a bias) carries the product of the parameters on
its edges; ``Phi(theta)`` is the vector of these products. This module builds
``Phi`` path by path for tiny MLPs, 1-D conv nets (average pooling, flatten or
global-average head, BatchNorm) and single-stage 1-D ResNets, differentiates
it with ``torch.func`` and forms the path kernel ``P = J J^T`` and
``G = J^T J``. It is the brute-force reference for :func:`wslib.pathcond.rescaling.diag_g`.

Each layer is a :class:`Factor`: a dense ``(out, in)`` matrix whose entries
are single parameters or constants (conv layers are unrolled over positions,
pooling holds ``1/k``), or a diagonal (BatchNorm, identity shortcut). A chain
of factors gives the tensor of path products; a residual net is a union of
chains (one per choice of shortcut or block), each bias path counted once.
BatchNorm uses the path-lifting of :mod:`wslib.pathcond`: channel ``c`` is
``u -> gamma_c u / s_c + beta_c`` with ``s_c^2`` the squared path norm reaching
it (per position, averaged over positions), a constant.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from wslib.core.models import MLP, BasicBlock, ConvNet, ResNet

Params = dict[str, torch.Tensor]
MAX_PATHS = 5_000_000


@dataclass
class Factor:
    """One layer of a chain: ``y = weight @ x + bias`` (``weight`` a vector when diagonal)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    diagonal: bool = False

    @property
    def out_size(self) -> int:
        return self.weight.shape[0]


def chain_paths(
    factors: Sequence[Factor], *, use_bias: Sequence[bool] | None = None
) -> torch.Tensor:
    """Path products of a chain, as a matrix ``(output neuron, path ending there)``.

    Paths start at every input coordinate and at every bias of a factor whose
    ``use_bias`` flag is set (default: all).
    """
    use_bias = use_bias if use_bias is not None else [True] * len(factors)
    blocks: list[torch.Tensor] = []  # each (n_current, paths...) flattened to 2-D
    for k, f in enumerate(factors):
        if k == 0:
            blocks = [torch.diag(f.weight) if f.diagonal else f.weight]
        elif f.diagonal:
            blocks = [f.weight[:, None] * b for b in blocks]
        else:
            blocks = [
                (f.weight[:, :, None] * b[None]).reshape(f.out_size, -1) for b in blocks
            ]
        if f.bias is not None and use_bias[k]:
            blocks.append(f.bias[:, None])
        if sum(b.numel() for b in blocks) > MAX_PATHS:
            raise ValueError(
                f"more than {MAX_PATHS} path entries: use a smaller network"
            )
    return torch.cat(blocks, 1)


def _dense_conv(weight: torch.Tensor, length: int) -> torch.Tensor:
    """The ``(C_out L, C_in L)`` matrix of a stride-1, same-padding 1-D convolution."""
    c_in = weight.shape[1]
    basis = torch.eye(c_in * length, dtype=weight.dtype).reshape(-1, c_in, length)
    out = F.conv1d(basis, weight, padding=weight.shape[2] // 2)
    return out.reshape(c_in * length, -1).T


def _dense_pool(channels: int, length: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    basis = torch.eye(channels * length, dtype=dtype).reshape(-1, channels, length)
    return F.avg_pool1d(basis, k).reshape(channels * length, -1).T


def _dense_mean(channels: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.kron(
        torch.eye(channels, dtype=dtype),
        torch.full((1, length), 1.0 / length, dtype=dtype),
    )


def _bn_factor(
    params: Params, prefix: str, upstream: torch.Tensor, length: int
) -> Factor:
    """BatchNorm as ``gamma u / s + beta`` with ``s^2`` the path mass reaching each channel."""
    mass = (upstream.detach() ** 2).sum(1).reshape(-1, length).mean(1)
    scale = params[f"{prefix}.weight"] / mass.sqrt()
    return Factor(
        scale.repeat_interleave(length),
        params[f"{prefix}.bias"].repeat_interleave(length),
        True,
    )


def _conv_factor(params: Params, prefix: str, length: int) -> Factor:
    w = params[f"{prefix}.weight"]
    b = params.get(f"{prefix}.bias")
    return Factor(
        _dense_conv(w, length), None if b is None else b.repeat_interleave(length)
    )


def _mlp_paths(model: MLP, params: Params) -> torch.Tensor:
    n = len(model.linears)
    factors = [
        Factor(params[f"linears.{i}.weight"], params[f"linears.{i}.bias"])
        for i in range(n)
    ]
    return chain_paths(factors)


def _convnet_paths(
    model: ConvNet, params: Params, in_shape: Sequence[int]
) -> torch.Tensor:
    length, dtype = in_shape[1], next(iter(params.values())).dtype
    factors: list[Factor] = []
    layers = list(model.features)
    for i, layer in enumerate(layers):
        if isinstance(layer, (nn.Conv1d,)):
            factors.append(_conv_factor(params, f"features.{i}", length))
        elif isinstance(layer, nn.BatchNorm1d):
            factors.append(
                _bn_factor(params, f"features.{i}", chain_paths(factors), length)
            )
        elif isinstance(layer, nn.AvgPool1d):
            kernel = cast("tuple[int]", layer.kernel_size)[0]  # stored as a 1-tuple
            channels = factors[-1].out_size // length
            factors.append(Factor(_dense_pool(channels, length, kernel, dtype)))
            length //= kernel
        elif not isinstance(layer, nn.ReLU):
            raise TypeError(
                f"explicit path-lifting: unsupported layer {type(layer).__name__}"
            )
    if model.fully_conv:
        factors.append(_conv_factor(params, "head", length))
        factors.append(
            Factor(_dense_mean(factors[-1].out_size // length, length, dtype))
        )
    else:
        factors.append(Factor(params["head.weight"], params["head.bias"]))
    return chain_paths(factors)


def _block_factors(
    params: Params, prefix: str, stream: torch.Tensor, length: int
) -> list[Factor]:
    """conv1, bn1, conv2, bn2 of a BasicBlock; ``stream`` holds all paths reaching its input."""
    start = Factor(stream.detach())
    conv1 = _conv_factor(params, f"{prefix}.conv1", length)
    bn1 = _bn_factor(params, f"{prefix}.bn1", chain_paths([start, conv1]), length)
    conv2 = _conv_factor(params, f"{prefix}.conv2", length)
    bn2 = _bn_factor(
        params, f"{prefix}.bn2", chain_paths([start, conv1, bn1, conv2]), length
    )
    return [conv1, bn1, conv2, bn2]


def _resnet_paths(
    model: ResNet, params: Params, in_shape: Sequence[int]
) -> torch.Tensor:
    """Union over routes (shortcut or block body, per block) of chain path products."""
    stages = cast("Sequence[Sequence[BasicBlock]]", model.stages)
    if len(stages) != 1 or any(b.shortcut is not None for b in stages[0]):
        raise ValueError(
            "explicit path-lifting supports single-stage ResNets (identity shortcuts)"
        )
    length, dtype = in_shape[1], next(iter(params.values())).dtype
    conv = _conv_factor(params, "stem.conv", length)
    stem = [conv, _bn_factor(params, "stem.bn", chain_paths([conv]), length)]
    width = stem[-1].out_size
    skip = Factor(torch.ones(width, dtype=dtype), None, True)
    routes: list[tuple[list[Factor], list[bool]]] = [(stem, [True, True])]
    for b in range(len(stages[0])):
        stream = torch.cat([chain_paths(f, use_bias=fl) for f, fl in routes], 1)
        body = _block_factors(params, f"stages.0.{b}", stream, length)
        # a bias path of the body is the same whatever route led to the block: count it once
        routes = [(f + [skip], fl + [False]) for f, fl in routes] + [
            (f + body, fl + [i == 0] * len(body)) for i, (f, fl) in enumerate(routes)
        ]
    mean = Factor(_dense_mean(width // length, length, dtype))
    head = Factor(params["head.weight"], params["head.bias"])
    return torch.cat(
        [
            chain_paths([*f, mean, head], use_bias=[*fl, False, i == 0])
            for i, (f, fl) in enumerate(routes)
        ],
        1,
    )


def path_lifting(
    model: nn.Module, in_shape: Sequence[int]
) -> Callable[[Params], torch.Tensor]:
    """A function ``params -> Phi`` (flat vector of path products) for a tiny model.

    Supports MLPs, 1-D ConvNets with average or no pooling (BatchNorm and
    fully convolutional heads included) and single-stage 1-D ResNets.
    """
    if isinstance(model, MLP):
        return lambda params: _mlp_paths(model, params).reshape(-1)
    if isinstance(model, ConvNet) and len(in_shape) == 2:
        if any(isinstance(m, nn.MaxPool1d) for m in model.features):
            raise ValueError(
                "max pooling has no fixed path-lifting; use pool='avg' or None"
            )
        return lambda params: _convnet_paths(model, params, in_shape).reshape(-1)
    if isinstance(model, ResNet) and len(in_shape) == 2:
        return lambda params: _resnet_paths(model, params, in_shape).reshape(-1)
    raise ValueError(
        f"no explicit path-lifting for {type(model).__name__} with input {list(in_shape)}; "
        "use a tiny MLP, 1-D ConvNet or single-stage 1-D ResNet"
    )


@dataclass
class PathLifting:
    """``Phi``, its Jacobian ``J`` (paths x parameters), ``P = J J^T`` and ``G = J^T J``."""

    phi: torch.Tensor
    jacobian: torch.Tensor
    names: list[str]
    shapes: list[torch.Size]

    @property
    def kernel(self) -> torch.Tensor:
        """The path kernel ``P = J J^T`` (paths x paths)."""
        return self.jacobian @ self.jacobian.T

    @property
    def gram(self) -> torch.Tensor:
        """``G = J^T J`` (parameters x parameters)."""
        return self.jacobian.T @ self.jacobian

    def range_spectrum(self, n_neurons: int) -> torch.Tensor:
        """Eigenvalues of ``G`` in decreasing order, without the ``n_neurons`` smallest.

        ``G`` has one zero eigenvalue per rescalable hidden neuron (moving along
        a rescaling orbit leaves ``Phi`` fixed); the others are the non-zero
        eigenvalues of the path kernel ``P``.
        """
        ev = torch.linalg.eigvalsh(self.gram).flip(0)
        return ev[: len(ev) - n_neurons]

    def diag_g(self) -> dict[str, torch.Tensor]:
        """``diag(G)`` per parameter tensor."""
        d = (self.jacobian**2).sum(0)
        sizes = [math.prod(s) for s in self.shapes]
        return {
            n: c.reshape(s)
            for n, c, s in zip(self.names, d.split(sizes), self.shapes, strict=True)
        }


def explicit_path_lifting(model: nn.Module, in_shape: Sequence[int]) -> PathLifting:
    """Brute force: ``Phi`` path by path and its Jacobian (``torch.func.jacfwd``), in float64.

    Unrolled conv layers list structurally absent paths too, as zeros: they
    change neither ``G`` nor the non-zero spectrum of ``P``.
    """
    phi_fn = path_lifting(model, in_shape)
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    shapes = [params[n].shape for n in names]
    flat = torch.cat([params[n].reshape(-1) for n in names])
    sizes = [math.prod(s) for s in shapes]

    def phi_of_flat(v: torch.Tensor) -> torch.Tensor:
        parts = dict(
            zip(
                names,
                (c.reshape(s) for c, s in zip(v.split(sizes), shapes, strict=True)),
                strict=True,
            )
        )
        return phi_fn(parts)

    phi = phi_of_flat(flat)
    jac = torch.func.jacfwd(phi_of_flat)(flat)
    return PathLifting(phi.detach(), jac.detach(), names, shapes)


def mlp_path_labels(widths: Sequence[int]) -> list[str]:
    """Labels of the paths of an MLP with layer sizes ``widths``, in the order of ``Phi``.

    ``x3 > h1.0 > y1`` is the path from input 3 through hidden neuron 0 of
    layer 1 to output 1; ``b1.2 > y0`` starts at the bias of neuron 2 of layer 1.
    """
    n_layers = len(widths) - 1
    labels = []
    for o in range(widths[-1]):
        for start in range(n_layers):
            sizes = [widths[k] for k in range(n_layers - 1, start - 1, -1)]
            for idx in itertools.product(*(range(s) for s in sizes)):
                names = [f"h{n_layers - 1 - j}.{i}" for j, i in enumerate(idx)]
                names[-1] = f"x{idx[-1]}" if start == 0 else f"b{start}.{idx[-1]}"
                labels.append(" > ".join([*reversed(names), f"y{o}"]))
        labels.append(f"b{n_layers}.{o} > y{o}")
    return labels
