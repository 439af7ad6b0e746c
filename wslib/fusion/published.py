"""Zero-shot test accuracies (%) that the HF/KF paper reports, to print beside the book's own.

Each number carries the paper's setting. :func:`beside_paper` puts this
run's number next to it only where the run has that setting (data set,
architecture, regime, number of models); otherwise the row names what
differs, so a reader never compares numbers of different experiments.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from wslib.fusion.experiments import best_importance


@dataclass(frozen=True)
class Published:
    """One reported accuracy and its setting (regime as this book names it)."""

    source: str
    data: str
    arch: str
    regime: str
    n_models: int
    method: str
    acc: float


_TABLE1 = {  # VGG-11, CIFAR-10, non-IID, zero-shot; models -> accuracy
    "kf_linear": {2: 84.5, 4: 78.9, 8: 69.6},
    "otfusion": {2: 43.4, 4: 20.4, 8: 12.9},
    "averaging": {2: 11.2, 4: 10.0, 8: 10.0},
    "rebasin_wm": {2: 71.8},
}
PUBLISHED: tuple[Published, ...] = tuple(
    Published("Table 1", "cifar10", "vgg11", "noniid", n, method, acc)
    for method, by_n in _TABLE1.items()
    for n, acc in by_n.items()
)


def beside_paper(summary: pd.DataFrame, data: str, arch: str) -> pd.DataFrame:
    """The paper's numbers with this run's (variant chosen on validation) where the setting matches.

    ``summary`` is :func:`~wslib.fusion.experiments.summarise_runs`'s table;
    ``data`` and ``arch`` name this run's data set and architecture.
    """
    rows = []
    for p in PUBLISHED:
        differs = [
            f"{what}: {theirs} here {ours}"
            for what, theirs, ours in (("data", p.data, data), ("model", p.arch, arch))
            if theirs != ours
        ]
        mine = summary[
            (summary.regime == p.regime)
            & (summary.n == p.n_models)
            & (summary.method == p.method)
        ]
        if mine.empty:
            differs.append(f"not run with {p.n_models} models in regime {p.regime}")
        ours = "—"
        if not differs:
            best = best_importance(mine, p.method).iloc[0]
            ours = f"{100 * best['mean']:.1f} ± {100 * best['std']:.1f}"
        rows.append(
            {
                "paper": p.source,
                "setting": f"{p.arch}, {p.data}, {p.regime}, {p.n_models} models",
                "method": p.method,
                "paper's %": p.acc,
                "this run's %": ours,
                "same setting": "yes"
                if not differs
                else "no (" + "; ".join(differs) + ")",
            }
        )
    return pd.DataFrame(rows)
