"""Toy studies and result tables for the tests of the fusion chapters' protocols.

The generic pieces (the fake zoo, the balanced toy data set, seeded models) are
in :mod:`tests.kit`.
"""

from __future__ import annotations

import pandas as pd
import torch

from tests.kit import SIGNAL, FakeZoo, balanced_dataset, mlp, resnet1d
from wslib.core.data import Dataset, balanced_subset
from wslib.fusion import ch10_regimes
from wslib.fusion.retrofit import GradientConfig

QUICK = GradientConfig(max_epochs=3, patience=2)


MLP = mlp([8, 6], **SIGNAL)
RESNET = resnet1d([4, 8], **SIGNAL, blocks_per_stage=1)


RECIPE = {"epochs": 1}


def toy_fusion_set(
    ds: Dataset, per_class: int = 6
) -> tuple[torch.Tensor, torch.Tensor]:
    idx = balanced_subset(ds.y_train, per_class, 0)
    return ds.x_train[idx], ds.y_train[idx]


def toy_cost_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arch": ["mlp"] * 4 + ["cnn"] * 2,
            "method": ["HF-linear", "HF-linear", "KF-gradient", "KF-gradient"]
            + ["KF-linear", "KF-linear"],
            "importance": ["uniform", "uniform", "uniform", "deeplift"]
            + ["uniform", "uniform"],
            "level": [0, 1, 0, 0, 0, 1],
            "cost": [1.0, 2.0, 4.0, 8.0, 2.0, 4.0],
            "clustering": [1.0, 1.0, 1.0, 2.0, 1.0, 3.0],
            "approximation": [0.0, 1.0, 3.0, 6.0, 1.0, 1.0],
            "test acc": [0.5, 0.5, 0.7, 0.6, 0.8, 0.8],
            "abs err": [0.0, 1e-9, 2e-9, 0.0, 0.0, 4e-9],
            "rel err": [0.0, 5e-10, 5e-10, 0.0, 0.0, 1e-9],
        }
    )


METHODS = ["averaging", "ensemble", "otfusion", "hf_linear", "kf_linear"]


def toy_study(tmp_path=None, **changes) -> tuple[ch10_regimes.RegimeStudy, FakeZoo]:
    zoo = FakeZoo(balanced_dataset())
    settings = {
        "zoo": zoo,
        "data": {"name": "toy"},
        "arch": MLP,
        "recipe": RECIPE,
        "regimes": {"full": {"kind": "full"}, "sharded": {"kind": "shards"}},
        "fusion_per_class": 6,
        "methods": METHODS,
        "importances": ["uniform", "conductance"],
        "ridge": 1e-8,
        "gradient": {"max_epochs": 3, "patience": 2},
        "run_cache": tmp_path,
        "val_per_class": 3,
    }
    return ch10_regimes.RegimeStudy(**{**settings, **changes}), zoo


VAL_BONUS = {("kf_gradient", "deeplift"): 0.5}  # best on validation, not on test


def toy_runs() -> pd.DataFrame:
    """Two seeds of a small table; binary fractions, so every mean is exact."""
    offsets = {
        ("individual", "uniform"): 0.0,
        ("averaging", "uniform"): -0.25,
        ("ensemble", "uniform"): 0.125,
        ("otfusion", "uniform"): -0.125,
        ("kf_linear", "conductance"): 0.0625,
        ("kf_linear", "deeplift"): -0.0625,
        ("kf_gradient", "uniform"): 0.0,
        ("kf_gradient", "conductance"): 0.0,
        ("kf_gradient", "deeplift"): 0.0,
    }
    hf = {("hf_linear", "uniform"): 0.125, ("hf_linear", "conductance"): 0.25}
    rows = []
    for s, shift in [(0, 0.0), (1, 0.125)]:
        for regime, base in [("full", 0.75), ("sharded", 0.5)]:
            for n in (2, 4):
                cells = {**offsets, ("kf_linear", "uniform"): shift}
                cells.update(hf if n == 2 else {})
                rows += [
                    {"regime": regime, "n": n, "seed": s, "method": m}
                    | {"importance": imp, "acc": base + off}
                    | {"val": base + off + VAL_BONUS.get((m, imp), 0.0)}
                    for (m, imp), off in cells.items()
                ]
    return pd.DataFrame(rows)


IMPORTANCES = ["uniform", "conductance", "deeplift"]


METHODS_10 = [
    "averaging",
    "ensemble",
    "otfusion",
    "hf_linear",
    "kf_linear",
    "kf_gradient",
]


def toy_cell(
    summary: pd.DataFrame, regime: str, n: int, method: str, imp: str
) -> pd.Series:
    return summary[
        (summary.regime == regime)
        & (summary.n == n)
        & (summary.method == method)
        & (summary.importance == imp)
    ].iloc[0]


def toy_block_rows(lin: float, blk: float, start: float = 2.0) -> list[dict]:
    return [
        {"method": "KF", "variant": "Linear", "test acc": lin},
        {"method": "KF", "variant": "Gradient, affine steps", "test acc": lin},
        {
            "method": "KF",
            "variant": "Gradient, whole blocks",
            "test acc": blk,
            "block MSE start": start,
            "block MSE end": 0.5,
        },
    ]
