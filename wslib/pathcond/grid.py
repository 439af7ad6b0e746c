"""Cached training runs of named MLP configurations, trained in worker processes.

A :class:`RunGrid` names every run by a :class:`Job` (configuration, widths,
initialisation scale, activation, method, rate, seed, epochs) and trains the
ones it has not trained yet with :func:`~wslib.pathcond.training.train_runs`;
chapter 7 builds one (:func:`wslib.pathcond.ch07_mlp.mlp_grid`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from wslib.core.data import DataKey, Dataset
from wslib.core.models import ActivationName
from wslib.core.train import Recipe
from wslib.pathcond.protocols import Run
from wslib.pathcond.training import InitMethod, TrainSettings, train_runs

Pair = tuple[str, InitMethod]  # (configuration, method)


class Job(NamedTuple):
    """One MLP training run of a :class:`RunGrid`."""

    config: str
    widths: tuple[int, ...]
    init_scale: float
    activation: ActivationName
    method: InitMethod
    lr: float
    seed: int
    epochs: int
    output_bias: bool = True
    stop_at: float | None = None  # end the run once its accuracy reaches this
    give_up_after: int | None = None  # ... or after this epoch if it has not


def mlp_config(
    base: dict[str, Any],
    widths: Sequence[int],
    *,
    activation: ActivationName = "relu",
    output_bias: bool | None = None,
) -> dict[str, Any]:
    """The model config of an MLP: ``base`` (name, in_shape, n_classes), widths, activation.

    ``output_bias`` (a bias in the output layer) defaults to ``base``'s, else True.
    """
    if output_bias is None:
        output_bias = base.get("output_bias", True)
    return {
        **base,
        "widths": list(widths),
        "activation": activation,
        "output_bias": output_bias,
    }


def has_output_bias(base: dict[str, Any], cfg: dict[str, Any]) -> bool:
    """Whether configuration ``cfg`` has an output bias (its own key, else ``base``'s)."""
    return bool(cfg.get("output_bias", base.get("output_bias", True)))


@dataclass
class RunGrid:
    """Cached training runs of MLPs of named configurations, in worker processes.

    ``base`` holds the model's name, input shape and classes (and
    ``output_bias``); ``configs`` maps a configuration's name to its
    ``widths``, ``init_scale`` and ``methods`` (and optionally ``output_bias``);
    ``recipe`` is the default recipe (a dict of :class:`~wslib.core.recipes.Recipe` fields). Runs
    are stored in ``runs`` by :class:`Job` and in ``cache_dir`` on disk. A
    grid without a data set (``ds=None``) lists jobs but cannot train them.
    A :class:`~wslib.core.data.DataKey` as ``ds`` is what the jobs carry to
    the worker processes, each of which loads the data set once.
    """

    base: dict[str, Any]
    ds: Dataset | DataKey | None
    recipe: dict[str, Any]
    configs: dict[str, dict[str, Any]]
    cache_dir: str | Path | None = None
    workers: int | None = None
    stack: bool | None = None  # train stackable runs together (default: on CUDA)
    runs: dict[Job, Run] = field(default_factory=dict, repr=False)

    @property
    def dataset(self) -> Dataset:
        """The data set itself (loaded here once if ``ds`` is a key)."""
        if self.ds is None:
            raise ValueError(
                "this grid has no data set (ds=None): it lists jobs but cannot "
                "train them; build it with the data set or its key"
            )
        return self.ds.load() if isinstance(self.ds, DataKey) else self.ds

    def job(
        self,
        config: str,
        method: InitMethod,
        seed: int,
        *,
        lr: float | None = None,
        epochs: int | None = None,
        widths: Sequence[int] | None = None,
        activation: ActivationName = "relu",
        stop_at: float | None = None,
        give_up_after: int | None = None,
    ) -> Job:
        """The run of ``config`` by ``method`` on ``seed``; recipe and widths by default."""
        cfg = self.configs[config]
        return Job(
            config,
            tuple(cfg["widths"] if widths is None else widths),
            cfg["init_scale"],
            activation,
            method,
            self.recipe["lr"] if lr is None else lr,
            seed,
            self.recipe["epochs"] if epochs is None else epochs,
            has_output_bias(self.base, cfg),
            stop_at,
            give_up_after,
        )

    def arguments(self, job: Job) -> dict[str, Any]:
        """The keyword arguments of :func:`~wslib.pathcond.training.train_run` for ``job``."""
        recipe = Recipe(**{**self.recipe, "lr": job.lr, "epochs": job.epochs})
        settings = TrainSettings(
            model=mlp_config(
                self.base,
                job.widths,
                activation=job.activation,
                output_bias=job.output_bias,
            ),
            method=job.method,
            recipe=recipe,
            seed=job.seed,
            init_scale=job.init_scale,
            stop_at=job.stop_at,
            give_up_after=job.give_up_after,
        )
        return {"settings": settings, "ds": self.ds, "cache_dir": self.cache_dir}

    def train(self, jobs: Sequence[Job], *, desc: str = "runs") -> list[Run]:
        """Train the ``jobs`` not trained yet (one :func:`~wslib.pathcond.training.train_runs` call); return all runs."""
        todo = [job for job in dict.fromkeys(jobs) if job not in self.runs]
        if todo and self.ds is None:
            raise ValueError(
                "this RunGrid has no data set (built with load=False): it lists "
                "jobs but cannot train them; build it with load=True to train"
            )
        done = train_runs(
            [self.arguments(j) for j in todo],
            workers=self.workers,
            desc=desc,
            stack=self.stack,
        )
        self.runs.update(zip(todo, done, strict=True))
        return [self.runs[job] for job in jobs]

    def select(
        self, config: str, method: InitMethod, seeds: Sequence[int], **options: Any
    ) -> list[Run]:
        """The trained runs of ``config`` by ``method`` on ``seeds`` (options: see :meth:`job`)."""
        return [self.runs[self.job(config, method, s, **options)] for s in seeds]

    def config_jobs(self, seeds: Sequence[int]) -> list[Job]:
        """Every configuration with each of its methods on ``seeds``, default recipe."""
        return [
            self.job(name, method, s)
            for name, cfg in self.configs.items()
            for method in cfg["methods"]
            for s in seeds
        ]

    def size_jobs(
        self,
        config: str,
        sizes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        methods: Sequence[InitMethod] = ("baseline", "pathcond"),
    ) -> list[Job]:
        """``config`` with each of the hidden ``sizes`` (widths) instead of its own."""
        return [
            self.job(config, method, s, widths=widths)
            for widths in sizes
            for method in methods
            for s in seeds
        ]

    def activation_jobs(
        self,
        config: str,
        activations: Sequence[ActivationName],
        seeds: Sequence[int],
        *,
        methods: Sequence[InitMethod] = ("baseline", "pathcond"),
    ) -> list[Job]:
        """``config`` with each of ``activations`` instead of ReLU."""
        return [
            self.job(config, method, s, activation=act)
            for act in activations
            for method in methods
            for s in seeds
        ]
