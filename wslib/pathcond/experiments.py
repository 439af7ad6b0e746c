"""The protocols the PathCond chapters run.

- chapter 6: the explicit path-lifting of a tiny network before and after
  PathCond (:func:`tiny_lifting`, :func:`lifting_spectra`), the one-pass
  ``diag(G)`` against brute force (:func:`diag_g_check`), the function kept
  by the rescaling (:func:`function_check`), two training trajectories from one
  function (:func:`trajectories`);
- chapter 7: a grid of cached MLP training runs (:class:`RunGrid`, built by
  :func:`mlp_grid` with the seeds of :func:`mlp_seeds`; its runs at the
  default recipe: :func:`default_jobs`), the
  learning-rate tuning protocol on a tuning seed (:func:`tune_rates`) and the
  evaluation at the chosen rates (:func:`evaluate_rates`), where PathCond
  moves scale between layers (:func:`layer_scale_rows`), the converged solver
  against the paper's 10-sweep setting (:func:`solver_comparison`), the cost
  of rescaling per configuration (:func:`cost_rows`);
- chapter 8: one training run per architecture, method and seed
  (:func:`train_archs`);
- chapters 7 and 8: the cost of rescaling against an epoch (:func:`rescale_cost`);
  their seeds come from :mod:`wslib.core.seeds` (chapter 7: :func:`mlp_seeds`).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wslib.core.data import DataKey, Dataset, load_dataset
from wslib.core.models import build_model
from wslib.core.neurons import random_scales, rescale_state
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.core.train import Recipe, fit, model_device, seed_everything
from wslib.pathcond.lifting import PathLifting, explicit_path_lifting, mlp_path_labels
from wslib.pathcond.rescaling import (
    PAPER_SWEEPS,
    am_over_gm,
    diag_g,
    optimize_rescaling,
    pathcond_rescale,
    rescalable_structure,
)
from wslib.pathcond.training import prepare_model, train_run, train_runs
from wslib.runs.stats import RateSearch, search_rates

Run = dict[str, Any]

COST_BATCH = 128  # batch size of the epoch that :func:`rescale_cost` times
RUNS_DIR = "data/runs"  #: the chapters' run cache, relative to the repository root
SWEPT_METHODS = ("baseline", "pathcond")  #: the methods of chapter 7's rate search


def rescale_cost(
    config: dict[str, Any],
    ds: Dataset,
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
        model, seconds, _ = prepare_model(config, "pathcond", 1.0, seed)
        start = time.perf_counter()
        fit(model, ds.x_train, ds.y_train, recipe, seed, progress=False)
        epoch.append(time.perf_counter() - start)
        rescale.append(seconds)
    rescale_seconds, epoch_seconds = float(np.median(rescale)), float(np.median(epoch))
    return {
        "n_params": float(sum(p.numel() for p in model.parameters())),
        "rescale_seconds": rescale_seconds,
        "epoch_seconds": epoch_seconds,
        "rescale_over_epoch": rescale_seconds / epoch_seconds,
    }


# --- chapter 6: path-lifting ------------------------------------------------------


@dataclass
class TinyLifting:
    """The explicit path-lifting of one network ``before`` and ``after`` PathCond."""

    before: PathLifting
    after: PathLifting
    n_neurons: int
    sweeps: int

    @property
    def n_paths(self) -> int:
        """Number of paths (entries of Phi)."""
        return self.before.phi.numel()

    @property
    def n_params(self) -> int:
        """Number of parameters (columns of the Jacobian)."""
        return self.before.jacobian.shape[1]

    @property
    def phi_change(self) -> float:
        """Largest change of an entry of Phi made by the rescaling (0 up to rounding)."""
        return float((self.after.phi - self.before.phi).abs().max())


def tiny_lifting(config: dict[str, Any], spread: float, seed: int = 0) -> TinyLifting:
    """Build ``config`` in float64, give its neurons random scales, then apply PathCond.

    The random positive scales (log-spread ``spread``) make a badly scaled
    network with the function of the initialised one; PathCond then rescales
    a copy. Both are lifted explicitly (:func:`~wslib.pathcond.lifting.explicit_path_lifting`).
    """
    seed_everything(seed)
    net = build_model(config).double()
    structure = net.neuron_structure()
    scales = random_scales(structure, spread, torch.Generator().manual_seed(seed))
    net.load_state_dict(rescale_state(net.state_dict(), structure, scales))
    before = explicit_path_lifting(net, config["in_shape"])
    conditioned = copy.deepcopy(net)
    solve = pathcond_rescale(conditioned, config["in_shape"])
    after = explicit_path_lifting(conditioned, config["in_shape"])
    n_neurons = sum(g.size for g in structure.groups if g.rescalable)
    return TinyLifting(before, after, n_neurons, int(solve.sweeps))


def path_rows(
    lifting: TinyLifting, config: dict[str, Any], n_rows: int = 10
) -> list[dict[str, Any]]:
    """About ``n_rows`` evenly spaced paths of an MLP ``config``: label, Phi before and after."""
    sizes = [math.prod(config["in_shape"]), *config["widths"], config["n_classes"]]
    labels = mlp_path_labels(sizes)
    step = max(1, lifting.n_paths // n_rows)
    return [
        {
            "path": labels[k],
            "Phi (before)": float(lifting.before.phi[k]),
            "Phi (after)": float(lifting.after.phi[k]),
        }
        for k in range(0, lifting.n_paths, step)
    ]


def lifting_spectra(lifting: TinyLifting) -> dict[str, Any]:
    """The spectra of ``P`` and ``G`` and the diagonal ``g``, before and after PathCond.

    ``ev_before`` / ``ev_after``: the non-zero spectrum of ``G`` (decreasing);
    ``p_vs_g``: largest relative difference between it and the top eigenvalues
    of ``P`` before PathCond; ``cond_*``: condition numbers on the range;
    ``g_*``: ``diag(G)`` per tensor; ``amgm_*``: its AM/GM.
    """
    before, after, n = lifting.before, lifting.after, lifting.n_neurons
    ev_before = before.range_spectrum(n).cpu().numpy()
    ev_after = after.range_spectrum(n).cpu().numpy()
    kernel = before.kernel.cpu().numpy()
    ev_p = np.sort(np.linalg.eigvalsh(kernel))[::-1][: len(ev_before)]
    g_before, g_after = before.diag_g(), after.diag_g()
    return {
        "ev_before": ev_before,
        "ev_after": ev_after,
        "p_vs_g": float(np.max(np.abs(ev_p - ev_before) / ev_before)),
        "cond_before": float(ev_before[0] / ev_before[-1]),
        "cond_after": float(ev_after[0] / ev_after[-1]),
        "g_before": g_before,
        "g_after": g_after,
        "amgm_before": am_over_gm(g_before),
        "amgm_after": am_over_gm(g_after),
    }


def diag_g_check(
    archs: dict[str, dict[str, Any]], seed: int = 0, noise: float = 0.2
) -> list[dict[str, Any]]:
    """The one-pass ``diag(G)`` against brute force, one row per architecture.

    Each model is built in float64 with ``seed``, its parameters perturbed by
    ``noise`` times a standard normal (so BN and biases are not at their
    defaults), and lifted explicitly; the row gives the largest relative error.
    """
    rows = []
    for name, config in tqdm(archs.items(), desc="brute force"):
        seed_everything(seed)
        model = build_model(config).double()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p))
        lifting = explicit_path_lifting(model, config["in_shape"])
        brute, fast = lifting.diag_g(), diag_g(model, config["in_shape"])
        err = max(
            float(((fast[n] - brute[n]).abs() / brute[n].abs().clamp_min(1e-300)).max())
            for n in brute
        )
        rows.append(
            {
                "architecture": name,
                "paths (incl. structural zeros)": lifting.phi.numel(),
                "parameters": sum(p.numel() for p in model.parameters()),
                "max rel. error": err,
            }
        )
    return rows


def function_check(
    archs: dict[str, dict[str, Any]], seed: int = 0, batch: int = 32
) -> list[dict[str, Any]]:
    """How much PathCond changes each model's outputs, in train and eval mode.

    Each model (float32, ``seed``) gets random neuron scales, then PathCond;
    the row gives the relative change of its outputs on ``batch`` random
    inputs against the original model, the solver's sweeps and seconds.
    """
    rows = []
    for name, config in tqdm(archs.items(), desc="architectures"):
        seed_everything(seed)
        model = build_model(config)
        x = torch.randn(batch, *config["in_shape"])
        structure = model.neuron_structure()
        scales = random_scales(structure, 1.0, torch.Generator().manual_seed(seed))
        rescaled = copy.deepcopy(model)
        rescaled.load_state_dict(rescale_state(model.state_dict(), structure, scales))
        start = time.perf_counter()
        res = pathcond_rescale(rescaled, config["in_shape"])
        seconds = time.perf_counter() - start
        row = {"architecture": name, "sweeps": res.sweeps, "rescale s": seconds}
        for mode in ("train", "eval"):
            a = copy.deepcopy(model).train(mode == "train")
            b = copy.deepcopy(rescaled).train(mode == "train")
            with torch.no_grad():
                ya, yb = a(x.to(model_device(a))), b(x.to(model_device(b)))
            row[f"rel. change ({mode})"] = float((yb - ya).norm() / ya.norm())
        rows.append(row)
    return rows


def trajectories(
    config: dict[str, Any],
    methods: Sequence[str],
    ds: Dataset,
    recipe: Recipe,
    seed: int = 0,
    init_scale: float = 1.0,
) -> dict[str, Run]:
    """One training run per method (not cached), each with its ``initial_loss``.

    ``initial_loss`` is the cross-entropy of the prepared model on the whole
    training set before the first step (the same for every method that keeps
    the function, as PathCond does).
    """
    runs = {
        method: train_run(config, method, ds, recipe, seed=seed, init_scale=init_scale)
        for method in tqdm(methods, desc="training")
    }
    for method in methods:
        model, *_ = prepare_model(config, method, init_scale, seed)
        with torch.no_grad():
            out = model(ds.x_train.to(model_device(model)))
            loss = F.cross_entropy(out, ds.y_train.to(out.device))
        runs[method]["initial_loss"] = float(loss)
    return runs


# --- chapter 7: MLP training runs -------------------------------------------------


class Job(NamedTuple):
    """One MLP training run of a :class:`RunGrid`."""

    config: str
    widths: tuple[int, ...]
    init_scale: float
    activation: str
    method: str
    lr: float
    seed: int
    epochs: int
    output_bias: bool = True
    stop_at: float | None = None  # end the run once its accuracy reaches this


def mlp_config(
    base: dict[str, Any],
    widths: Sequence[int],
    activation: str = "relu",
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
    ``recipe`` is the default recipe (a dict of :class:`~wslib.core.train.Recipe` fields). Runs
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
    def dataset(self) -> Dataset | None:
        """The data set itself (loaded here once if ``ds`` is a key)."""
        return self.ds.load() if isinstance(self.ds, DataKey) else self.ds

    def job(
        self,
        config: str,
        method: str,
        seed: int,
        lr: float | None = None,
        epochs: int | None = None,
        widths: Sequence[int] | None = None,
        activation: str = "relu",
        stop_at: float | None = None,
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
        )

    def arguments(self, job: Job) -> dict[str, Any]:
        """The keyword arguments of :func:`~wslib.pathcond.training.train_run` for ``job``."""
        recipe = Recipe(**{**self.recipe, "lr": job.lr, "epochs": job.epochs})
        return {
            "config": mlp_config(
                self.base, job.widths, job.activation, job.output_bias
            ),
            "method": job.method,
            "ds": self.ds,
            "recipe": recipe,
            "seed": job.seed,
            "init_scale": job.init_scale,
            "cache_dir": self.cache_dir,
            "stop_at": job.stop_at,
        }

    def train(self, jobs: Sequence[Job], desc: str = "runs") -> list[Run]:
        """Train the ``jobs`` not trained yet (one :func:`~wslib.pathcond.training.train_runs` call); return all runs."""
        todo = [job for job in dict.fromkeys(jobs) if job not in self.runs]
        if todo and self.ds is None:
            raise ValueError(
                "this RunGrid has no data set (built with load=False): it lists "
                "jobs but cannot train them; build it with load=True to train"
            )
        done = train_runs(
            [self.arguments(j) for j in todo], self.workers, desc, self.stack
        )
        self.runs.update(zip(todo, done, strict=True))
        return [self.runs[job] for job in jobs]

    def select(
        self, config: str, method: str, seeds: Sequence[int], **options: Any
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
        methods: Sequence[str] = ("baseline", "pathcond"),
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
        activations: Sequence[str],
        seeds: Sequence[int],
        methods: Sequence[str] = ("baseline", "pathcond"),
    ) -> list[Job]:
        """``config`` with each of ``activations`` instead of ReLU."""
        return [
            self.job(config, method, s, activation=act)
            for act in activations
            for method in methods
            for s in seeds
        ]


Pair = tuple[str, str]  # (configuration, method)


class MlpSeeds(NamedTuple):
    """Chapter 7's seeds: ``evaluation``, ``tuning`` (the rate search) and ``activation``."""

    evaluation: list[int]
    tuning: int
    activation: list[int]


