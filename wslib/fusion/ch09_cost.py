"""Chapter 9, the representation cost: Theorem 1 at every level of every fusion,
the shares of its terms, importance agreement, KF's target map and fused accuracies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from sklearn.decomposition import PCA
from torch import nn
from tqdm.auto import tqdm

from wslib.core.data import Dataset
from wslib.core.train import (
    evaluate,
)
from wslib.fusion.grouping import kmeans_groups, weighted_centroids
from wslib.fusion.hfkf import (
    fuse,
)
from wslib.fusion.importance import ImportanceName
from wslib.fusion.levels import GROUPINGS, RETROFITS, layer_io, neuron_matrix
from wslib.fusion.retrofit import GradientConfig


def cost_decompositions(
    models: Mapping[str, Sequence[nn.Module]],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    importances: Sequence[ImportanceName],
    gradient: GradientConfig,
    *,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    """Theorem 1 at every hidden level of HF and KF fusions, with each retrofit and weighting.

    HF fuses the first two models of each architecture, KF all of them, on the
    fusion set ``(x, y)``. One row per fusion and level: architecture, method,
    importance, level, the cost and its two parts, the fused model's test
    accuracy on ``ds``, and the absolute and relative gap of the identity.
    """
    jobs = [
        (a, g, r, imp)
        for a in models
        for g in GROUPINGS
        for r in RETROFITS
        for imp in importances
    ]
    rows = []
    for a, g, r, imp in tqdm(jobs, desc="fusions", disable=not progress):
        ms = models[a][:2] if g == "hf" else models[a]
        res = fuse(
            ms, x, y, g, r, importance=imp, gradient=gradient, seed=seed, progress=False
        )
        acc = evaluate(res.model, ds.x_test, ds.y_test)[1]
        for li, c in enumerate(res.costs):
            rows.append(
                {
                    "arch": a,
                    "method": f"{g.upper()}-{r}",
                    "importance": imp,
                    "level": li,
                    **{k: c[k] for k in ("cost", "clustering", "approximation")},
                    "test acc": acc,
                }
            )
    costs = pd.DataFrame(rows)
    costs["abs err"] = (
        costs["cost"] - costs["clustering"] - costs["approximation"]
    ).abs()
    costs["rel err"] = costs["abs err"] / costs["cost"]
    return costs


def theorem1_gaps(costs: pd.DataFrame) -> dict[str, float | int]:
    """Largest absolute and relative gap of Theorem 1 over the rows, and the number of rows."""
    return {
        "max_abs": float(costs["abs err"].max()),
        "max_rel": float(costs["rel err"].max()),
        "n_checks": len(costs),
    }


def cost_shares(
    costs: pd.DataFrame, importance: ImportanceName = "uniform"
) -> pd.DataFrame:
    """The rows of one weighting with the shares of the cost: ``clustering share``, ``approximation share``."""
    view = costs[costs.importance == importance].copy()
    view["clustering share"] = view["clustering"] / view["cost"]
    view["approximation share"] = view["approximation"] / view["cost"]
    return view


def approximation_shares(
    costs: pd.DataFrame, importance: ImportanceName = "uniform"
) -> dict[str, float]:
    """Mean share of the approximation error for the Linear and the Gradient variants."""
    view = cost_shares(costs, importance)
    return {
        retrofit: float(
            view[view.method.str.endswith(retrofit)]["approximation share"].mean()
        )
        for retrofit in ("linear", "gradient")
    }


def fused_accuracies(costs: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Test accuracy of each fusion: ``{arch: {method: {importance: acc}}}``."""
    first = costs.groupby(["arch", "method", "importance"], sort=False)[
        "test acc"
    ].first()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, acc in first.items():
        a, m, imp = cast(tuple[str, str, str], key)
        out.setdefault(a, {}).setdefault(m, {})[imp] = float(acc)
    return out


def fused_accuracy_table(costs: pd.DataFrame) -> pd.DataFrame:
    """:func:`fused_accuracies` as a table: rows (architecture, method), columns importance."""
    return (
        costs.groupby(["arch", "method", "importance"])["test acc"]
        .first()
        .unstack("importance")
    )


def importance_agreement(
    scores: Mapping[str, Sequence[Mapping[str, torch.Tensor]]],
    levels: Sequence[str],
) -> pd.DataFrame:
    """Per level: Spearman correlation of Conductance and DeepLIFT scores, and concentration.

    ``scores[importance][model][level]`` holds one score per neuron; the scores
    of all models are pooled. ``share of top 10% (conductance)`` is the share
    of the total Conductance score held by the top tenth of the neurons (at
    least one).
    """
    rows = []
    for li, lv in enumerate(levels):
        cond = torch.cat([s[lv] for s in scores["conductance"]]).cpu().numpy()
        deep = torch.cat([s[lv] for s in scores["deeplift"]]).cpu().numpy()
        ranked = np.sort(cond / cond.sum())[::-1]
        rows.append(
            {
                "level": li,
                "neurons": len(cond),
                "Spearman(conductance, deeplift)": pd.Series(cond).corr(
                    pd.Series(deep), "spearman"
                ),
                "share of top 10% (conductance)": ranked[
                    : max(1, len(ranked) // 10)
                ].sum(),
            }
        )
    return pd.DataFrame(rows)


def kf_target_map(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    level: str,
    scores: Mapping[str, Sequence[Mapping[str, torch.Tensor]]],
    *,
    seed: int = 0,
) -> dict[str, Any]:
    """The neurons of one level of several models and their KF targets, in 2-D.

    Each neuron is its activation vector on ``x``, projected on the first two
    principal components of all neurons. For each weighting in ``scores`` the
    neuron weights (scaled to mean 1 per model) and the weighted k-means
    centroids (``k`` = the first model's width) are returned:
    ``{"xy", "owner", "width", "weights": {imp: w}, "targets": {imp: xy}}``.
    """
    acts = [
        neuron_matrix(o[level]).cpu().numpy()
        for o in (layer_io(m, [level], x) for m in models)
    ]
    points = np.concatenate(acts)
    owner = np.concatenate([np.full(len(a), i) for i, a in enumerate(acts)])
    pca = PCA(2, random_state=seed).fit(points)
    weights, targets = {}, {}
    for imp, per_model in scores.items():
        w = np.concatenate(
            [s[level].cpu().numpy() / s[level].cpu().numpy().mean() for s in per_model]
        )
        w = np.maximum(w, 1e-6)
        labels = kmeans_groups(points, w, len(acts[0]), init_first=True, seed=seed)
        weights[imp] = w
        targets[imp] = pca.transform(
            weighted_centroids(points, w, labels, len(acts[0])).numpy()
        )
    return {
        "xy": pca.transform(points),
        "owner": owner,
        "width": len(acts[0]),
        "weights": weights,
        "targets": targets,
    }
