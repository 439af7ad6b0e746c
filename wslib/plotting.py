"""One plot style for the whole book, and the few plot helpers chapters share."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes

PALETTE = sns.color_palette("colorblind")
_C = PALETTE.as_hex()

# One colour per method, the same in every chapter. Names are normalised by
# :func:`method_colour` (lower case, spaces and hyphens as underscores).
METHOD_COLOURS: dict[str, str] = {
    # paths between modes (chapters 1-5)
    "straight_line": "#7f7f7f",
    "aligned_line": _C[9],
    "llpf": _C[3],
    "m2m": _C[3],
    "m2o": _C[1],
    "hybrid": _C[4],
    "all_at_once": _C[8],
    "bezier": _C[0],
    "autoneb": _C[2],
    # initialisation and rescaling (chapters 6-8)
    "baseline": _C[0],
    "kaiming": _C[7],
    "pathcond": _C[3],
    "enorm": _C[2],
    # fusion (chapters 9-11)
    "individual": "#000000",
    "averaging": "#7f7f7f",
    "ensemble": _C[8],
    "last_layer_kd": _C[5],
    "otfusion": _C[6],
    "rebasin_wm": _C[4],
    "rebasin_am": _C[2],
    "hf_linear": _C[0],
    "hf_gradient": _C[9],
    "kf_linear": _C[3],
    "kf_gradient": "#7f2704",  # dark brown-red: apart from kf_linear's vermillion
}


def method_colour(method: str) -> str:
    """The book's colour for ``method``; unknown methods get a fixed colour from the palette."""
    key = method.lower().replace(" ", "_").replace("-", "_")
    if key in METHOD_COLOURS:
        return METHOD_COLOURS[key]
    return _C[sum(map(ord, key)) % len(_C)]


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
            "font.size": 10,
            "axes.labelsize": 10,
            "xtick.labelsize": 9,
            "ytick.labelsize": 9,
            "legend.fontsize": 9,
            "legend.title_fontsize": 9,
        }
    )


def band(
    ax: Axes,
    x: Sequence[float] | np.ndarray,
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
    """Axis labels and an optional title."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