def mlp_seeds(seed: int, n_seeds: int, n_activation_seeds: int) -> MlpSeeds:
    """Chapter 7's seeds from its ``seed``: the evaluation runs (role ``"run"``),
    the rate search (role ``"tune"``, never evaluated) and the GELU/SiLU runs
    (the first ``n_activation_seeds`` evaluation seeds)."""
    return MlpSeeds(
        derive_seeds(seed, "run", n_seeds),
        derive_seed(seed, "tune"),
        derive_seeds(seed, "run", n_activation_seeds),
    )


def mlp_grid(
    data: dict[str, Any],
    mlp: dict[str, Any],
    recipe: dict[str, Any],
    configs: dict[str, dict[str, Any]],
    workers: int | None = None,
    load: bool = True,
    stack: bool | None = None,
) -> RunGrid:
    """Chapter 7's :class:`RunGrid`, cached in :data:`RUNS_DIR`, on the data set ``data``.

    ``data`` holds the arguments of :func:`~wslib.core.data.load_dataset`; with ``load=False``
    nothing is loaded and the grid only lists jobs (training raises).
    ``stack``: see :func:`~wslib.pathcond.training.train_runs`.
    """
    key = DataKey.of(data, load_dataset(**data)) if load else None
    return RunGrid(mlp, key, recipe, configs, RUNS_DIR, workers, stack)


