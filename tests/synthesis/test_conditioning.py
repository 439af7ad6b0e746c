"""PathCond's criterion along a path: the gauge keeps the loss and lowers AM/GM."""

from __future__ import annotations

import pytest
import torch

from wslib.core.interpolation import lerp_state
from wslib.core.models import build_model
from wslib.synthesis.conditioning import path_conditioning

IN = [1, 20]
MLP = {"name": "mlp", "in_shape": IN, "n_classes": 4, "widths": [12, 10]}


def test_gauge_keeps_each_point_and_improves_its_conditioning() -> None:
    torch.manual_seed(0)
    a, b = build_model(MLP), build_model(MLP)
    states = [lerp_state(a.state_dict(), b.state_dict(), t) for t in (0.0, 0.5, 1.0)]
    x, y = torch.randn(50, *IN), torch.randint(0, 4, (50,))
    result = path_conditioning(a, states, IN, x, y)
    assert result["loss_gauge"] == pytest.approx(result["loss"], rel=1e-5)
    pairs = list(zip(result["amgm"], result["amgm_gauge"]))
    assert all(1.0 <= gauged < given for given, gauged in pairs)
