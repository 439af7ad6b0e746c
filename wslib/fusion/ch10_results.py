"""Chapter 10's results: the summaries of :class:`~wslib.fusion.ch10_regimes.RegimeStudy`'s
runs over seeds, the accuracy tables, the importance gains, the headline
numbers and their verdicts in words.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

from wslib.fusion.baselines import HF_KF, USES_IMPORTANCE, MethodName
from wslib.fusion.importance import ImportanceName
from wslib.fusion.protocols import beats
from wslib.runs.verdicts import decide

if TYPE_CHECKING:
    from pandas.io.formats.style_render import CSSDict

GRADIENT_TIE = 0.5
"""Linear and Gradient variants within this many points (mean over cells) count as a match."""


def summarise_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (0 for one seed) and number of ``runs`` (seeds) of the test accuracy
    per regime, n, method and importance.

    ``val``: the mean validation accuracy (NaN when the runs have none).
    """
    keys = ["regime", "n", "method", "importance"]
    summary = runs.groupby(keys)["acc"].agg(["mean", "std", "count"]).reset_index()
    summary = summary.rename(columns={"count": "runs"})
    summary["std"] = summary["std"].fillna(0.0)
    if "val" in runs:
        summary["val"] = runs.groupby(keys)["val"].mean().to_numpy()
    else:
        summary["val"] = float("nan")
    # every seed's accuracy, for the verdicts of headline_numbers
    summary["values"] = runs.groupby(keys)["acc"].agg(list).to_numpy()
    return summary


def accuracy_table(
    summary: pd.DataFrame,
    regimes: Sequence[str],
    n_models: Sequence[int],
    methods: Sequence[MethodName],
    importances: Sequence[ImportanceName],
) -> pd.DataFrame:
    """The main table: "mean ± std" in %, rows (method, importance), columns (regime, n)."""
    order = ["individual", *methods]
    table = summary.assign(
        cell=lambda d: [
            f"{100 * m:.1f} ± {100 * v:.1f}" for m, v in zip(d["mean"], d["std"])
        ]
    )
    table = table.pivot(
        index=["method", "importance"], columns=["regime", "n"], values="cell"
    )
    table = table.reindex(columns=[(r, n) for r in regimes for n in n_models])
    table = table.reindex(
        sorted(table.index, key=lambda k: (order.index(k[0]), importances.index(k[1])))
    )
    return table.fillna("n/a")


# A row of the main table: a fusion method, or the mean individual model.
RowMethod = MethodName | Literal["individual"]
# The rows that are no single fused model.
NOT_FUSED: tuple[RowMethod, ...] = ("individual", "ensemble")


def styled_accuracy_table(
    summary: pd.DataFrame,
    regimes: Sequence[str],
    n_models: Sequence[int],
    methods: Sequence[MethodName],
    importances: Sequence[ImportanceName],
) -> Styler:
    """:func:`accuracy_table` for a page: each cell on one line, and in each
    column the highest mean among the fused models in bold (the mean
    individual model and the ensemble, which costs several models at
    inference, are not candidates; equal means are all in bold). A mark for
    the eye, not a verdict: the chapter's verdicts weigh the spread."""
    table = accuracy_table(summary, regimes, n_models, methods, importances)
    means = summary.pivot_table(
        index=["method", "importance"], columns=["regime", "n"], values="mean"
    ).reindex(index=table.index, columns=table.columns)
    fused = ~means.index.get_level_values("method").isin(NOT_FUSED)
    candidates = means[fused]
    best = candidates.eq(candidates.max()).reindex(means.index, fill_value=False)

    def bold(column: pd.Series) -> list[str]:
        return ["font-weight: bold" if b else "" for b in best[column.name]]

    cells: CSSDict = {
        "selector": "td, th",
        "props": "white-space: nowrap; padding: 1px 6px;",
    }
    return table.style.apply(bold, axis=0).set_table_styles([cells])


def nested_accuracies(
    summary: pd.DataFrame, regimes: Iterable[str], n_models: Iterable[int]
) -> dict[str, dict[str, dict[str, dict[str, dict[str, float]]]]]:
    """``acc[regime][str(n)][method][importance] = {"mean", "std"}`` for the results file."""
    acc: dict = {r: {str(n): {} for n in n_models} for r in regimes}
    row: Any  # a row of the summary (named tuple)
    for row in summary.itertuples():
        acc[row.regime][str(row.n)].setdefault(row.method, {})[row.importance] = {
            "mean": float(row.mean),
            "std": float(row.std),
        }
    return acc