def default_jobs(
    grid: RunGrid,
    seeds: Sequence[int],
    size_sweep: dict[str, Any],
    activation_config: str,
    activations: Sequence[str],
    activation_seeds: Sequence[int],
) -> list[Job]:
    """Chapter 7's runs at the default recipe: every configuration and method on
    ``seeds``, the hidden sizes of ``size_sweep`` (``config``, ``widths``), and
    ``activation_config`` with each of ``activations`` on ``activation_seeds``."""
    return [
        *grid.config_jobs(seeds),
        *grid.size_jobs(size_sweep["config"], size_sweep["widths"], seeds),
        *grid.activation_jobs(activation_config, activations, activation_seeds),
    ]


@contextmanager
def activation_warnings_ignored() -> Iterator[None]:
    """Silence PathCond's warning that GELU/SiLU make its invariance approximate.

    The chapter trains GELU/SiLU networks knowing this; any other warning shows.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="GELU/SiLU")
        yield


def swept_pairs(configs: Sequence[str]) -> list[Pair]:
    """The (configuration, method) pairs of chapter 7's rate search: :data:`SWEPT_METHODS`."""
    return [(name, method) for name in configs for method in SWEPT_METHODS]


def tune_rates(
    grid: RunGrid,
    pairs: Sequence[Pair],
    lr_grid: Sequence[float],
    factors: Sequence[float],
    seed: int,
    epochs: int,
    threshold: float = 0.99,
) -> RateSearch[Pair]:
    """Each (configuration, method)'s best learning rate on the tuning ``seed``.

    The protocol of :func:`wslib.runs.stats.search_rates`: every pair trains
    for up to ``epochs`` at every rate of ``lr_grid``, then at its best rate
    times each of ``factors``; the best rate reaches ``threshold`` in the
    fewest epochs (ties: the higher accuracy at that epoch). A run stops at
    the epoch it reaches ``threshold``: nothing later enters the choice.
    """

    def train(items: list[tuple[Pair, float]]) -> list[Run]:
        jobs = [
            grid.job(c, m, seed, lr=lr, epochs=epochs, stop_at=threshold)
            for (c, m), lr in items
        ]
        return grid.train(jobs, "lr sweep")

    return search_rates(train, pairs, lr_grid, factors, threshold)


