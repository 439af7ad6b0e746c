"""Chapter 2, one layer at a time: the straight line between two modes moved one
stage of the data flow at a time, its table, panels and metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from torch import nn

from wslib.core.interpolation import PathTs, linear_path
from wslib.llpf.stages import data_flow_stage_names, data_flow_stages

if TYPE_CHECKING:
    from wslib.core.data import Dataset


Result = Mapping[str, Any]


def layerwise_lines(
    a: nn.Module, b: nn.Module, ts: PathTs, ds: Dataset
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The straight line from ``a`` to ``b`` for the whole model and for each stage alone.

    A stage's line moves only that stage's tensors (from
    :func:`wslib.llpf.stages.data_flow_stages`), every other tensor stays at ``a``.
    Returns the whole model's :func:`~wslib.core.interpolation.linear_path`
    (training set) and one per stage name.
    """
    sa, sb = a.state_dict(), b.state_dict()
    whole = linear_path(a, sa, sb, ts, ds.x_train, ds.y_train)
    single = {
        stage: linear_path(a, sa, sb, ts, ds.x_train, ds.y_train, names=names)
        for stage, names in zip(data_flow_stage_names(a), data_flow_stages(a))
    }
    return whole, single


def stage_list(models: Mapping[str, nn.Module]) -> str:
    """The data-flow stages of each model, as text: ``"mlp: linears.0, linears.1; ..."``."""
    return "; ".join(
        f"{name}: {', '.join(data_flow_stage_names(model))}"
        for name, model in models.items()
    )


def layer_panels(
    single: Mapping[str, Mapping[str, Any]], *, per_panel: int = 7
) -> list[tuple[str, list[str]]]:
    """``(model, stages)`` for each panel of a figure: a model's stages, at most ``per_panel`` a panel.

    Stages are split into as few panels as needed, of sizes that differ by at most one.
    """
    panels: list[tuple[str, list[str]]] = []
    for name, lines in single.items():
        stages = list(lines)
        n = -(-len(stages) // per_panel)
        bounds = np.linspace(0, len(stages), n + 1).round().astype(int)
        panels.extend((name, stages[i:j]) for i, j in zip(bounds[:-1], bounds[1:]))
    return panels


def _line_row(model: str, moved: str, base: float, res: Result) -> dict[str, Any]:
    loss = res["train_loss"]
    return {
        "model": model,
        "moved": moved,
        "loss at A": base,
        "loss after first step": float(loss[1]),
        "loss at end": float(loss[-1]),
        "barrier": float(res["barrier"]),
    }


def layerwise_table(
    whole: Mapping[str, Result], single: Mapping[str, Mapping[str, Result]]
) -> pd.DataFrame:
    """One row per model and moved part (whole model, each stage alone)."""
    rows = []
    for name, res in whole.items():
        base = float(res["train_loss"][0])
        rows.append(_line_row(name, "whole model", base, res))
        rows.extend(
            _line_row(name, f"only {stage}", base, line)
            for stage, line in single[name].items()
        )
    return pd.DataFrame(rows)


def first_step_increase(res: Result) -> float:
    """Training loss after the first step of a line minus the loss at its start."""
    return float(res["train_loss"][1] - res["train_loss"][0])


def layerwise_metrics(
    whole: Mapping[str, Result], single: Mapping[str, Mapping[str, Result]]
) -> dict[str, dict[str, float]]:
    """Chapter 2's metrics: barrier and first-step increase, whole model vs worst single stage."""
    return {
        name: {
            "whole_barrier": float(whole[name]["barrier"]),
            "max_single_layer_barrier": max(
                float(r["barrier"]) for r in single[name].values()
            ),
            "whole_first_step_increase": first_step_increase(whole[name]),
            "max_single_first_step_increase": max(
                first_step_increase(r) for r in single[name].values()
            ),
        }
        for name in whole
    }
