"""The architectures of the book, each describing its own hidden neurons.

Every model is an ``nn.Module`` with a ``neuron_structure()`` method that lists
its hidden neuron groups in data-flow order (see :mod:`wslib.core.neurons`). The
1-D and 2-D versions of an architecture share one class; the number of
spatial dimensions comes from ``in_shape`` (``[C, L]`` or ``[C, H, W]``).

Build models by name with :func:`wslib.core.configs.build_model`::

    build_model({"name": "mlp", "in_shape": [1, 40], "n_classes": 10, "widths": [256, 256]})
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from wslib.core.neurons import NeuronGroup, NeuronStructure, Role, Slot
from wslib.core.pooling import PairMaxPool1d

#: The convolutions and BatchNorms of the book's models (1-D or 2-D).
Conv = nn.Conv1d | nn.Conv2d
BatchNorm = nn.BatchNorm1d | nn.BatchNorm2d
_CONV: dict[int, type[Conv]] = {1: nn.Conv1d, 2: nn.Conv2d}
_BN: dict[int, type[BatchNorm]] = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d}
_POOL: dict[str, dict[int, type[nn.Module]]] = {
    "avg": {1: nn.AvgPool1d, 2: nn.AvgPool2d},
    "max": {1: PairMaxPool1d, 2: nn.MaxPool2d},
}
# The activations and pooling layers a model config may name.
ActivationName = Literal["relu", "gelu", "silu"]
PoolName = Literal["max", "avg"]
_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}


# --- slot helpers ----------------------------------------------------------------------------


def rows(name: str, *, role: Role = "out") -> Slot:
    """Axis 0 of ``name`` (weight rows, a bias, a norm parameter)."""
    return Slot(name, 0, role)


def linear_in(prefix: str, *, block: int = 1) -> list[Slot]:
    """Input columns of a Linear or Conv layer that consumes the neurons."""
    return [Slot(f"{prefix}.weight", 1, "in", block)]


def linear_out(prefix: str) -> list[Slot]:
    """Weight rows and bias of a Linear or Conv layer that produces the neurons."""
    return [rows(f"{prefix}.weight"), rows(f"{prefix}.bias")]


def bn_out(prefix: str) -> list[Slot]:
    """BatchNorm affine parameters (produce the neurons) and running statistics (free)."""
    return [
        rows(f"{prefix}.weight"),
        rows(f"{prefix}.bias"),
        rows(f"{prefix}.running_mean", role="free"),
        rows(f"{prefix}.running_var", role="free"),
    ]


def conv_bn_out(conv: str, bn: str) -> list[Slot]:
    """A bias-free conv followed by BatchNorm: the conv rows are scale-free."""
    return [rows(f"{conv}.weight", role="free"), *bn_out(bn)]


def norm_free(prefix: str) -> list[Slot]:
    """LayerNorm affine parameters (permuted only)."""
    return [rows(f"{prefix}.weight", role="free"), rows(f"{prefix}.bias", role="free")]


def _structure(sizes: dict[str, int], slots: dict[str, list[Slot]]) -> NeuronStructure:
    return NeuronStructure(
        tuple(NeuronGroup(n, sizes[n], tuple(slots[n])) for n in sizes)
    )


# --- MLP -------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Flatten, ``Linear -> activation`` per hidden width, then a Linear head.

    ``linears`` holds every Linear layer, head last. Only ReLU groups are
    rescalable; GELU and SiLU are not positively homogeneous. With
    ``output_bias=False`` the head has no bias, the layout of the PathCond
    paper's MLPs.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        n_classes: int,
        widths: Sequence[int],
        *,
        activation: ActivationName = "relu",
        output_bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation {activation!r}; expected one of {list(_ACTIVATIONS)}"
            )
        sizes = [math.prod(in_shape), *widths, n_classes]
        n_layers = len(sizes) - 1
        self.linears = nn.ModuleList(
            nn.Linear(a, b, bias=output_bias or i < n_layers - 1)
            for i, (a, b) in enumerate(itertools.pairwise(sizes))
        )
        self.act = _ACTIVATIONS[activation]()
        self.rescalable = activation == "relu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.linears[:-1]:
            x = self.act(layer(x))
        return self.linears[-1](x)

    def neuron_structure(self) -> NeuronStructure:
        groups = (
            NeuronGroup(
                f"layer{i}",
                layer.out_features,
                (*linear_out(f"linears.{i}"), *linear_in(f"linears.{i + 1}")),
                self.rescalable,
            )
            for i, layer in enumerate(cast("Sequence[nn.Linear]", self.linears[:-1]))
        )
        return NeuronStructure(tuple(groups))


# --- plain conv nets (cnn1d, vgg11) -----------------------------------------------------------


def _he_init(conv: Conv) -> Conv:
    """He-normal weights keep the signal scale through deep ReLU stacks without BatchNorm."""
    nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
    return conv


class ConvNet(nn.Module):
    """``Conv (+ BN) -> ReLU`` layers with pooling, then a head.

    Parameters
    ----------
    plan
        Conv output channels in order; ``"P"`` inserts a 2x pooling layer.
    pool
        ``"max"`` or ``"avg"``. Both commute with permutations and positive
        per-channel scaling, so every group stays rescalable.
    head
        ``"flatten"`` (Flatten + Linear) or ``"conv"`` (fully convolutional: a
        conv to ``n_classes`` channels, then global average pooling).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        n_classes: int,
        plan: Sequence[int | str],
        *,
        kernel_size: int = 3,
        pool: PoolName = "max",
        bn: bool = False,
        head: Literal["flatten", "conv"] = "flatten",
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        if pool not in _POOL or head not in ("flatten", "conv"):
            raise ValueError(
                f"pool must be one of {list(_POOL)} and head 'flatten' or 'conv'"
            )
        dims = len(in_shape) - 1
        layers: list[nn.Module] = []
        self.convs: list[tuple[int, int]] = []  # (index in features, channels)
        channels = in_shape[0]
        for item in plan:
            if item == "P":
                layers.append(_POOL[pool][dims](2))
                continue
            width = cast(int, item)
            self.convs.append((len(layers), width))
            conv = _CONV[dims](
                channels, width, kernel_size, padding=kernel_size // 2, bias=not bn
            )
            layers.append(_he_init(conv))
            layers.extend([_BN[dims](width)] if bn else [])
            layers.append(nn.ReLU())
            channels = width
        self.features = nn.Sequential(*layers)
        self.bn = bn
        self.fully_conv = head == "conv"
        self.head: Conv | nn.Linear
        if self.fully_conv:
            self.head_block = 1
            self.head = _CONV[dims](
                channels, n_classes, kernel_size, padding=kernel_size // 2
            )
        else:
            self.head_block = math.prod(s // 2 ** plan.count("P") for s in in_shape[1:])
            if self.head_block == 0:
                raise ValueError(
                    f"input {list(in_shape)} is too small for its poolings"
                )
            self.head = nn.Linear(channels * self.head_block, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        if self.fully_conv:
            return self.head(x).flatten(2).mean(2)
        return self.head(x.flatten(1))

    def neuron_structure(self) -> NeuronStructure:
        prefixes = [f"features.{i}" for i, _ in self.convs]
        consumers = [linear_in(p) for p in prefixes[1:]] + [
            linear_in("head", block=self.head_block)
        ]
        groups = []
        for k, ((i, width), consumer) in enumerate(zip(self.convs, consumers)):
            producer = (
                conv_bn_out(f"features.{i}", f"features.{i + 1}")
                if self.bn
                else linear_out(f"features.{i}")
            )
            groups.append(NeuronGroup(f"conv{k}", width, (*producer, *consumer)))
        return NeuronStructure(tuple(groups))


# --- ResNets (resnet1d, resnet18) -------------------------------------------------------------


def _conv(dims: int, c_in: int, c_out: int, kernel_size: int, stride: int) -> Conv:
    return _CONV[dims](c_in, c_out, kernel_size, stride, kernel_size // 2, bias=False)


class ConvBN(nn.Sequential):
    """Bias-free conv followed by BatchNorm (children ``conv`` and ``bn``)."""

    conv: Conv
    bn: BatchNorm

    def __init__(
        self, dims: int, c_in: int, c_out: int, kernel_size: int, stride: int
    ) -> None:
        super().__init__(
            OrderedDict(
                conv=_conv(dims, c_in, c_out, kernel_size, stride), bn=_BN[dims](c_out)
            )
        )


class BasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    The shortcut is the identity, or a 1x1 ``ConvBN`` projection when the
    channels or the stride change.
    """

    def __init__(
        self, dims: int, c_in: int, c_out: int, stride: int, kernel_size: int
    ) -> None:
        super().__init__()
        self.conv1 = _conv(dims, c_in, c_out, kernel_size, stride)
        self.bn1 = _BN[dims](c_out)
        self.conv2 = _conv(dims, c_out, c_out, kernel_size, 1)
        self.bn2 = _BN[dims](c_out)
        projects = stride != 1 or c_in != c_out
        self.shortcut = ConvBN(dims, c_in, c_out, 1, stride) if projects else None
        # One ReLU module per use, so attribution hooks (captum's DeepLIFT) see each.
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """Stem ``ConvBN -> ReLU``, stages of BasicBlocks, global average pool, Linear head.

    Stage ``s`` has ``widths[s]`` channels; every stage but the first starts
    with stride 2.

    Neuron groups: the inner neuron of each block (``stage{s}.block{b}``), and
    one tied group per residual stream (``stream{s}``, opened by the stem or by
    a projection shortcut) covering every layer that writes to or reads from
    it. Rescaling a stream is exact: BatchNorm's gamma/beta carry the scale,
    identity shortcuts carry the scaled stream and ``relu(lam x) = lam relu(x)``.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        n_classes: int,
        widths: Sequence[int],
        blocks_per_stage: int,
        *,
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        if blocks_per_stage < 1 or kernel_size % 2 == 0:
            raise ValueError("blocks_per_stage must be >= 1 and kernel_size odd")
        dims = len(in_shape) - 1
        self.stem = ConvBN(dims, in_shape[0], widths[0], kernel_size, 1)
        self.stem_relu = nn.ReLU()
        stages = []
        channels = widths[0]
        for s, width in enumerate(widths):
            blocks = []
            for b in range(blocks_per_stage):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(BasicBlock(dims, channels, width, stride, kernel_size))
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem_relu(self.stem(x)))
        return self.head(x.flatten(2).mean(2))

    def neuron_structure(self) -> NeuronStructure:
        sizes: dict[str, int] = {}
        slots: dict[str, list[Slot]] = {}

        def open_group(name: str, size: int, producer: list[Slot]) -> None:
            sizes[name], slots[name] = size, list(producer)

        stream = "stream0"
        open_group(
            stream, self.stem.bn.num_features, conv_bn_out("stem.conv", "stem.bn")
        )
        for s, stage in enumerate(self.stages):
            for b, block in enumerate(cast("Sequence[BasicBlock]", stage)):
                p, inner = f"stages.{s}.{b}", f"stage{s}.block{b}"
                open_group(
                    inner, block.bn1.num_features, conv_bn_out(f"{p}.conv1", f"{p}.bn1")
                )
                slots[inner] += linear_in(f"{p}.conv2")
                slots[stream] += linear_in(f"{p}.conv1")
                if block.shortcut is not None:
                    slots[stream] += linear_in(f"{p}.shortcut.conv")
                    stream = f"stream{s}"
                    producer = conv_bn_out(f"{p}.shortcut.conv", f"{p}.shortcut.bn")
                    open_group(stream, block.bn2.num_features, producer)
                slots[stream] += conv_bn_out(f"{p}.conv2", f"{p}.bn2")
        slots[stream] += linear_in("head")
        return _structure(sizes, slots)


# --- transformers (transformer1d, vit) --------------------------------------------------------


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection and an output ``proj``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"embed_dim {width} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def extra_repr(self) -> str:
        """The number of heads, which no parameter's shape shows (a cached step's
        key holds a module's ``repr``: :mod:`wslib.runs.steps`)."""
        return f"heads={self.heads}"

    def mix(self, qkv: torch.Tensor) -> torch.Tensor:
        """The heads' outputs ``(N, T, D)`` (before ``proj``) from the ``qkv`` projection."""
        n, t, d3 = qkv.shape
        d = d3 // 3
        qkv = qkv.reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return y.transpose(1, 2).reshape(n, t, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.mix(self.qkv(x)))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, width: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(width, mlp_dim),
                act=nn.ReLU(),
                fc2=nn.Linear(mlp_dim, width),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Patch embedding, learned positions, pre-LN blocks, final LN, mean pool, Linear head.

    The patch embedding is a conv with kernel = stride = ``patch_size``, i.e. a
    Linear map of each flattened patch. No dropout.

    Neuron groups: the residual stream (``stream``; permutable only, since
    LayerNorm is not invariant to per-feature scaling) and each block's MLP
    hidden layer (``block{i}.mlp``; rescalable, ReLU). Attention heads are not
    permuted: permuting whole heads, and query/key or value dimensions within a
    head, is a valid extra symmetry that we do not use.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        n_classes: int,
        patch_size: int,
        embed_dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
    ) -> None:
        super().__init__()
        if any(s % patch_size for s in in_shape[1:]):
            raise ValueError(
                f"input {list(in_shape)} is not divisible into patches of {patch_size}"
            )
        dims = len(in_shape) - 1
        n_tokens = math.prod(s // patch_size for s in in_shape[1:])
        self.embed = _CONV[dims](in_shape[0], embed_dim, patch_size, stride=patch_size)
        self.pos = nn.Parameter(0.02 * torch.randn(1, n_tokens, embed_dim))
        self.blocks = nn.Sequential(
            *(TransformerBlock(embed_dim, heads, mlp_dim) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(tokens)).mean(1))

    def neuron_structure(self) -> NeuronStructure:
        stream = [*linear_out("embed"), Slot("pos", 2, "out")]
        mlps = []
        for i, block in enumerate(cast("Sequence[TransformerBlock]", self.blocks)):
            p = f"blocks.{i}"
            stream += [*norm_free(f"{p}.norm1"), *linear_in(f"{p}.attn.qkv")]
            stream += [*linear_out(f"{p}.attn.proj"), *norm_free(f"{p}.norm2")]
            stream += [*linear_in(f"{p}.mlp.fc1"), *linear_out(f"{p}.mlp.fc2")]
            hidden = (*linear_out(f"{p}.mlp.fc1"), *linear_in(f"{p}.mlp.fc2"))
            mlps.append(
                NeuronGroup(
                    f"block{i}.mlp", cast(nn.Linear, block.mlp.fc1).out_features, hidden
                )
            )
        stream += [*norm_free("norm"), *linear_in("head")]
        width = self.head.in_features
        return NeuronStructure(
            (NeuronGroup("stream", width, tuple(stream), False), *mlps)
        )