def _selection_column(summary: pd.DataFrame) -> str:
    """``"val"`` when every row has a validation accuracy; else ``"mean"``, with a warning."""
    if "val" in summary and summary["val"].notna().all():
        return "val"
    warnings.warn(
        "the summary lacks validation accuracies; choosing variants by test accuracy "
        "(rerun the settings to record them)",
        stacklevel=3,
    )
    return "mean"


def best_importance(summary: pd.DataFrame, method: MethodName) -> pd.DataFrame:
    """For each regime and n, the row of ``method`` whose importance is best on validation.

    Falls back to the test accuracy, with a warning, only for summaries
    without validation accuracies.
    """
    rows = summary[summary.method == method]
    return rows.loc[rows.groupby(["regime", "n"])[_selection_column(rows)].idxmax()]


def importance_pivot(
    summary: pd.DataFrame, *, methods: Sequence[MethodName] = USES_IMPORTANCE
) -> pd.DataFrame:
    """Mean accuracy of ``methods`` (default: all with importance): rows (regime, n, method), columns importance."""
    view = summary[summary.method.isin(methods)]
    return view.pivot(
        index=["regime", "n", "method"], columns="importance", values="mean"
    )


def importance_gains(
    summary: pd.DataFrame,
    importances: Sequence[ImportanceName],
    *,
    methods: Sequence[MethodName] = USES_IMPORTANCE,
) -> pd.DataFrame:
    """Accuracy gain (points) of each non-uniform importance over uniform weights, per cell."""
    wide = importance_pivot(summary, methods=methods)
    return pd.DataFrame(
        {
            imp: 100 * (wide[imp] - wide["uniform"])
            for imp in importances
            if imp != "uniform"
        }
    )


def summary_cell(
    summary: pd.DataFrame,
    regime: str,
    n: int,
    method: RowMethod,
    *,
    importance: ImportanceName = "uniform",
) -> float:
    """Mean accuracy (%) of one cell of the table; NaN when the method did not run there."""
    row = _row(summary, regime, n, method, importance)
    return float("nan") if row is None else float(100 * row["mean"])


def _row(
    summary: pd.DataFrame,
    regime: str,
    n: int,
    method: RowMethod,
    importance: ImportanceName = "uniform",
) -> pd.Series | None:
    """The summary row of one cell (None when the method did not run there)."""
    rows = summary[
        (summary.regime == regime)
        & (summary.n == n)
        & (summary.method == method)
        & (summary.importance == importance)
    ]
    return rows.iloc[0] if len(rows) else None


def select_variant(
    summary: pd.DataFrame, regime: str, n: int, methods: Sequence[MethodName]
) -> tuple[str, float]:
    """The (method, importance) of ``methods`` best on validation in a cell, and its test accuracy (%).

    The name reads ``"kf_linear (conductance)"``. Without validation
    accuracies the test accuracy chooses, with a warning.
    """
    return _variant(_chosen(summary, regime, n, methods))


def _variant(row: pd.Series) -> tuple[str, float]:
    """``"method (importance)"`` of a summary row and its test accuracy (%)."""
    return f"{row.method} ({row.importance})", float(100 * row["mean"])


def _chosen(
    summary: pd.DataFrame, regime: str, n: int, methods: Sequence[MethodName]
) -> pd.Series:
    """The summary row of :func:`select_variant`'s choice."""
    rows = summary[
        (summary.regime == regime) & (summary.n == n) & summary.method.isin(methods)
    ]
    if not len(rows):
        raise ValueError(f"no runs of {list(methods)} for {regime}, n={n}")
    best: Any = rows[_selection_column(rows)].idxmax()  # a label of the index
    return cast(pd.Series, rows.loc[best])


def _points(row: pd.Series | None) -> list[float]:
    """A cell's per-seed test accuracies in points (none when it did not run)."""
    return [] if row is None else [100 * a for a in row["values"]]


def cell_verdict(row: pd.Series | None, reference: pd.Series | None) -> str:
    """:func:`~wslib.fusion.protocols.beats` of two cells' per-seed accuracies."""
    a, b = _points(row), _points(reference)
    return beats(a, b) if a and b else "was not compared with (a cell did not run)"


