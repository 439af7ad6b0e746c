"""Alignment steps keep each model's function and bring B closer to A."""

from __future__ import annotations

import pytest
import torch

from wslib.core.models import build_model
from wslib.synthesis.alignment import (
    STEPS,
    alignment_steps,
    distance,
    function_change,
)

IN = [1, 20]
CONFIGS = {
    "mlp": {"name": "mlp", "in_shape": IN, "n_classes": 4, "widths": [12, 10]},
    "cnn": {"name": "cnn1d", "in_shape": IN, "n_classes": 4, "channels": [5, 6]},
    "resnet": {
        "name": "resnet1d",
        "in_shape": IN,
        "n_classes": 4,
        "widths": [4, 6],
        "blocks_per_stage": 1,
    },
}


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_every_step_keeps_both_functions(arch: str) -> None:
    torch.manual_seed(0)
    a, b = build_model(CONFIGS[arch]), build_model(CONFIGS[arch])
    x = torch.randn(64, *IN)
    steps = alignment_steps(a, b, IN, seed=0)
    assert list(steps) == list(STEPS)
    for sa, sb in steps.values():
        assert function_change(a, sa, x) < 1e-4
        assert function_change(b, sb, x) < 1e-4


def test_scale_matching_moves_b_closer_than_weight_matching_alone() -> None:
    torch.manual_seed(1)
    a, b = build_model(CONFIGS["mlp"]), build_model(CONFIGS["mlp"])
    steps = alignment_steps(a, b, IN, seed=0)
    wm = distance(*steps["weight matching"])
    assert distance(*steps["WM + scale matching"]) < wm < distance(*steps["none"])
