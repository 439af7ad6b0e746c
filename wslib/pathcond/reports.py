"""Result assembly for the PathCond chapters: descriptions, tables, metrics, verdicts.

Everything here turns runs (dicts of per-epoch ``loss`` and ``acc``, and
``test_loss`` / ``test_acc``) or parameters into what a chapter shows: the
text that names a data set, a model or a recipe (so the prose is true in every
profile), table rows, the metrics of the results file and the sentences that
state a comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from wslib.core.data import Dataset
from wslib.core.describe import DATA_LABELS
from wslib.core.models import build_model
from wslib.pathcond.experiments import Pair, RunGrid, has_output_bias, mlp_config
from wslib.pathcond.rescaling import PAPER_SWEEPS
from wslib.runs.published import PATHCOND, beside_paper, run_setting
from wslib.runs.stats import (
    RateSearch,
    format_epochs,
    format_mean_std,
    format_speedup,
    mean_std,
    speedup,
    summarise_epochs,
)
from wslib.runs.verdicts import Verdict, compare

Run = dict[str, Any]
PAIR_METHODS = ("baseline", "pathcond")  # the two methods every comparison holds

# --- descriptions -----------------------------------------------------------------


def percent(threshold: float) -> str:
    """A threshold as a percentage: ``0.99`` -> ``"99%"``."""
    return f"{threshold:.0%}"


def dataset_name(name: str) -> str:
    """The name of a data set of :data:`wslib.core.data.DATASETS` as written in text."""
    return DATA_LABELS.get(name, name)


def data_text(ds: Dataset) -> str:
    """``"MNIST-1D (4000 training examples of shape 1×40, 10 classes)"``."""
    name = dataset_name(ds.name)
    shape = "×".join(map(str, ds.in_shape))
    return (
        f"{name} ({len(ds.x_train)} training examples of shape {shape}, "
        f"{ds.n_classes} classes)"
    )


def mlp_text(config: dict[str, Any]) -> str:
    """The layer sizes of an MLP config, input to output: ``"40-256-256-10"``."""
    sizes = [math.prod(config["in_shape"]), *config["widths"], config["n_classes"]]
    return "-".join(map(str, sizes))


def model_text(config: dict[str, Any]) -> str:
    """A short description of a model config (:func:`wslib.core.models.build_model`)."""
    name = config["name"]
    if name == "mlp":
        act = config.get("activation", "relu")
        return f"MLP {mlp_text(config)}" + ("" if act == "relu" else f", {act.upper()}")
    if name in ("cnn1d", "cnn2d"):
        parts = [f"{name[-2]}-D CNN, channels {'-'.join(map(str, config['channels']))}"]
        parts += ["average pooling"] if config.get("pool") == "avg" else []
        parts += ["BatchNorm"] if config.get("bn") else []
        parts += ["fully convolutional"] if config.get("fully_conv") else []
        return ", ".join(parts)
    if name == "resnet1d":
        blocks = config["blocks_per_stage"]
        return (
            f"1-D ResNet with BatchNorm, widths {'-'.join(map(str, config['widths']))}, "
            f"{blocks} block{'s' if blocks > 1 else ''} per stage"
        )
    if name == "resnet18":
        width = config.get("width", 1.0)
        return "ResNet-18 with BatchNorm" + (
            "" if width == 1.0 else f", width {width:g}"
        )
    if name == "vgg11":
        return "VGG-11" + (" with BatchNorm" if config.get("bn") else "")
    if name == "cifar_nv":
        width = config.get("width", 1.0)
        return "CIFAR-NV-like net (9 convolutions, max pooling)" + (
            "" if width == 1.0 else f", width {width:g}"
        )
    return name


def pooling_text(config: dict[str, Any]) -> str:
    """What the pooling of a fully convolutional ``config`` means for ``diag(G)``, in words."""
    pool = "max" if config["name"] == "cifar_nv" else config.get("pool", "max")
    if pool != "max":
        layers = "ReLU and average pooling" if pool == "avg" else "ReLU (no pooling)"
        return (
            f"convolutions, {layers}, then a convolutional head and a "
            "global mean: diag(G) is exact"
        )
    return (
        "convolutions, ReLU and max pooling, then a convolutional head and a global "
        "mean: diag(G) keeps the largest squared path mass at each "
        "max pool (chapter 6), an approximation"
    )


def sgd_text(recipe: dict[str, Any]) -> str:
    """A plain-SGD recipe in words: momentum, weight decay, schedule, batch size."""
    return (
        f"momentum {recipe.get('momentum', 0.0):g}, "
        f"weight decay {recipe.get('weight_decay', 0.0):g}, "
        f"{recipe.get('schedule', 'constant')} learning rate, "
        f"batch {recipe['batch_size']}"
    )


def config_text(base: dict[str, Any], name: str, cfg: dict[str, Any]) -> str:
    """One configuration of chapter 7 in words: its MLP and initialisation."""
    init = (
        "default initialisation"
        if cfg["init_scale"] == 1.0
        else f"every parameter multiplied by $a={cfg['init_scale']:g}$"
    )
    head = "" if has_output_bias(base, cfg) else ", no output bias"
    return f"`{name}`: {mlp_text({**base, 'widths': cfg['widths']})}{head}, {init}"


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


# --- chapter 7: evaluation summaries ----------------------------------------------


def summarise_runs(runs: Sequence[Run], threshold: float = 0.99) -> dict[str, Any]:
    """Runs over seeds: ``epochs`` to ``threshold`` (:func:`~wslib.runs.stats.summarise_epochs`), mean
    and std of ``test_acc``, mean final training accuracy ``final_acc``."""
    test_acc, test_acc_std = mean_std([r["test_acc"] for r in runs])
    return {
        "epochs": summarise_epochs([r["acc"] for r in runs], threshold),
        "test_acc": test_acc,
        "test_acc_std": test_acc_std,
        "final_acc": float(np.mean([r["acc"][-1] for r in runs])),
    }


def summarise_grid(
    grid: RunGrid, seeds: Sequence[int], threshold: float = 0.99
) -> dict[Pair, dict[str, Any]]:
    """:func:`summarise_runs` of every (configuration, method) of ``grid`` on ``seeds``."""
    return {
        (name, method): summarise_runs(grid.select(name, method, seeds), threshold)
        for name, cfg in grid.configs.items()
        for method in cfg["methods"]
    }


def epochs_rows(
    summaries: dict[Pair, dict[str, Any]], threshold: float = 0.99
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
    """Table rows of a learning-rate search: every rate tried, its epochs and
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
                    f"epochs to {percent(search.threshold)}": hit or "never",
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


