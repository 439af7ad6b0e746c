"""The protocols of the fusion chapters and the assembly of their results.

- Chapter 9, the representation cost: :func:`cost_decompositions` (Theorem 1
  at every level of every fusion), :func:`theorem1_gaps`,
  :func:`approximation_shares`, :func:`importance_agreement`,
  :func:`kf_target_map` and :func:`fused_accuracies`.
- Chapter 10, the main table: :class:`RegimeStudy` (base models per data
  regime, every method in every setting, each setting stored in the run cache
  under :data:`FUSION_CODE`), :func:`summarise_runs`, :func:`accuracy_table`
  (:func:`styled_accuracy_table` on a page), :func:`nested_accuracies`,
  :func:`importance_gains`, :func:`headline_numbers`, :func:`head_rules` and
  :func:`self_fusion`.
- Chapter 11, beyond the table: :func:`finetune_curves`,
  :func:`epochs_within`, :func:`width_fusions`, :func:`compression`,
  :func:`depth_compression`, :func:`kf_versus_distillation`,
  :func:`cached_size_sweep`, :func:`architecture_zero_shot`,
  :func:`residual_gradient_variants` and :func:`block_fit_text`.

Every function runs the same steps, in the same order and with the same seeds,
as the chapters did before these protocols moved into the library.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from pandas.io.formats.style import Styler
from sklearn.decomposition import PCA
from torch import nn
from tqdm.auto import tqdm

from wslib.core.data import Dataset, balanced_subset, class_counts
from wslib.core.files import tensor_digest
from wslib.core.models import build_model
from wslib.core.seeds import derive_seed
from wslib.core.train import (
    Recipe,
    evaluate,
    fit,
    full_precision,
    model_device,
    predict,
)
from wslib.fusion.baselines import HF_KF, USES_IMPORTANCE, Ensemble, distill, fuse_by
from wslib.fusion.hfkf import (
    attribution_share,
    augment_fusion_set,
    class_share,
    fuse,
    model_importance,
)
from wslib.fusion.levels import (
    RESIDUAL_ARCHS,
    GradientConfig,
    kmeans_groups,
    layer_io,
    neuron_matrix,
    weighted_centroids,
)
from wslib.runs.cache import cached_run
from wslib.runs.stats import epochs_to
from wslib.runs.verdicts import compare
from wslib.runs.zoo import TRAINING_CODE, Zoo, split_indices

FUSION_CODE = (
    *TRAINING_CODE,
    "wslib.core.matching",
    "wslib.core.norms",
    "wslib.core.seeds",
    "wslib.fusion",
)
"""The modules whose source determines a cached fusion result: the code that
trains the base models (:data:`wslib.runs.zoo.TRAINING_CODE`), the core
modules the fusion methods call, and the whole fusion package."""

AUGMENTATION = {"shift": 3, "noise": 0.1}
"""Settings of :func:`~wslib.fusion.hfkf.augment_fusion_set` in the size sweep."""

GRADIENT_TIE = 0.5
"""Linear and Gradient variants within this many points (mean over cells) count as a match."""

SELF_FUSION_METHODS = ("averaging", "otfusion", "rebasin_wm", "hf_linear", "kf_linear")
"""Methods that must return a model fused with an exact copy of itself unchanged."""


# --- shared by the three chapters -------------------------------------------------------------


def accuracy(model: nn.Module, ds: Dataset) -> float:
    """Test accuracy of ``model`` on the whole test set of ``ds``."""
    return float(evaluate(model, ds.x_test, ds.y_test)[1])


def data_digest(ds: Dataset) -> str:
    """Hash of the content of a data set's training and test tensors."""
    return tensor_digest(ds.x_train, ds.y_train, ds.x_test, ds.y_test)


