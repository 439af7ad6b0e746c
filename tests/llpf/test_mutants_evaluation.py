"""Path evaluation pinned against hand computations (survivors of mutation testing).

Layer distances against the Euclidean norm written out, the dense segments'
shape, the barrier against ``max(loss - line)`` by a loop, the positions of
:func:`wslib.llpf.evaluation.dense_curve`, the scalar results of
:func:`wslib.llpf.evaluation.evaluate_path`, its progress bars and its refusal
of a one-point path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.kit import MLP, pair_states, toy_tensors
from wslib.core.interpolation import lerp_state
from wslib.llpf.evaluation import (
    dense_curve,
    dense_segments,
    evaluate_path,
    layer_distances,
)
from wslib.llpf.path import LLPFPath


def three_states() -> tuple[torch.nn.Module, list[dict]]:
    """Model A and a path A -> midpoint -> B of the LLPF tests' MLP."""
    model, a, b = pair_states(MLP)
    return model, [a, lerp_state(a, b, 0.5), b]


def data() -> tuple[torch.Tensor, torch.Tensor]:
    return toy_tensors(24)


def test_layer_distances_are_euclidean_norms_relative_to_the_start() -> None:
    """Stage distances are sqrt(sum of squares), divided by the first point's (< 1 too)."""
    dest = {"w": torch.zeros(2), "v": torch.zeros(1)}
    states = [
        {"w": torch.tensor([0.3, 0.4]), "v": torch.tensor([0.5])},  # |w| 0.5
        {"w": torch.tensor([0.6, 0.8]), "v": torch.tensor([0.25])},  # |w| 1.0
        {"w": torch.tensor([3.0, 4.0]), "v": torch.tensor([0.0])},  # |w| 5.0
    ]
    got = layer_distances(states, dest, [["w"], ["v"]])
    expected = np.zeros((3, 2))
    for i, s in enumerate(states):
        for j, names in enumerate([["w"], ["v"]]):
            d = math.sqrt(sum(float(x) ** 2 for n in names for x in s[n]))
            d0 = math.sqrt(sum(float(x) ** 2 for n in names for x in states[0][n]))
            expected[i, j] = d / d0
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(got[:, 0], [1.0, 2.0, 10.0], rtol=1e-6)
    np.testing.assert_allclose(got[:, 1], [1.0, 0.5, 0.0], rtol=1e-6)


def test_layer_distances_of_a_start_at_the_destination_divide_by_a_tiny_floor() -> None:
    dest = {"w": torch.zeros(1)}
    states = [{"w": torch.zeros(1)}, {"w": torch.tensor([1e-9])}]
    got = layer_distances(states, dest, [["w"]])
    assert got[0, 0] == 0.0
    assert got[1, 0] == pytest.approx(1e-9 / 1e-12, rel=1e-5)


@pytest.mark.parametrize("dense", [0, -1])
def test_no_dense_points_give_an_empty_column_per_segment(dense: int) -> None:
    model, states = three_states()
    x, y = data()
    got = dense_segments(model, states, x, y, dense, progress=False)
    assert got.shape == (len(states) - 1, 0)


def test_dense_curve_places_points_and_dense_losses_in_path_order() -> None:
    res = {
        "train_loss": np.array([1.0, 2.0, 3.0]),
        "dense_loss": np.array([[10.0, 11.0], [20.0, 21.0]]),
    }
    pos, loss = dense_curve(res)
    np.testing.assert_allclose(pos, [0, 1 / 6, 2 / 6, 0.5, 4 / 6, 5 / 6, 1.0])
    np.testing.assert_array_equal(loss, [1.0, 10.0, 11.0, 2.0, 20.0, 21.0, 3.0])


def test_dense_curve_reads_a_results_file_none_as_nan() -> None:
    """A NaN dense loss is written to JSON as null; read back it is NaN again."""
    res = {"train_loss": [1.0, 2.0], "dense_loss": [[None, 1.5]]}
    pos, loss = dense_curve(res)
    np.testing.assert_allclose(pos, [0.0, 1 / 3, 2 / 3, 1.0])
    assert math.isnan(loss[1])
    assert list(loss[[0, 2, 3]]) == [1.0, 1.5, 2.0]


def test_evaluate_path_results_against_hand_computations() -> None:
    """Default dense 1; positions, peaks, barrier by a loop, min test accuracy, zero cost."""
    model, states = three_states()
    x, y = data()
    xt, yt = toy_tensors(12, seed=1)
    res = evaluate_path(model, states, x, y, xt, yt, progress=False)
    assert res["dense_loss"].shape == (2, 1)
    np.testing.assert_array_equal(res["position"], [0.0, 0.5, 1.0])
    train, dense = res["train_loss"], res["dense_loss"]
    pos = [0.0, 0.25, 0.5, 0.75, 1.0]
    loss = [train[0], dense[0, 0], train[1], dense[1, 0], train[2]]
    barrier = max(
        loss[i] - ((1 - pos[i]) * loss[0] + pos[i] * loss[-1]) for i in range(5)
    )
    assert res["interp_barrier"] == pytest.approx(barrier, rel=1e-9)
    assert res["peak_loss"] == pytest.approx(max(loss))
    assert res["peak_excess"] == pytest.approx(max(loss) - max(train[0], train[2]))
    assert res["min_test_acc"] == min(res["test_acc"])
    assert isinstance(res["min_test_acc"], float)
    assert res["grad_steps"] == 0
    assert res["seconds"] == 0.0


def test_evaluate_path_of_an_llpf_path_reports_its_cost() -> None:
    model, states = three_states()
    x, y = data()
    path = LLPFPath.of_run(states, 7, 2.5, "bezier")
    res = evaluate_path(model, path, x, y, x, y, dense=0, progress=False)
    assert res["grad_steps"] == 7
    assert res["seconds"] == 2.5
    assert res["dense_loss"].shape == (2, 0)


def test_evaluate_path_refuses_a_single_state() -> None:
    model, states = three_states()
    x, y = data()
    with pytest.raises(
        ValueError, match=r"^a path needs at least two states \(start and end\)$"
    ):
        evaluate_path(model, states[:1], x, y, x, y, progress=False)


def bars(err: str) -> set[str]:
    """The totals of the progress bars ``evaluate path`` shown in ``err``."""
    return {
        part.split("/")[1].split(" ")[0]
        for part in err.split("evaluate path:")[1:]
        if "/" in part
    }


def test_evaluate_path_shows_both_bars_by_default_and_none_when_quiet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three points (bar of 3) and two segments of 2 dense points (bar of 4)."""
    model, states = three_states()
    x, y = data()
    evaluate_path(model, states, x, y, x, y, dense=2)
    assert bars(capsys.readouterr().err) == {"3", "4"}
    evaluate_path(model, states, x, y, x, y, dense=2, progress=False)
    assert "evaluate path" not in capsys.readouterr().err
    evaluate_path(model, states, x, y, x, y, dense=2, progress=True)
    assert bars(capsys.readouterr().err) == {"3", "4"}


def test_dense_segments_show_a_bar_by_default_and_none_when_quiet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, states = three_states()
    x, y = data()
    dense_segments(model, states, x, y, 2)
    assert bars(capsys.readouterr().err) == {"4"}
    dense_segments(model, states, x, y, 2, progress=True)
    assert bars(capsys.readouterr().err) == {"4"}
    dense_segments(model, states, x, y, 2, progress=False)
    assert "evaluate path" not in capsys.readouterr().err
