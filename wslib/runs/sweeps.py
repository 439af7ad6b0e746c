"""A notebook's metrics over seeds: ``results/<profile>/seeds/<notebook>.json``.

A sweep (``notebooks/sweep.py``) leaves one results file per seed,
``results/<profile>/seed-<S>/<notebook>.json``, beside the default run's
``results/<profile>/<notebook>.json``. :func:`summarise_seeds` reads them all
(one per seed; a seed run twice counts once, the ``seed-<S>`` file winning) and
gives, for every scalar metric (nested keys joined by ``/``), the per-seed
values, n, mean, sample standard deviation and a 95% t-interval of the mean.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scipy import stats

from wslib.core.files import atomic_write


def scalar_metrics(metrics: Any, *, prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(path, value)`` for every finite int or float leaf (bools, lists, text left out)."""
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            yield from scalar_metrics(value, prefix=f"{prefix}{key}/")
    elif isinstance(metrics, int | float) and not isinstance(metrics, bool):
        if math.isfinite(metrics):
            yield prefix.rstrip("/"), float(metrics)


def seed_results(results_dir: Path, notebook: str) -> dict[int, dict[str, Any]]:
    """The results file of each seed of ``notebook`` under ``results_dir``."""
    files = [results_dir / f"{notebook}.json"]
    files += sorted(results_dir.glob(f"seed-*/{notebook}.json"))
    by_seed: dict[int, dict[str, Any]] = {}
    for path in files:
        if not path.exists():
            continue
        try:
            results = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(
                f"{path} is not a results file ({error}); delete it and run the "
                "chapter again (make notebook NB=... SEED=...)"
            ) from None
        if not isinstance(results, dict):
            raise ValueError(
                f"{path} is not a results file (a JSON {type(results).__name__}); "
                "delete it and run the chapter again (make notebook NB=... SEED=...)"
            )
        seed = results.get("params", {}).get("seed")
        if isinstance(seed, int):
            by_seed[seed] = results
    return dict(sorted(by_seed.items()))


def summary(values: list[float]) -> dict[str, Any]:
    """n, mean, sample std and the 95% t-interval of the mean (None for n = 1)."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "ci95": None}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def summarise_seeds(results_dir: Path, notebook: str) -> dict[str, Any]:
    """Per-seed values and their summary for every scalar metric of ``notebook``,
    and the devices its seeds' training and paths ran on (``devices``)."""
    runs = seed_results(results_dir, notebook)
    values: dict[str, dict[int, float]] = {}
    for seed, results in runs.items():
        for path, value in scalar_metrics(results.get("metrics", {})):
            values.setdefault(path, {})[seed] = value
    metrics = {
        path: {"values": {str(s): v for s, v in by_seed.items()}}
        | summary(list(by_seed.values()))
        for path, by_seed in values.items()
    }
    devices = sorted(
        {d for r in runs.values() for d in r.get("env", {}).get("devices_used", [])}
    )
    return {
        "notebook": notebook,
        "seeds": list(runs),
        "metrics": metrics,
        "devices": devices,
    }


def write_summary(results_dir: Path, notebook: str) -> Path | None:
    """Write ``<results_dir>/seeds/<notebook>.json``; None when no run exists."""
    summarised = summarise_seeds(results_dir, notebook)
    if not summarised["seeds"]:
        return None
    text = json.dumps(summarised, indent=1) + "\n"
    path = results_dir / "seeds" / f"{notebook}.json"
    return atomic_write(path, lambda tmp: tmp.write_text(text))
