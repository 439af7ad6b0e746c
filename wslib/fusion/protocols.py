"""What the fusion chapters share: base models from the zoo, fusion sets, test accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from wslib.core.data import Dataset, balanced_subset, class_counts
from wslib.core.files import tensor_digest
from wslib.core.seeds import derive_seed
from wslib.core.train import (
    evaluate,
)
from wslib.runs.verdicts import POINTS_MARGIN, decide_independent
from wslib.runs.zoo import TRAINING_CODE, Zoo, split_indices

FUSION_CODE = (
    *TRAINING_CODE,
    "wslib.core.matching",
    "wslib.core.norms",
    "wslib.fusion",
)
"""The modules whose source determines a cached fusion result: the code that
trains the base models (:data:`wslib.runs.zoo.TRAINING_CODE`), the core
modules the fusion methods call, and the whole fusion package."""


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


def beats(values: Sequence[float], reference: Sequence[float]) -> str:
    """ "beats" / "does not beat" by the book's rule (:mod:`wslib.runs.verdicts`)
    on two cells' per-seed accuracies in points (independent samples, Welch's
    95% interval; within 1 point by the equivalence test: level); one seed on
    either side gives the sign, undecided."""
    d = decide_independent(values, reference, margin=POINTS_MARGIN)
    return d.word(
        "beats",
        "does not beat",
        "is level (within 1 point) with",
        "is undecided (the 95% interval of the gap reaches zero) against",
    )