def evaluate_rates(
    grid: RunGrid, rates: dict[Pair, float], seeds: Sequence[int], epochs: int
) -> dict[Pair, list[Run]]:
    """Each pair trained at its rate in ``rates`` for ``epochs`` on the ``seeds``."""
    jobs = [
        grid.job(c, m, s, lr=lr, epochs=epochs)
        for (c, m), lr in rates.items()
        for s in seeds
    ]
    runs = iter(grid.train(jobs, "long runs"))
    return {pair: [next(runs) for _ in seeds] for pair in rates}


def g_share(g: dict[str, torch.Tensor], prefix: str) -> float:
    """The share of ``sum(g)`` held by the parameters whose names start with ``prefix``."""
    total = sum(float(v.double().sum()) for v in g.values())
    part = sum(float(v.double().sum()) for k, v in g.items() if k.startswith(prefix))
    return part / total


def head_bias(widths: Sequence[int]) -> str:
    """The name of the output layer's bias in an MLP of hidden ``widths``."""
    return f"linears.{len(widths)}.bias"


def first_layer_fan(base: dict[str, Any], widths: Sequence[int]) -> tuple[int, int]:
    """Parameters into (weights and bias) and out of one first-layer neuron of an MLP."""
    first, second = build_model(mlp_config(base, widths)).linears[:2]
    return first.in_features + 1, second.out_features


