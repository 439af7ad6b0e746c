"""Result assembly of the LLPF chapters (2-5): tables, metrics and run-cache keys.

The runs themselves are in :mod:`wslib.llpf.protocols`; this module turns their
evaluated paths (dicts of :func:`wslib.llpf.evaluation.evaluate_path`) into
the tables the chapters show and the metrics their results files hold. The
chapters' setup (zoo, data, :class:`~wslib.llpf.protocols.PathSetup`, derived
seeds, base-model configs) is here too, shared by the notebooks and their
units (:mod:`wslib.llpf.units`), so both make the same runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from torch import nn

from wslib.core.connectivity import mode_config
from wslib.core.files import tensor_digest
from wslib.core.interpolation import linear_path
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.llpf.layerwise import data_flow_stage_names, data_flow_stages
from wslib.llpf.protocols import (
    CODE,
    PathSetup,
    compare_at_equal_steps,
    method_run,
    peak_anatomy,
)
from wslib.runs.cache import cached_run
from wslib.runs.published import LLPF, beside_paper, run_setting
from wslib.runs.verdicts import Comparison, Verdict
from wslib.runs.verdicts import compare as compare_values
from wslib.runs.zoo import Zoo

if TYPE_CHECKING:
    from wslib.core.data import Dataset

Result = Mapping[str, Any]


def profile_folder(root: str | Path | None, profile: str) -> Path | None:
    """``root/profile`` (None when ``root`` is None: no files)."""
    return None if root is None else Path(root) / profile


# --- setup shared by the chapters and their units ------------------------------

ZOO_ROOT = "data/zoo"  # the book's model zoo (relative to the repository root)


def chapter_data(data: Mapping[str, Any]) -> tuple[Zoo, Dataset]:
    """The book's model zoo and the data set ``data`` names."""
    zoo = Zoo(ZOO_ROOT)
    return zoo, zoo.dataset(dict(data))


def chapter_setup(
    ds: Dataset,
    batch_size: int,
    r_min: int,
    threshold_margin: float,
    dense: int,
    checkpoint_dir: str | Path | None,
    profile: str,
) -> PathSetup:
    """The :class:`~wslib.llpf.protocols.PathSetup` of a chapter: path checkpoints in
    ``checkpoint_dir/profile`` (none when ``checkpoint_dir`` is None)."""
    checkpoints = profile_folder(checkpoint_dir, profile)
    return PathSetup(ds, batch_size, r_min, threshold_margin, dense, checkpoints)


def mode_seeds(seed: int) -> list[int]:
    """The training seeds of the two modes a chapter joins (role ``"mode"``, shared
    with chapters 1, 2 and 12)."""
    return derive_seeds(seed, "mode", 2)


def path_seed_list(seed: int, n: int) -> list[int]:
    """The ``n`` path seeds of a chapter run with ``seed`` (role ``"path"``)."""
    return derive_seeds(seed, "path", n)


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


