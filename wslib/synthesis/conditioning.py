"""PathCond's criterion along a path between two modes.

At every point of a path (LLPF, the straight line, a Bezier curve) the network
has a diag G (:func:`wslib.pathcond.rescaling.diag_g`). PathCond's criterion
is its spread: the objective ``F`` of the rescaling at the point as given
(``F(0)``, which is ``p log(AM/GM)`` of diag G up to a constant of the
point) and at its minimum over rescalings (``F_gauge``), and the ratio of
the arithmetic to the geometric mean of diag G (1 when every path counts
the same). :func:`path_conditioning` gives these per point, as the path
leaves it and after rescaling the point to its PathCond gauge, with the
training loss before and after the rescaling (the same function, so the
same loss up to rounding).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from wslib.core.neurons import StateDict
from wslib.core.train import float64_outputs
from wslib.pathcond.rescaling import am_over_gm, diag_g, pathcond_rescale
from wslib.synthesis.alignment import with_state

KEYS = ("F", "F_gauge", "amgm", "amgm_gauge", "log_g_std", "loss", "loss_gauge")


def log_spread(g: dict[str, torch.Tensor]) -> float:
    """Standard deviation of ``log g`` over the positive entries of diag G."""
    flat = torch.cat([v.reshape(-1) for v in g.values()]).double()
    return float(flat[flat > 0].log().std())


def float64_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Cross-entropy of ``model`` on ``(x, y)`` in eval mode, its outputs computed in float64.

    The gauge's loss change is a symmetry check: in float64 it is the float32
    weights' rounding alone, on any device (no TF32 or kernel choice).
    """
    outputs = float64_outputs(model, x)
    return float(nn.functional.cross_entropy(outputs, y.cpu().long()))


def path_conditioning(
    model: nn.Module,
    states: Sequence[StateDict],
    in_shape: Sequence[int],
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, list[float]]:
    """Per point: F, AM/GM and spread of diag G as given and in the PathCond gauge;
    losses (:func:`float64_loss`) as given and in the gauge."""
    if len(states) == 0:
        raise ValueError("path_conditioning needs at least one state on the path")
    out: dict[str, list[float]] = {k: [] for k in KEYS}
    for state in states:
        point = with_state(model, state)
        wide = copy.deepcopy(point).double()
        g = diag_g(wide, in_shape)
        result = pathcond_rescale(wide, in_shape)
        gauged = with_state(
            model, {k: v.to(state[k].dtype) for k, v in wide.state_dict().items()}
        )
        out["F"].append(float(result.objective[0]))
        out["F_gauge"].append(float(result.objective[-1]))
        out["amgm"].append(am_over_gm(g))
        out["amgm_gauge"].append(am_over_gm(diag_g(wide, in_shape)))
        out["log_g_std"].append(log_spread(g))
        out["loss"].append(float64_loss(point, x, y))
        out["loss_gauge"].append(float64_loss(gauged, x, y))
    return {k: [float(v) for v in np.asarray(vals)] for k, vals in out.items()}