def fusion_examples(
    ds: Dataset, per_class: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The class-balanced fusion set of a chapter run with ``seed``: ``per_class``
    training examples of every class (drawn with role ``"fusion-set"``)."""
    idx = balanced_subset(ds.y_train, per_class, derive_seed(seed, "fusion-set"))
    return ds.x_train[idx], ds.y_train[idx]


def model_seed(seed: int, index: int) -> int:
    """The training seed of chapter 11's model ``index`` (role ``"model"``)."""
    return derive_seed(seed, "model", index)


def trained(
    zoo: Zoo,
    data: dict[str, Any],
    model: dict[str, Any],
    recipe: dict[str, Any],
    seed: int,
    split: dict[str, Any] | None = None,
) -> nn.Module:
    """The zoo's model of config ``model`` trained with ``recipe`` and ``seed`` (on ``split``)."""
    config = {"data": data, "model": model, "recipe": recipe, "seed": seed}
    return zoo.get(config if split is None else {**config, "split": split})


def regime_models(
    zoo: Zoo,
    data: dict[str, Any],
    arch: dict[str, Any],
    recipe: dict[str, Any],
    regime: dict[str, Any],
    n: int,
    s: int,
) -> tuple[list[nn.Module], np.ndarray]:
    """The ``n`` base models of a data regime for seed ``s`` and their per-class training counts.

    Model ``i`` is trained on part ``i`` of an ``n``-way split of kind
    ``regime["kind"]`` drawn with ``derive_seed(s, "split")`` (the full
    regime: the whole training set), with model seed ``derive_seed(s, "mode", i)``.
    """
    ds = zoo.dataset(data)
    models, counts = [], []
    for i in range(n):
        split = (
            regime
            if regime["kind"] == "full"
            else {**regime, "n_parts": n, "part": i, "seed": derive_seed(s, "split")}
        )
        models.append(
            trained(zoo, data, arch, recipe, derive_seed(s, "mode", i), split)
        )
        idx = split_indices(ds.y_train, split)
        counts.append(
            class_counts(
                ds.y_train,
                np.arange(len(ds.y_train)) if idx is None else idx,
                ds.n_classes,
            )
        )
    return models, np.array(counts)


def describe_model(config: Mapping[str, Any]) -> str:
    """A model config in words, e.g. ``cnn1d (channels [16, 16])``."""
    details = [
        f"{k.replace('_', ' ')} {v}"
        for k, v in config.items()
        if k not in ("name", "in_shape", "n_classes")
    ]
    name = str(config["name"])
    return f"{name} ({', '.join(details)})" if details else name


def describe_recipe(recipe: Mapping[str, Any]) -> str:
    """A training recipe in words, e.g. ``100 epochs, lr 0.1, batch size 32``."""
    return ", ".join(
        f"{v} epoch{'s' * (v != 1)}" if k == "epochs" else f"{k.replace('_', ' ')} {v}"
        for k, v in recipe.items()
    )


# --- chapter 9: the representation cost -------------------------------------------------------


def cost_decompositions(
    models: Mapping[str, Sequence[nn.Module]],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    importances: Sequence[str],
    gradient: GradientConfig,
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
        for g in ("hf", "kf")
        for r in ("linear", "gradient")
        for imp in importances
    ]
    rows = []
    for a, g, r, imp in tqdm(jobs, desc="fusions", disable=not progress):
        ms = models[a][:2] if g == "hf" else models[a]
        res = fuse(ms, x, y, g, r, imp, gradient=gradient, seed=seed, progress=False)
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


def cost_shares(costs: pd.DataFrame, importance: str = "uniform") -> pd.DataFrame:
    """The rows of one weighting with the shares of the cost: ``clustering share``, ``approximation share``."""
    view = costs[costs.importance == importance].copy()
    view["clustering share"] = view["clustering"] / view["cost"]
    view["approximation share"] = view["approximation"] / view["cost"]
    return view


def approximation_shares(
    costs: pd.DataFrame, importance: str = "uniform"
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
    for (a, m, imp), acc in first.items():
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


# --- chapter 10: the main table ---------------------------------------------------------------


@dataclass
class RegimeStudy:
    """Chapter 10's protocol: every method fused from base models of every data regime.

    A *setting* is a regime name, a number of models ``n`` and a seed ``s``.
    Its base models come from :func:`regime_models`; its fusion set holds
    ``fusion_per_class`` examples of every class drawn with seed ``s`` from the
    whole training set. :meth:`cached_setting` stores a setting's accuracies
    and fusion times in ``run_cache`` under :meth:`setting_key` and the source
    of :data:`FUSION_CODE`, so an edit of the fusion package recomputes them.
    """

    zoo: Zoo
    data: dict[str, Any]
    arch: dict[str, Any]
    recipe: dict[str, Any]
    regimes: dict[str, dict[str, Any]]
    fusion_per_class: int
    methods: list[str]
    importances: list[str]
    ridge: float
    gradient: dict[str, Any]
    run_cache: str | Path | None = None
    val_per_class: int = 20

    @property
    def ds(self) -> Dataset:
        """The data set of the study."""
        return self.zoo.dataset(self.data)

    @functools.cached_property
    def digest(self) -> str:
        """:func:`data_digest` of the study's data set (computed once)."""
        return data_digest(self.ds)

    def settings(
        self, n_models: Iterable[int], seeds: Iterable[int]
    ) -> list[tuple[str, int, int]]:
        """Every (regime, n, seed), regimes outermost."""
        return [(r, n, s) for r in self.regimes for n in n_models for s in seeds]

    def base_models(
        self, regime: str, n: int, s: int
    ) -> tuple[list[nn.Module], np.ndarray]:
        """The base models of a setting and their per-class training counts."""
        return regime_models(
            self.zoo, self.data, self.arch, self.recipe, self.regimes[regime], n, s
        )

    def fusion_set(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The class-balanced fusion set of seed ``s``."""
        idx = balanced_subset(self.ds.y_train, self.fusion_per_class, s)
        return self.ds.x_train[idx], self.ds.y_train[idx]

    def validation_set(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``val_per_class`` training examples per class outside the fusion set of seed ``s``.

        Used to choose among fusion variants (never the test set); the base
        models may have trained on these examples.
        """
        fusion = balanced_subset(self.ds.y_train, self.fusion_per_class, s)
        rest = np.setdiff1d(np.arange(len(self.ds.y_train)), fusion)
        idx = balanced_subset(
            self.ds.y_train, self.val_per_class, derive_seed(s, "subset"), rest
        )
        return self.ds.x_train[idx], self.ds.y_train[idx]

    def train(
        self, settings: Iterable[tuple[str, int, int]], progress: bool = True
    ) -> None:
        """Train (or load) the base models of every setting."""
        for r, n, s in tqdm(list(settings), desc="base models", disable=not progress):
            self.base_models(r, n, s)

    def fuse_setting(
        self, regime: str, n: int, s: int
    ) -> dict[str, list[dict[str, Any]]]:
        """Test accuracy of every method (and importance) in one setting, and its fusion times.

        ``rows``: the mean individual model, then each method with each
        importance it uses, with test accuracy ``acc`` and accuracy ``val``
        on :meth:`validation_set`; ``times``: seconds per fusion. Importance
        scores are computed once per base model.
        """
        ds = self.ds
        models, counts = self.base_models(regime, n, s)
        share = class_share(counts)
        xf, yf = self.fusion_set(s)
        xv, yv = self.validation_set(s)

        def val(model: nn.Module) -> float:
            return float(evaluate(model, xv, yv)[1])

        rows = [
            {
                "method": "individual",
                "importance": "uniform",
                "acc": float(np.mean([accuracy(m, ds) for m in models])),
                "val": float(np.mean([val(m) for m in models])),
            }
        ]
        times = []
        scores = {
            imp: [model_importance(m, xf, yf, imp, progress=False) for m in models]
            for imp in self.importances
        }
        grad_config = GradientConfig(**self.gradient)
        for method in self.methods:
            for imp in self.importances if method in USES_IMPORTANCE else ["uniform"]:
                t0 = time.perf_counter()
                fused = fuse_by(
                    method,
                    models,
                    xf,
                    yf,
                    share,
                    imp,
                    scores[imp],
                    ridge=self.ridge,
                    gradient=grad_config,
                    seed=s,
                )
                times.append({"method": method, "seconds": time.perf_counter() - t0})
                rows.append(
                    {
                        "method": method,
                        "importance": imp,
                        "acc": accuracy(fused, ds),
                        "val": val(fused),
                    }
                )
        return {"rows": rows, "times": times}

    def setting_key(self, regime: str, n: int, s: int) -> dict[str, Any]:
        """Everything besides the code that determines :meth:`fuse_setting`'s result."""
        return {
            "protocol": "wslib.fusion.experiments.RegimeStudy.fuse_setting",
            "data": self.digest,
            "arch": self.arch,
            "recipe": self.recipe,
            "regime": self.regimes[regime],
            "n": n,
            "seed": s,
            "fusion_per_class": self.fusion_per_class,
            "val_per_class": self.val_per_class,
            "methods": self.methods,
            "importances": self.importances,
            "ridge": self.ridge,
            "gradient": self.gradient,
        }

    def cached_setting(self, regime: str, n: int, s: int) -> dict[str, Any]:
        """:meth:`fuse_setting`, read from or stored in ``run_cache``."""
        return cached_run(
            self.run_cache,
            self.setting_key(regime, n, s),
            functools.partial(self.fuse_setting, regime, n, s),
            code=FUSION_CODE,
        )

    def run(
        self, settings: Iterable[tuple[str, int, int]], progress: bool = True
    ) -> tuple[pd.DataFrame, dict[str, list[float]]]:
        """Every setting (cached): one row per setting, method and importance; fusion seconds per method."""
        runs, seconds = [], {m: [] for m in self.methods}
        for r, n, s in tqdm(list(settings), desc="settings", disable=not progress):
            res = self.cached_setting(r, n, s)
            runs += [{"regime": r, "n": n, "seed": s, **row} for row in res["rows"]]
            for t in res["times"]:
                seconds[t["method"]].append(t["seconds"])
        return pd.DataFrame(runs), seconds


def head_rules(
    study: RegimeStudy,
    regime: str,
    n: int,
    s: int,
    method: str = "kf_linear",
    importance: str = "conductance",
) -> dict[str, float]:
    """Test accuracy of one fusion with each head-target rule: data share and attribution share.

    ``"data share"``: :func:`~wslib.fusion.hfkf.class_share` of the training
    counts; ``"attribution"``: :func:`~wslib.fusion.hfkf.attribution_share`
    (the authors' rule) with ``importance``; ``"equal"``: equal weights.
    """
    models, counts = study.base_models(regime, n, s)
    xf, yf = study.fusion_set(s)
    rules = {
        "equal": None,
        "data share": class_share(counts),
        "attribution": attribution_share(models, xf, yf, importance),
    }
    grad = GradientConfig(**study.gradient)
    return {
        name: accuracy(
            fuse_by(
                method,
                models,
                xf,
                yf,
                w,
                importance,
                ridge=study.ridge,
                gradient=grad,
                seed=s,
            ),
            study.ds,
        )
        for name, w in rules.items()
    }


def method_groups(methods: Sequence[str]) -> dict[str, list[str]]:
    """The methods in two figure panels: the baselines, and HF/KF with two references.

    Both panels show the mean individual model; the HF/KF panel also shows the
    ensemble when it ran.
    """
    references = ["individual"] + (["ensemble"] if "ensemble" in methods else [])
    return {
        "baselines": ["individual", *(m for m in methods if m not in HF_KF)],
        "HF / KF": [*references, *(m for m in methods if m in HF_KF)],
    }


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
    return summary


def accuracy_table(
    summary: pd.DataFrame,
    regimes: Sequence[str],
    n_models: Sequence[int],
    methods: Sequence[str],
    importances: Sequence[str],
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


NOT_FUSED = ("individual", "ensemble")  # rows that are no single fused model


def styled_accuracy_table(
    summary: pd.DataFrame,
    regimes: Sequence[str],
    n_models: Sequence[int],
    methods: Sequence[str],
    importances: Sequence[str],
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

    cells = {"selector": "td, th", "props": "white-space: nowrap; padding: 1px 6px;"}
    return table.style.apply(bold, axis=0).set_table_styles([cells])


def nested_accuracies(
    summary: pd.DataFrame, regimes: Iterable[str], n_models: Iterable[int]
) -> dict[str, dict[str, dict[str, dict[str, dict[str, float]]]]]:
    """``acc[regime][str(n)][method][importance] = {"mean", "std"}`` for the results file."""
    acc: dict = {r: {str(n): {} for n in n_models} for r in regimes}
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


def best_importance(summary: pd.DataFrame, method: str) -> pd.DataFrame:
    """For each regime and n, the row of ``method`` whose importance is best on validation.

    Falls back to the test accuracy, with a warning, only for summaries
    without validation accuracies.
    """
    rows = summary[summary.method == method]
    return rows.loc[rows.groupby(["regime", "n"])[_selection_column(rows)].idxmax()]


def importance_pivot(
    summary: pd.DataFrame, methods: Sequence[str] = USES_IMPORTANCE
) -> pd.DataFrame:
    """Mean accuracy of ``methods`` (default: all with importance): rows (regime, n, method), columns importance."""
    view = summary[summary.method.isin(methods)]
    return view.pivot(
        index=["regime", "n", "method"], columns="importance", values="mean"
    )


def importance_gains(
    summary: pd.DataFrame,
    importances: Sequence[str],
    methods: Sequence[str] = USES_IMPORTANCE,
) -> pd.DataFrame:
    """Accuracy gain (points) of each non-uniform importance over uniform weights, per cell."""
    wide = importance_pivot(summary, methods)
    return pd.DataFrame(
        {
            imp: 100 * (wide[imp] - wide["uniform"])
            for imp in importances
            if imp != "uniform"
        }
    )


def summary_cell(
    summary: pd.DataFrame, regime: str, n: int, method: str, importance: str = "uniform"
) -> float:
    """Mean accuracy (%) of one cell of the table; NaN when the method did not run there."""
    row = _row(summary, regime, n, method, importance)
    return float("nan") if row is None else float(100 * row["mean"])


def _row(
    summary: pd.DataFrame, regime: str, n: int, method: str, importance: str = "uniform"
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
    summary: pd.DataFrame, regime: str, n: int, methods: Sequence[str]
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
    summary: pd.DataFrame, regime: str, n: int, methods: Sequence[str]
) -> pd.Series:
    """The summary row of :func:`select_variant`'s choice."""
    rows = summary[
        (summary.regime == regime) & (summary.n == n) & summary.method.isin(methods)
    ]
    if not len(rows):
        raise ValueError(f"no runs of {list(methods)} for {regime}, n={n}")
    return rows.loc[rows[_selection_column(rows)].idxmax()]


def _spread(*rows: pd.Series | None) -> float | None:
    """The spread between seeds a gap of these cells is judged by: the larger
    standard deviation (points); None when a cell has a single run or none."""
    if any(r is None or int(r["runs"]) < 2 for r in rows):
        return None
    return float(100 * max(r["std"] for r in rows))


def beats(gap: float, spread: float | None) -> str:
    """ "beats" / "does not beat" by the book's rule (:func:`wslib.runs.verdicts.compare`):
    a gap within the spread between seeds is level; one seed says so."""
    level = "is level (within the spread between seeds) with"
    return compare(gap, spread).word("beats", "does not beat", level)


def gradient_word(gap: float) -> str:
    """The Gradient retrofit against the Linear one, ``gap`` points ahead (mean
    over cells): within :data:`GRADIENT_TIE` points either way a match."""
    return compare(gap, GRADIENT_TIE).word("is ahead of", "is behind", "matches")


def headline_numbers(
    summary: pd.DataFrame, n_models: Sequence[int], importances: Sequence[str]
) -> dict[str, float | int | str]:
    """The numbers and verdicts the chapter's closing text quotes (accuracies in %, gaps in points).

    Sharded and full regimes with the fewest models (``n0``), the sharded
    regime with the most (``n_max``): the HF/KF variant and the OTFusion /
    Git Re-Basin importance chosen on the validation set, their test
    accuracies and gaps; the gains of Conductance and DeepLIFT over uniform
    weights for HF/KF; linear minus gradient retrofit averaged over cells.
    """
    n0, n_max = n_models[0], n_models[-1]

    def cell(r: str, n: int, method: str, imp: str = "uniform") -> float:
        return summary_cell(summary, r, n, method, imp)

    sh, full = (_chosen(summary, r, n0, HF_KF) for r in ("sharded", "full"))
    shmax = _chosen(summary, "sharded", n_max, HF_KF)
    ot, ot_max = (_chosen(summary, "sharded", k, ["otfusion"]) for k in (n0, n_max))
    sh_name, sh_best = _variant(sh)
    full_name, full_best = _variant(full)
    shmax_name, shmax_best = _variant(shmax)
    sh_ot, shmax_ot = _variant(ot)[1], _variant(ot_max)[1]
    wide = importance_pivot(summary, HF_KF)
    gains = importance_gains(summary, importances, HF_KF)

    def lin_minus_grad(g: str) -> float:
        methods = set(wide.index.get_level_values("method"))
        if not {f"{g}_linear", f"{g}_gradient"} <= methods:
            return float("nan")
        diff = wide.xs(f"{g}_linear", level="method") - wide.xs(
            f"{g}_gradient", level="method"
        )
        return float(100 * np.nanmean(diff.to_numpy()))

    out: dict[str, float | int | str] = {
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
        "kf_lin_minus_grad": lin_minus_grad("kf"),
        "hf_lin_minus_grad": lin_minus_grad("hf"),
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
    out["sh_vs_ot"] = beats(out["sh_gap_ot"], _spread(sh, ot))
    out["sh_vs_avg"] = beats(out["sh_gap_avg"], _spread(sh, avg))
    out["full_vs_indiv"] = beats(out["full_gap"], _spread(full, indiv))
    out["shmax_vs_ot"] = beats(out["shmax_gap_ot"], _spread(shmax, ot_max))
    gradient_gap = -float(
        np.nanmean([out["kf_lin_minus_grad"], out["hf_lin_minus_grad"]])
    )
    out["gradient_vs_linear"] = gradient_word(gradient_gap)
    return out


def mean_seconds(seconds: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Mean seconds per fusion of each method that ran."""
    return {m: float(np.mean(v)) for m, v in seconds.items() if v}


def self_fusion(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    x_test: torch.Tensor,
    methods: Sequence[str] = SELF_FUSION_METHODS,
    ridge: float = 1e-8,
) -> dict[str, float]:
    """Largest output difference on ``x_test`` between ``model`` and its fusion with a copy of itself.

    With TF32 off (:func:`~wslib.core.train.full_precision`), so that a GPU's
    difference is float32's, as on a CPU.
    """
    pair = [model, copy.deepcopy(model)]
    with full_precision():
        ref = predict(model, x_test)
        return {
            m: float(
                (predict(fuse_by(m, pair, x, y, ridge=ridge), x_test) - ref).abs().max()
            )
            for m in methods
        }


# --- chapter 11: beyond the table -------------------------------------------------------------


def finetune_curves(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    recipe: Recipe,
    gradient: GradientConfig,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, list[float]]:
    """Test accuracy of fused models before and after each epoch of training on all of ``ds``.

    ``models`` are fused on ``(x, y)`` by KF-Linear, KF-Gradient (uniform
    weights) and vanilla averaging; each fused model is then trained with
    ``recipe`` on the whole training set. Entry 0 of a curve is zero-shot.
    """
    starts = {
        "KF-Linear": fuse_by("kf_linear", models, x, y),
        "KF-Gradient": fuse_by(
            "kf_gradient", models, x, y, gradient=gradient, seed=seed
        ),
        "averaging": fuse_by("averaging", models, x, y),
    }
    curves = {}
    for name, model in tqdm(starts.items(), desc="fine-tuning", disable=not progress):
        model = copy.deepcopy(model)
        accs = [accuracy(model, ds)]
        fit(
            model,
            ds.x_train,
            ds.y_train,
            recipe,
            seed,
            progress=False,
            on_epoch=lambda epoch, m, accs=accs: accs.append(accuracy(m, ds)),
        )
        curves[name] = accs
    return curves


def epochs_within(
    curve: Sequence[float], target: float, gap: float = 0.01
) -> int | None:
    """Fine-tuning epochs until ``curve`` comes within ``gap`` of ``target``.

    ``curve[0]`` is the accuracy before fine-tuning (0 epochs when it is
    already within ``gap``); None when no epoch gets there.
    """
    if curve[0] >= target - gap:
        return 0
    return epochs_to(curve[1:], target - gap)


def width_fusions(
    models: Sequence[nn.Module],
    variants: Sequence[Mapping[str, Any]],
    arch: Mapping[str, Any],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    gradient: GradientConfig,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """KF fusion of models of different widths into a model of each width.

    ``models[i]`` is ``arch`` updated by ``variants[i]``; rows: each base
    model's test accuracy, then KF-Linear and KF-Gradient into each variant.
    """
    rows = [
        {"model": f"base {v}", "test acc": accuracy(m, ds)}
        for v, m in zip(variants, models)
    ]
    for v in variants:
        torch.manual_seed(seed)
        target = build_model({**arch, **v})
        for retrofit in ("linear", "gradient"):
            res = fuse(
                models,
                x,
                y,
                "kf",
                retrofit,
                fused=target,
                gradient=gradient,
                seed=seed,
                progress=False,
            )
            rows.append(
                {"model": f"KF-{retrofit} -> {v}", "test acc": accuracy(res.model, ds)}
            )
    return rows


def student_like(config: Mapping[str, Any], teacher: nn.Module) -> nn.Module:
    """A fresh model of ``config`` on ``teacher``'s device (initialised on the CPU, so its
    weights do not depend on the device)."""
    return build_model(dict(config)).to(model_device(teacher))


def compression(
    wide: nn.Module,
    narrow: Mapping[str, Any],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    gradient: GradientConfig,
    kd_epochs: int,
    seed: int = 0,
    importances: Sequence[str] = ("uniform", "conductance"),
) -> dict[str, Any]:
    """A wide model compressed into the ``narrow`` config with the fusion set only.

    KF with one base model (each weighting in ``importances``, both retrofits)
    against knowledge distillation of a fresh narrow model for ``kd_epochs``.
    Returns ``{"variants": {name: acc}, "kd_acc": acc, "kf_minus_kd": points,
    "kf_vs_kd": word}``: the best variant (picked on the test set) against
    distillation, in points and in the book's words (:func:`beats`, one run).
    """
    variants = {}
    for imp in importances:
        for retrofit in ("linear", "gradient"):
            torch.manual_seed(seed)
            target = build_model(dict(narrow))
            res = fuse(
                [wide],
                x,
                y,
                "kf",
                retrofit,
                imp,
                fused=target,
                gradient=gradient,
                seed=seed,
                progress=False,
            )
            variants[f"KF-{retrofit} ({imp})"] = accuracy(res.model, ds)
    torch.manual_seed(seed)
    student = distill(student_like(narrow, wide), wide, x, kd_epochs, seed=seed)
    kd_acc = accuracy(student, ds)
    gap = 100 * (max(variants.values()) - kd_acc)
    return {
        "variants": variants,
        "kd_acc": kd_acc,
        "kf_minus_kd": gap,
        "kf_vs_kd": beats(gap, None),
    }


def depth_compression(
    deep: nn.Module,
    shallow: Mapping[str, Any],
    ds: Dataset,
    sizes: Sequence[int],
    gradient: GradientConfig,
    kd_epochs: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """A deeper chain compressed into a shallower one (KF across depths) against distillation.

    For each number of examples per class in ``sizes`` a balanced fusion set
    is drawn with ``seed``; KF-Linear and KF-Gradient (uniform weights, one
    base model, levels mapped by :func:`~wslib.fusion.hfkf.depth_map`) fit a
    fresh ``shallow`` model, and knowledge distillation trains another fresh
    one on the same inputs for ``kd_epochs``. Rows: per class, size, method,
    test accuracy.
    """
    rows = []
    for per_class in sizes:
        idx = balanced_subset(ds.y_train, per_class, seed)
        x, y = ds.x_train[idx], ds.y_train[idx]
        for retrofit in ("linear", "gradient"):
            torch.manual_seed(seed)
            res = fuse(
                [deep],
                x,
                y,
                "kf",
                retrofit,
                fused=build_model(dict(shallow)),
                gradient=gradient,
                seed=seed,
                progress=False,
            )
            rows.append(
                {
                    "per class": per_class,
                    "size": len(idx),
                    "method": f"kf_{retrofit}",
                    "test acc": accuracy(res.model, ds),
                }
            )
        torch.manual_seed(seed)
        student = distill(student_like(shallow, deep), deep, x, kd_epochs, seed=seed)
        rows.append(
            {
                "per class": per_class,
                "size": len(idx),
                "method": "distillation",
                "test acc": accuracy(student, ds),
            }
        )
    return rows


def kf_versus_distillation(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per fusion-set size, the best KF variant minus distillation (points), and the sizes where KF wins."""
    table = pd.DataFrame(rows).pivot_table(
        index="size", columns="method", values="test acc"
    )
    kf = table[[c for c in table.columns if c.startswith("kf_")]].max(axis=1)
    gap = 100 * (kf - table["distillation"])
    return {
        "gap": {int(k): float(v) for k, v in gap.items()},
        "kf_wins_at": [int(k) for k, v in gap.items() if v > 0],
        "n_sizes": len(gap),
    }


def size_sweep(
    models: Sequence[nn.Module],
    share: np.ndarray,
    ds: Dataset,
    sizes: Sequence[int],
    copies: int,
    gradient: GradientConfig,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Zero-shot accuracy of KF-Linear / KF-Gradient (Conductance) per fusion-set size.

    For each number of examples per class in ``sizes``, a balanced fusion set
    is drawn with ``seed`` and used as is and with ``copies`` augmented copies
    (:data:`AUGMENTATION`).
    """
    rows = []
    for per_class in tqdm(sizes, desc="fusion-set sizes", disable=not progress):
        idx = balanced_subset(ds.y_train, per_class, seed)
        for aug in (False, True):
            x_s, y_s = ds.x_train[idx], ds.y_train[idx]
            if aug:
                x_s, y_s = augment_fusion_set(
                    x_s, y_s, copies, **AUGMENTATION, seed=seed
                )
            for method in ("kf_linear", "kf_gradient"):
                fused = fuse_by(
                    method,
                    models,
                    x_s,
                    y_s,
                    share,
                    "conductance",
                    gradient=gradient,
                    seed=seed,
                )
                rows.append(
                    {
                        "per class": per_class,
                        "size": len(idx),
                        "augmented": aug,
                        "method": method,
                        "test acc": accuracy(fused, ds),
                    }
                )
    return rows


def augmentation_gain(rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean accuracy gain (points) of augmentation at the smallest fusion set, over the methods."""
    sizes = pd.DataFrame(rows)
    wide = sizes.pivot_table(
        index=["method", "size"], columns="augmented", values="test acc"
    )
    gain = (wide[True] - wide[False]).xs(min(sizes["size"]), level="size")
    return float(100 * gain.mean())


def cached_size_sweep(
    zoo: Zoo,
    data: dict[str, Any],
    arch: dict[str, Any],
    recipe: dict[str, Any],
    sizes: Sequence[int],
    copies: int,
    gradient: dict[str, Any],
    seed: int = 0,
    run_cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """:func:`size_sweep` on the two models of the sharded regime, stored in ``run_cache``.

    The key holds the data content, the base models' configs, the sweep's
    settings and the source of :data:`FUSION_CODE`.
    """
    ds = zoo.dataset(data)
    key = {
        "protocol": "wslib.fusion.experiments.size_sweep",
        "data": data_digest(ds),
        "arch": arch,
        "recipe": recipe,
        "seed": seed,
        "fusion_sizes": list(sizes),
        "augment_copies": copies,
        "augmentation": AUGMENTATION,
        "gradient": gradient,
    }

    def compute() -> dict[str, Any]:
        models, counts = regime_models(
            zoo, data, arch, recipe, {"kind": "shards"}, 2, seed
        )
        rows = size_sweep(
            models,
            class_share(counts),
            ds,
            sizes,
            copies,
            GradientConfig(**gradient),
            seed,
        )
        return {"rows": rows}

    return cached_run(run_cache, key, compute, code=FUSION_CODE)["rows"]


def architecture_zero_shot(
    zoo: Zoo,
    data: dict[str, Any],
    architectures: Mapping[str, Mapping[str, Any]],
    methods: Sequence[str],
    x: torch.Tensor,
    y: torch.Tensor,
    gradient: GradientConfig,
    seed: int = 0,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Two models per architecture (full data) fused by each method, zero-shot.

    ``architectures[name]`` holds a ``model`` config and its ``recipe``. Rows:
    the architecture, the mean individual and the ensemble accuracy, then one
    accuracy per method (None where the method does not apply). Also returns
    one line per method that does not apply, with the first line of its error.
    """
    ds = zoo.dataset(data)
    rows, skipped = [], []
    for name, spec in tqdm(
        architectures.items(), desc="architectures", disable=not progress
    ):
        models = [
            trained(
                zoo, data, spec["model"], spec["recipe"], derive_seed(seed, "model", i)
            )
            for i in range(2)
        ]
        row = {
            "architecture": name,
            "individual": float(np.mean([accuracy(m, ds) for m in models])),
            "ensemble": accuracy(Ensemble(models), ds),
        }
        for method in methods:
            try:
                row[method] = accuracy(
                    fuse_by(method, models, x, y, gradient=gradient, seed=seed), ds
                )
            except ValueError as err:
                skipped.append(
                    f"{name} / {method}: not applicable ({str(err).splitlines()[0][:90]})"
                )
                row[method] = None
        rows.append(row)
    return rows, skipped


GRADIENT_VARIANTS = {
    "Linear": ("linear", {}),
    "Gradient, affine steps": ("gradient", {"blocks": False}),
    "Gradient, whole blocks": ("gradient", {"blocks": True}),
}
"""The retrofits compared on residual nets: name -> (retrofit, GradientConfig changes)."""


def residual_gradient_variants(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    gradient: GradientConfig,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """HF and KF (uniform weights) of two residual models with each of :data:`GRADIENT_VARIANTS`.

    Rows: grouping, variant, test accuracy, and for the whole-block fit the
    block-output MSE on the fusion set at the start (the least-squares fit)
    and at the end, summed over the blocks (None for the other variants).
    """
    rows = []
    for grouping in ("hf", "kf"):
        for name, (retrofit, change) in GRADIENT_VARIANTS.items():
            config = dataclasses.replace(gradient, **change)
            res = fuse(
                models,
                x,
                y,
                grouping,
                retrofit,
                gradient=config,
                seed=seed,
                progress=False,
            )
            fits = res.block_fits
            rows.append(
                {
                    "method": grouping.upper(),
                    "variant": name,
                    "test acc": accuracy(res.model, ds),
                    "block MSE start": sum(f["start"] for f in fits) if fits else None,
                    "block MSE end": sum(f["best"] for f in fits) if fits else None,
                    "seconds": res.seconds,
                }
            )
    return rows


def residual_architectures(architectures: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The names of the ResNets and transformers among ``architectures`` (``name -> {"model"}``)."""
    return [
        name
        for name, spec in architectures.items()
        if isinstance(build_model(dict(spec["model"])), RESIDUAL_ARCHS)
    ]


def block_fit_text(name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """One sentence per residual net: each variant's accuracy and the whole-block fit's effect.

    The verdict (raises / lowers / leaves) compares the whole-block fit with
    the Linear variant, per grouping, at 0.1 points.
    """
    parts = []
    for method in dict.fromkeys(r["method"] for r in rows):
        sub = {r["variant"]: r for r in rows if r["method"] == method}
        lin = 100 * sub["Linear"]["test acc"]
        blk = sub["Gradient, whole blocks"]
        gap = 100 * blk["test acc"] - lin
        start = blk["block MSE start"]
        drop = 100 * (1 - blk["block MSE end"] / start) if start > 0 else 0.0
        word = compare(gap, 0.1).word("raises", "lowers", "leaves")
        error = (
            f"lowers the block-output error by {drop:.0f} %"
            if drop > 0
            else "leaves the block-output error as it was"
        )
        parts.append(
            f"{method}: Linear {lin:.1f} %, affine-step Gradient "
            f"{100 * sub['Gradient, affine steps']['test acc']:.1f} %, whole-block "
            f"Gradient {100 * blk['test acc']:.1f} % (the block fit {error} and "
            f"{word} the accuracy, {gap:+.1f} points)"
        )
    return f"{name}: " + "; ".join(parts)


def block_fit_study(
    zoo: Zoo,
    data: dict[str, Any],
    architectures: Mapping[str, Mapping[str, Any]],
    x: torch.Tensor,
    y: torch.Tensor,
    gradient: GradientConfig,
    seed: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`residual_gradient_variants` for the two full-data models of each residual net.

    The models are those of :func:`architecture_zero_shot` (model seeds
    ``derive_seed(seed, "model", i)``, ``i = 0, 1``); chains are left out.
    """
    ds = zoo.dataset(data)
    out = {}
    for name in residual_architectures(architectures):
        spec = architectures[name]
        models = [
            trained(
                zoo, data, spec["model"], spec["recipe"], derive_seed(seed, "model", i)
            )
            for i in (0, 1)
        ]
        out[name] = residual_gradient_variants(models, x, y, ds, gradient, seed)
    return out