def layer_scale_rows(
    base: dict[str, Any], configs: dict[str, dict[str, Any]], seed: int
) -> tuple[list[dict[str, Any]], dict[str, tuple[dict, dict]]]:
    """Per configuration and layer: where ``g`` and the weights sit before and after PathCond.

    Each row gives the layer's share of the parameters and of ``sum(g)``
    (weights and bias), the log10 geometric mean of ``g`` over its weights and
    their mean absolute value; a configuration's last row also gives the
    AM/GM of ``g``. Also returns ``(g before, g after)`` per configuration.
    """
    rows, g_pairs = [], {}
    for name, cfg in configs.items():
        config = mlp_config(base, cfg["widths"], output_bias=has_output_bias(base, cfg))
        models = [
            prepare_model(config, m, cfg["init_scale"], seed)[0]
            for m in ("baseline", "pathcond")
        ]
        g_before, g_after = (diag_g(m, base["in_shape"]) for m in models)
        g_pairs[name] = g_before, g_after
        n_params = sum(p.numel() for p in models[0].parameters())
        for i, (lb, lp) in enumerate(zip(models[0].linears, models[1].linears)):
            key = f"linears.{i}.weight"
            rows.append(
                {
                    "config": name,
                    "layer": i,
                    "share of params": lb.weight.numel() / n_params,
                    "share of Σg before": g_share(g_before, f"linears.{i}."),
                    "share of Σg after": g_share(g_after, f"linears.{i}."),
                    "log10 GM g before": float(g_before[key].double().log10().mean()),
                    "log10 GM g after": float(g_after[key].double().log10().mean()),
                    "mean |W| before": float(lb.weight.detach().abs().mean()),
                    "mean |W| after": float(lp.weight.detach().abs().mean()),
                }
            )
        rows[-1]["AM/GM of g before -> after"] = (
            f"{am_over_gm(g_before):.3g} -> {am_over_gm(g_after):.3g}"
        )
    return rows, g_pairs


