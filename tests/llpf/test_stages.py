"""wslib/llpf/stages.py: the layer order in which LLPF moves a model's tensors."""

from __future__ import annotations

import pytest

from tests.kit import RESNET, TRANSFORMER
from wslib.core.configs import build_model
from wslib.llpf import data_flow_stage_names  # the package exports it
from wslib.llpf.stages import data_flow_stages, stage_starts


def test_data_flow_stages_follow_module_order() -> None:
    model = build_model(RESNET)
    stages = data_flow_stages(model)
    assert stages[0][0].startswith("stem.") and stages[-1] == [
        "head.weight",
        "head.bias",
    ]
    assert sorted(n for s in stages for n in s) == sorted(
        n for n, _ in model.named_parameters()
    )
    assert stage_starts(4, 100, 10) == [0, 10, 20, 30]
    assert stage_starts(4, 100, None, all_at_once=True) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="stage_ticks"):
        stage_starts(4, 100, [1, 2])
    with pytest.raises(ValueError, match="last stage"):
        stage_starts(4, 10, 5)


def test_stage_names_match_stages() -> None:
    model = build_model(TRANSFORMER)
    names = data_flow_stage_names(model)
    assert len(names) == len(data_flow_stages(model))
    assert names[-1] == "head" and "blocks.0" in names
