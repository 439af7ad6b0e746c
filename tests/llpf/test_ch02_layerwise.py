"""Chapter 2: one layer at a time (wslib.llpf.ch02_layerwise)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kit import MLP, pair, toy_dataset
from tests.llpf.path_results import lines_of
from wslib.core.configs import build_model
from wslib.core.interpolation import lerp_state, linear_path
from wslib.core.train import evaluate
from wslib.llpf.ch02_layerwise import (
    first_step_increase,
    layer_panels,
    layerwise_lines,
    layerwise_metrics,
    layerwise_table,
    stage_list,
)
from wslib.llpf.stages import data_flow_stage_names, data_flow_stages


def test_layerwise_lines_move_one_stage_at_a_time() -> None:
    ds = toy_dataset()
    a, b = pair()
    ts = [0.0, 0.5, 1.0]
    whole, single = layerwise_lines(a, b, ts, ds)
    ref = linear_path(a, a.state_dict(), b.state_dict(), ts, ds.x_train, ds.y_train)
    assert np.array_equal(whole["train_loss"], ref["train_loss"])
    assert list(single) == data_flow_stage_names(a)
    # the end of a stage's line is A with that stage of B
    stage = data_flow_stages(a)[1]
    hybrid = build_model(MLP)
    hybrid.load_state_dict(lerp_state(a.state_dict(), b.state_dict(), 1.0, stage))
    loss = evaluate(hybrid, ds.x_train, ds.y_train)[0]
    assert single[data_flow_stage_names(a)[1]]["train_loss"][-1] == pytest.approx(loss)
    assert single["linears.0"]["train_loss"][0] == pytest.approx(whole["train_loss"][0])


def test_stage_list_names_each_models_stages() -> None:
    a, _ = pair()
    assert stage_list({"mlp": a}) == "mlp: linears.0, linears.1, linears.2"


def test_layer_panels_keep_at_most_per_panel_lines() -> None:
    single = {"a": dict.fromkeys("123"), "b": dict.fromkeys("123456789")}
    assert layer_panels(single, per_panel=7) == [
        ("a", ["1", "2", "3"]),
        ("b", ["1", "2", "3", "4"]),
        ("b", ["5", "6", "7", "8", "9"]),
    ]
    assert layer_panels(single, per_panel=3)[-1] == ("b", ["7", "8", "9"])


def test_layerwise_table_and_metrics() -> None:
    whole = {"m": lines_of([1.0, 1.5, 3.0, 1.2])}
    single = {
        "m": {
            "s0": lines_of([1.0, 1.1, 4.0, 2.0]),
            "s1": lines_of([1.0, 1.2, 1.1, 1.0]),
        }
    }
    table = layerwise_table(whole, single)
    assert list(table.moved) == ["whole model", "only s0", "only s1"]
    assert list(table["loss after first step"]) == [1.5, 1.1, 1.2]
    assert (table["loss at A"] == 1.0).all()
    assert list(table["loss at end"]) == [1.2, 2.0, 1.0]
    assert first_step_increase(whole["m"]) == pytest.approx(0.5)
    metrics = layerwise_metrics(whole, single)
    assert metrics["m"] == pytest.approx(
        {
            "whole_barrier": 3.0 - 1.1,
            "max_single_layer_barrier": 4.0 - 1.5,
            "whole_first_step_increase": 0.5,
            "max_single_first_step_increase": 0.2,
        }
    )
