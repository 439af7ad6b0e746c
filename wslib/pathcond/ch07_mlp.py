"""Chapter 7 (``07_pathcond_mlp``): PathCond on MLPs, its protocol and its words.

The protocol: the chapter's seeds (:func:`mlp_seeds`), its grid of cached MLP
runs (:func:`mlp_grid`; the runs at the default recipe: :func:`default_jobs`),
the learning-rate tuning on a tuning seed (:func:`tune_rates`) and the
evaluation at the chosen rates (:func:`evaluate_rates`), where PathCond moves
scale between layers (:func:`layer_scale_rows`), the converged solver against
the paper's 10-sweep setting (:func:`solver_comparison`) and the cost of
rescaling per configuration (:func:`cost_rows`).

Its results (summaries, table rows, metrics, sentences) are in
:mod:`wslib.pathcond.ch07_results`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from wslib.core.configs import build_model
from wslib.core.data import DataKey, Dataset, load_dataset
from wslib.core.describe import mlp_sizes
from wslib.core.models import ActivationName
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.pathcond.grid import Job, Pair, RunGrid, has_output_bias, mlp_config
from wslib.pathcond.protocols import RUNS_DIR, Run, rescale_cost
from wslib.pathcond.rescaling import am_over_gm, diag_g, rescalable_structure
from wslib.pathcond.solver import PAPER_SWEEPS, RescalingMethod, optimize_rescaling
from wslib.pathcond.training import InitMethod, prepare_model
from wslib.runs.stats import (
    RateSearch,
    search_rates,
)

#: the methods of chapter 7's rate search
SWEPT_METHODS: tuple[InitMethod, ...] = ("baseline", "pathcond")
# the two methods every comparison holds
PAIR_METHODS: tuple[InitMethod, ...] = ("baseline", "pathcond")

# --- the protocol -----------------------------------------------------------------


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
    *,
    workers: int | None = None,
    load: bool = True,
    stack: bool | None = None,
) -> RunGrid:
    """Chapter 7's :class:`~wslib.pathcond.grid.RunGrid` on the data set ``data``.

    Its runs are cached in :data:`~wslib.pathcond.protocols.RUNS_DIR`.
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
    activations: Sequence[ActivationName],
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
    *,
    threshold: float = 0.99,
) -> RateSearch[Pair]:
    """Each (configuration, method)'s best learning rate on the tuning ``seed``.

    The protocol of :func:`wslib.runs.stats.search_rates`: every pair trains
    for up to ``epochs`` at every rate of ``lr_grid``, then at its best rate
    times each of ``factors``; the best rate reaches ``threshold`` in the
    fewest epochs (ties: the higher accuracy at that epoch). A run stops at
    the epoch it reaches ``threshold``: nothing later enters the choice. A
    run that can no longer win stops early (the grid's runs first give up
    after half of ``epochs``), which leaves every choice unchanged.
    """

    def train(items: list[tuple[Pair, float, int | None]]) -> list[Run]:
        jobs = [
            grid.job(
                c, m, seed, lr=lr, epochs=epochs, stop_at=threshold, give_up_after=cap
            )
            for (c, m), lr, cap in items
        ]
        return grid.train(jobs, desc="lr sweep")

    return search_rates(
        train,
        pairs,
        lr_grid,
        factors,
        threshold=threshold,
        give_up_first=max(epochs // 2, 1),
    )


def evaluate_rates(
    grid: RunGrid, rates: dict[Pair, float], seeds: Sequence[int], epochs: int
) -> dict[Pair, list[Run]]:
    """Each pair trained at its rate in ``rates`` for ``epochs`` on the ``seeds``."""
    jobs = [
        grid.job(c, m, s, lr=lr, epochs=epochs)
        for (c, m), lr in rates.items()
        for s in seeds
    ]
    runs = iter(grid.train(jobs, desc="long runs"))
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
    linears = cast(
        "Sequence[torch.nn.Linear]", build_model(mlp_config(base, widths)).linears
    )
    first, second = linears[:2]
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
            prepare_model(config, m, init_scale=cfg["init_scale"], seed=seed)[0]
            for m in ("baseline", "pathcond")
        ]
        g_before, g_after = (diag_g(m, base["in_shape"]) for m in models)
        g_pairs[name] = g_before, g_after
        n_params = sum(p.numel() for p in models[0].parameters())
        before, after = (cast("Sequence[torch.nn.Linear]", m.linears) for m in models)
        for i, (lb, lp) in enumerate(zip(before, after)):
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
    after :data:`~wslib.pathcond.solver.PAPER_SWEEPS` sweeps (the paper's setting) and
    :data:`~wslib.pathcond.solver.PAPER_SWEEPS` sweeps of per-neuron coordinate descent (the
    authors' scheme, this library's implementation). Each is timed
    ``repeats`` times on one thread (medians). Also the median relative
    difference between the 10-sweep and the converged neuron scales.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    config = mlp_config(base, cfg["widths"], output_bias=has_output_bias(base, cfg))
    model, *_ = prepare_model(
        config, "baseline", init_scale=cfg["init_scale"], seed=seed
    )
    g = diag_g(model, base["in_shape"])
    structure = rescalable_structure(model)
    settings: dict[str, tuple[RescalingMethod, int, float]] = {
        "converged": ("block", 1000, 1e-12),
        f"block, {PAPER_SWEEPS} sweeps": ("block", PAPER_SWEEPS, 0.0),
        f"per neuron, {PAPER_SWEEPS} sweeps": ("neuron", PAPER_SWEEPS, 0.0),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = {
            k: [
                optimize_rescaling(
                    g, structure, method=method, max_sweeps=sweeps, rtol=rtol
                )
                for _ in range(repeats)
            ]
            for k, (method, sweeps, rtol) in settings.items()
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
    """:func:`~wslib.pathcond.protocols.rescale_cost` of each named MLP configuration (default init) on ``ds``."""
    rows = []
    for name, cfg in configs.items():
        out = has_output_bias(base, cfg)
        config = mlp_config(base, cfg["widths"], output_bias=out)
        rows.append(
            {
                "config": name,
                **rescale_cost(
                    config, ds, batch_size=batch_size, seed=seed, repeats=repeats
                ),
            }
        )
    return rows


# --- descriptions -----------------------------------------------------------------


def config_text(base: dict[str, Any], name: str, cfg: dict[str, Any]) -> str:
    """One configuration of chapter 7 in words: its MLP and initialisation."""
    init = (
        "default initialisation"
        if cfg["init_scale"] == 1.0
        else f"every parameter multiplied by $a={cfg['init_scale']:g}$"
    )
    head = "" if has_output_bias(base, cfg) else ", no output bias"
    return f"`{name}`: {mlp_sizes({**base, 'widths': cfg['widths']})}{head}, {init}"


def config_list(base: dict[str, Any], configs: dict[str, dict[str, Any]]) -> str:
    """The configurations as a Markdown list (:func:`config_text`), one sentence."""
    items = [f"- {config_text(base, n, c)}" for n, c in configs.items()]
    return ";\n".join(items) + "."


METHOD_TEXT = {
    "baseline": "PyTorch's default initialisation (**baseline**)",
    "kaiming": "**Kaiming normal** weights with zero biases (`kaiming`)",
    "pathcond": "the default initialisation rescaled by **PathCond**, its solver run "
    "to convergence (`pathcond`)",
    "pathcond_10": "the same with the paper's solver setting, stopped after "
    f"{PAPER_SWEEPS} sweeps (`pathcond_10`)",
    "enorm": "**ENorm** as Stock et al. (2019) run it (`enorm`): after every SGD step "
    "each hidden neuron is rescaled so that the 2-norms of its incoming and "
    "outgoing weights match, biases following their neuron (the function is "
    "kept); not the PathCond authors' variant, which skips the last hidden layer, "
    "uses norms from before the cycle and leaves biases alone",
}


def methods_list(configs: dict[str, dict[str, Any]]) -> str:
    """The initialisation methods used by ``configs`` as a Markdown list (first use order)."""
    methods = dict.fromkeys(m for cfg in configs.values() for m in cfg["methods"])
    return ";\n".join(f"- {METHOD_TEXT[m]}" for m in methods) + "."


def rate_range_text(rates: Sequence[float]) -> str:
    """``"from 3 down to 3e-06"``: the largest and smallest of ``rates``."""
    return f"from {max(rates):g} down to {min(rates):g}"
