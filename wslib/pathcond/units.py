"""Chapters 7 and 8 as independent units of cached training runs.

See :mod:`wslib.runs.units`. Every unit calls the library functions the
chapter's notebook calls, with the arguments it builds from its parameters
(through the shared setup: :func:`~wslib.pathcond.ch07_mlp.mlp_seeds`,
:func:`~wslib.pathcond.ch07_mlp.mlp_grid`,
:func:`~wslib.core.seeds.derive_seeds`), so each fills the run
cache entries the notebook then reads.

Chapter 7 (:func:`mlp_units`):

- stage 0: the runs at the default recipe, one unit per configuration (or
  hidden size, or activation) and method over the evaluation seeds; the rate
  search's grid, one unit per swept (configuration, method);
- stage 1: each swept pair's refinement around its best grid rate (the search
  is rerun for that pair alone: its grid runs are cache hits, and a pair's
  best rate depends on its own runs only);
- stage 2: each swept pair's long runs on the evaluation seeds at the rate
  the whole search picks (rerun from the cache).

Chapter 8 (:func:`conv_units`): one unit per architecture, method and seed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from wslib.core.data import Dataset, load_dataset
from wslib.core.seeds import derive_seeds
from wslib.pathcond.ch07_mlp import (
    activation_warnings_ignored,
    default_jobs,
    evaluate_rates,
    mlp_grid,
    mlp_seeds,
    swept_pairs,
    tune_rates,
)
from wslib.pathcond.ch08_conv import train_archs
from wslib.pathcond.grid import Job, Pair, RunGrid
from wslib.pathcond.protocols import RUNS_DIR
from wslib.pathcond.training import InitMethod
from wslib.runs.stats import RateSearch
from wslib.runs.units import Params, Unit


def job_group(grid: RunGrid, job: Job) -> str:
    """The name of ``job``'s group of seeds: configuration, widths and activation
    where they differ from the configuration's, method."""
    parts = [job.config]
    if list(job.widths) != list(grid.configs[job.config]["widths"]):
        parts.append("widths " + "x".join(map(str, job.widths)))
    if job.activation != "relu":
        parts.append(job.activation)
    return " ".join([*parts, job.method])


def group_by_seed(grid: RunGrid, jobs: Sequence[Job]) -> dict[str, list[Job]]:
    """``jobs`` grouped by everything but their seed, named by :func:`job_group`.

    Raises ValueError if two groups get one name (they would differ in a field
    the name leaves out, e.g. the learning rate).
    """
    groups: dict[Job, list[Job]] = {}
    for job in dict.fromkeys(jobs):
        groups.setdefault(job._replace(seed=0), []).append(job)
    named: dict[str, list[Job]] = {}
    for members in groups.values():
        name = job_group(grid, members[0])
        if name in named:
            raise ValueError(f"two groups of runs are both named {name!r}")
        named[name] = members
    return named


def mlp_units(params: Params) -> list[Unit]:
    """Chapter 7's units (``07_pathcond_mlp``) for its effective ``params``."""
    p = params
    seeds = mlp_seeds(p["seed"], p["n_seeds"], p["n_activation_seeds"])
    grid_args = (p["data"], p["mlp"], p["recipe"], p["configs"])

    @functools.cache
    def grid() -> RunGrid:  # loaded on the first unit run, shared by the others
        return mlp_grid(*grid_args, workers=p["workers"], stack=p["stack"])

    listed = mlp_grid(*grid_args, workers=p["workers"], load=False)
    jobs = default_jobs(
        listed,
        seeds.evaluation,
        p["size_sweep"],
        p["activation_config"],
        p["activations"],
        seeds.activation,
    )
    units = [
        Unit(f"runs {name}", 0, functools.partial(_train, grid, group))
        for name, group in group_by_seed(listed, jobs).items()
    ]

    def search(pair: Pair, factors: Sequence[float]) -> RateSearch[Pair]:
        return tune_rates(
            grid(),
            [pair],
            p["lr_grid"],
            factors,
            seeds.tuning,
            p["long_epochs"],
            threshold=p["threshold"],
        )

    def long_runs(pair: Pair) -> None:
        rate = search(pair, p["lr_refine"]).best[pair]
        evaluate_rates(grid(), {pair: rate}, seeds.evaluation, p["long_epochs"])

    for pair in swept_pairs(p["lr_sweep_configs"]):
        name = " ".join(pair)
        units += [
            # no refinement factors: the search trains its grid only
            Unit(f"lr grid {name}", 0, functools.partial(search, pair, ())),
            Unit(
                f"lr refine {name}", 1, functools.partial(search, pair, p["lr_refine"])
            ),
            Unit(f"long runs {name}", 2, functools.partial(long_runs, pair)),
        ]
    return units


def _train(grid: Callable[[], RunGrid], jobs: list[Job]) -> None:
    with activation_warnings_ignored():
        grid().train(jobs, desc="runs")


def conv_units(params: Params) -> list[Unit]:
    """Chapter 8's units (``08_pathcond_conv``) for its effective ``params``."""
    p = params
    seeds = derive_seeds(p["seed"], "run", p["n_seeds"])

    @functools.cache
    def ds() -> Dataset:  # loaded on the first unit run, shared by the others
        return load_dataset(**p["data"])

    def train(arch: str, method: InitMethod, seed: int) -> None:
        train_archs(
            {arch: p["archs"][arch]}, [method], [seed], ds(), cache_dir=RUNS_DIR
        )

    return [
        Unit(f"{arch} {method} seed {s}", 0, functools.partial(train, arch, method, s))
        for arch in p["archs"]
        for method in p["methods"]
        for s in seeds
    ]