def sphere_configs(
    data: Mapping[str, Any],
    arch: Mapping[str, Any],
    recipe: Mapping[str, Any],
    norm_arch: Mapping[str, Any],
    norm_recipe: Mapping[str, Any],
    wd_source: float,
    wd_dest: float,
    sharp_recipe: Mapping[str, Any],
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Chapter 5's base models (zoo configs): ``base`` and ``normed`` (M2O), ``source``
    and ``dest`` (the hybrid: weight decay ``wd_source`` / ``wd_dest``), ``sharp a``
    and ``sharp b`` (sharp minima, one per mode seed)."""
    a, b = mode_seeds(seed)
    data, arch = dict(data), dict(arch)
    return {
        "base": mode_config(data, arch, dict(recipe), a),
        "normed": mode_config(data, dict(norm_arch), dict(norm_recipe), a),
        "source": mode_config(data, arch, {**recipe, "weight_decay": wd_source}, a),
        "dest": mode_config(data, arch, {**recipe, "weight_decay": wd_dest}, b),
        "sharp a": mode_config(data, arch, dict(sharp_recipe), a),
        "sharp b": mode_config(data, arch, dict(sharp_recipe), b),
    }


# --- chapter 2: one layer at a time ------------------------------------------


def layerwise_lines(
    a: nn.Module, b: nn.Module, ts: Sequence[float], ds: Dataset
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The straight line from ``a`` to ``b`` for the whole model and for each stage alone.

    A stage's line moves only that stage's tensors (from
    :func:`wslib.llpf.layerwise.data_flow_stages`), every other tensor stays at ``a``.
    Returns the whole model's :func:`~wslib.core.interpolation.linear_path`
    (training set) and one per stage name.
    """
    sa, sb = a.state_dict(), b.state_dict()
    whole = linear_path(a, sa, sb, ts, ds.x_train, ds.y_train)
    single = {
        stage: linear_path(a, sa, sb, ts, ds.x_train, ds.y_train, names=names)
        for stage, names in zip(data_flow_stage_names(a), data_flow_stages(a))
    }
    return whole, single


def stage_list(models: Mapping[str, nn.Module]) -> str:
    """The data-flow stages of each model, as text: ``"mlp: linears.0, linears.1; ..."``."""
    return "; ".join(
        f"{name}: {', '.join(data_flow_stage_names(model))}"
        for name, model in models.items()
    )


def layer_panels(
    single: Mapping[str, Mapping[str, Any]], per_panel: int = 7
) -> list[tuple[str, list[str]]]:
    """``(model, stages)`` for each panel of a figure: a model's stages, at most ``per_panel`` a panel.

    Stages are split into as few panels as needed, of sizes that differ by at most one.
    """
    panels = []
    for name, lines in single.items():
        stages = list(lines)
        n = -(-len(stages) // per_panel)
        bounds = np.linspace(0, len(stages), n + 1).round().astype(int)
        panels.extend((name, stages[i:j]) for i, j in zip(bounds[:-1], bounds[1:]))
    return panels


def _line_row(model: str, moved: str, base: float, res: Result) -> dict[str, Any]:
    loss = res["train_loss"]
    return {
        "model": model,
        "moved": moved,
        "loss at A": base,
        "loss after first step": float(loss[1]),
        "loss at end": float(loss[-1]),
        "barrier": float(res["barrier"]),
    }


def layerwise_table(
    whole: Mapping[str, Result], single: Mapping[str, Mapping[str, Result]]
) -> pd.DataFrame:
    """One row per model and moved part (whole model, each stage alone)."""
    rows = []
    for name, res in whole.items():
        base = float(res["train_loss"][0])
        rows.append(_line_row(name, "whole model", base, res))
        rows.extend(
            _line_row(name, f"only {stage}", base, line)
            for stage, line in single[name].items()
        )
    return pd.DataFrame(rows)


def first_step_increase(res: Result) -> float:
    """Training loss after the first step of a line minus the loss at its start."""
    return float(res["train_loss"][1] - res["train_loss"][0])


def layerwise_metrics(
    whole: Mapping[str, Result], single: Mapping[str, Mapping[str, Result]]
) -> dict[str, dict[str, float]]:
    """Chapter 2's metrics: barrier and first-step increase, whole model vs worst single stage."""
    return {
        name: {
            "whole_barrier": float(whole[name]["barrier"]),
            "max_single_layer_barrier": max(
                float(r["barrier"]) for r in single[name].values()
            ),
            "whole_first_step_increase": first_step_increase(whole[name]),
            "max_single_first_step_increase": max(
                first_step_increase(r) for r in single[name].values()
            ),
        }
        for name in whole
    }


# --- chapter 3: M2M paths ----------------------------------------------------


def line_table(
    lines: Mapping[str, Result], end_losses: Mapping[str, float]
) -> pd.DataFrame:
    """Per model: the larger endpoint loss, the straight line's barrier and lowest test accuracy."""
    return pd.DataFrame(
        {
            name: {
                "endpoint loss (max)": end_losses[name],
                "barrier": float(res["barrier"]),
                "min test acc": float(res["test_acc"].min()),
            }
            for name, res in lines.items()
        }
    ).T


def m2m_summary(
    lines: Mapping[str, Result], paths: Mapping[str, Result]
) -> pd.DataFrame:
    """Per model: straight-line barrier against the M2M path's peak excess, accuracy and cost."""
    return pd.DataFrame(
        {
            name: {
                "linear barrier": float(lines[name]["barrier"]),
                "LLPF peak excess": res["peak_excess"],
                "LLPF min test acc": res["min_test_acc"],
                "endpoint test acc (min)": float(min(res["test_acc"][[0, -1]])),
                "gradient steps": res["grad_steps"],
                "seconds": res["seconds"],
            }
            for name, res in paths.items()
        }
    ).T


def segment_rises(res: Result) -> np.ndarray:
    """Per segment: the largest loss inside it minus the larger loss at its two ends."""
    loss = np.asarray(res["train_loss"])
    ends = np.maximum(loss[:-1], loss[1:])
    return np.asarray(res["dense_loss"]).max(1) - ends


def seed_table(seed_runs: Mapping[str, Sequence[Result]]) -> pd.DataFrame:
    """Per model: mean and spread over path seeds of the peak excess, accuracy and steps."""
    return pd.DataFrame(
        {
            name: {
                "peak excess mean": np.mean([r["peak_excess"] for r in runs]),
                "peak excess std": np.std([r["peak_excess"] for r in runs]),
                "min test acc mean": np.mean([r["min_test_acc"] for r in runs]),
                "gradient steps mean": np.mean([r["grad_steps"] for r in runs]),
            }
            for name, runs in seed_runs.items()
        }
    ).T


def cached_peak_anatomy(
    setup: PathSetup,
    model: Mapping[str, Any],
    pair: Sequence[nn.Module],
    settings: Mapping[str, Any],
    seed: int,
    run_cache: str | Path | None = None,
) -> dict[str, float]:
    """:func:`~wslib.llpf.protocols.peak_anatomy`, stored in ``run_cache`` under its key."""
    key = comparison_key(setup, model, pair, {"anatomy": settings}, seed, 0)
    key["protocol"] = "peak_anatomy"
    return cached_run(
        run_cache,
        key,
        lambda: peak_anatomy(setup, pair, settings, seed),
        code=CODE,
    )


def ablation_seed_table(
    fdf: Mapping[str, Sequence[Result]], all_at_once: Mapping[str, Sequence[Result]]
) -> pd.DataFrame:
    """Per model, over paired path seeds: peak excess of FDF and all at once (mean, std),
    their difference (all at once - FDF, mean and sample std over seeds, the spread
    of :func:`~wslib.runs.verdicts.compare_paired`; NaN for one seed) and the seeds
    where FDF was lower."""
    rows = {}
    for name, runs in all_at_once.items():
        a = np.array([r["peak_excess"] for r in fdf.get(name, [])[: len(runs)]])
        b = np.array([r["peak_excess"] for r in runs])
        if name not in fdf or len(a) != len(b):
            raise ValueError(
                f"{name}: {len(b)} all-at-once runs but {len(a)} FDF runs; run FDF "
                "on at least as many path seeds"
            )
        rows[name] = {
            "FDF mean": a.mean(),
            "FDF std": a.std(),
            "all at once mean": b.mean(),
            "all at once std": b.std(),
            "difference mean": (b - a).mean(),
            "difference std": (b - a).std(ddof=1) if len(a) > 1 else np.nan,
            "seeds FDF lower": int((a < b).sum()),
            "seeds": len(a),
        }
    return pd.DataFrame(rows).T


def ablation_comparison(table: pd.DataFrame, name: str) -> Comparison:
    """The one verdict rule (:func:`~wslib.runs.verdicts.compare`) on ``name``'s row
    of :func:`ablation_seed_table`: the mean difference (all at once - FDF, ABOVE:
    FDF lower) against its standard deviation over the paired path seeds."""
    row = table.loc[name]
    std = float(row["difference std"])
    return compare_values(
        float(row["difference mean"]), std if row["seeds"] > 1 else None
    )


def ablation_verdict(table: pd.DataFrame, name: str) -> str:
    """:func:`ablation_comparison` in one phrase, with the numbers it rests on."""
    row, c = table.loc[name], ablation_comparison(table, name)
    words = c.word(
        above="FDF lower than all at once",
        below="all at once lower than FDF",
        within="FDF and all at once within the spread between path seeds",
    )
    return (
        f"{name}: {words} (all at once - FDF {c.difference:+.3f} on average, "
        f"standard deviation {float(row['difference std']):.3f} over path seeds); "
        f"FDF lower in {int(row['seeds FDF lower'])} of {int(row['seeds'])} seeds"
    )


def _ablation_pair(fdf: Result, all_at_once: Result) -> dict[str, float]:
    return {
        "fdf_peak_excess": float(fdf["peak_excess"]),
        "all_at_once_peak_excess": float(all_at_once["peak_excess"]),
    }


def m2m_metrics(
    lines: Mapping[str, Result],
    paths: Mapping[str, Result],
    seeds: pd.DataFrame,
    ablation: Mapping[str, Result],
    ablation_seeds: pd.DataFrame | None = None,
    anatomy: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Chapter 3's metrics: per model, over path seeds (``seeds``, :func:`seed_table`), the
    ablation (first seed; over seeds: :func:`ablation_seed_table`), the peak's parts
    (:func:`~wslib.llpf.protocols.peak_anatomy`)."""
    metrics: dict[str, Any] = {
        name: {
            "linear_barrier": float(lines[name]["barrier"]),
            "llpf_peak_excess": float(res["peak_excess"]),
            "llpf_min_test_acc": float(res["min_test_acc"]),
            "grad_steps": int(res["grad_steps"]),
            "seconds": float(res["seconds"]),
        }
        for name, res in paths.items()
    }
    first_model = next(iter(paths))
    std = seeds["peak excess std"]
    metrics["seed_std_peak_excess"] = float(std.iloc[0])
    metrics["seed_std_by_arch"] = {n: float(std.loc[n]) for n in seeds.index}
    first = next(iter(ablation))
    metrics["ablation"] = _ablation_pair(paths[first], ablation[first])
    metrics["ablation_by_arch"] = {
        n: _ablation_pair(paths[n], res) for n, res in ablation.items()
    }
    metrics["max_segment_midpoint_rise"] = max(
        float(segment_rises(res).max()) for res in paths.values()
    )
    if ablation_seeds is not None:
        for n, row in ablation_seeds.iterrows():
            over = {
                f"over_seeds_{k.replace(' ', '_')}": float(v) for k, v in row.items()
            }
            metrics["ablation_by_arch"][n].update(over)
    if anatomy is not None:
        metrics[first_model]["peak_anatomy"] = {k: float(v) for k, v in anatomy.items()}
    return metrics


# --- chapter 4: LLPF against Bezier curves and AutoNEB -----------------------


def comparison_key(
    setup: PathSetup,
    model: Mapping[str, Any],
    pair: Sequence[nn.Module],
    methods: Mapping[str, Mapping[str, Any]],
    seed: int,
    budget: int | None = None,
) -> dict[str, Any]:
    """Everything that determines a run of the chapter (one method or a comparison).

    The data and the two modes enter by the digest of their content, the
    model by its config (its code enters the cache key through
    :data:`wslib.llpf.protocols.CODE`).
    """
    ds = setup.ds
    return {
        "protocol": "compare_at_equal_steps" if budget is None else "method_run",
        "data": tensor_digest(ds.x_train, ds.y_train, ds.x_test, ds.y_test),
        "model": dict(model),
        "modes": [tensor_digest(m.state_dict()) for m in pair],
        "path_seed": seed,
        "methods": {label: dict(v) for label, v in methods.items()},
        "budget": budget,
        "r_min": setup.r_min,
        "batch_size": setup.batch_size,
        "threshold_margin": setup.margin,
        "dense": setup.dense,
    }


def chapter_methods(
    llpf: Mapping[str, Any], baselines: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Label -> settings of every method for one model: ``"LLPF"`` first, then ``baselines``."""
    return {
        "LLPF": {"method": "llpf", **llpf},
        **{k: dict(v) for k, v in baselines.items()},
    }


def cached_method_run(
    setup: PathSetup,
    model: Mapping[str, Any],
    pair: Sequence[nn.Module],
    label: str,
    settings: Mapping[str, Any],
    seed: int,
    budget: int | None,
    run_cache: str | Path | None = None,
) -> dict[str, Any]:
    """:func:`~wslib.llpf.protocols.method_run`, stored in ``run_cache`` under its key."""
    key = comparison_key(setup, model, pair, {label: settings}, seed, budget or 0)
    return cached_run(
        run_cache,
        key,
        lambda: method_run(setup, pair, settings, seed, budget),
        code=CODE,
    )


def _number(value: float | None) -> float:
    """A metric read back from a run cache: NaN (a diverged run) comes back as None."""
    return float("nan") if value is None else float(value)


def tuning_budget(
    setup: PathSetup,
    model: Mapping[str, Any],
    pair: Sequence[nn.Module],
    methods: Mapping[str, Mapping[str, Any]],
    seed: int,
    run_cache: str | Path | None = None,
) -> int:
    """The gradient steps of the first method (LLPF) at its base settings on ``seed``.

    ``methods``: one model's label -> settings, LLPF first; the run is
    :func:`cached_method_run`'s. It is the budget of every baseline of
    :func:`tuning_sweep`.
    """
    first = next(iter(methods))
    args = (setup, model, pair, first, methods[first], seed, None, run_cache)
    return int(cached_method_run(*args)["grad_steps"])


def tuning_run(
    setup: PathSetup,
    model: Mapping[str, Any],
    pair: Sequence[nn.Module],
    methods: Mapping[str, Mapping[str, Any]],
    label: str,
    override: Mapping[str, Any],
    seed: int,
    budget: int | None,
    run_cache: str | Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One setting of :func:`tuning_sweep`: ``(settings, evaluated path)``.

    The settings are ``methods[label]`` with ``override`` applied; a baseline
    takes exactly ``budget`` gradient steps (:func:`tuning_budget`), LLPF
    ignores it.
    """
    settings = {**methods[label], **override}
    kind_budget = None if settings["method"] == "llpf" else budget
    res = cached_method_run(
        setup, model, pair, label, settings, seed, kind_budget, run_cache
    )
    return settings, res


def tuning_sweep(
    setup: PathSetup,
    models: Mapping[str, Mapping[str, Any]],
    modes: Mapping[str, Sequence[nn.Module]],
    methods: Mapping[str, Mapping[str, Mapping[str, Any]]],
    grid: Mapping[str, Sequence[Mapping[str, Any]]],
    seed: int,
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
        args = (setup, models[name], modes[name], methods[name])
        budget = tuning_budget(*args, seed, run_cache)
        for label, options in grid.items():
            for override in options:
                settings, res = tuning_run(
                    *args, label, override, seed, budget, run_cache
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
        for label, res in rows.groupby("method", sort=False):
            best = res.loc[res["peak excess"].idxmin(), "setting"]
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
    run_cache: str | Path | None = None,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """:func:`~wslib.llpf.protocols.compare_at_equal_steps` for every model and path seed.

    ``methods[model]``: label -> settings, LLPF first. Each run is stored in
    ``run_cache`` (see :func:`wslib.runs.cache.cached_run`) under
    :func:`comparison_key` and the source of :data:`wslib.llpf.protocols.CODE`.
    Returns ``runs[model][label]``: the evaluated paths of the seeds, in order.
    """
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in models:
        runs[name] = {}
        for s in seeds:
            key = comparison_key(setup, models[name], modes[name], methods[name], s)
            result = cached_run(
                run_cache,
                key,
                lambda name=name, s=s: compare_at_equal_steps(
                    setup, modes[name], methods[name], s, name
                ),
                code=CODE,
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
                    "seeds": len(excess),
                    "worst peak loss": max(r["peak_loss"] for r in res),
                    "min test acc": min(r["min_test_acc"] for r in res),
                    "gradient steps (mean)": np.mean([r["grad_steps"] for r in res]),
                    "seconds (mean)": np.mean([r["seconds"] for r in res]),
                }
            )
    return pd.DataFrame(rows)


def method_comparison(compare: pd.DataFrame, model: str) -> tuple[str, str, Comparison]:
    """The lowest mean peak excess on ``model``, the runner-up, and the one verdict
    rule (:func:`~wslib.runs.verdicts.compare`) on their gap (ABOVE: the best is
    lower by more than the spread, the two seed standard deviations together)."""
    rows = compare[compare.model == model]
    if len(rows) < 2:
        raise ValueError(f"need at least two methods on {model!r} to compare them")
    rows = rows.dropna(subset=["peak excess mean"]).sort_values("peak excess mean")
    if len(rows) < 2:  # a diverged run: no gap to judge
        first = rows.iloc[0]["method"] if len(rows) else "none"
        return first, "none", Comparison(Verdict.UNKNOWN, float("nan"), None)
    best, second = rows.iloc[0], rows.iloc[1]
    gap = second["peak excess mean"] - best["peak excess mean"]
    spread = best["peak excess std"] + second["peak excess std"]
    one_seed = min(best["seeds"], second["seeds"]) < 2
    return (
        best["method"],
        second["method"],
        compare_values(gap, None if one_seed else float(spread)),
    )


def comparison_verdict(compare: pd.DataFrame, model: str) -> str:
    """:func:`method_comparison` in one sentence, with the numbers it rests on."""
    first, runner_up, c = method_comparison(compare, model)
    if runner_up == "none":
        return f"on the {model}, fewer than two methods had a finite peak excess"
    rows = compare[compare.model == model].set_index("method")
    a, b = rows.loc[first], rows.loc[runner_up]
    how = (
        "with one path seed, no spread to judge the gap by"
        if c.verdict is Verdict.UNKNOWN
        else c.word(
            above="more than their seed standard deviations together",
            below="",  # the runner-up is never lower
            within="within the spread between seeds (their standard deviations "
            "together)",
        )
    )
    return (
        f"on the {model}, {first} had the lowest mean peak excess "
        f"({a['peak excess mean']:.3f} ± {a['peak excess std']:.3f}), "
        f"{c.difference:.3f} below {runner_up} "
        f"({b['peak excess mean']:.3f} ± {b['peak excess std']:.3f}), {how}"
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

    def records(table: pd.DataFrame) -> list[dict[str, Any]]:
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


# --- chapter 5: across variance spheres --------------------------------------

# Chapter 5's M2O runs: label -> with angular compliance (in the chapter's order).
M2O_VARIANTS = {"with angular compliance": True, "without": False}


def m2o_table(m2o_runs: Mapping[str, Result]) -> pd.DataFrame:
    """Per M2O variant: final variance ratio, peak training loss, final test accuracy, steps."""
    return pd.DataFrame(
        {
            label: {
                "final variance ratio": float(res["variance"][-1]),
                "peak training loss": float(np.max(res["train_loss"])),
                "final test acc": float(res["test_acc"][-1]),
                "gradient steps": res["grad_steps"],
            }
            for label, res in m2o_runs.items()
        }
    ).T


def spheres_metrics(
    with_compliance: Result,
    without: Result,
    hybrid: Result,
    sharp: Result,
) -> dict[str, float | int]:
    """Chapter 5's metrics: M2O with and without compliance, the hybrid, sharp minima.

    The keys are those of the book's first results files (tests/book checks
    them); the chapter's other numbers are glued from the runs.
    """
    return {
        "m2o_final_variance_ratio": float(with_compliance["variance"][-1]),
        "m2o_final_variance_ratio_no_compliance": float(without["variance"][-1]),
        "m2o_peak_loss": float(np.max(with_compliance["train_loss"])),
        "m2o_peak_loss_no_compliance": float(np.max(without["train_loss"])),
        "hybrid_peak_excess": float(hybrid["peak_excess"]),
        "hybrid_min_test_acc": float(hybrid["min_test_acc"]),
        "hybrid_grad_steps": int(hybrid["grad_steps"]),
        "sphere_variance_ratio": float(hybrid["dest_variance"]),
        "sharp_peak_excess": float(sharp["peak_excess"]),
        "sharp_grad_steps": int(sharp["grad_steps"]),
    }
