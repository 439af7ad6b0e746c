"""The figures of the PathCond chapters, in the book's style and method colours.

Each ``draw_*`` function makes one figure from results and returns it; panels
hold at most a few methods each and the figures are sized for a book page
(8 inches wide), with panels in rows of at most three.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from wslib.core.models import ActivationName
from wslib.pathcond.grid import Pair, RunGrid
from wslib.pathcond.protocols import Run
from wslib.pathcond.training import InitMethod
from wslib.plotting import band, label_axes, method_colour
from wslib.runs.stats import RateSearch

PAGE_WIDTH = 8.0  # inches
THRESHOLD_STYLE: dict[str, Any] = {"color": "gray", "lw": 0.8, "ls": ":"}


def panels(n: int, *, ncols: int = 3, height: float = 2.8) -> tuple[Figure, list[Axes]]:
    """A page-wide figure of ``n`` panels in rows of at most ``ncols``; unused ones hidden."""
    ncols = max(1, min(n, ncols))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(PAGE_WIDTH, height * nrows), squeeze=False
    )
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def _flat(g: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([v.detach().reshape(-1).cpu() for v in g.values()]).numpy()


# --- chapter 6 --------------------------------------------------------------------


def draw_spectra(spectra: dict[str, Any]) -> Figure:
    """Non-zero spectrum of P and histogram of diag(G), before and after PathCond.

    ``spectra`` is a :func:`wslib.pathcond.ch06_pathlifting.lifting_spectra` result.
    """
    fig, (left, right) = panels(2, height=3.6)
    before, after = method_colour("baseline"), method_colour("pathcond")
    left.semilogy(
        spectra["ev_before"],
        "o-",
        color=before,
        label=f"before (cond {spectra['cond_before']:.2g})",
    )
    left.semilogy(
        spectra["ev_after"],
        "s-",
        color=after,
        label=f"after PathCond (cond {spectra['cond_after']:.2g})",
    )
    label_axes(left, "index", "eigenvalue", "Non-zero spectrum of P (= of G)")
    left.legend()
    flat_b, flat_a = _flat(spectra["g_before"]), _flat(spectra["g_after"])
    both = np.concatenate([flat_b, flat_a])
    bins = np.logspace(np.log10(both.min()), np.log10(both.max()), 30).tolist()
    amgm_b, amgm_a = spectra["amgm_before"], spectra["amgm_after"]
    right.hist(
        flat_b, bins, alpha=0.6, color=before, label=f"before (AM/GM {amgm_b:.2f})"
    )
    right.hist(
        flat_a, bins, alpha=0.6, color=after, label=f"after (AM/GM {amgm_a:.2f})"
    )
    right.set_xscale("log")
    label_axes(right, "g_i = G_ii", "number of parameters", "Diagonal of G")
    right.legend()
    fig.tight_layout()
    return fig


def draw_trajectories(runs: dict[str, Run]) -> Figure:
    """Training loss from epoch 0 (``initial_loss``) and running accuracy, per method."""
    fig, (loss_ax, acc_ax) = panels(2, height=3.6)
    for method, run in runs.items():
        epochs = np.arange(1, len(run["loss"]) + 1)
        colour = method_colour(method)
        loss = [run["initial_loss"], *run["loss"]]
        loss_ax.semilogy(np.r_[0, epochs], loss, color=colour, label=method)
        acc_ax.plot(epochs, run["acc"], color=colour, label=method)
    label_axes(loss_ax, "epoch", "training loss", "Same function at epoch 0")
    label_axes(acc_ax, "epoch", "training accuracy (running)", "Training accuracy")
    for ax in (loss_ax, acc_ax):
        ax.legend()
    fig.tight_layout()
    return fig


# --- chapter 7 --------------------------------------------------------------------


def draw_config_curves(
    grid: RunGrid,
    seeds: Sequence[int],
    quantity: Literal["loss", "acc"],
    *,
    threshold: float | None = None,
) -> Figure:
    """One panel per configuration: training ``"loss"`` (log) or ``"acc"`` per epoch.

    Mean ± std over ``seeds`` for each method at the grid's recipe. Methods
    whose loss is not finite (diverged) are named in the panel's title; a
    ``threshold`` draws a dotted line.
    """
    fig, axes = panels(len(grid.configs))
    for ax, (name, cfg) in zip(axes, grid.configs.items(), strict=True):
        diverged = []
        for method in cfg["methods"]:
            values = [r[quantity] for r in grid.select(name, method, seeds)]
            curves = np.array(values, dtype=float)  # NaN losses are stored as None
            epochs = np.arange(1, curves.shape[1] + 1)
            band(ax, epochs, curves, label=method, color=method_colour(method))
            if not np.isfinite(curves).all():
                diverged.append(method)
        title = f"{name} (a={cfg['init_scale']:g})"
        if diverged:
            title += "\ndiverged: " + ", ".join(diverged)
        ylabel = "training loss" if quantity == "loss" else "training accuracy"
        label_axes(ax, "epoch", ylabel, title)
        if quantity == "loss":
            ax.set_yscale("log")
        if threshold is not None:
            ax.axhline(threshold, **THRESHOLD_STYLE)
    axes[0].legend()
    fig.tight_layout()
    return fig


def draw_rate_sweep(
    search: RateSearch[Pair], names: Sequence[str], epochs: int
) -> Figure:
    """Epochs to the threshold against the learning rate, one panel per configuration.

    Crosses mark rates whose run did not reach the threshold, at the epoch it
    stopped: the run length ``epochs`` (dotted), or earlier where it gave up.
    """
    fig, axes = panels(len(names), ncols=2, height=3.4)
    pct = f"{search.threshold:.0%}"
    for ax, name in zip(axes, names, strict=True):
        methods = [m for c, m in search.tried if c == name]
        for method, shift in zip(methods, np.linspace(1.04, 0.96, len(methods))):
            rates = search.tried[(name, method)]
            hits = [search.hit((name, method), lr) for lr in rates]
            colour = method_colour(method)
            best = search.best[(name, method)]
            ax.plot(
                rates,
                [np.nan if h is None else h for h in hits],
                "o-",
                color=colour,
                label=f"{method} (best {best:.3g})",
            )
            missed = [lr for lr, h in zip(rates, hits) if h is None]
            stops = [search.length((name, method), lr) * shift for lr in missed]
            ax.scatter(missed, stops, marker="x", color=colour)
        ax.axhline(epochs, **THRESHOLD_STYLE)
        ax.set_xscale("log")
        ax.set_ylim(0, epochs * 1.1)
        label_axes(
            ax,
            "learning rate",
            f"epochs to {pct}",
            f"{name}: tuning seed, {epochs} epochs",
        )
        ax.legend()
    fig.tight_layout()
    return fig


def draw_best_rate_curves(
    long_runs: dict[Pair, list[Run]], rates: dict[Pair, float], threshold: float
) -> Figure:
    """Training accuracy at each method's best rate, one panel per configuration."""
    names = list(dict.fromkeys(name for name, _ in long_runs))
    fig, axes = panels(len(names), ncols=2, height=3.4)
    for ax, name in zip(axes, names, strict=True):
        for (config, method), runs in long_runs.items():
            if config != name:
                continue
            acc = np.array([r["acc"] for r in runs])
            epochs = np.arange(1, acc.shape[1] + 1)
            label = f"{method} (lr {rates[(config, method)]:.3g})"
            band(ax, epochs, acc, label=label, color=method_colour(method))
        ax.axhline(threshold, **THRESHOLD_STYLE)
        label_axes(ax, "epoch", "training accuracy", f"{name}: best lr each")
        ax.legend()
    fig.tight_layout()
    return fig


