"""LLPF's layer order: which parameter tensors move together, and from which tick.

Layer order. A "layer" is one parameter tensor. :func:`data_flow_stages`
groups the parameter tensors by the block that owns them, in module order,
which for every model of :mod:`wslib.core.models` is the order of the data flow
(input to output). Stage ``k`` starts moving at tick ``start[k]`` ("Follow
Data Flow"); once started, a tensor keeps moving. Every tensor is trained
during refinement from the first tick. ``all_at_once=True`` starts every
stage at tick 0 (the ablation).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def _block_of(name: str) -> str:
    """The block owning a parameter: its module path up to the first numeric index."""
    parts = name.split(".")[:-1]
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0] if parts else name


def _stages_by_block(model: nn.Module) -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        stages.setdefault(_block_of(name), []).append(name)
    return stages


def data_flow_stages(model: nn.Module) -> list[list[str]]:
    """Parameter names grouped by owning block, in module (= data-flow) order.

    MLP: one stage per Linear; CNN: one per conv, then the head; ResNet: stem,
    one per residual stage, head; transformer: position table, patch
    embedding, one per block, final norm, head.
    """
    return list(_stages_by_block(model).values())


def data_flow_stage_names(model: nn.Module) -> list[str]:
    """Names of the stages of :func:`data_flow_stages` (the owning blocks), in the same order."""
    return list(_stages_by_block(model))


def stage_starts(
    n_stages: int,
    ticks: int,
    stage_ticks: int | Sequence[int] | None,
    *,
    all_at_once: bool = False,
) -> list[int]:
    """Tick at which each stage starts moving.

    ``stage_ticks`` is the number of ticks between the starts of consecutive
    stages: one int for all, a list of ``n_stages - 1`` ints, or ``None`` to
    spread the starts evenly over the first half of the path.
    """
    if all_at_once:
        return [0] * n_stages
    if stage_ticks is None:
        return [round(k * ticks / (2 * n_stages)) for k in range(n_stages)]
    gaps = (
        [stage_ticks] * (n_stages - 1)
        if isinstance(stage_ticks, int)
        else list(stage_ticks)
    )
    if len(gaps) != n_stages - 1 or any(g < 0 for g in gaps):
        raise ValueError(
            f"stage_ticks must be one int or {n_stages - 1} non-negative ints (gaps between "
            f"the starts of {n_stages} stages), got {stage_ticks!r}"
        )
    starts = [sum(gaps[:k]) for k in range(n_stages)]
    if starts[-1] >= ticks:
        raise ValueError(
            f"the last stage would start at tick {starts[-1]} >= ticks={ticks}; "
            "use fewer stage ticks or more ticks"
        )
    return starts
