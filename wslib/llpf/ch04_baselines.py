"""Chapter 4, LLPF against Bezier curves and AutoNEB at equal step budgets: the
methods, the tuning sweep on its own seed, the comparison and the papers' numbers.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from torch import nn

from wslib.core.seeds import derive_seed
from wslib.llpf.methods import compare_at_equal_steps, method_run
from wslib.llpf.protocols import PathSetup
from wslib.runs.published import LLPF, beside_paper, run_setting
from wslib.runs.verdicts import LOSS_MARGIN, Decision, decide_paired

Result = Mapping[str, Any]


def tuning_seed(seed: int) -> int:
    """Chapter 4's tuning path seed (role ``"tune"``), never an evaluation seed."""
    return derive_seed(seed, "tune")


def methods_by_model(
    models: Mapping[str, Any],
    llpf: Mapping[str, Mapping[str, Any]],
    baselines: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Chapter 4's methods per model: :func:`chapter_methods` with the model's LLPF settings."""
    return {name: chapter_methods(llpf[name], baselines) for name in models}


def chapter_methods(
    llpf: Mapping[str, Any], baselines: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Label -> settings of every method for one model: ``"LLPF"`` first, then ``baselines``."""
    return {
        "LLPF": {"method": "llpf", **llpf},
        **{k: dict(v) for k, v in baselines.items()},
    }


def _number(value: float | None) -> float:
    """A metric read back from a run cache: NaN (a diverged run) comes back as None."""
    return float("nan") if value is None else float(value)


def tuning_budget(
    setup: PathSetup,
    pair: Sequence[nn.Module],
    methods: Mapping[str, Mapping[str, Any]],
    seed: int,
    *,
    run_cache: str | Path | None = None,
) -> int:
    """The gradient steps of the first method (LLPF) at its base settings on ``seed``.

    ``methods``: one model's label -> settings, LLPF first; the run is
    :func:`~wslib.llpf.methods.method_run`'s (cached in ``run_cache``). It
    is the budget of every baseline of :func:`tuning_sweep`.
    """
    first = methods[next(iter(methods))]
    return int(method_run(setup, pair, first, seed, run_cache=run_cache)["grad_steps"])


def tuning_run(
    setup: PathSetup,
    pair: Sequence[nn.Module],
    methods: Mapping[str, Mapping[str, Any]],
    label: str,
    override: Mapping[str, Any],
    seed: int,
    budget: int | None,
    *,
    run_cache: str | Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One setting of :func:`tuning_sweep`: ``(settings, evaluated path)``.

    The settings are ``methods[label]`` with ``override`` applied; a baseline
    takes exactly ``budget`` gradient steps (:func:`tuning_budget`), LLPF
    ignores it.
    """
    settings = {**methods[label], **override}
    kind_budget = None if settings["method"] == "llpf" else budget
    res = method_run(
        setup, pair, settings, seed, budget=kind_budget, run_cache=run_cache
    )
    return settings, res


def tuning_sweep(
    setup: PathSetup,
    models: Mapping[str, Mapping[str, Any]],
    modes: Mapping[str, Sequence[nn.Module]],
    methods: Mapping[str, Mapping[str, Mapping[str, Any]]],
    grid: Mapping[str, Sequence[Mapping[str, Any]]],
    seed: int,
    *,
    run_cache: str | Path | None = None,
) -> pd.DataFrame:
    """Every method at every setting of ``grid`` (label -> overrides), on path seed ``seed``.

    ``methods[model]`` gives each label's base settings (LLPF first). The
    budget of the baselines is the gradient steps of LLPF at its base
    settings on this seed (:func:`tuning_budget`); LLPF's own settings change
    its steps (column ``gradient steps``). One row per model, method and
    setting (:func:`tuning_run`), with the learning rate (``lr``; AutoNEB: its
    first cycle's) and ``momentum`` (curves; NaN otherwise); a diverged run
    has peak excess NaN and is never chosen.
    """
    rows = []
    for name in models:
        args = (setup, modes[name], methods[name])
        budget = tuning_budget(*args, seed, run_cache=run_cache)
        for label, options in grid.items():
            for override in options:
                settings, res = tuning_run(
                    *args, label, override, seed, budget, run_cache=run_cache
                )
                lrs = settings.get("lrs")
                rows.append(
                    {
                        "model": name,
                        "method": label,
                        "setting": dict(override),
                        "lr": float(lrs[0] if lrs is not None else settings["lr"]),
                        "momentum": float(settings.get("momentum", np.nan)),
                        "peak excess": _number(res["peak_excess"]),
                        "gradient steps": int(res["grad_steps"]),
                    }
                )
    return pd.DataFrame(rows)


def tuned_methods(
    methods: Mapping[str, Mapping[str, Mapping[str, Any]]], sweep: pd.DataFrame
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each model's methods with the sweep's best setting (lowest peak excess) applied.

    Methods the sweep did not tune keep their settings.
    """
    out = {}
    for name, base in methods.items():
        out[name] = {label: dict(v) for label, v in base.items()}
        rows = sweep[sweep.model == name]
        by_method = rows.groupby("method", sort=False)
        for label, res in cast("Iterable[tuple[str, pd.DataFrame]]", by_method):
            best_row: Any = res["peak excess"].idxmin()  # a label of the index
            best = cast(dict[str, Any], res.loc[best_row, "setting"])
            out[name][label] = {**base[label], **best}
    return out


def chosen_settings(sweep: pd.DataFrame) -> pd.DataFrame:
    """The sweep's best row per model and method (what :func:`tuned_methods` applies)."""
    best = sweep.loc[
        sweep.groupby(["model", "method"], sort=False)["peak excess"].idxmin()
    ]
    return best.drop(columns="setting").reset_index(drop=True)


def compare_methods(
    setup: PathSetup,
    models: Mapping[str, Mapping[str, Any]],
    modes: Mapping[str, Sequence[nn.Module]],
    methods: Mapping[str, Mapping[str, Mapping[str, Any]]],
    seeds: Sequence[int],
    *,
    run_cache: str | Path | None = None,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """:func:`~wslib.llpf.methods.compare_at_equal_steps` for every model and path seed.

    ``methods[model]``: label -> settings, LLPF first. Each comparison is a
    cached step in ``run_cache`` (:mod:`wslib.runs.steps`). Returns
    ``runs[model][label]``: the evaluated paths of the seeds, in order.
    """
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in models:
        runs[name] = {}
        for s in seeds:
            pair, chosen = modes[name], methods[name]
            result = compare_at_equal_steps(
                setup, pair, chosen, s, name=name, run_cache=run_cache
            )
            for method, res in result.items():
                runs[name].setdefault(method, []).append(res)
    return runs


def comparison_table(
    runs: Mapping[str, Mapping[str, Sequence[Result]]],
) -> pd.DataFrame:
    """One row per model and method: peak excess over the seeds, worst loss, cost."""
    rows = []
    for name, methods in runs.items():
        for method, res in methods.items():
            excess = [_number(r["peak_excess"]) for r in res]
            rows.append(
                {
                    "model": name,
                    "method": method,
                    "peak excess mean": np.mean(excess),
                    "peak excess std": np.std(excess),
                    "peak excess values": excess,
                    "seeds": len(excess),
                    "worst peak loss": max(r["peak_loss"] for r in res),
                    "min test acc": min(r["min_test_acc"] for r in res),
                    "gradient steps (mean)": np.mean([r["grad_steps"] for r in res]),
                    "seconds (mean)": np.mean([r["seconds"] for r in res]),
                }
            )
    return pd.DataFrame(rows)


def method_comparison(
    compare: pd.DataFrame, model: str
) -> tuple[str, str, Decision | None]:
    """The lowest mean peak excess on ``model``, the runner-up, and the book's rule
    (:mod:`wslib.runs.verdicts`) on their gap over the path seeds both ran on,
    paired seed by seed (ABOVE: the best is lower; margin 0.01 of loss); None
    when fewer than two methods have a finite peak excess."""
    rows = compare[compare.model == model]
    if len(rows) < 2:
        raise ValueError(f"need at least two methods on {model!r} to compare them")
    rows = rows.dropna(subset=["peak excess mean"]).sort_values("peak excess mean")
    if len(rows) < 2:  # a diverged run: no gap to judge
        first = rows.iloc[0]["method"] if len(rows) else "none"
        return first, "none", None
    best, second = rows.iloc[0], rows.iloc[1]
    n = min(best["seeds"], second["seeds"])
    decision = decide_paired(
        second["peak excess values"][:n],
        best["peak excess values"][:n],
        margin=LOSS_MARGIN,
    )
    return best["method"], second["method"], decision


def comparison_verdict(compare: pd.DataFrame, model: str) -> str:
    """:func:`method_comparison` in one sentence, with the numbers it rests on."""
    first, runner_up, c = method_comparison(compare, model)
    if c is None:
        return f"on the {model}, fewer than two methods had a finite peak excess"
    rows = compare[compare.model == model].set_index("method")
    a, b = rows.loc[first], rows.loc[runner_up]
    if c.interval is None:
        how = "with one path seed, undecided (no spread to judge the gap by)"
    else:
        how = c.word(
            above="lower on the 95% interval of the paired gap",
            below="",  # the runner-up is never lower on average
            equivalent="no different in practice (the gap within 0.01 of loss)",
            undecided="undecided (the 95% interval of the paired gap reaches zero)",
        )
    return (
        f"on the {model}, {first} had the lowest mean peak excess "
        f"({a['peak excess mean']:.3f} ± {a['peak excess std']:.3f}), "
        f"{c.difference:.3f} below {runner_up} "
        f"({b['peak excess mean']:.3f} ± {b['peak excess std']:.3f}): {how}"
        + (f", gap {c.interval_text('.3f')}" if c.interval else "")
    )


def method_prefix(method: str) -> str:
    """Metric-name prefix of a method label: lower case, runs of other characters as ``_``."""
    return re.sub(r"[^a-z0-9]+", "_", method.lower()).strip("_")


def paper_table(compare: pd.DataFrame) -> pd.DataFrame:
    """The paper's comparison of path finders, with this run's numbers."""
    rows = []
    for method, res in compare.groupby("method", sort=False):
        rows.append(
            {
                "method": method,
                "architectures run here": ", ".join(res.model),
                "consistency (max seed std of peak excess)": float(
                    res["peak excess std"].max()
                ),
                "crosses spheres": "yes (hybrid, chapter 5)"
                if method == "LLPF"
                else "not tested",
                "worst training loss on the path": float(res["worst peak loss"].max()),
            }
        )
    return pd.DataFrame(rows).set_index("method")


def paper_numbers_beside(
    compare: pd.DataFrame, models: Mapping[str, Mapping[str, Any]], data_name: str
) -> pd.DataFrame:
    """The paper's ResNet-18 peak losses (:data:`~wslib.runs.published.LLPF`) beside
    this run's worst peak training loss over the seeds, where the setting is the paper's."""
    names = {key: str(config["name"]) for key, config in models.items()}
    measured = {
        f"{row['method']}/peak loss": f"{row['worst peak loss']:.3g} (worst seed)"
        for row in compare.to_dict("records")
        if names[row["model"]] == "resnet18"
    }
    runs = [run_setting(data_name, config) for config in models.values()]
    return beside_paper(LLPF, runs, measured)


def comparison_metrics(compare: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Chapter 4's metrics: per model and method, the columns of :func:`comparison_table`."""
    metrics: dict[str, dict[str, float]] = {}
    for row in compare.to_dict("records"):
        prefix = method_prefix(row["method"])
        metrics.setdefault(row["model"], {}).update(
            {
                f"{prefix}_peak_excess": float(row["peak excess mean"]),
                f"{prefix}_peak_excess_std": float(row["peak excess std"]),
                f"{prefix}_grad_steps": float(row["gradient steps (mean)"]),
                f"{prefix}_worst_peak_loss": float(row["worst peak loss"]),
            }
        )
    return metrics


def comparison_results(compare: pd.DataFrame, sweep: pd.DataFrame) -> dict[str, Any]:
    """Chapter 4's results, per model: :func:`comparison_metrics`, the chosen settings
    (``chosen``) and the whole sweep (``sweep``; without the raw settings, NaN as None)."""

    def records(table: pd.DataFrame) -> list[dict[Hashable, Any]]:
        return [
            {
                k: (None if isinstance(v, float) and np.isnan(v) else v)
                for k, v in r.items()
            }
            for r in table.to_dict("records")
        ]

    out: dict[str, Any] = comparison_metrics(compare)
    chosen = chosen_settings(sweep)
    for name in out:
        out[name]["chosen"] = records(chosen[chosen.model == name])
        out[name]["sweep"] = records(sweep[sweep.model == name].drop(columns="setting"))
    return out