def grid_edge_text(search: RateSearch[Pair], grid: Sequence[float]) -> str:
    """Which best rates lie at or beyond an end of the rate ``grid``, in words."""
    lo, hi = min(grid), max(grid)
    edge = [
        f"{m} on `{n}` (lr {lr:.3g})"
        for (n, m), lr in search.best.items()
        if lr <= lo or lr >= hi
    ]
    if not edge:
        return "No best rate lies at an end of the grid"
    return "At an end of the grid (a better rate may lie outside it): " + ", ".join(
        edge
    )


def best_rates_text(
    search: RateSearch[Pair],
    names: Sequence[str],
    methods: Sequence[str] = PAIR_METHODS,
) -> str:
    """:func:`best_rate_text` of every method on every configuration in ``names``."""
    return "; ".join(
        f"on {n}, " + " and ".join(best_rate_text(search, (n, m)) for m in methods)
        for n in names
    )


def long_rows(
    long_summary: dict[Pair, dict[str, Any]],
    rates: dict[Pair, float],
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
    groups: dict[str, list[str]] = {
        "faster": [],
        "slower": [],
        "spread": [],
        "tied": [],
        "undecided": [],
    }
    for name in names:
        groups[_tuned_verdict(long_summary, name)].append(name)
    higher = [
        n
        for n in names
        if long_summary[(n, "pathcond")]["test_acc"]
        > long_summary[(n, "baseline")]["test_acc"]
    ]
    words = {
        "faster": "sooner on average than the baseline on",
        "slower": "later on average than the baseline on",
        "spread": "as soon as the baseline within the spread between seeds on",
        "tied": "after as many epochs (mean) as the baseline on",
        "undecided": "in an order the run length leaves open on",
    }
    parts = [
        f"{words[k]} " + ", ".join(_epochs_detail(long_summary, n) for n in v)
        for k, v in groups.items()
        if v
    ]
    parts[0] = "PathCond reaches the threshold " + parts[0]
    test = (
        f"its mean test accuracy is higher on {_names(higher)} and not higher on "
        f"{_names([n for n in names if n not in higher])}"
        if 0 < len(higher) < len(names)
        else "its mean test accuracy is "
        + ("higher" if higher else "not higher")
        + " on every one"
    )
    return "; ".join(parts) + "; " + test


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
    "spread" when the one verdict rule (:func:`~wslib.runs.verdicts.compare`) finds
    the means' difference within the larger standard deviation over seeds."""
    s = pair_speedup(long_summary, name)
    base, pc = (long_summary[(name, m)]["epochs"] for m in PAIR_METHODS)
    if s["value"] is None and not base["censored"]:
        return "slower"
    verdict = speedup_verdict(s)
    if verdict in ("faster", "slower") and None not in (pc["mean"], base["mean"]):
        spread = max(pc["std"], base["std"])  # the larger seed standard deviation
        if compare(pc["mean"] - base["mean"], spread).verdict is Verdict.WITHIN:
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
    threshold: float = 0.99,
    methods: Sequence[str] = PAIR_METHODS,
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
            summ = summarise_epochs([r["acc"] for r in runs], threshold)
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
    activations: Sequence[str],
    seeds: Sequence[int],
    threshold: float = 0.99,
    methods: Sequence[str] = PAIR_METHODS,
) -> list[dict[str, Any]]:
    """Per activation and method: mean epochs to ``threshold``, runs reaching it, test accuracy."""
    rows = []
    for act in activations:
        for method in methods:
            runs = grid.select(config, method, seeds, activation=act)
            summ = summarise_epochs([r["acc"] for r in runs], threshold)
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
    cost_rows: Sequence[dict[str, Any]],
    solver_rows: Sequence[dict[str, Any]],
) -> None:
    """Put the cost and solver rows of chapter 7 into ``metrics`` (in place).

    Per configuration: rescale and epoch seconds and their ratio, and the
    solver comparison (every value of its row, a time ``s (...)`` named
    ``seconds (...)`` so that wall-clock entries read as such); over all cost
    rows: the mean rescale and epoch seconds.
    """
    for row in cost_rows:
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
    metrics["rescale_seconds"] = float(
        np.mean([r["rescale_seconds"] for r in cost_rows])
    )
    metrics["epoch_seconds"] = float(np.mean([r["epoch_seconds"] for r in cost_rows]))


