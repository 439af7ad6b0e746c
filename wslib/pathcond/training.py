"""One initialisation method (baseline, Kaiming, PathCond, ENorm), one training run, cached."""

from __future__ import annotations

import functools
import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from wslib.core.configs import build_model, check_fits_data
from wslib.core.data import DataKey, Dataset
from wslib.core.files import tensor_digest
from wslib.core.settings import Settings
from wslib.core.stacked import fit_stacked, stack_signature
from wslib.core.train import (
    Recipe,
    evaluate,
    fit,
    pick_device,
    predict,
    seed_everything,
)
from wslib.pathcond.enorm import enorm_callback
from wslib.pathcond.rescaling import pathcond_rescale
from wslib.pathcond.solver import PAPER_SWEEPS, PathCondResult
from wslib.runs.cache import cached_run, stored_run
from wslib.runs.units import refuse_compute
from wslib.runs.workers import run_jobs

# The modules whose source determines a run's result (its run-cache key).
#: The modules whose source keys a cached training run.
CODE = (
    "wslib.core.configs",
    "wslib.core.settings",
    "wslib.core.models",
    "wslib.core.pooling",
    "wslib.core.neurons",
    "wslib.core.seeds",
    "wslib.core.stacked",
    "wslib.core.train",
    "wslib.core.recipes",
    "wslib.pathcond.enorm",
    "wslib.pathcond.rescaling",
    "wslib.pathcond.solver",
    "wslib.pathcond.training",
)
# How a model is initialised before training (:data:`INIT_METHODS` lists them at run time).
InitMethod = Literal["baseline", "kaiming", "pathcond", "pathcond_10", "enorm"]
INIT_METHODS: tuple[InitMethod, ...] = get_args(InitMethod)
# What a run trains the model for (:data:`TASKS` lists them at run time).
TaskName = Literal["classify", "autoencoder"]
TASKS: tuple[TaskName, ...] = get_args(TaskName)


class Prepared(NamedTuple):
    """A model initialised by a method, with the seconds and outcome of its rescaling.

    ``solver`` is PathCond's :class:`~wslib.pathcond.solver.PathCondResult`
    (``None`` for the methods that do not rescale at initialisation).
    """

    model: nn.Module
    seconds: float
    solver: PathCondResult | None


def solver_report(solver: PathCondResult | None) -> dict[str, Any]:
    """Whether PathCond's solver converged, its sweeps and its last relative drop of F."""
    if solver is None:
        return {
            "rescale_converged": None,
            "rescale_sweeps": 0,
            "rescale_last_drop": None,
        }
    f = solver.objective
    drop = abs(f[-2] - f[-1]) / max(abs(f[-1]), 1e-300) if len(f) > 1 else 0.0
    return {
        "rescale_converged": bool(solver.converged),
        "rescale_sweeps": solver.sweeps,
        "rescale_last_drop": float(drop),
    }


