"""The LLPF chapters' shared panels draw what they are given, in the book's colours."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from wslib.llpf.evaluation import dense_curve  # noqa: E402
from wslib.llpf.figures import (  # noqa: E402
    draw_path_loss,
    draw_stage_distances,
    draw_straight_line,
    draw_tick_sketch,
)
from wslib.plotting import method_colour  # noqa: E402

RES = {
    "train_loss": np.array([0.1, 0.3, 0.2]),
    "dense_loss": np.array([[0.5], [0.25]]),
    "position": np.array([0.0, 0.5, 1.0]),
    "distances": np.array([[1.0, 1.0], [0.2, 0.9], [0.0, 0.0]]),
}


def test_path_loss_is_the_dense_curve_and_the_points_in_the_methods_colour() -> None:
    fig, ax = plt.subplots()
    draw_path_loss(ax, RES, method="AutoNEB")
    curve, points = ax.get_lines()
    pos, loss = dense_curve(RES)
    assert np.array_equal(curve.get_xdata(), pos)
    assert np.array_equal(curve.get_ydata(), loss)
    assert np.array_equal(points.get_ydata(), RES["train_loss"])
    assert to_hex(curve.get_color()) == method_colour("autoneb")
    assert curve.get_label() == "AutoNEB"
    plt.close(fig)


def test_path_loss_without_points_and_with_a_label() -> None:
    fig, ax = plt.subplots()
    draw_path_loss(ax, RES, method="LLPF", label="seed 0", points=False)
    (curve,) = ax.get_lines()
    assert curve.get_label() == "seed 0"
    plt.close(fig)


def test_straight_line_is_dashed_grey() -> None:
    fig, ax = plt.subplots()
    values = {"ts": [0, 1], "train_loss": [1.0, 2.0], "test_acc": [0.9, 0.8]}
    draw_straight_line(ax, values, key="test_acc")
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == [0.9, 0.8]
    assert line.get_linestyle() == "--"
    assert to_hex(line.get_color()) == method_colour("straight_line")
    plt.close(fig)


def test_stage_distances_are_one_row_per_stage() -> None:
    fig, ax = plt.subplots()
    image = draw_stage_distances(ax, RES, ["first", "last"])
    assert image.get_array().shape == (2, 3)
    assert np.array_equal(image.get_array()[1], RES["distances"][:, 1])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["first", "last"]
    plt.close(fig)


def test_tick_sketch_draws_the_four_steps() -> None:
    fig, ax = plt.subplots()
    draw_tick_sketch(ax)
    texts = [t.get_text() for t in ax.texts]
    for step in ("1 move", "2 correct", "3 refine (SGD)", "4 project"):
        assert step in texts
    plt.close(fig)
