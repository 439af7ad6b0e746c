"""Chapter 3, M2M paths: the tables and metrics of LLPF's model-to-model paths,
over path seeds, with the all-at-once ablation and the anatomy of a peak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from wslib.core.train import evaluate
from wslib.llpf.layerwise import M2MSettings, m2m
from wslib.llpf.protocols import CODE, Pair, PathRun, PathSetup
from wslib.runs.resumable import Persist
from wslib.runs.steps import cached_step
from wslib.runs.verdicts import LOSS_MARGIN, Decision, decide_summary

Result = Mapping[str, Any]


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


@cached_step(code=(*CODE, __name__))
def peak_anatomy(
    setup: PathSetup,
    pair: Pair,
    settings: PathRun | Mapping[str, Any],
    seed: int,
    *,
    run_cache: str | Path | None = None,
) -> dict[str, float]:
    """Where an M2M path's peak excess comes from, measured on one run (no
    checkpoint; a cached step in ``run_cache``, this module's source in its key).

    At every tick the full training-set loss of the refined point is measured
    before and after its projection on the variance spheres (eval mode:
    meant for models without BatchNorm). At the recorded tick whose point
    has the highest full loss: ``moving_average`` (what the stop rule saw),
    ``before_projection``, ``after_projection``; with ``endpoint_loss``,
    ``threshold`` and the evaluated path's ``peak_loss``. The parts
    ``margin`` (threshold - endpoint), ``stop_gap`` (moving average -
    threshold), ``full_set_gap`` (before projection - moving average),
    ``projection`` (after - before) and ``elsewhere`` (peak - after: other
    points, segment midpoints) add up to ``peak_excess``.
    """
    run = PathRun.of(settings, "M2M settings")
    a, b = pair
    refine = setup.refine(pair, run)
    ds = setup.ds
    before: dict[int, float] = {}
    after: dict[int, float] = {}

    def full(store: dict[int, float]):
        return lambda tick, model: store.__setitem__(
            tick, evaluate(model, ds.x_train, ds.y_train)[0]
        )

    path = m2m(
        a,
        a.state_dict(),
        b.state_dict(),
        ds.x_train,
        ds.y_train,
        M2MSettings(
            ticks=run.ticks,
            refine=refine,
            seed=seed,
            record_every=run.record_every,
        ),
        on_refined=full(before),
        persist=Persist(progress=False, on_tick=full(after)),
    )
    res = setup.evaluate(a, path)
    recorded = [t for t in path.ticks[1:-1] if t in before]
    tick = max(recorded or before, key=lambda t: after[t])
    ends = float(max(res["train_loss"][0], res["train_loss"][-1]))
    out = {
        "tick": float(tick),
        "endpoint_loss": ends,
        "threshold": float(refine.threshold),
        "moving_average": float(path.refine_loss[tick - 1]),
        "before_projection": float(before[tick]),
        "after_projection": float(after[tick]),
        "peak_loss": float(res["peak_loss"]),
        "peak_excess": float(res["peak_excess"]),
    }
    out["margin"] = out["threshold"] - ends
    out["stop_gap"] = out["moving_average"] - out["threshold"]
    out["full_set_gap"] = out["before_projection"] - out["moving_average"]
    out["projection"] = out["after_projection"] - out["before_projection"]
    out["elsewhere"] = out["peak_loss"] - out["after_projection"]
    return out


def ablation_seed_table(
    fdf: Mapping[str, Sequence[Result]], all_at_once: Mapping[str, Sequence[Result]]
) -> pd.DataFrame:
    """Per model, over paired path seeds: peak excess of FDF and all at once (mean, std),
    their difference (all at once - FDF, mean and sample std over seeds; NaN for
    one seed) and the seeds where FDF was lower."""
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


def ablation_comparison(table: pd.DataFrame, name: str) -> Decision:
    """The book's rule (:mod:`wslib.runs.verdicts`) on ``name``'s row of
    :func:`ablation_seed_table`: the 95% interval of the mean paired difference
    (all at once - FDF; ABOVE: FDF lower) over the path seeds of this run, with
    the ledger's margin of 0.01 of loss."""
    row = cast(pd.Series, table.loc[name])
    n = int(row["seeds"])
    std = float(row["difference std"]) if n > 1 else 0.0
    return decide_summary(float(row["difference mean"]), std, n, margin=LOSS_MARGIN)


def ablation_verdict(table: pd.DataFrame, name: str) -> str:
    """:func:`ablation_comparison` in one phrase, with the numbers it rests on."""
    row, c = cast(pd.Series, table.loc[name]), ablation_comparison(table, name)
    words = c.word(
        above="FDF lower than all at once",
        below="all at once lower than FDF",
        equivalent="FDF and all at once no different in practice (within 0.01)",
        undecided="undecided between FDF and all at once",
    )
    return (
        f"{name}: {words} (all at once - FDF: {c.interval_text('+.3f')} over the "
        "path seeds of this run); "
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
    *,
    ablation_seeds: pd.DataFrame | None = None,
    anatomy: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Chapter 3's metrics: per model, over path seeds (``seeds``, :func:`seed_table`), the
    ablation (first seed; over seeds: :func:`ablation_seed_table`), the peak's parts
    (:func:`peak_anatomy`)."""
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
                f"over_seeds_{cast(str, k).replace(' ', '_')}": float(v)
                for k, v in row.items()
            }
            metrics["ablation_by_arch"][n].update(over)
    if anatomy is not None:
        metrics[first_model]["peak_anatomy"] = {k: float(v) for k, v in anatomy.items()}
    return metrics
