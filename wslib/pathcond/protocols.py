"""What the PathCond chapters share: a run's type, the run cache, the cost of rescaling.

:func:`rescale_cost` times PathCond against one training epoch of the same
model; chapter 7 runs it per MLP configuration, chapter 8 per architecture.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from wslib.core.data import Dataset
from wslib.core.train import Recipe, fit
from wslib.pathcond.training import prepare_model

Run = dict[str, Any]  # one training run: per-epoch ``loss`` and ``acc``, test scores

COST_BATCH = 128  # batch size of the epoch that :func:`rescale_cost` times
RUNS_DIR = "data/runs"  #: the chapters' run cache, under the workspace's root


def rescale_cost(
    config: dict[str, Any],
    ds: Dataset,
    *,
    batch_size: int = COST_BATCH,
    seed: int = 0,
    repeats: int = 1,
) -> dict[str, float]:
    """Seconds to compute and apply PathCond vs one SGD epoch of ``config`` on ``ds``.

    Each of ``repeats`` rounds builds a fresh model, rescales it and trains it
    for one epoch over ``ds``'s training set, back to back in this process;
    the times are the medians over the rounds. Returns ``n_params``,
    ``rescale_seconds``, ``epoch_seconds`` and their ratio ``rescale_over_epoch``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    recipe = Recipe(
        epochs=1, batch_size=batch_size, lr=1e-3, momentum=0.0, weight_decay=0.0
    )
    rescale, epoch = [], []
    for _ in range(repeats):
        model, seconds, _ = prepare_model(config, "pathcond", init_scale=1.0, seed=seed)
        start = time.perf_counter()
        fit(model, ds.x_train, ds.y_train, recipe, seed=seed, progress=False)
        epoch.append(time.perf_counter() - start)
        rescale.append(seconds)
    rescale_seconds, epoch_seconds = float(np.median(rescale)), float(np.median(epoch))
    return {
        "n_params": float(sum(p.numel() for p in model.parameters())),
        "rescale_seconds": rescale_seconds,
        "epoch_seconds": epoch_seconds,
        "rescale_over_epoch": rescale_seconds / epoch_seconds,
    }