def solver_text(rows: Sequence[dict[str, Any]], sweeps: int = PAPER_SWEEPS) -> str:
    """The solver comparison of :func:`~wslib.pathcond.experiments.solver_comparison` in words."""
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


# --- chapter 8 --------------------------------------------------------------------


def arch_metrics(
    runs: dict[tuple[str, str, int], Run],
    archs: dict[str, dict[str, Any]],
    methods: Sequence[str],
    seeds: Sequence[int],
    threshold: float = 0.99,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The results-file entry of every architecture of chapter 8, and table rows.

    Per method: final training loss (mean, std over ``seeds``), test loss and,
    for classifiers, test accuracy and epochs to ``threshold`` (None and no
    entry for the autoencoder); per architecture PathCond's final training
    loss over the baseline's.
    """
    metrics, rows = {}, []
    pct = percent(threshold)
    for arch, spec in archs.items():
        entry: dict[str, Any] = {
            "final_train_loss": {},
            "test_acc": {},
            "test_loss": {},
            "epochs_to_99": {},
        }
        for method in methods:
            sel = [runs[(arch, method, s)] for s in seeds]
            final = [r["loss"][-1] for r in sel]
            mean, std = mean_std(final)
            entry["final_train_loss"][method] = {"mean": mean, "std": std}
            entry["test_loss"][method] = float(np.mean([r["test_loss"] for r in sel]))
            row = {
                "architecture": arch,
                "method": method,
                "final train loss": format_mean_std(final, ".4g", ".2g"),
                "test loss": entry["test_loss"][method],
            }
            entry["test_acc"][method] = None
            if spec["task"] == "classify":
                summ = summarise_epochs([r["acc"] for r in sel], threshold)
                entry["epochs_to_99"][method] = summ
                entry["test_acc"][method] = float(np.mean([r["test_acc"] for r in sel]))
                row[f"epochs to {pct}"] = format_epochs(summ)
                row["test acc."] = entry["test_acc"][method]
            rows.append(row)
        losses = entry["final_train_loss"]
        entry["final_loss_ratio_pathcond_over_baseline"] = (
            losses["pathcond"]["mean"] / losses["baseline"]["mean"]
        )
        metrics[arch] = entry
    return metrics, rows


def paper_numbers_beside(
    metrics: dict[str, dict[str, Any]],
    archs: dict[str, dict[str, Any]],
    data: dict[str, Any],
) -> pd.DataFrame:
    """The paper's CIFAR-NV test accuracies (:data:`~wslib.runs.published.PATHCOND`)
    beside this run's (mean over seeds, %), where the setting is the paper's.

    ``metrics``: :func:`arch_metrics`'s first value; ``data``: the chapter's
    data set (an architecture with its own ``data`` is measured only there).
    """
    measured, runs = {}, []
    for arch, spec in archs.items():
        own_data = spec.get("data", data)
        runs.append(run_setting(own_data["name"], spec["model"]))
        if spec["model"]["name"] == "cifar_nv" and own_data == data:
            for method, acc in metrics[arch]["test_acc"].items():
                if acc is not None:
                    measured[f"{method}/test_acc"] = f"{100 * acc:.1f}"
    return beside_paper(PATHCOND, runs, measured)


def setup_rows(
    archs: dict[str, dict[str, Any]], ds: Dataset, methods: Sequence[str]
) -> list[dict[str, Any]]:
    """Table rows of chapter 8's set-up: per architecture its model, data, task and recipe."""
    return [
        {
            "architecture": arch,
            "model": model_text(spec["model"]),
            "data": dataset_name(spec.get("data", {}).get("name", ds.name)),
            "task": spec["task"],
            "epochs": spec["recipe"]["epochs"],
            "lr": spec["recipe"]["lr"],
            "SGD": sgd_text(spec["recipe"]),
            "methods": ", ".join(methods),
        }
        for arch, spec in archs.items()
    ]


def cost_metrics(cost_rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The results-file entry of the cost rows: per model its size and rescale/epoch ratio."""
    return {
        r["model"]: {"n_params": r["n_params"], "ratio": r["rescale_over_epoch"]}
        for r in cost_rows
    }


def convergence_rows(
    runs: dict[tuple[str, str, int], Run],
    archs: dict[str, dict[str, Any]],
    seeds: Sequence[int],
    method: str = "pathcond",
) -> list[dict[str, Any]]:
    """Per architecture and seed: did PathCond's solver converge, and how far from it it stopped."""
    rows = []
    for arch in archs:
        for s in seeds:
            run = runs.get((arch, method, s))
            if run is None or run.get("rescale_converged") is None:
                continue
            rows.append(
                {
                    "architecture": arch,
                    "seed": s,
                    "converged": run["rescale_converged"],
                    "sweeps": run["rescale_sweeps"],
                    "last relative drop of F": run["rescale_last_drop"],
                }
            )
    return rows


def convergence_text(rows: Sequence[dict[str, Any]], rtol: float = 1e-12) -> str:
    """One sentence: which runs' solver stopped at its sweep limit, and how far from converged."""
    stopped = [r for r in rows if not r["converged"]]
    if not stopped:
        return (
            f"The PathCond solver converged in every run here (F fell by at most "
            f"{rtol:g} of itself in its last sweep)."
        )
    parts = [
        f"{r['architecture']} (seed {r['seed']}: {r['sweeps']} sweeps, last relative "
        f"drop {r['last relative drop of F']:.1e})"
        for r in stopped
    ]
    return (
        f"The PathCond solver stopped at its sweep limit before converging in "
        f"{len(stopped)} of {len(rows)} runs: {'; '.join(parts)}; the tolerance is a drop "
        f"of {rtol:g}, so these rows train from a rescaling near, not at, "
        "the optimum."
    )
