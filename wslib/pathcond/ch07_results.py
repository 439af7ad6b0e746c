"""Chapter 7 (``07_pathcond_mlp``): its results, from the runs of
:mod:`wslib.pathcond.ch07_mlp`: summaries over seeds, table rows, the
results-file metrics (:func:`mlp_metrics`) and the sentences that state a
comparison, in the words of :mod:`wslib.runs.verdicts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wslib.core.configs import build_model
from wslib.core.describe import percent
from wslib.core.models import ActivationName
from wslib.pathcond.ch07_mlp import PAIR_METHODS
from wslib.pathcond.grid import Pair, RunGrid, has_output_bias, mlp_config
from wslib.pathcond.protocols import Run
from wslib.pathcond.solver import PAPER_SWEEPS
from wslib.pathcond.training import InitMethod
from wslib.runs.stats import (
    RateSearch,
    epochs_to,
    format_epochs,
    format_speedup,
    mean_std,
    speedup,
    summarise_epochs,
)
from wslib.runs.verdicts import Verdict, decide_independent


def reached_text(epochs: dict[str, Any]) -> str:
    """How many runs of a :func:`~wslib.runs.stats.summarise_epochs` result reached the threshold: ``"2/3"``."""
    return f"{epochs['n_reached']}/{epochs['n_runs']}"


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
) -> dict[str, Any]:
    """The results-file entry of every configuration of chapter 7 (the chapter
    adds entries of other kinds: costs, the activations' rows).

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
    """The solver comparison of :func:`~wslib.pathcond.ch07_mlp.solver_comparison` in words."""
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
