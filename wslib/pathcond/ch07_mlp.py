"""Chapter 7 (``07_pathcond_mlp``): PathCond on MLPs, its protocol and its words.

The protocol: the chapter's seeds (:func:`mlp_seeds`), its grid of cached MLP
runs (:func:`mlp_grid`; the runs at the default recipe: :func:`default_jobs`),
the learning-rate tuning on a tuning seed (:func:`tune_rates`) and the
evaluation at the chosen rates (:func:`evaluate_rates`), where PathCond moves
scale between layers (:func:`layer_scale_rows`), the converged solver against
the paper's 10-sweep setting (:func:`solver_comparison`) and the cost of
rescaling per configuration (:func:`cost_rows`).

The results: summaries over seeds, table rows, the results-file metrics
(:func:`mlp_metrics`) and the sentences that state a comparison.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from wslib.core.data import DataKey, Dataset, load_dataset
from wslib.core.describe import mlp_sizes, percent
from wslib.core.models import ActivationName, build_model
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.pathcond.grid import Job, Pair, RunGrid, has_output_bias, mlp_config
from wslib.pathcond.protocols import RUNS_DIR, Run, rescale_cost
from wslib.pathcond.rescaling import (
    PAPER_SWEEPS,
    RescalingMethod,
    am_over_gm,
    diag_g,
    optimize_rescaling,
    rescalable_structure,
)
from wslib.pathcond.training import InitMethod, prepare_model
from wslib.runs.stats import (
    RateSearch,
    epochs_to,
    format_epochs,
    format_speedup,
    mean_std,
    search_rates,
    speedup,
    summarise_epochs,
)
from wslib.runs.verdicts import Verdict, decide_independent

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
    after :data:`~wslib.pathcond.rescaling.PAPER_SWEEPS` sweeps (the paper's setting) and
    :data:`~wslib.pathcond.rescaling.PAPER_SWEEPS` sweeps of per-neuron coordinate descent (the
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


def reached_text(epochs: dict[str, Any]) -> str:
    """How many runs of a :func:`~wslib.runs.stats.summarise_epochs` result reached the threshold: ``"2/3"``."""
    return f"{epochs['n_reached']}/{epochs['n_runs']}"


def rate_range_text(rates: Sequence[float]) -> str:
    """``"from 3 down to 3e-06"``: the largest and smallest of ``rates``."""
    return f"from {max(rates):g} down to {min(rates):g}"


# --- results ----------------------------------------------------------------------


def summarise_runs(runs: Sequence[Run], *, threshold: float = 0.99) -> dict[str, Any]:
    """Runs over seeds: ``epochs`` to ``threshold`` (:func:`~wslib.runs.stats.summarise_epochs`), mean
    and std of ``test_acc``, mean final training accuracy ``final_acc``."""
    test_acc, test_acc_std = mean_std([r["test_acc"] for r in runs])
    return {
        "epochs": summarise_epochs([r["acc"] for r in runs], threshold=threshold),
        # per run, in seed order (a run that never reached counts as its length)
        "epochs_per_run": [
            epochs_to(r["acc"], threshold=threshold) or len(r["acc"]) for r in runs
        ],
        "test_acc": test_acc,
        "test_acc_std": test_acc_std,
        "final_acc": float(np.mean([r["acc"][-1] for r in runs])),
    }


def summarise_grid(
    grid: RunGrid, seeds: Sequence[int], *, threshold: float = 0.99
) -> dict[Pair, dict[str, Any]]:
    """:func:`summarise_runs` of every (configuration, method) of ``grid`` on ``seeds``."""
    return {
        (name, method): summarise_runs(
            grid.select(name, method, seeds), threshold=threshold
        )
        for name, cfg in grid.configs.items()
        for method in cfg["methods"]
    }


def epochs_rows(
    summaries: dict[Pair, dict[str, Any]], *, threshold: float = 0.99
) -> list[dict[str, Any]]:
    """Table rows: epochs to ``threshold``, runs reaching it, test accuracy (mean ± std)."""
    pct = percent(threshold)
    return [
        {
            "config": name,
            "method": method,
            f"epochs to {pct}": format_epochs(s["epochs"]),
            f"runs reaching {pct}": reached_text(s["epochs"]),
            "test acc.": f"{s['test_acc']:.3f} ± {s['test_acc_std']:.3f}",
        }
        for (name, method), s in summaries.items()
    ]


def sweep_rows(search: RateSearch[Pair]) -> list[dict[str, Any]]:
    """Table rows of a learning-rate search: every rate tried, its epochs (or
    "not by N": it stopped after N epochs without reaching the threshold) and
    its last accuracy (at the threshold, where the run stopped there)."""
    rows = []
    for (name, method), rates in search.tried.items():
        for lr in rates:
            hit = search.hit((name, method), lr)
            rows.append(
                {
                    "config": name,
                    "method": method,
                    "lr": lr,
                    f"epochs to {percent(search.threshold)}": hit
                    or f"not by {search.length((name, method), lr)}",
                    "last train acc.": search.final_acc((name, method), lr),
                }
            )
    return rows


def best_rate_text(search: RateSearch[Pair], pair: Pair) -> str:
    """The best rate of a (configuration, method) on the tuning seed, in words."""
    method, lr = pair[1], search.best[pair]
    hit = search.hit(pair)
    if hit is None:
        return (
            f"{method} reaches {percent(search.threshold)} at none of its "
            f"{len(search.tried[pair])} rates (best final accuracy "
            f"{search.final_acc(pair):.3f}, at lr {lr:.3g})"
        )
    return f"{method} at lr {lr:.3g} ({hit} epochs)"


def grid_edge_text(search: RateSearch[Pair]) -> str:
    """Which best rates lie at an end of the rates tried for their pair, in words.

    A best rate at an end of the grid is not at an end when the refinement
    tried a neighbour beyond it (and that neighbour lost).
    """
    edge = [
        f"{m} on `{n}` (lr {lr:.3g})"
        for (n, m), lr in search.best.items()
        if lr <= min(search.tried[(n, m)]) or lr >= max(search.tried[(n, m)])
    ]
    if not edge:
        return "No best rate lies at an end of the rates tried"
    return (
        "At an end of the rates tried (a better rate may lie beyond it): "
        + ", ".join(edge)
    )


def best_rates_text(
    search: RateSearch[Pair],
    names: Sequence[str],
    *,
    methods: Sequence[InitMethod] = PAIR_METHODS,
) -> str:
    """:func:`best_rate_text` of every method on every configuration in ``names``."""
    return "; ".join(
        f"on {n}, " + " and ".join(best_rate_text(search, (n, m)) for m in methods)
        for n in names
    )


def long_rows(
    long_summary: dict[Pair, dict[str, Any]],
    rates: dict[Pair, float],
    *,
    threshold: float = 0.99,
) -> list[dict[str, Any]]:
    """Table rows of the evaluation at each method's best rate, with PathCond's speed-up.

    Epochs to ``threshold`` as mean ± std (``>`` when censored), the runs
    that reached it, final training and test accuracy (mean ± std); the
    PathCond row of a configuration also gives its speed-up over the
    baseline with its censoring (``>=``, ``<=``, ``~``, ``n/a``).
    """
    pct = percent(threshold)
    rows = []
    for (name, method), s in long_summary.items():
        up = (
            format_speedup(pair_speedup(long_summary, name))
            if method == "pathcond" and (name, "baseline") in long_summary
            else ""
        )
        rows.append(
            {
                "config": name,
                "method": method,
                "lr": rates[(name, method)],
                f"epochs to {pct}": format_epochs(s["epochs"]),
                "reached": reached_text(s["epochs"]),
                "final train acc.": f"{s['final_acc']:.3f}",
                "test acc.": f"{s['test_acc']:.3f} ± {s['test_acc_std']:.3f}",
                "speed-up": up,
            }
        )
    return rows


def speedup_verdict(s: dict[str, Any] | None) -> str:
    """Whether a :func:`~wslib.runs.stats.speedup` says PathCond is ``"faster"``, ``"slower"``, ``"tied"``
    (the same mean epochs, no run censored) or ``"undecided"``.

    Censoring decides only in the direction it bounds: a lower bound above 1
    is faster, an upper bound below 1 is slower; a ratio with both sides cut
    by the run length, or none (no PathCond run reached), is undecided unless
    the ratio is exact.
    """
    if s is None or s["value"] is None:
        return "undecided"
    value = s["value"]
    if s.get("both_censored"):
        return "undecided"
    if abs(value - 1) < 1e-9 and not (s["lower_bound"] or s["upper_bound"]):
        return "tied"
    if value > 1 and not s["upper_bound"]:
        return "faster"
    if value < 1 and not s["lower_bound"]:
        return "slower"
    return "undecided"


TUNED_WORDS = {  # a tuned verdict (:func:`tuned_verdict_text`) in words
    "faster": "sooner on average than the baseline on",
    "slower": "later on average than the baseline on",
    "spread": "undecided against the baseline (the 95% interval of the gap in "
    "epochs over seeds reaches zero) on",
    "tied": "after as many epochs (mean) as the baseline on",
    "undecided": "in an order the run length leaves open on",
}


def tuned_verdict_text(
    long_summary: dict[Pair, dict[str, Any]], names: Sequence[str]
) -> str:
    """The tuned comparison in words: where PathCond reaches the threshold sooner,
    later, within the spread between seeds, or undecided, and where its mean test
    accuracy is higher.

    Each configuration names the epochs it rests on (mean ± std over the seeds).
    A difference of the means smaller than the larger of the two standard
    deviations is "within the spread between seeds", not sooner or later. A
    configuration where every baseline run reached the threshold and no
    PathCond run did counts as later (the ratio itself is undetermined).
    """
    if not names:
        raise ValueError("tuned_verdict_text needs at least one configuration name")
    groups: dict[str, list[str]] = {verdict: [] for verdict in TUNED_WORDS}
    for name in names:
        groups[_tuned_verdict(long_summary, name)].append(name)
    parts = [
        f"{TUNED_WORDS[k]} " + ", ".join(_epochs_detail(long_summary, n) for n in v)
        for k, v in groups.items()
        if v
    ]
    parts[0] = "PathCond reaches the threshold " + parts[0]
    return "; ".join(parts) + "; " + _test_acc_text(long_summary, names)


def _test_acc_text(
    long_summary: dict[Pair, dict[str, Any]], names: Sequence[str]
) -> str:
    """Where PathCond's mean test accuracy is higher than the baseline's, in words."""
    higher = [
        n
        for n in names
        if long_summary[(n, "pathcond")]["test_acc"]
        > long_summary[(n, "baseline")]["test_acc"]
    ]
    if 0 < len(higher) < len(names):
        return (
            f"its mean test accuracy is higher on {_names(higher)} and not higher on "
            f"{_names([n for n in names if n not in higher])}"
        )
    return (
        "its mean test accuracy is "
        + ("higher" if higher else "not higher")
        + " on every one"
    )


def _epochs_detail(long_summary: dict[Pair, dict[str, Any]], name: str) -> str:
    """``name`` with PathCond's and the baseline's epochs (mean ± std) over the seeds."""
    base, pc = (long_summary[(name, m)]["epochs"] for m in PAIR_METHODS)

    def text(e: dict[str, Any]) -> str:
        if e["mean"] is None:
            return f"never within {e['run_length']}"
        return format_epochs(e)

    n = pc["n_runs"]
    return (
        f"`{name}` ({text(pc)} vs {text(base)} epochs over {n} "
        f"seed{'s' if n != 1 else ''})"
    )


def _tuned_verdict(long_summary: dict[Pair, dict[str, Any]], name: str) -> str:
    """:func:`speedup_verdict` of ``name``; "slower" when only the baseline reached,
    "spread" when the book's rule (:func:`~wslib.runs.verdicts.decide_independent`,
    Welch's 95% interval of the gap in mean epochs) decides neither way. One
    seed keeps the sign (the text gives the count)."""
    s = pair_speedup(long_summary, name)
    base, pc = (long_summary[(name, m)]["epochs"] for m in PAIR_METHODS)
    if s["value"] is None and not base["censored"]:
        return "slower"
    verdict = speedup_verdict(s)
    if verdict in ("faster", "slower") and None not in (pc["mean"], base["mean"]):
        base_runs, pc_runs = (
            long_summary[(name, m)]["epochs_per_run"] for m in PAIR_METHODS
        )
        d = decide_independent(pc_runs, base_runs)
        if d.interval is not None and d.verdict is Verdict.UNDECIDED:
            return "spread"
    return verdict


def _names(names: Sequence[str]) -> str:
    """Configuration names as a comma-separated list of code spans ("none" if empty)."""
    return ", ".join(f"`{n}`" for n in names) if names else "none"


def ablation_rows(
    summaries: dict[Pair, dict[str, Any]],
    pairs: dict[str, str],
    base: dict[str, Any],
    configs: dict[str, dict[str, Any]],
    *,
    threshold: float = 0.99,
) -> list[dict[str, Any]]:
    """Rows of the output-bias ablation at the shared rate.

    ``pairs`` maps a with-bias configuration to its paper-layout twin; each
    row gives a configuration, its layout, a method, epochs to ``threshold``,
    runs reaching it, final training and test accuracy.
    """
    rows = []
    for bias_name, twin in pairs.items():
        for name in (twin, bias_name):
            layout = (
                "with output bias"
                if has_output_bias(base, configs[name])
                else "no output bias (paper)"
            )
            for method in PAIR_METHODS:
                s = summaries[(name, method)]
                rows.append(
                    {
                        "config": name,
                        "layout": layout,
                        "method": method,
                        f"epochs to {percent(threshold)}": format_epochs(s["epochs"]),
                        "reached": reached_text(s["epochs"]),
                        "final train acc.": f"{s['final_acc']:.3f}",
                        "test acc.": f"{s['test_acc']:.3f}",
                    }
                )
    return rows


def ablation_text(summaries: dict[Pair, dict[str, Any]], pairs: dict[str, str]) -> str:
    """The ablation in words: PathCond minus baseline final training accuracy, per layout."""
    parts = []
    for bias_name, twin in pairs.items():
        gaps = [
            summaries[(n, "pathcond")]["final_acc"]
            - summaries[(n, "baseline")]["final_acc"]
            for n in (twin, bias_name)
        ]
        parts.append(
            f"on `{twin}` {gaps[0]:+.3f} without the output bias and {gaps[1]:+.3f} "
            f"with it (`{bias_name}`)"
        )
    return "; ".join(parts)


def pair_speedup(summaries: dict[Pair, dict[str, Any]], name: str) -> dict[str, Any]:
    """PathCond's :func:`~wslib.runs.stats.speedup` over the baseline on configuration ``name``."""
    return speedup(
        summaries[(name, "baseline")]["epochs"], summaries[(name, "pathcond")]["epochs"]
    )