def prepare_model(
    config: dict[str, Any],
    method: InitMethod,
    *,
    init_scale: float = 1.0,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> Prepared:
    """Build ``config`` with ``seed``, initialise it by ``method``, on ``device``.

    The model is built on the CPU (the same initial weights on every device),
    then moved to ``device`` (default: :func:`~wslib.core.train.pick_device`)
    before any rescaling, so the rescale is computed and timed where the
    model trains.

    ``baseline``: PyTorch's default initialisation; ``kaiming``: Kaiming-normal
    weights (fan-in, ReLU gain) and zero biases; ``pathcond``: default
    initialisation rescaled by PathCond (solver run to convergence);
    ``pathcond_10``: the same with the paper's solver setting (stopped after
    :data:`~wslib.pathcond.solver.PAPER_SWEEPS` sweeps); ``enorm``: default initialisation
    (ENorm acts during training). Every parameter is first multiplied by
    ``init_scale`` (low-variance initialisation), before any rescaling.
    """
    if method not in INIT_METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {INIT_METHODS}")
    if init_scale <= 0:
        raise ValueError(f"init_scale must be positive, got {init_scale}")
    seed_everything(seed)
    model = build_model(config)
    with torch.no_grad():
        if method == "kaiming":
            for module in model.modules():
                if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                    nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
        for p in model.parameters():
            p.mul_(init_scale)
    dev = pick_device(device)
    model.to(dev)
    if method not in ("pathcond", "pathcond_10"):
        return Prepared(model, 0.0, None)
    paper = method == "pathcond_10"
    sweeps = PAPER_SWEEPS if paper else 1000
    start = time.perf_counter()
    with warnings.catch_warnings():  # not converged: reported in the run's result
        warnings.simplefilter("ignore", UserWarning)
        solver = pathcond_rescale(
            model, config["in_shape"], max_sweeps=sweeps, rtol=0.0 if paper else 1e-12
        )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return Prepared(model, time.perf_counter() - start, solver)


@dataclass(frozen=True, kw_only=True)
class TrainSettings(Settings):
    """Everything but the data that determines a training run of :func:`train_run`.

    ``model`` (a model config) prepared by ``method`` (see
    :func:`prepare_model`, with ``init_scale`` and ``seed``) and trained with
    ``recipe`` on ``seed`` for ``task``. With ``stop_at``, the run ends after
    the first epoch whose running training accuracy reaches it, or with
    ``give_up_after`` after that epoch if it has not (see
    :func:`wslib.core.train.fit`).
    """

    model: dict[str, Any]
    method: InitMethod
    recipe: Recipe
    seed: int = 0
    init_scale: float = 1.0
    task: TaskName = "classify"
    stop_at: float | None = None
    give_up_after: int | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; valid: {TASKS}")


def train_run(
    settings: TrainSettings,
    ds: Dataset | DataKey,
    *,
    device: str | torch.device | None = None,
    progress: bool = False,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """The run ``settings`` describe (:class:`TrainSettings`) on ``ds``: a model
    prepared by its method and trained with its recipe (ENorm: after every step).

    With ``cache_dir``, the result is stored there (see :mod:`wslib.runs.cache`)
    under the run's full description (:func:`run_key`: the data set's name and
    content, and ``settings.key()``) and the source of :data:`CODE`, and a
    later call with the same description and code loads it.

    Returns the per-epoch training ``loss`` and running ``acc`` (from
    :func:`wslib.core.train.fit`), ``test_loss``, ``test_acc`` (NaN for the
    autoencoder, whose loss is the MSE of reconstructing the flattened input),
    ``rescale_seconds``, ``epoch_seconds`` (the training's seconds per epoch
    of its history, whose repeated epochs of a diverged run took none) and the
    PathCond solver's :func:`solver_report` (did it converge, in how many
    sweeps, how far from converged: its last relative drop of F).
    """
    if isinstance(ds, DataKey):
        ds = ds.load()
    classes = ds.n_classes if settings.task == "classify" else None
    check_fits_data(settings.model, tuple(ds.x_train.shape[1:]), classes, ds.name)
    run = functools.partial(_train_run, settings, ds, device, progress)
    return cached_run(cache_dir, run_key(settings, ds), run, code=CODE)


def run_key(settings: TrainSettings, ds: Dataset) -> dict[str, Any]:
    """A training run's full description: its key in the run cache."""
    return {
        "data": {
            "name": ds.name,
            "content": tensor_digest(ds.x_train, ds.y_train, ds.x_test, ds.y_test),
        },
        **settings.key(),
    }


def _train_run(
    settings: TrainSettings,
    ds: Dataset,
    device: str | torch.device | None,
    progress: bool,
) -> dict[str, Any]:
    model, rescale_seconds, solver = prepare_model(
        settings.model,
        settings.method,
        init_scale=settings.init_scale,
        seed=settings.seed,
        device=device,
    )
    on_step = enorm_callback() if settings.method == "enorm" else None
    auto = settings.task == "autoencoder"
    y_train = ds.x_train.flatten(1) if auto else ds.y_train
    start = time.perf_counter()
    hist = fit(
        model,
        ds.x_train,
        y_train,
        settings.recipe,
        seed=settings.seed,
        device=device,
        progress=progress,
        on_step=on_step,
        loss_fn=F.mse_loss if auto else None,
        stop_at=settings.stop_at,
        give_up_after=settings.give_up_after,
    )
    epoch_seconds = (time.perf_counter() - start) / max(len(hist["loss"]), 1)
    if auto:
        out = predict(model, ds.x_test)
        test_loss, test_acc = float(F.mse_loss(out, ds.x_test.flatten(1))), float("nan")
    else:
        test_loss, test_acc = evaluate(model, ds.x_test, ds.y_test)
    return {
        "loss": hist["loss"],
        "acc": hist["acc"],
        "test_loss": test_loss,
        "test_acc": test_acc,
        "rescale_seconds": rescale_seconds,
        "epoch_seconds": epoch_seconds,
        **solver_report(solver),
    }


# --- many runs: stacked on a GPU, in worker processes on a CPU ----------------------


def stackable(job: dict[str, Any]) -> bool:
    """Whether :func:`train_run`'s arguments ``job`` can train in a stacked group.

    Stacked runs share every step (:mod:`wslib.core.stacked`): an MLP
    classifier trained by SGD without augmentation, initialised by any method
    but ENorm (which rescales after each step of its own run).
    """
    settings: TrainSettings = job["settings"]
    return (
        settings.model.get("name") == "mlp"
        and settings.method != "enorm"
        and settings.task == "classify"
        and settings.recipe.optimizer == "sgd"
        and not settings.recipe.augment
    )


def train_runs(
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int | None = None,
    desc: str = "runs",
    stack: bool | None = None,
) -> list[dict[str, Any]]:
    """``[train_run(**job) for job in jobs]`` (each job: the keyword arguments
    of :func:`train_run`), stacked where that pays.

    With ``stack`` (default: on CUDA), the :func:`stackable` runs of one model
    shape and one recipe but for the learning rate train as one stacked model;
    each is cached on its own, under its key marked ``stacked`` (a batched
    kernel rounds differently from a solo one). The other runs, and every run
    when ``stack`` is off, go to :func:`~wslib.runs.workers.run_jobs`.
    """
    if stack is None:
        stack = pick_device().type == "cuda"
    together = [i for i, job in enumerate(jobs) if stack and stackable(job)]
    apart = sorted(set(range(len(jobs))) - set(together))
    results = dict(
        zip(
            apart,
            run_jobs(train_run, [jobs[i] for i in apart], workers=workers, desc=desc),
        )
    )
    groups: dict[str, list[int]] = {}
    for i in together:
        settings = jobs[i]["settings"]
        stop = [settings.stop_at, settings.give_up_after]
        shape = [settings.model, stack_signature(settings.recipe), stop]
        groups.setdefault(json.dumps(shape, sort_keys=True), []).append(i)
    for ids in tqdm(groups.values(), desc=f"{desc}, stacked", disable=not groups):
        results.update(zip(ids, _train_group([jobs[i] for i in ids])))
    return [results[i] for i in range(len(jobs))]


def _train_group(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One stacked group: the runs the cache lacks trained together, each then stored."""
    data = jobs[0]["ds"]
    ds = data.load() if isinstance(data, DataKey) else data
    root = jobs[0].get("cache_dir")
    keys = [  # a stacked group trains classifiers (_fit_group): keyed as such
        {**run_key(replace(j["settings"], task="classify"), ds), "stacked": True}
        for j in jobs
    ]
    # a training run's result is a dict (never a list of rows)
    stored = [
        cast(dict[str, Any] | None, stored_run(root, key, code=CODE)) for key in keys
    ]
    missing = [i for i, result in enumerate(stored) if result is None]
    if missing:
        refuse_compute(f"{len(missing)} stacked runs")
    fresh = dict(zip(missing, _fit_group([jobs[i] for i in missing], ds)))
    return [
        result
        if result is not None
        else cached_run(root, keys[i], functools.partial(dict, fresh[i]), code=CODE)
        for i, result in enumerate(stored)
    ]


def _fit_group(jobs: list[dict[str, Any]], ds: Dataset) -> list[dict[str, Any]]:
    """Prepare each run's model by its method, train them stacked, evaluate each."""
    if not jobs:
        return []
    device = jobs[0].get("device")
    runs: list[TrainSettings] = [j["settings"] for j in jobs]
    prepared = [
        prepare_model(
            r.model, r.method, init_scale=r.init_scale, seed=r.seed, device=device
        )
        for r in runs
    ]
    models = [p.model for p in prepared]
    start = time.perf_counter()
    histories = fit_stacked(
        models,
        ds.x_train,
        ds.y_train,
        [r.recipe for r in runs],
        [r.seed for r in runs],
        device=device,
        progress=False,
        stop_at=runs[0].stop_at,
        give_up_after=runs[0].give_up_after,
    )
    epochs = max(len(h["loss"]) for h in histories)
    share = (time.perf_counter() - start) / len(jobs) / max(epochs, 1)
    results = []
    for p, hist in zip(prepared, histories, strict=True):
        test_loss, test_acc = evaluate(p.model, ds.x_test, ds.y_test)
        results.append(
            {
                "loss": hist["loss"],
                "acc": hist["acc"],
                "test_loss": test_loss,
                "test_acc": test_acc,
                "rescale_seconds": p.seconds,
                "epoch_seconds": share,  # its share of a stacked epoch
                **solver_report(p.solver),
            }
        )
    return results
