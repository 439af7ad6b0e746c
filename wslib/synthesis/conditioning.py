"""PathCond's criterion along a path between two modes.

At every point of a path (LLPF, the straight line, a Bezier curve) the network
has a diag G (:func:`wslib.pathcond.rescaling.diag_g`); its spread, measured by
the ratio of its arithmetic to its geometric mean (1 when every path counts
the same), is what PathCond's rescaling minimises. :func:`path_conditioning`
gives, per point, that ratio as the path leaves it and after rescaling the
point to its PathCond gauge, and the training loss before and after the
rescaling (the same function, so the same loss up to rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from wslib.core.neurons import StateDict
from wslib.core.train import evaluate
from wslib.pathcond.rescaling import am_over_gm, diag_g
from wslib.synthesis.alignment import pathcond_gauge, with_state


def path_conditioning(
    model: nn.Module,
    states: Sequence[StateDict],
    in_shape: Sequence[int],
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, list[float]]:
    """Per point: AM/GM of diag G as given and in the PathCond gauge, and both losses."""
    out: dict[str, list[float]] = {
        "amgm": [],
        "amgm_gauge": [],
        "loss": [],
        "loss_gauge": [],
    }
    for state in states:
        point = with_state(model, state)
        gauged = with_state(model, pathcond_gauge(point, in_shape))
        for suffix, net in (("", point), ("_gauge", gauged)):
            out[f"amgm{suffix}"].append(am_over_gm(diag_g(net, in_shape)))
            out[f"loss{suffix}"].append(evaluate(net, x, y)[0])
    return out
