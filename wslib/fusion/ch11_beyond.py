"""Chapter 11, beyond the table: fine-tuning, width and depth compression,
KF against distillation, the fusion-set size sweep, other architectures zero-shot
and the residual Gradient variants.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from wslib.core.configs import build_model
from wslib.core.data import Dataset, balanced_subset
from wslib.core.seeds import derive_seed
from wslib.core.train import (
    Recipe,
    fit,
    model_device,
)
from wslib.fusion.baselines import Ensemble, MethodName, distill, fuse_by
from wslib.fusion.hfkf import (
    augment_fusion_set,
    fuse,
)
from wslib.fusion.importance import ImportanceName
from wslib.fusion.levels import RESIDUAL_ARCHS, RetrofitName
from wslib.fusion.protocols import (
    FUSION_CODE,
    accuracy,
    beats,
    trained,
)
from wslib.fusion.retrofit import GradientConfig
from wslib.runs.stats import epochs_to
from wslib.runs.steps import cached_step
from wslib.runs.zoo import Zoo

AUGMENTATION: dict[str, Any] = {"shift": 3, "noise": 0.1}
"""Settings of :func:`~wslib.fusion.hfkf.augment_fusion_set` in the size sweep."""


def finetune_curves(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    recipe: Recipe,
    gradient: GradientConfig,
    *,
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

        def record(epoch: int, m: nn.Module, accs: list[float] = accs) -> None:
            accs.append(accuracy(m, ds))

        fit(
            model,
            ds.x_train,
            ds.y_train,
            recipe,
            seed=seed,
            progress=False,
            on_epoch=record,
        )
        curves[name] = accs
    return curves


def epochs_within(
    curve: Sequence[float], target: float, *, gap: float = 0.01
) -> int | None:
    """Fine-tuning epochs until ``curve`` comes within ``gap`` of ``target``.

    ``curve[0]`` is the accuracy before fine-tuning (0 epochs when it is
    already within ``gap``); None when no epoch gets there.
    """
    if curve[0] >= target - gap:
        return 0
    return epochs_to(curve[1:], threshold=target - gap)


def width_fusions(
    models: Sequence[nn.Module],
    variants: Sequence[Mapping[str, Any]],
    arch: Mapping[str, Any],
    x: torch.Tensor,
    y: torch.Tensor,
    ds: Dataset,
    gradient: GradientConfig,
    *,
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
    *,
    seed: int = 0,
    importances: Sequence[ImportanceName] = ("uniform", "conductance"),
) -> dict[str, Any]:
    """A wide model compressed into the ``narrow`` config with the fusion set only.

    KF with one base model (each weighting in ``importances``, both retrofits)
    against knowledge distillation of a fresh narrow model for ``kd_epochs``.
    Returns ``{"variants": {name: acc}, "kd_acc": acc, "kf_minus_kd": points,
    "kf_vs_kd": word}``: the best variant (picked on the test set) against
    distillation, in points and in the book's words (:func:`~wslib.fusion.protocols.beats`, one run).
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
                importance=imp,
                fused=target,
                gradient=gradient,
                seed=seed,
                progress=False,
            )
            variants[f"KF-{retrofit} ({imp})"] = accuracy(res.model, ds)
    torch.manual_seed(seed)
    student = distill(student_like(narrow, wide), wide, x, epochs=kd_epochs, seed=seed)
    kd_acc = accuracy(student, ds)
    gap = 100 * (max(variants.values()) - kd_acc)
    return {
        "variants": variants,
        "kd_acc": kd_acc,
        "kf_minus_kd": gap,
        "kf_vs_kd": beats([100 * max(variants.values())], [100 * kd_acc]),
    }