def draw_size_sweep(
    points: dict[str, list[dict[str, Any]]], title: str, *, threshold: float = 0.99
) -> Figure:
    """Epochs to the threshold against the number of parameters (log-log), per method.

    ``points`` is a :func:`wslib.pathcond.ch07_results.size_points` result; open
    markers where some run did not reach the threshold (a lower bound).
    """
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for method, pts in points.items():
        colour = method_colour(method)
        xs = [p["n_params"] for p in pts]
        ys = [p["mean"] for p in pts]
        es = [p["std"] for p in pts]
        ax.errorbar(
            xs,
            ys,
            yerr=es,
            color=colour,
            marker="o",
            mfc="white",
            label=method,
            capsize=3,
        )
        reached = [(x, y) for x, y, p in zip(xs, ys, pts) if not p["censored"]]
        if reached:
            ax.scatter(*zip(*reached), color=colour, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    label_axes(ax, "number of parameters", f"epochs to {threshold:.0%}", title)
    ax.legend()
    fig.tight_layout()
    return fig


def draw_activation_curves(
    grid: RunGrid,
    config: str,
    activations: Sequence[ActivationName],
    seeds: Sequence[int],
    *,
    methods: Sequence[InitMethod] = ("baseline", "pathcond"),
) -> Figure:
    """Training accuracy of ``config`` with each activation, one panel each."""
    fig, axes = panels(len(activations), ncols=2, height=3.4)
    for ax, act in zip(axes, activations, strict=True):
        for method in methods:
            runs = grid.select(config, method, seeds, activation=act)
            acc = np.array([r["acc"] for r in runs])
            epochs = np.arange(1, acc.shape[1] + 1)
            band(ax, epochs, acc, label=method, color=method_colour(method))
        label_axes(ax, "epoch", "training accuracy", f"{config}, {act.upper()}")
        ax.legend()
    fig.tight_layout()
    return fig


# --- chapter 8 --------------------------------------------------------------------


def draw_arch_curves(
    runs: dict[tuple[str, str, int], Run],
    archs: dict[str, dict[str, Any]],
    methods: Sequence[InitMethod],
    seeds: Sequence[int],
) -> Figure:
    """Per architecture: training loss (log) and, for classifiers, running accuracy.

    Mean ± std over ``seeds``; the loss panels form the first row, the
    accuracy panels the second (empty for the autoencoder).
    """
    n = len(archs)
    fig, axes = plt.subplots(
        2, n, figsize=(PAGE_WIDTH, 5.6), squeeze=False, sharex="col"
    )
    for j, (arch, spec) in enumerate(archs.items()):
        classify = spec["task"] == "classify"
        for method in methods:
            sel = [runs[(arch, method, s)] for s in seeds]
            colour = method_colour(method)
            loss = np.array([r["loss"] for r in sel])
            epochs = np.arange(1, loss.shape[1] + 1)
            band(axes[0, j], epochs, loss, label=method, color=colour)
            if classify:
                acc = np.array([r["acc"] for r in sel])
                band(axes[1, j], epochs, acc, label=method, color=colour)
        axes[0, j].set_yscale("log")
        loss_name = "cross-entropy" if classify else "MSE"
        label_axes(axes[0, j], "", f"training {loss_name}", arch)
        if classify:
            label_axes(axes[1, j], "epoch", "training accuracy (running)")
        else:
            axes[1, j].axis("off")
    axes[0, 0].legend()
    fig.tight_layout()
    return fig


def draw_cost(cost_rows: Sequence[dict[str, Any]]) -> Figure:
    """Rescaling time over epoch time against the number of parameters, one point per model."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs = [r["n_params"] for r in cost_rows]
    ys = [r["rescale_over_epoch"] for r in cost_rows]
    ax.loglog(xs, ys, "o", color=method_colour("pathcond"))
    for r, x, y in zip(cost_rows, xs, ys):
        ax.annotate(
            r["model"], (x, y), fontsize=8, xytext=(3, 3), textcoords="offset points"
        )
    label_axes(
        ax, "number of parameters", "rescaling time / epoch time", "Cost of PathCond"
    )
    fig.tight_layout()
    return fig
