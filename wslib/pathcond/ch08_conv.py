"""Chapter 8 (``08_pathcond_conv``): PathCond on convolutional and residual networks.

The protocol: one training run per architecture, method and seed
(:func:`train_archs`) and the cost of rescaling per model
(:func:`rescale_costs`). The results: the set-up and results tables, the
results-file metrics (:func:`arch_metrics`, :func:`cost_metrics`), the paper's
numbers beside this run's, whether the solver converged, and what max pooling
means for ``diag(G)`` (:func:`pooling_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from wslib.core.data import Dataset, load_dataset
from wslib.core.describe import data_label, describe_model, describe_sgd, percent
from wslib.core.train import Recipe
from wslib.pathcond.protocols import Run, rescale_cost
from wslib.pathcond.training import InitMethod, TrainSettings, train_run
from wslib.runs.published import PATHCOND, beside_paper, run_setting
from wslib.runs.stats import format_epochs, format_mean_std, mean_std, summarise_epochs

# --- the protocol -----------------------------------------------------------------


def train_archs(
    archs: dict[str, dict[str, Any]],
    methods: Sequence[InitMethod],
    seeds: Sequence[int],
    ds: Dataset,
    *,
    cache_dir: str | Path | None = None,
) -> dict[tuple[str, str, int], Run]:
    """One run per (architecture, method, seed), one after the other, keyed so.

    An architecture is ``{"model", "recipe", "task"}`` and may name its own
    ``data`` (arguments of :func:`~wslib.core.data.load_dataset`); otherwise it trains on ``ds``.
    """
    data = {
        a: load_dataset(**spec["data"]) if "data" in spec else ds
        for a, spec in archs.items()
    }
    jobs = [(a, m, s) for a in archs for m in methods for s in seeds]
    runs: dict[tuple[str, str, int], Run] = {}
    for arch, method, s in tqdm(jobs, desc="runs"):
        spec = archs[arch]
        settings = TrainSettings(
            model=spec["model"],
            method=method,
            recipe=Recipe(**spec["recipe"]),
            seed=s,
            task=spec["task"],
        )
        runs[(arch, method, s)] = train_run(settings, data[arch], cache_dir=cache_dir)
    return runs


def rescale_costs(
    models: dict[str, dict[str, Any]], ds: Dataset, *, repeats: int = 1
) -> list[dict[str, Any]]:
    """:func:`~wslib.pathcond.protocols.rescale_cost` of each named model config on ``ds``, one row each."""
    return [
        {"model": name, **rescale_cost(config, ds, repeats=repeats)}
        for name, config in tqdm(models.items(), desc="cost")
    ]


# --- results ----------------------------------------------------------------------


def pooling_text(config: dict[str, Any]) -> str:
    """What the pooling of a fully convolutional ``config`` means for ``diag(G)``, in words."""
    pool = "max" if config["name"] == "cifar_nv" else config.get("pool", "max")
    if pool != "max":
        layers = "ReLU and average pooling" if pool == "avg" else "ReLU (no pooling)"
        return (
            f"convolutions, {layers}, then a convolutional head and a "
            "global mean: diag(G) is exact"
        )
    return (
        "convolutions, ReLU and max pooling, then a convolutional head and a global "
        "mean: diag(G) keeps the largest squared path mass at each "
        "max pool (chapter 6), an approximation"
    )


def arch_metrics(
    runs: dict[tuple[str, str, int], Run],
    archs: dict[str, dict[str, Any]],
    methods: Sequence[InitMethod],
    seeds: Sequence[int],
    *,
    threshold: float = 0.99,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The results-file entry of every architecture of chapter 8 (the chapter adds
    entries of other kinds: the solver's convergence, the costs), and table rows.

    Per method: final training loss (mean, std over ``seeds``), test loss and,
    for classifiers, test accuracy and epochs to ``threshold`` (None and no
    entry for the autoencoder); per architecture PathCond's final training
    loss over the baseline's.
    """
    metrics, rows = {}, []
    pct = percent(threshold)
    for arch, spec in archs.items():
        entry: dict[str, Any] = {
            "final_train_loss": {},
            "test_acc": {},
            "test_loss": {},
            "epochs_to_99": {},
        }
        for method in methods:
            sel = [runs[(arch, method, s)] for s in seeds]
            final = [r["loss"][-1] for r in sel]
            mean, std = mean_std(final)
            entry["final_train_loss"][method] = {"mean": mean, "std": std}
            entry["test_loss"][method] = float(np.mean([r["test_loss"] for r in sel]))
            row = {
                "architecture": arch,
                "method": method,
                "final train loss": format_mean_std(final, fmt=".4g", std_fmt=".2g"),
                "test loss": entry["test_loss"][method],
            }
            entry["test_acc"][method] = None
            if spec["task"] == "classify":
                summ = summarise_epochs([r["acc"] for r in sel], threshold=threshold)
                entry["epochs_to_99"][method] = summ
                entry["test_acc"][method] = float(np.mean([r["test_acc"] for r in sel]))
                row[f"epochs to {pct}"] = format_epochs(summ)
                row["test acc."] = entry["test_acc"][method]
            rows.append(row)
        losses = entry["final_train_loss"]
        entry["final_loss_ratio_pathcond_over_baseline"] = (
            losses["pathcond"]["mean"] / losses["baseline"]["mean"]
        )
        metrics[arch] = entry
    return metrics, rows