def best_rate_metrics(
    search: RateSearch[Pair],
    long_summary: dict[Pair, dict[str, Any]],
    name: str,
    epochs: int,
) -> dict[str, Any]:
    """The results-file entries of a configuration evaluated at each method's best rate."""
    return {
        "speedup_pathcond_best_lr": {
            **pair_speedup(long_summary, name),
            "lr_baseline": search.best[(name, "baseline")],
            "lr_pathcond": search.best[(name, "pathcond")],
            "epochs": epochs,
        },
        "best_lr_runs": {
            m: {
                "lr": search.best[(name, m)],
                "epochs_to_99": long_summary[(name, m)]["epochs"],
                "test_acc": long_summary[(name, m)]["test_acc"],
            }
            for m in PAIR_METHODS
        },
        "lr_sweep": {
            m: {str(lr): search.hit((name, m), lr) for lr in search.tried[(name, m)]}
            for m in PAIR_METHODS
        },
    }


def mlp_metrics(
    configs: dict[str, dict[str, Any]],
    summaries: dict[Pair, dict[str, Any]],
    search: RateSearch[Pair],
    long_summary: dict[Pair, dict[str, Any]],
    long_epochs: int,
) -> dict[str, dict[str, Any]]:
    """The results-file entry of every configuration of chapter 7.

    Epochs to the threshold and test accuracy per method, PathCond's speed-up
    at the shared rate, and for the configurations of the learning-rate search
    the speed-up at each method's best rate (None for the others).
    """
    metrics = {}
    for name, cfg in configs.items():
        entry = {
            "init_scale": cfg["init_scale"],
            "widths": cfg["widths"],
            "epochs_to_99": {m: summaries[(name, m)]["epochs"] for m in cfg["methods"]},
            "speedup_pathcond": pair_speedup(summaries, name),
            "test_acc": {m: summaries[(name, m)]["test_acc"] for m in cfg["methods"]},
            "speedup_pathcond_best_lr": None,
        }
        if (name, "baseline") in search.best:
            entry.update(best_rate_metrics(search, long_summary, name, long_epochs))
        metrics[name] = entry
    return metrics


