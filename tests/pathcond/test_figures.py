"""The PathCond chapters' figures: panels, method colours, what each line shows."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex

from tests.pathcond.planted import (
    CONFIGS,
    FAST,
    NEVER,
    SLOW,
    empty_grid,
    rate_search,
    run,
)
from wslib.pathcond.ch06_pathlifting import lifting_spectra
from wslib.pathcond.figures import (
    draw_activation_curves,
    draw_arch_curves,
    draw_best_rate_curves,
    draw_config_curves,
    draw_cost,
    draw_rate_sweep,
    draw_size_sweep,
    draw_spectra,
    draw_trajectories,
    panels,
)
from wslib.pathcond.grid import RunGrid
from wslib.plotting import method_colour


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.axison]


def line_colours(ax) -> list[str]:
    return [
        to_hex(line.get_color())
        for line in ax.get_lines()
        if line.get_label()[0] != "_"
    ]


def test_panels_hides_the_unused_ones():
    fig, axes = panels(5)
    assert len(axes) == 5 and len(fig.axes) == 6 and len(visible_axes(fig)) == 5
    assert fig.get_size_inches()[0] == pytest.approx(8.0)
    _, single = panels(1)
    assert len(single) == 1


def test_draw_spectra_and_trajectories_use_method_colours(lifted):
    spectra = lifting_spectra(lifted)
    fig = draw_spectra(spectra)
    left, right = fig.axes
    assert line_colours(left) == [method_colour("baseline"), method_colour("pathcond")]
    np.testing.assert_allclose(left.get_lines()[0].get_ydata(), spectra["ev_before"])
    assert len(right.patches) == 2 * 29  # two histograms of 30 bin edges
    runs = {m: {**run(FAST), "initial_loss": 2.3} for m in ("baseline", "pathcond")}
    loss_ax, acc_ax = draw_trajectories(runs).axes
    assert list(loss_ax.get_lines()[0].get_xdata()) == [0, 1, 2, 3]
    assert loss_ax.get_lines()[0].get_ydata()[0] == 2.3
    assert line_colours(acc_ax) == [
        method_colour("baseline"),
        method_colour("pathcond"),
    ]


@pytest.fixture
def grid() -> RunGrid:
    g = empty_grid()
    for name, cfg in CONFIGS.items():
        for method in cfg["methods"]:
            for seed in (0, 1):
                loss = [float("nan")] * 3 if method == "enorm" else None
                g.runs[g.job(name, method, seed)] = run(FAST, loss=loss)
                g.runs[g.job(name, method, seed, activation="gelu")] = run(SLOW)
    return g


def test_draw_config_curves_one_panel_per_config_and_marks_divergence(grid):
    fig = draw_config_curves(grid, [0, 1], "loss")
    axes = visible_axes(fig)
    assert len(axes) == len(CONFIGS)
    assert line_colours(axes[1]) == [
        method_colour(m) for m in CONFIGS["low"]["methods"]
    ]
    assert "diverged: enorm" in axes[1].get_title()
    assert "diverged" not in axes[0].get_title()
    assert axes[0].get_yscale() == "log"
    acc = visible_axes(draw_config_curves(grid, [0, 1], "acc", threshold=0.99))
    assert acc[0].get_yscale() == "linear"
    assert any(list(line.get_ydata()) == [0.99, 0.99] for line in acc[0].get_lines())


def test_draw_rate_sweep_marks_runs_that_never_reached():
    search = rate_search(
        {
            (("low", m), lr): acc
            for m in ("baseline", "pathcond")
            for lr, acc in ((1.0, NEVER), (0.1, SLOW))
        }
    )
    (ax,) = draw_rate_sweep(search, ["low"], epochs=3).axes
    base = ax.get_lines()[0]
    assert list(base.get_xdata()) == [1.0, 0.1]
    assert np.isnan(base.get_ydata()[0]) and base.get_ydata()[1] == 3
    crosses = ax.collections[0].get_offsets()
    assert crosses.shape == (1, 2) and crosses[0][0] == 1.0
    assert line_colours(ax)[:2] == [
        method_colour("baseline"),
        method_colour("pathcond"),
    ]


def test_draw_rate_sweep_marks_a_run_that_gave_up_where_it_stopped():
    search = rate_search(  # the run at 1.0 gave up after 2 epochs
        {(("low", "baseline"), 1.0): NEVER[:2], (("low", "baseline"), 0.1): SLOW}
    )
    (ax,) = draw_rate_sweep(search, ["low"], epochs=10).axes
    (cross,) = ax.collections[0].get_offsets()
    assert cross[0] == 1.0 and cross[1] == pytest.approx(2 * 1.04)


def test_draw_best_rate_and_activation_curves(grid):
    long_runs = {("low", m): [run(FAST), run(SLOW)] for m in ("baseline", "pathcond")}
    rates = {("low", "baseline"): 0.1, ("low", "pathcond"): 0.3}
    (ax,) = draw_best_rate_curves(long_runs, rates, 0.99).axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["baseline (lr 0.1)", "pathcond (lr 0.3)"]
    fig = draw_activation_curves(grid, "const", ["gelu"], [0, 1])
    assert visible_axes(fig)[0].get_title() == "const, GELU"


def test_draw_size_sweep_fills_only_points_that_are_not_censored():
    points = {
        "baseline": [
            {"n_params": 10, "mean": 5.0, "std": 1.0, "censored": False},
            {"n_params": 100, "mean": 9.0, "std": 0.0, "censored": True},
        ]
    }
    (ax,) = draw_size_sweep(points, "t").axes
    filled = ax.collections[-1].get_offsets()
    assert [tuple(p) for p in filled] == [(10, 5.0)]
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "epochs to 99%"


def test_draw_arch_curves_leaves_the_autoencoder_without_accuracy():
    archs = {"net": {"task": "classify"}, "ae": {"task": "autoencoder"}}
    runs = {
        (a, m, s): run(FAST)
        for a in archs
        for m in ("baseline", "enorm")
        for s in (0, 1)
    }
    fig = draw_arch_curves(runs, archs, ["baseline", "enorm"], [0, 1])
    assert len(visible_axes(fig)) == 3  # two loss panels, one accuracy panel
    assert line_colours(fig.axes[0]) == [
        method_colour("baseline"),
        method_colour("enorm"),
    ]


def test_draw_cost_annotates_each_model():
    rows = [
        {"model": "a", "n_params": 10.0, "rescale_over_epoch": 0.1},
        {"model": "b", "n_params": 100.0, "rescale_over_epoch": 0.3},
    ]
    (ax,) = draw_cost(rows).axes
    assert [t.get_text() for t in ax.texts] == ["a", "b"]
    assert list(ax.get_lines()[0].get_ydata()) == [0.1, 0.3]