def gradient_word(gaps: Sequence[float]) -> str:
    """The Gradient retrofit against the Linear one, from its gap in points per
    cell (regime, n, importance): the book's rule on those gaps, with
    :data:`GRADIENT_TIE` as the margin; one cell gives the sign, undecided."""
    return decide(gaps, margin=GRADIENT_TIE).word(
        "is ahead of", "is behind", "matches", "is undecided against"
    )


def headline_numbers(
    summary: pd.DataFrame,
    n_models: Sequence[int],
    importances: Sequence[ImportanceName],
) -> dict[str, float | int | str]:
    """The numbers and verdicts the chapter's closing text quotes (accuracies in %, gaps in points).

    Sharded and full regimes with the fewest models (``n0``), the sharded
    regime with the most (``n_max``): the HF/KF variant and the OTFusion /
    Git Re-Basin importance chosen on the validation set, their test
    accuracies and gaps; the gains of Conductance and DeepLIFT over uniform
    weights for HF/KF; linear minus gradient retrofit averaged over cells.
    """
    n0, n_max = n_models[0], n_models[-1]

    def cell(
        r: str, n: int, method: RowMethod, imp: ImportanceName = "uniform"
    ) -> float:
        return summary_cell(summary, r, n, method, importance=imp)

    sh, full = (_chosen(summary, r, n0, HF_KF) for r in ("sharded", "full"))
    shmax = _chosen(summary, "sharded", n_max, HF_KF)
    ot, ot_max = (_chosen(summary, "sharded", k, ["otfusion"]) for k in (n0, n_max))
    sh_name, sh_best = _variant(sh)
    full_name, full_best = _variant(full)
    shmax_name, shmax_best = _variant(shmax)
    sh_ot, shmax_ot = _variant(ot)[1], _variant(ot_max)[1]
    wide = importance_pivot(summary, methods=HF_KF)
    gains = importance_gains(summary, importances, methods=HF_KF)

    def lin_minus_grad(g: str) -> np.ndarray:
        """Linear minus Gradient per cell, in points (empty: one did not run)."""
        methods = set(wide.index.get_level_values("method"))
        if not {f"{g}_linear", f"{g}_gradient"} <= methods:
            return np.array([])
        diff = wide.xs(f"{g}_linear", level="method") - wide.xs(
            f"{g}_gradient", level="method"
        )
        d = 100 * diff.to_numpy().ravel()
        return d[np.isfinite(d)]

    out: dict[str, Any] = {
        "n0": int(n0),
        "n_max": int(n_max),
        "sh_best_name": sh_name,
        "sh_best": sh_best,
        "sh_ot": sh_ot,
        "sh_avg": cell("sharded", n0, "averaging"),
        "sh_ens": cell("sharded", n0, "ensemble"),
        "full_best_name": full_name,
        "full_best": full_best,
        "full_indiv": cell("full", n0, "individual"),
        "shmax_best_name": shmax_name,
        "shmax_best": shmax_best,
        "shmax_ens": cell("sharded", n_max, "ensemble"),
        "shmax_indiv": cell("sharded", n_max, "individual"),
        "shmax_ot": shmax_ot,
        "kf_lin_minus_grad": _mean_or_nan(lin_minus_grad("kf")),
        "hf_lin_minus_grad": _mean_or_nan(lin_minus_grad("hf")),
        "gain_conductance": float(gains["conductance"].mean()),
        "gain_deeplift": float(gains["deeplift"].mean()),
        "gain_positive_share": float((gains > 0).to_numpy().mean()),
    }
    out["sh_gap_ot"] = sh_best - sh_ot
    out["sh_gap_avg"] = sh_best - out["sh_avg"]
    out["full_gap"] = full_best - out["full_indiv"]
    out["shmax_gap_ot"] = shmax_best - shmax_ot
    avg = _row(summary, "sharded", n0, "averaging")
    indiv = _row(summary, "full", n0, "individual")
    out["sh_vs_ot"] = cell_verdict(sh, ot)
    out["sh_vs_avg"] = cell_verdict(sh, avg)
    out["full_vs_indiv"] = cell_verdict(full, indiv)
    out["shmax_vs_ot"] = cell_verdict(shmax, ot_max)
    gaps = -np.concatenate([lin_minus_grad("kf"), lin_minus_grad("hf")])
    out["gradient_vs_linear"] = (
        gradient_word(gaps.tolist()) if gaps.size else "was not compared with"
    )
    return out


def _mean_or_nan(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else float("nan")


def mean_seconds(seconds: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Mean seconds per fusion of each method that ran."""
    return {m: float(np.mean(v)) for m, v in seconds.items() if v}
