"""One plot style for the whole book, and the few plot helpers chapters share."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes

PALETTE = sns.color_palette("colorblind")


def set_style() -> None:
    """Seaborn's white grid, readable font sizes, figures sized for a book page."""
    sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
    plt.rcParams.update(
        {
            "figure.figsize": (8, 3.6),
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "axes.titlesize": "medium",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "legend.frameon": False,
        }
    )


def band(
    ax: Axes,
    x: Sequence[float],
    runs: np.ndarray,
    label: str,
    color: object | None = None,
) -> None:
    """Mean line with a +- one standard deviation band over the rows of ``runs``."""
    runs = np.atleast_2d(np.asarray(runs, dtype=float))
    mean, std = runs.mean(0), runs.std(0)
    (line,) = ax.plot(x, mean, label=label, color=color)
    ax.fill_between(
        x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0
    )


def label_axes(ax: Axes, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