def solver_comparison(
    base: dict[str, Any], name: str, cfg: dict[str, Any], seed: int, repeats: int
) -> dict[str, Any]:
    """The book's converged solver against the paper's 10-sweep setting, same weights.

    On ``cfg``'s MLP (default initialisation times its ``init_scale``, ``seed``),
    one ``g``: the block solver run to convergence, the block solver stopped
    after :data:`~wslib.pathcond.rescaling.PAPER_SWEEPS` sweeps (the paper's setting) and
    :data:`~wslib.pathcond.rescaling.PAPER_SWEEPS` sweeps of per-neuron coordinate descent (the
    authors' scheme, this library's implementation). Each is timed
    ``repeats`` times on one thread (medians). Also the median relative
    difference between the 10-sweep and the converged neuron scales.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    config = mlp_config(base, cfg["widths"], output_bias=has_output_bias(base, cfg))
    model, *_ = prepare_model(config, "baseline", cfg["init_scale"], seed)
    g = diag_g(model, base["in_shape"])
    structure = rescalable_structure(model)
    settings = {
        "converged": ("block", 1000, 1e-12),
        f"block, {PAPER_SWEEPS} sweeps": ("block", PAPER_SWEEPS, 0.0),
        f"per neuron, {PAPER_SWEEPS} sweeps": ("neuron", PAPER_SWEEPS, 0.0),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = {
            k: [optimize_rescaling(g, structure, *v) for _ in range(repeats)]
            for k, v in settings.items()
        }
    finally:
        torch.set_num_threads(threads)
    row: dict[str, Any] = {"config": name}
    for key, res in results.items():
        row[f"F ({key})"] = res[0].objective[-1]
        row[f"s ({key})"] = float(np.median([r.seconds for r in res]))
    row["sweeps (converged)"] = results["converged"][0].sweeps
    full = results["converged"][0].z
    paper = results[f"block, {PAPER_SWEEPS} sweeps"][0].z
    diff = np.concatenate([np.abs(np.expm1((paper[k] - full[k]) / 2)) for k in full])
    row["median scale diff. (10 sweeps vs converged)"] = float(np.median(diff))
    return row


def cost_rows(
    base: dict[str, Any],
    configs: dict[str, dict[str, Any]],
    ds: Dataset,
    batch_size: int,
    seed: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """:func:`rescale_cost` of each named MLP configuration (default init) on ``ds``."""
    rows = []
    for name, cfg in configs.items():
        out = has_output_bias(base, cfg)
        config = mlp_config(base, cfg["widths"], output_bias=out)
        rows.append(
            {"config": name, **rescale_cost(config, ds, batch_size, seed, repeats)}
        )
    return rows


# --- chapter 8: architectures -----------------------------------------------------


def train_archs(
    archs: dict[str, dict[str, Any]],
    methods: Sequence[str],
    seeds: Sequence[int],
    ds: Dataset,
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
    runs = {}
    for arch, method, s in tqdm(jobs, desc="runs"):
        spec = archs[arch]
        runs[(arch, method, s)] = train_run(
            spec["model"],
            method,
            data[arch],
            Recipe(**spec["recipe"]),
            seed=s,
            task=spec["task"],
            cache_dir=cache_dir,
        )
    return runs


def rescale_costs(
    models: dict[str, dict[str, Any]], ds: Dataset, repeats: int = 1
) -> list[dict[str, Any]]:
    """:func:`rescale_cost` of each named model config on ``ds``, one row each."""
    return [
        {"model": name, **rescale_cost(config, ds, repeats=repeats)}
        for name, config in tqdm(models.items(), desc="cost")
    ]