def depth_compression(
    deep: nn.Module,
    shallow: Mapping[str, Any],
    ds: Dataset,
    sizes: Sequence[int],
    gradient: GradientConfig,
    kd_epochs: int,
    *,
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
        student = distill(
            student_like(shallow, deep), deep, x, epochs=kd_epochs, seed=seed
        )
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
    by_size = cast("list[tuple[int, float]]", list(gap.items()))
    return {
        "gap": {int(k): float(v) for k, v in by_size},
        "kf_wins_at": [int(k) for k, v in by_size if v > 0],
        "n_sizes": len(gap),
    }


@cached_step(code=FUSION_CODE, not_keyed={"progress": "a progress bar"})
def size_sweep(
    models: Sequence[nn.Module],
    share: np.ndarray,
    ds: Dataset,
    sizes: Sequence[int],
    copies: int,
    gradient: GradientConfig,
    *,
    seed: int = 0,
    progress: bool = True,
    run_cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Zero-shot accuracy of KF-Linear / KF-Gradient (Conductance) per fusion-set size.

    For each number of examples per class in ``sizes``, a balanced fusion set
    is drawn with ``seed`` and used as is and with ``copies`` augmented copies
    (:data:`AUGMENTATION`). A cached step (:mod:`wslib.runs.steps`) in ``run_cache``.
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
                    class_weights=share,
                    importance="conductance",
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


def _full_data_pair(
    zoo: Zoo, data: dict[str, Any], spec: Mapping[str, Any], seed: int
) -> list[nn.Module]:
    """The two models of ``spec`` (its ``model`` config and ``recipe``) trained on all of
    ``data``, with model seeds ``derive_seed(seed, "model", i)``, ``i = 0, 1``."""
    return [
        trained(zoo, data, spec["model"], spec["recipe"], derive_seed(seed, "model", i))
        for i in (0, 1)
    ]


def architecture_zero_shot(
    zoo: Zoo,
    data: dict[str, Any],
    architectures: Mapping[str, Mapping[str, Any]],
    methods: Sequence[MethodName],
    x: torch.Tensor,
    y: torch.Tensor,
    gradient: GradientConfig,
    *,
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
        models = _full_data_pair(zoo, data, spec, seed)
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


GRADIENT_VARIANTS: dict[str, tuple[RetrofitName, dict[str, Any]]] = {
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
    *,
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

    The whole-block fit against the Linear variant, per grouping: one run, so
    the book's rule decides nothing and the words give the sign ("one run:
    undecided")
    """
    parts = []
    for method in dict.fromkeys(r["method"] for r in rows):
        sub = {r["variant"]: r for r in rows if r["method"] == method}
        lin = 100 * sub["Linear"]["test acc"]
        blk = sub["Gradient, whole blocks"]
        gap = 100 * blk["test acc"] - lin
        start = blk["block MSE start"]
        drop = 100 * (1 - blk["block MSE end"] / start) if start > 0 else 0.0
        word = "raises" if gap > 0 else "lowers" if gap < 0 else "leaves"
        error = (
            f"lowers the block-output error by {drop:.0f} %"
            if drop > 0
            else "leaves the block-output error as it was"
        )
        parts.append(
            f"{method}: Linear {lin:.1f} %, affine-step Gradient "
            f"{100 * sub['Gradient, affine steps']['test acc']:.1f} %, whole-block "
            f"Gradient {100 * blk['test acc']:.1f} % (the block fit {error} and "
            f"{word} the accuracy, {gap:+.1f} points; one run: undecided)"
        )
    return f"{name}: " + "; ".join(parts)


def block_fit_study(
    zoo: Zoo,
    data: dict[str, Any],
    architectures: Mapping[str, Mapping[str, Any]],
    x: torch.Tensor,
    y: torch.Tensor,
    gradient: GradientConfig,
    *,
    seed: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`residual_gradient_variants` for the two full-data models of each residual net.

    The models are those of :func:`architecture_zero_shot` (model seeds
    ``derive_seed(seed, "model", i)``, ``i = 0, 1``); chains are left out.
    """
    ds = zoo.dataset(data)
    out = {}
    for name in residual_architectures(architectures):
        models = _full_data_pair(zoo, data, architectures[name], seed)
        out[name] = residual_gradient_variants(models, x, y, ds, gradient, seed=seed)
    return out
