"""Chapter 1's protocols: modes through a model cache, symmetry checks, lines and barriers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.kit import MLP, RESNET, FakeZoo, toy_dataset
from wslib.core.configs import build_model
from wslib.core.connectivity import (
    OUTPUT_DIFFS,
    barrier_sweep,
    connectivity_metrics,
    largest_output_diff,
    lines_between,
    max_output_diff,
    max_weight_change,
    mode_config,
    mode_table,
    n_parameters,
    straight_line,
    symmetry_check,
    train_modes,
)
from wslib.core.interpolation import linear_path
from wslib.core.matching import align
from wslib.core.train import evaluate

DATA = {"name": "toy"}


def test_train_modes_asks_the_zoo_for_each_model_and_seed_in_order() -> None:
    zoo = FakeZoo()
    recipes = {"mlp": {"epochs": 1}, "resnet": {"epochs": 2}}
    modes = train_modes(zoo, DATA, {"mlp": MLP, "resnet": RESNET}, recipes, [3, 4])
    assert list(modes) == ["mlp", "resnet"]
    assert zoo.requests == [
        mode_config(DATA, MLP, recipes["mlp"], 3),
        mode_config(DATA, MLP, recipes["mlp"], 4),
        mode_config(DATA, RESNET, recipes["resnet"], 3),
        mode_config(DATA, RESNET, recipes["resnet"], 4),
    ]
    assert zoo.requests[0] == {
        "data": DATA,
        "model": MLP,
        "recipe": {"epochs": 1},
        "seed": 3,
    }
    a, b = modes["mlp"]
    assert not torch.equal(
        a.state_dict()["linears.0.weight"], b.state_dict()["linears.0.weight"]
    )


def test_n_parameters_counts_every_entry() -> None:
    # 8*6 + 6 + 6*5 + 5 + 5*3 + 3
    assert n_parameters(build_model(MLP)) == 107


def test_mode_table_holds_each_modes_evaluation() -> None:
    ds = toy_dataset()
    modes = train_modes(FakeZoo(), DATA, {"mlp": MLP}, {"mlp": {}}, [0, 1])
    table = mode_table(modes, [0, 1], ds)
    assert list(table.seed) == [0, 1] and list(table.model) == ["mlp", "mlp"]
    loss, acc = evaluate(modes["mlp"][1], ds.x_train, ds.y_train)
    _, test_acc = evaluate(modes["mlp"][1], ds.x_test, ds.y_test)
    row = table.iloc[1]
    assert row["train loss"] == loss and row["train acc"] == acc
    assert row["test acc"] == test_acc and row["parameters"] == 107


def test_max_weight_change_is_the_largest_absolute_difference() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([1.5, -1.0]), "b": torch.tensor([0.25])}
    assert max_weight_change(a, b) == 3.0


def test_max_output_diff_measures_the_change() -> None:
    model = build_model(MLP).eval()
    x = toy_dataset().x_train
    assert max_output_diff(model, model.state_dict(), x, True) == 0.0
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["linears.2.bias"] += torch.tensor([0.0, 0.5, -0.25])
    assert max_output_diff(model, state, x, False) == pytest.approx(0.5)
    assert not model.training


def test_symmetry_check_changes_neither_the_model_nor_batchnorm_statistics() -> None:
    model = build_model(RESNET).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    symmetry_check({"m": model}, toy_dataset().x_test, seed=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not model.training


@pytest.mark.parametrize("config", [MLP, RESNET])
def test_symmetries_change_weights_not_outputs(config: dict) -> None:
    torch.manual_seed(0)
    model = build_model(config).eval()
    x = toy_dataset().x_test
    with torch.no_grad():
        reference = model(x)
    table, states = symmetry_check({"m": model}, x, seed=0)
    assert list(table.symmetry) == ["permutation", "rescaling"]
    assert (table["max weight change"] > 1e-3).all()
    assert (table[list(OUTPUT_DIFFS)].to_numpy() < 1e-4).all()
    for kind in ("permutation", "rescaling"):
        other = build_model(config).eval()
        other.load_state_dict(states["m"][kind])
        with torch.no_grad():
            assert torch.allclose(reference, other(x), atol=1e-4)


def test_symmetry_check_is_seeded() -> None:
    model = build_model(MLP).eval()
    x = toy_dataset().x_test
    _, first = symmetry_check({"m": model}, x, seed=1)
    _, again = symmetry_check({"m": model}, x, seed=1)
    _, other = symmetry_check({"m": model}, x, seed=2)
    w = "linears.0.weight"
    assert torch.equal(first["m"]["permutation"][w], again["m"]["permutation"][w])
    assert not torch.equal(first["m"]["permutation"][w], other["m"]["permutation"][w])


def test_largest_output_diff_reads_both_modes_of_one_symmetry() -> None:
    table = pd.DataFrame(
        {
            "symmetry": ["permutation", "rescaling", "permutation"],
            OUTPUT_DIFFS[0]: [1e-6, 5.0, 2e-6],
            OUTPUT_DIFFS[1]: [3e-6, 7.0, 1e-7],
        }
    )
    assert largest_output_diff(table, "permutation") == 3e-6
    assert largest_output_diff(table, "rescaling") == 7.0


def test_straight_line_is_the_linear_path_on_the_data_set() -> None:
    ds = toy_dataset()
    a, b = FakeZoo().get(mode_config(DATA, MLP, {}, 0)), build_model(MLP)
    ts = [0.0, 0.5, 1.0]
    line = straight_line(a, a.state_dict(), b.state_dict(), ts, ds)
    ref = linear_path(
        a,
        a.state_dict(),
        b.state_dict(),
        ts,
        ds.x_train,
        ds.y_train,
        ds.x_test,
        ds.y_test,
    )
    assert np.array_equal(line["train_loss"], ref["train_loss"])
    assert np.array_equal(line["test_acc"], ref["test_acc"])
    assert "test_loss" not in straight_line(
        a, a.state_dict(), b.state_dict(), ts, ds, test=False
    )


def test_lines_between_ends_on_b_and_on_b_aligned() -> None:
    ds = toy_dataset()
    zoo = FakeZoo()
    a, b = (zoo.get(mode_config(DATA, MLP, {}, s)) for s in (0, 1))
    ts = np.linspace(0, 1, 5)
    line, aligned = lines_between(a, b, ts, ds, seed=0)
    end = align(a.state_dict(), b.state_dict(), a.neuron_structure(), seed=0)
    ref = linear_path(a, a.state_dict(), end, ts, ds.x_train, ds.y_train)
    assert np.allclose(aligned["train_loss"], ref["train_loss"])
    # the aligned B computes the same function as B: same end losses, other middle
    assert aligned["train_loss"][-1] == pytest.approx(line["train_loss"][-1], abs=1e-5)
    assert line["train_loss"][0] == aligned["train_loss"][0]
    assert not np.allclose(line["train_loss"][1:-1], aligned["train_loss"][1:-1])


def test_barrier_sweep_trains_two_layer_mlps_of_each_width() -> None:
    ds = toy_dataset()
    zoo = FakeZoo()
    rows = barrier_sweep(
        zoo, DATA, MLP, [4, 8], {"epochs": 1}, [0, 1, 2], [0, 0.5, 1], ds
    )
    assert [r["width"] for r in rows] == [4, 8]
    assert [c["model"]["widths"] for c in zoo.requests] == [
        [4, 4],
        [4, 4],
        [8, 8],
        [8, 8],
    ]
    assert [c["seed"] for c in zoo.requests] == [0, 1, 0, 1]
    a, b = (FakeZoo().get(c) for c in zoo.requests[2:])
    line, aligned = lines_between(a, b, [0, 0.5, 1], ds, test=False)
    assert rows[1] == {
        "width": 8,
        "barrier": float(line["barrier"]),
        "aligned barrier": float(aligned["barrier"]),
    }


def test_connectivity_metrics_collects_barriers_and_symmetry_errors() -> None:
    lines = {"mlp": {"barrier": np.array(2.0)}, "cnn": {"barrier": np.array(3.0)}}
    aligned = {"mlp": {"barrier": np.array(0.5)}, "cnn": {"barrier": np.array(1.0)}}
    table = pd.DataFrame(
        {
            "symmetry": ["permutation", "rescaling"],
            OUTPUT_DIFFS[0]: [1e-6, 2e-6],
            OUTPUT_DIFFS[1]: [4e-6, 3e-6],
        }
    )
    sweep = [{"width": 4, "barrier": 1.0, "aligned barrier": 0.1}]
    metrics = connectivity_metrics(lines, aligned, table, sweep)
    assert metrics == {
        "mlp": {"linear_barrier": 2.0, "aligned_barrier": 0.5},
        "cnn": {"linear_barrier": 3.0, "aligned_barrier": 1.0},
        "permutation_invariance_max_abs_diff": 4e-6,
        "rescaling_invariance_max_abs_diff": 3e-6,
        "width_sweep": sweep,
    }
