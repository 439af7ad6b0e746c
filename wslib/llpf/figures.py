"""Panels the LLPF chapters share: a path's loss, its stages' distances, one tick sketched.

Every panel draws on a given matplotlib ``Axes`` and uses the book's colour of
its method (:func:`wslib.plotting.method_colour`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.image import AxesImage

from wslib.llpf.evaluation import dense_curve
from wslib.plotting import label_axes, method_colour

POSITION = "position on the path (0 = A, 1 = B)"


def draw_straight_line(
    ax: Axes, line: Mapping[str, Any], *, key: str = "train_loss"
) -> None:
    """The straight line between the modes (a :func:`~wslib.core.interpolation.linear_path`), dashed."""
    ax.plot(
        line["ts"],
        line[key],
        "--",
        color=method_colour("straight_line"),
        label="straight line",
    )


def label_colour(label: str) -> str:
    """The book's colour of the method a label starts with ("Bezier, authors' recipe" -> Bezier)."""
    return method_colour(re.split(r"[ ,(]", label.strip())[0])


def draw_sensitivity(ax: Axes, sweep: pd.DataFrame, chosen: pd.DataFrame) -> None:
    """Peak excess against learning rate per method (one model's sweep rows).

    Curves with momentum 0 (a separate setting) are drawn apart, dashed;
    the chosen settings (rows of ``chosen``) are circled.
    """
    for method, rows in sweep.groupby("method", sort=False):
        colour = label_colour(cast(str, method))
        plain = rows[rows.momentum.isna() | (rows.momentum > 0)].sort_values("lr")
        ax.plot(plain.lr, plain["peak excess"], "o-", color=colour, ms=4, label=method)
        nomo = rows[rows.momentum == 0].sort_values("lr")
        if len(nomo):
            label = f"{method}, no momentum"
            ax.plot(
                nomo.lr, nomo["peak excess"], "s--", color=colour, ms=4, label=label
            )
    ax.plot(
        chosen.lr,
        chosen["peak excess"],
        "o",
        mfc="none",
        mec="k",
        ms=10,
        label="chosen",
    )
    ax.set_xscale("log")


def draw_path_loss(
    ax: Axes,
    res: Mapping[str, Any],
    *,
    method: str = "LLPF",
    label: str | None = None,
    points: bool = True,
    **line: Any,
) -> None:
    """Training loss along an evaluated path: the dense curve, and dots at the recorded points.

    ``label`` defaults to the method; extra keyword arguments style the line.
    """
    colour = label_colour(method)
    pos, loss = dense_curve(res)
    ax.plot(pos, loss, "-", color=colour, label=label or method, **line)
    if points:
        ax.plot(res["position"], res["train_loss"], "o", color=colour, ms=3)


def draw_stage_distances(
    ax: Axes, res: Mapping[str, Any], stage_names: Sequence[str]
) -> AxesImage:
    """Heat map of each stage's distance to the destination (relative to the start) along the path.

    Rows are stages, input at the top; returns the image (for a colour bar).
    """
    dist = np.asarray(res["distances"], dtype=float).T
    image = ax.imshow(
        dist,
        aspect="auto",
        cmap="viridis",
        vmin=0.0,
        vmax=max(1.0, float(dist.max())),
        extent=(0.0, 1.0, len(stage_names) - 0.5, -0.5),
        interpolation="nearest",
    )
    ax.set_yticks(range(len(stage_names)), stage_names)
    ax.grid(False)
    label_axes(ax, POSITION, "stage")
    return image


def draw_tick_sketch(ax: Axes) -> None:
    """One LLPF tick on the variance sphere of one tensor, in two dimensions (not to scale)."""

    def on_circle(degrees: float) -> np.ndarray:
        return np.array([np.cos(np.radians(degrees)), np.sin(np.radians(degrees))])

    p_i, d = on_circle(130), on_circle(20)
    moved = p_i + 0.35 * (d - p_i)
    corrected = moved / np.linalg.norm(moved)
    refined = corrected + np.array([0.45, 0.2])
    projected = refined / np.linalg.norm(refined)
    circle = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(circle), np.sin(circle), color="0.6", lw=1, label="variance sphere")
    ax.plot(*np.stack([p_i, d]).T, ":", color="0.5", lw=1, label="straight line to $D$")
    steps = [  # (from, to, label, label offset)
        (p_i, moved, "1 move", (0.0, -0.12)),
        (moved, corrected, "2 correct", (0.25, 0.0)),
        (corrected, refined, "3 refine (SGD)", (0.0, 0.14)),
        (refined, projected, "4 project", (0.42, 0.1)),
    ]
    for k, (u, v, text, offset) in enumerate(steps):
        ax.annotate(
            "", v, u, arrowprops={"arrowstyle": "->", "color": f"C{k}", "lw": 2}
        )
        x, y = 0.5 * (u + v) + offset
        ax.text(x, y, text, color=f"C{k}", ha="center", va="center")
    for point, text, offset in (
        (p_i, "$P_i$", (-0.1, 0.08)),
        (d, "$D$", (0.1, 0.05)),
        (projected, "$P_{i+1}$", (0.2, -0.03)),
    ):
        ax.plot(*point, "ko", ms=5)
        x, y = point + offset
        ax.text(x, y, text, ha="center", va="center")
    ax.plot(0, 0, "k+")
    ax.set_aspect("equal")
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-0.6, 1.35)
    ax.legend(loc="lower left")
    label_axes(ax, "weight direction 1", "weight direction 2", "One LLPF tick (sketch)")