def paper_numbers_beside(
    metrics: dict[str, dict[str, Any]],
    archs: dict[str, dict[str, Any]],
    data: dict[str, Any],
) -> pd.DataFrame:
    """The paper's CIFAR-NV test accuracies (:data:`~wslib.runs.published.PATHCOND`)
    beside this run's (mean over seeds, %), where the setting is the paper's.

    ``metrics``: :func:`arch_metrics`'s first value; ``data``: the chapter's
    data set (an architecture with its own ``data`` is measured only there).
    """
    measured, runs = {}, []
    for arch, spec in archs.items():
        own_data = spec.get("data", data)
        runs.append(run_setting(own_data["name"], spec["model"]))
        if spec["model"]["name"] == "cifar_nv" and own_data == data:
            for method, acc in metrics[arch]["test_acc"].items():
                if acc is not None:
                    measured[f"{method}/test_acc"] = f"{100 * acc:.1f}"
    return beside_paper(PATHCOND, runs, measured)


def setup_rows(
    archs: dict[str, dict[str, Any]], ds: Dataset, methods: Sequence[InitMethod]
) -> list[dict[str, Any]]:
    """Table rows of chapter 8's set-up: per architecture its model, data, task and recipe."""
    return [
        {
            "architecture": arch,
            "model": describe_model(spec["model"], words="details"),
            "data": data_label(spec.get("data", {}).get("name", ds.name)),
            "task": spec["task"],
            "epochs": spec["recipe"]["epochs"],
            "lr": spec["recipe"]["lr"],
            "SGD": describe_sgd(spec["recipe"]),
            "methods": ", ".join(methods),
        }
        for arch, spec in archs.items()
    ]


def cost_metrics(cost_rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The results-file entry of the cost rows: per model its size and rescale/epoch ratio."""
    return {
        r["model"]: {"n_params": r["n_params"], "ratio": r["rescale_over_epoch"]}
        for r in cost_rows
    }


def convergence_rows(
    runs: dict[tuple[str, str, int], Run],
    archs: dict[str, dict[str, Any]],
    seeds: Sequence[int],
    *,
    method: InitMethod = "pathcond",
) -> list[dict[str, Any]]:
    """Per architecture and seed: did PathCond's solver converge, and how far from it it stopped."""
    rows = []
    for arch in archs:
        for s in seeds:
            run = runs.get((arch, method, s))
            if run is None or run.get("rescale_converged") is None:
                continue
            rows.append(
                {
                    "architecture": arch,
                    "seed": s,
                    "converged": run["rescale_converged"],
                    "sweeps": run["rescale_sweeps"],
                    "last relative drop of F": run["rescale_last_drop"],
                }
            )
    return rows


def convergence_text(rows: Sequence[dict[str, Any]], *, rtol: float = 1e-12) -> str:
    """One sentence: which runs' solver stopped at its sweep limit, and how far from converged."""
    stopped = [r for r in rows if not r["converged"]]
    if not stopped:
        return (
            f"The PathCond solver converged in every run here (F fell by at most "
            f"{rtol:g} of itself in its last sweep)."
        )
    parts = [
        f"{r['architecture']} (seed {r['seed']}: {r['sweeps']} sweeps, last relative "
        f"drop {r['last relative drop of F']:.1e})"
        for r in stopped
    ]
    return (
        f"The PathCond solver stopped at its sweep limit before converging in "
        f"{len(stopped)} of {len(rows)} runs: {'; '.join(parts)}; the tolerance is a drop "
        f"of {rtol:g}, so these rows train from a rescaling near, not at, "
        "the optimum."
    )