def speedup_rows(metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows: PathCond's speed-up per configuration, same rate and best rate each."""
    return [
        {
            "config": name,
            "speed-up (same lr)": format_speedup(m["speedup_pathcond"]),
            "speed-up (best lr each)": format_speedup(m["speedup_pathcond_best_lr"])
            if m["speedup_pathcond_best_lr"]
            else "not swept",
        }
        for name, m in metrics.items()
    ]


def speedups_text(metrics: dict[str, dict[str, Any]]) -> str:
    """PathCond's speed-up at the shared rate on every configuration, in words."""
    return "; ".join(
        f"{format_speedup(m['speedup_pathcond'])} on {name}"
        for name, m in metrics.items()
    )


def long_text(
    search: RateSearch[Pair],
    long_summary: dict[Pair, dict[str, Any]],
    metrics: dict[str, dict[str, Any]],
    name: str,
) -> str:
    """The evaluation runs of ``name`` at each method's best rate, in words.

    When no baseline run of the search reached the threshold and the speed-up
    is a lower bound, the sentence says what the bound is made of.
    """
    pct = percent(search.threshold)
    parts = []
    for method in PAIR_METHODS:
        s = long_summary[(name, method)]
        detail = (
            f"{format_epochs(s['epochs'])} epochs"
            if s["epochs"]["n_reached"]
            else f"final training accuracy {s['final_acc']:.3f}"
        )
        parts.append(
            f"{method} at lr {search.best[(name, method)]:.3g}: "
            f"{reached_text(s['epochs'])} runs reached {pct} ({detail})"
        )
    s = metrics[name]["speedup_pathcond_best_lr"]
    note = (
        f" (the run length over PathCond's epochs; no baseline run of the sweep "
        f"reached {pct})"
        if s["lower_bound"] and not search.reached((name, "baseline"))
        else ""
    )
    return f"on {name}, " + ", ".join(parts) + f"; speed-up {format_speedup(s)}{note}"


def size_points(
    grid: RunGrid,
    config: str,
    sizes: Sequence[Sequence[int]],
    seeds: Sequence[int],
    *,
    threshold: float = 0.99,
    methods: Sequence[InitMethod] = PAIR_METHODS,
) -> dict[str, list[dict[str, Any]]]:
    """Epochs to ``threshold`` against the number of parameters, per method.

    One point per hidden ``sizes`` entry and for ``config``'s own widths:
    ``n_params``, ``mean`` epochs (the run length when no run reached the
    threshold), ``std`` and whether the mean is ``censored`` (a lower bound).
    """
    all_sizes = [*sizes, grid.configs[config]["widths"]]
    points: dict[str, list[dict[str, Any]]] = {}
    for method in methods:
        points[method] = []
        for widths in all_sizes:
            runs = grid.select(config, method, seeds, widths=widths)
            summ = summarise_epochs([r["acc"] for r in runs], threshold=threshold)
            model = build_model(mlp_config(grid.base, widths))
            points[method].append(
                {
                    "n_params": sum(p.numel() for p in model.parameters()),
                    "mean": summ["run_length"]
                    if summ["mean"] is None
                    else summ["mean"],
                    "std": summ["std"] or 0.0,
                    "censored": summ["censored"],
                }
            )
    return points


def activation_rows(
    grid: RunGrid,
    config: str,
    activations: Sequence[ActivationName],
    seeds: Sequence[int],
    *,
    threshold: float = 0.99,
    methods: Sequence[InitMethod] = PAIR_METHODS,
) -> list[dict[str, Any]]:
    """Per activation and method: mean epochs to ``threshold``, runs reaching it, test accuracy."""
    rows = []
    for act in activations:
        for method in methods:
            runs = grid.select(config, method, seeds, activation=act)
            summ = summarise_epochs([r["acc"] for r in runs], threshold=threshold)
            rows.append(
                {
                    "activation": act,
                    "method": method,
                    f"epochs to {percent(threshold)}": summ["mean"],
                    "reached": reached_text(summ),
                    "test acc.": float(np.mean([r["test_acc"] for r in runs])),
                }
            )
    return rows


def add_cost_metrics(
    metrics: dict[str, Any],
    costs: Sequence[dict[str, Any]],
    solver_rows: Sequence[dict[str, Any]],
) -> None:
    """Put the cost and solver rows of chapter 7 into ``metrics`` (in place).

    Per configuration: rescale and epoch seconds and their ratio, and the
    solver comparison (every value of its row, a time ``s (...)`` named
    ``seconds (...)`` so that wall-clock entries read as such); over all cost
    rows: the mean rescale and epoch seconds.
    """
    for row in costs:
        metrics[row["config"]].update(
            {
                "rescale_seconds": row["rescale_seconds"],
                "epoch_seconds": row["epoch_seconds"],
                "rescale_over_epoch": row["rescale_over_epoch"],
            }
        )
    for row in solver_rows:
        metrics[row["config"]]["solver"] = {
            "seconds" + k[1:] if k.startswith("s (") else k: v
            for k, v in row.items()
            if k != "config"
        }
    metrics["rescale_seconds"] = float(np.mean([r["rescale_seconds"] for r in costs]))
    metrics["epoch_seconds"] = float(np.mean([r["epoch_seconds"] for r in costs]))


def solver_text(rows: Sequence[dict[str, Any]], *, sweeps: int = PAPER_SWEEPS) -> str:
    """The solver comparison of :func:`solver_comparison` in words."""
    parts = []
    for r in rows:
        block, neuron = f"block, {sweeps} sweeps", f"per neuron, {sweeps} sweeps"
        gap = r[f"F ({block})"] - r["F (converged)"]
        parts.append(
            f"on `{r['config']}` the converged solver takes {r['s (converged)']:.3g} s "
            f"({r['sweeps (converged)']} sweeps), {sweeps} block sweeps "
            f"{r[f's ({block})']:.3g} s and {sweeps} per-neuron sweeps "
            f"{r[f's ({neuron})']:.3g} s; {sweeps} block sweeps leave F "
            f"{gap:.3g} above the converged value and neuron scales that differ "
            f"from the converged ones by a median "
            f"{r['median scale diff. (10 sweeps vs converged)']:.1%}"
        )
    return "; ".join(parts)
