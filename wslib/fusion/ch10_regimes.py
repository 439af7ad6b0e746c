"""Chapter 10, the main table: every method in every data regime and setting
(:class:`RegimeStudy`, cached under :data:`~wslib.fusion.protocols.FUSION_CODE`),
the head rules and self-fusion; the summaries, tables, importance gains and
headline numbers are in :mod:`wslib.fusion.ch10_results`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from wslib.core.data import Dataset, balanced_subset
from wslib.core.seeds import derive_seed
from wslib.core.train import (
    evaluate,
    float64_outputs,
)
from wslib.fusion.baselines import HF_KF, USES_IMPORTANCE, MethodName, fuse_by
from wslib.fusion.hfkf import (
    attribution_share,
    class_share,
    model_importance,
)
from wslib.fusion.importance import ImportanceName
from wslib.fusion.protocols import (
    FUSION_CODE,
    accuracy,
    data_digest,
    regime_models,
)
from wslib.fusion.retrofit import GradientConfig
from wslib.runs.cache import cached_run
from wslib.runs.zoo import Zoo

SELF_FUSION_METHODS: tuple[MethodName, ...] = (
    "averaging",
    "otfusion",
    "rebasin_wm",
    "hf_linear",
    "kf_linear",
)
"""Methods that must return a model fused with an exact copy of itself unchanged."""


NOT_KEYED = {
    "zoo": "where the base models are stored: they enter by arch, recipe and regime",
    "data": "enters by the digest of its contents",
    "regimes": "only the setting's own regime enters",
    "run_cache": "where the result is stored, not what it is",
}
"""The fields of :class:`RegimeStudy` that do not enter a setting's key, and why."""


@dataclass
class RegimeStudy:
    """Chapter 10's protocol: every method fused from base models of every data regime.

    A *setting* is a regime name, a number of models ``n`` and a seed ``s``.
    Its base models come from :func:`~wslib.fusion.protocols.regime_models`; its fusion set holds
    ``fusion_per_class`` examples of every class drawn with seed ``s`` from the
    whole training set. :meth:`cached_setting` stores a setting's accuracies
    and fusion times in ``run_cache`` under :meth:`setting_key` and the source
    of :data:`~wslib.fusion.protocols.FUSION_CODE`, so an edit of the fusion package recomputes them.
    """

    zoo: Zoo
    data: dict[str, Any]
    arch: dict[str, Any]
    recipe: dict[str, Any]
    regimes: dict[str, dict[str, Any]]
    fusion_per_class: int
    methods: list[MethodName]
    importances: list[ImportanceName]
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
        """:func:`~wslib.fusion.protocols.data_digest` of the study's data set (computed once)."""
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
            self.ds.y_train, self.val_per_class, derive_seed(s, "subset"), indices=rest
        )
        return self.ds.x_train[idx], self.ds.y_train[idx]

    def train(
        self, settings: Iterable[tuple[str, int, int]], *, progress: bool = True
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
            uniform: list[ImportanceName] = ["uniform"]
            for imp in self.importances if method in USES_IMPORTANCE else uniform:
                t0 = time.perf_counter()
                fused = fuse_by(
                    method,
                    models,
                    xf,
                    yf,
                    class_weights=share,
                    importance=imp,
                    scores=scores[imp],
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
        """Everything besides the code that determines :meth:`fuse_setting`'s result:
        every field but those of :data:`NOT_KEYED`, the data set by digest, the
        setting's regime, ``n`` and seed."""
        fields = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in NOT_KEYED
        }
        return {
            "protocol": "wslib.fusion.ch10_regimes.RegimeStudy.fuse_setting",
            "data": self.digest,
            "regime": self.regimes[regime],
            "n": n,
            "seed": s,
            **fields,
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
        self, settings: Iterable[tuple[str, int, int]], *, progress: bool = True
    ) -> tuple[pd.DataFrame, dict[str, list[float]]]:
        """Every setting (cached): one row per setting, method and importance; fusion seconds per method."""
        runs: list[dict[str, Any]] = []
        seconds: dict[str, list[float]] = {m: [] for m in self.methods}
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
    *,
    method: MethodName = "kf_linear",
    importance: ImportanceName = "conductance",
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
                class_weights=w,
                importance=importance,
                ridge=study.ridge,
                gradient=grad,
                seed=s,
            ),
            study.ds,
        )
        for name, w in rules.items()
    }


def method_groups(methods: Sequence[MethodName]) -> dict[str, list[str]]:
    """The methods in two figure panels: the baselines, and HF/KF with two references.

    Both panels show the mean individual model; the HF/KF panel also shows the
    ensemble when it ran.
    """
    references = ["individual"] + (["ensemble"] if "ensemble" in methods else [])
    return {
        "baselines": ["individual", *(m for m in methods if m not in HF_KF)],
        "HF / KF": [*references, *(m for m in methods if m in HF_KF)],
    }


def self_fusion(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    x_test: torch.Tensor,
    *,
    methods: Sequence[MethodName] = SELF_FUSION_METHODS,
    ridge: float = 1e-8,
) -> dict[str, float]:
    """Largest output difference on ``x_test`` between ``model`` and its fusion with a copy of itself.

    Outputs in float64 (:func:`~wslib.core.train.float64_outputs`), so that
    the difference is the fused weights' own, on any device.
    """
    pair = [model, copy.deepcopy(model)]
    ref = float64_outputs(model, x_test)
    return {
        m: float(
            (float64_outputs(fuse_by(m, pair, x, y, ridge=ridge), x_test) - ref)
            .abs()
            .max()
        )
        for m in methods
    }
