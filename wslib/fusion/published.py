"""This run's measurements of the fusion paper's reported numbers (:data:`wslib.runs.published.FUSION`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from wslib.fusion.ch10_results import best_importance
from wslib.runs.published import FUSION, beside_paper, run_setting


def measured_accuracies(summary: pd.DataFrame) -> dict[str, str]:
    """``"method/regime/n"`` -> this run's accuracy (%, the variant chosen on validation, mean ± std)."""
    out = {}
    row: Any  # a row of the summary (named tuple)
    for method in summary.method.unique():
        for row in best_importance(summary, method).itertuples():
            out[f"{method}/{row.regime}/{row.n}"] = (
                f"{100 * row.mean:.1f} ± {100 * row.std:.1f}"
            )
    return out


def table1_beside(
    summary: pd.DataFrame, data: str, arch: Mapping[str, Any]
) -> pd.DataFrame:
    """The paper's Table 1 with this run's numbers where data set and model are the paper's.

    The regime is matched by its kind (the paper's Dirichlet concentration
    is not compared).
    """
    runs = [run_setting(data, arch)]
    return beside_paper(FUSION, runs, measured_accuracies(summary))
