"""What an HF / KF fusion of a residual network reads and fits, and in which order.

The *taps* of a ResNet or a pre-LN transformer are every intermediate value
the fusion needs (:func:`resnet_taps`, :func:`transformer_taps`): each
stream value after each write, each block's input and output, the logits.
The *plan* (:func:`resnet_plan`, :func:`transformer_plan`) lists the fitting
steps of :func:`wslib.fusion.residual.fuse_residual` in data-flow order:
which layers are fitted together, to which tap, on which inputs. The
importance of a residual network's neurons is read at the same places
(:func:`importance_modules`, :func:`residual_importance`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from wslib.core.models import BasicBlock, ResNet, Transformer, TransformerBlock
from wslib.fusion.importance import ImportanceName, Scores, neuron_importance

Taps = dict[str, torch.Tensor]
TapsOf = Callable[[nn.Module, torch.Tensor], Taps]


@torch.no_grad()
def resnet_taps(model: ResNet, x: torch.Tensor) -> Taps:
    """Eval-mode values of a ResNet: stream sums (pre-ReLU), block inputs and inner neurons."""
    model.eval()
    t: Taps = {"x": x, "stem": model.stem(x)}
    cur = F.relu(t["stem"])
    for s, stage in enumerate(model.stages):
        for b, block in enumerate(cast("Sequence[BasicBlock]", stage)):
            p = f"stages.{s}.{b}"
            t[f"{p}.in"] = cur
            t[f"{p}.bn1"] = block.bn1(block.conv1(cur))
            t[f"{p}.h"] = F.relu(t[f"{p}.bn1"])
            t[f"{p}.sum"] = block_output(block, cur, inner=t[f"{p}.h"])
            cur = F.relu(t[f"{p}.sum"])
    t["pooled"] = cur.flatten(2).mean(2)
    t["head"] = model.head(t["pooled"])
    return t


@torch.no_grad()
def transformer_taps(model: Transformer, x: torch.Tensor) -> Taps:
    """Values of a transformer, tokens ``(N, T, D)``: stream after each write, MLP pre-activations."""
    model.eval()
    t: Taps = {"x": x, "embed": model.embed(x).flatten(2).transpose(1, 2) + model.pos}
    # the position embedding's input: one indicator per token
    t["tokens"] = torch.ones(
        len(x), model.pos.shape[1], 1, dtype=x.dtype, device=x.device
    )
    cur = t["embed"]
    for i, block in enumerate(cast("Sequence[TransformerBlock]", model.blocks)):
        p = f"blocks.{i}"
        mlp: Any = block.mlp  # a Sequential of fc1, act and fc2
        t[f"{p}.in"] = cur
        t[f"{p}.norm1"] = block.norm1(cur)
        t[f"{p}.qkv"] = block.attn.qkv(t[f"{p}.norm1"])
        t[f"{p}.mix"] = block.attn.mix(t[f"{p}.qkv"])
        t[f"{p}.attn_sum"] = cur + block.attn.proj(t[f"{p}.mix"])
        cur = t[f"{p}.attn_sum"]
        t[f"{p}.norm2"] = block.norm2(cur)
        t[f"{p}.fc1"] = mlp.fc1(t[f"{p}.norm2"])
        t[f"{p}.h"] = mlp.act(t[f"{p}.fc1"])
        t[f"{p}.mlp_sum"] = cur + mlp.fc2(t[f"{p}.h"])
        cur = t[f"{p}.mlp_sum"]
    t["pooled"] = model.norm(cur).mean(1)
    t["head"] = model.head(t["pooled"])
    return t


def block_output(
    block: BasicBlock | TransformerBlock,
    x: torch.Tensor,
    *,
    inner: torch.Tensor | None = None,
) -> torch.Tensor:
    """The output of a block on its input ``x``: a BasicBlock's pre-ReLU sum, a transformer block's.

    ``inner``: a BasicBlock's inner neurons (after ReLU) when already computed.
    """
    if isinstance(block, TransformerBlock):
        return block(x)
    if inner is None:
        inner = F.relu(block.bn1(block.conv1(x)))
    shortcut = x if block.shortcut is None else block.shortcut(x)
    return block.bn2(block.conv2(inner)) + shortcut


def tap_matrix(
    value: torch.Tensor, tokens: bool, *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """A tap as ``(neurons, samples)`` rows (on its device); samples are examples x positions (or tokens)."""
    if tokens or value.dim() == 2:
        return value.reshape(-1, value.shape[-1]).T.to(dtype)
    return value.movedim(1, 0).reshape(value.shape[1], -1).to(dtype)


@contextlib.contextmanager
def evaluating(models: Sequence[nn.Module]) -> Iterator[None]:
    """Eval mode inside; afterwards every module's mode is what it was."""
    modes = [(m, m.training) for model in models for m in model.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


# --- the plan: what is fitted, in which order, to which targets --------------------------------


@dataclass(frozen=True)
class Fit:
    """One affine piece of a fitted value: ``module`` applied to the tap ``source``."""

    module: str
    source: str
    bn: str | None = None  # the BatchNorm after a bias-free conv


@dataclass(frozen=True)
class Step:
    """Fit ``fits`` (summed, one bias) so that the fused value at ``tap`` matches its targets.

    ``group`` names the neuron group whose centroids are the targets (``None``:
    the targets are the base models' values, head or attention); ``residual``
    is the fused model's tap that an identity shortcut adds to the sum.
    """

    group: str | None
    tap: str
    fits: tuple[Fit, ...]
    residual: str | None = None
    bias: bool = True
    block: str | None = None  # the block whose output ``tap`` is (its last step)


def resnet_plan(model: ResNet) -> list[Step]:
    """Stem, then per block the inner neurons and the stream sum, then the head."""
    steps = [Step("stream0", "stem", (Fit("stem.conv", "x", "stem.bn"),))]
    stream = "stream0"
    for s, stage in enumerate(model.stages):
        for b, block in enumerate(cast("Sequence[BasicBlock]", stage)):
            p = f"stages.{s}.{b}"
            steps.append(
                Step(
                    f"stage{s}.block{b}",
                    f"{p}.bn1",
                    (Fit(f"{p}.conv1", f"{p}.in", f"{p}.bn1"),),
                )
            )
            fits: tuple[Fit, ...] = (Fit(f"{p}.conv2", f"{p}.h", f"{p}.bn2"),)
            if block.shortcut is None:
                steps.append(
                    Step(stream, f"{p}.sum", fits, residual=f"{p}.in", block=p)
                )
            else:
                stream = f"stream{s}"
                fits += (Fit(f"{p}.shortcut.conv", f"{p}.in", f"{p}.shortcut.bn"),)
                steps.append(Step(stream, f"{p}.sum", fits, block=p))
    steps.append(Step(None, "head", (Fit("head", "pooled"),)))
    return steps


def transformer_plan(model: Transformer) -> list[Step]:
    """Embedding, then per block attention (qkv, proj) and MLP (fc1, fc2), then the head."""
    steps = [
        Step("stream", "embed", (Fit("embed", "x"), Fit("pos", "tokens")), bias=False)
    ]
    for i in range(len(model.blocks)):
        p = f"blocks.{i}"
        steps += [
            Step(None, f"{p}.qkv", (Fit(f"{p}.attn.qkv", f"{p}.norm1"),)),
            Step(
                "stream",
                f"{p}.attn_sum",
                (Fit(f"{p}.attn.proj", f"{p}.mix"),),
                residual=f"{p}.in",
            ),
            Step(f"block{i}.mlp", f"{p}.fc1", (Fit(f"{p}.mlp.fc1", f"{p}.norm2"),)),
            Step(
                "stream",
                f"{p}.mlp_sum",
                (Fit(f"{p}.mlp.fc2", f"{p}.h"),),
                residual=f"{p}.attn_sum",
                block=p,
            ),
        ]
    steps.append(Step(None, "head", (Fit("head", "pooled"),)))
    return steps


def arch_plan(model: nn.Module) -> tuple[TapsOf, list[Step], bool]:
    """Taps function, plan and token layout of a residual model (and of its kind)."""
    if isinstance(model, ResNet):
        return cast(TapsOf, resnet_taps), resnet_plan(model), False
    if isinstance(model, Transformer):
        return cast(TapsOf, transformer_taps), transformer_plan(model), True
    raise TypeError(f"{type(model).__name__} is not a ResNet or Transformer")


def importance_modules(model: nn.Module) -> dict[str, list[str]]:
    """Per neuron group, the modules whose outputs carry its neurons (scores are averaged)."""
    if isinstance(model, ResNet):
        mods: dict[str, list[str]] = {"stream0": ["stem"]}
        stream = "stream0"
        for s, stage in enumerate(model.stages):
            for b, block in enumerate(cast("Sequence[BasicBlock]", stage)):
                p = f"stages.{s}.{b}"
                mods[f"stage{s}.block{b}"] = [f"{p}.bn1"]
                if block.shortcut is not None:
                    stream = f"stream{s}"
                    mods[stream] = []
                mods[stream].append(p)
        return mods
    if isinstance(model, Transformer):
        mods = {"stream": [f"blocks.{i}" for i in range(len(model.blocks))]}
        mods.update(
            {f"block{i}.mlp": [f"blocks.{i}.mlp.fc1"] for i in range(len(model.blocks))}
        )
        return mods
    raise TypeError(f"{type(model).__name__} is not a ResNet or Transformer")


def residual_importance(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    method: ImportanceName,
    *,
    progress: bool = True,
) -> Scores:
    """Importance of every neuron group of a residual model (mean over the group's modules)."""
    mods = importance_modules(model)
    names = [m for ms in mods.values() for m in ms]
    scores = neuron_importance(model, names, x, y, method, progress=progress)
    return Scores(
        {g: torch.stack([scores[m] for m in ms]).mean(0) for g, ms in mods.items()},
        method,
    )
