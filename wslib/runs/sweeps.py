"""A notebook's metrics over seeds: ``results/<profile>/seeds/<notebook>.json``.

A sweep (``bookkit/sweep.py``) leaves one results file per seed,
``results/<profile>/seed-<S>/<notebook>.json``, beside the default run's
``results/<profile>/<notebook>.json``. :func:`summarise_seeds` reads them all
(one per seed; a seed run twice counts once, the newer run winning) and
gives, for every scalar metric (nested keys joined by ``/``), the per-seed
values, n, mean, sample standard deviation and a 95% t-interval of the mean.
Runs made with other parameters or other code than the newest run are left
out, with a warning naming them: a summary never mixes two settings.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wslib.core.files import atomic_write
from wslib.core.seeds import check_seed


def scalar_metrics(metrics: Any, *, prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(path, value)`` for every finite int or float leaf (bools, lists, text left out)."""
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            yield from scalar_metrics(value, prefix=f"{prefix}{key}/")
    elif isinstance(metrics, int | float) and not isinstance(metrics, bool):
        if math.isfinite(metrics):
            yield prefix.rstrip("/"), float(metrics)


def _read(path: Path) -> dict[str, Any]:
    """One results file; a clear error when it is not one."""
    fix = "delete it and run the chapter again (make notebook NB=... SEED=...)"
    try:
        results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a results file ({error}); {fix}") from None
    if not isinstance(results, dict):
        raise ValueError(
            f"{path} is not a results file (a JSON {type(results).__name__}); {fix}"
        )
    seed = results.get("params", {}).get("seed")
    try:
        check_seed(seed)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{path}: its params.seed is {seed!r} ({error}), so no seed can hold its "
            f"numbers; {fix}"
        ) from None
    folder = path.parent.name
    if folder.startswith("seed-") and folder != f"seed-{seed}":
        raise ValueError(f"{path}: it records seed {seed}, not {folder[5:]}; {fix}")
    # files written before runs recorded their end: the file's time stands in
    results.setdefault("finished", path.stat().st_mtime)
    return results


def seed_results(results_dir: Path, notebook: str) -> dict[int, dict[str, Any]]:
    """The results file of each seed of ``notebook`` under ``results_dir``.

    A seed with two files (the default run's and a sweep's ``seed-<S>``)
    counts once: the newer run (``finished``) is the current one, the default
    run's on a tie.
    """
    files = [results_dir / f"{notebook}.json"]
    files += sorted(results_dir.glob(f"seed-*/{notebook}.json"))
    by_seed: dict[int, dict[str, Any]] = {}
    for path in files:
        if not path.exists():
            continue
        results = _read(path)
        seed = results["params"]["seed"]
        if seed not in by_seed or results["finished"] > by_seed[seed]["finished"]:
            by_seed[seed] = results
    return dict(sorted(by_seed.items()))


PER_RUN = {"seed", "results_path"}
"""Parameters that differ between the seeds of one setting by design."""


def setting(results: dict[str, Any]) -> tuple[str, str]:
    """What must agree between the seeds of one summary: parameters and code."""
    params = {k: v for k, v in results.get("params", {}).items() if k not in PER_RUN}
    return json.dumps(params, sort_keys=True), str(results.get("code"))


def current_runs(
    runs: dict[int, dict[str, Any]],
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """The runs made with the newest run's parameters and code, and why each other is not.

    After a change of parameters or code a later run of some seeds would
    otherwise be summarised with earlier runs of the rest.
    """
    if not runs:
        return {}, {}
    newest = max(runs.values(), key=lambda r: r["finished"])
    params, code = setting(newest)
    kept, left = {}, {}
    for seed, results in runs.items():
        theirs = setting(results)
        if theirs == (params, code):
            kept[seed] = results
        else:
            left[seed] = "other parameters" if theirs[0] != params else "other code"
    return kept, left


def summary(values: list[float]) -> dict[str, Any]:
    """n, mean, sample std and the 95% t-interval of the mean (None for n = 1)."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "ci95": None}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    from scipy import stats  # here: a sweep that fails before its summary needs none

    half = float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def summarise_seeds(results_dir: Path, notebook: str) -> dict[str, Any]:
    """Per-seed values and their summary for every scalar metric of ``notebook``,
    and the devices its seeds' training and paths ran on (``devices``).

    Only the runs of the newest run's setting count (:func:`current_runs`);
    ``left_out`` names the others, and a warning says so.
    """
    runs, left = current_runs(seed_results(results_dir, notebook))
    if left:
        warnings.warn(
            f"{notebook}: seeds {sorted(left)} are left out of the summary: they ran "
            f"with {', '.join(sorted(set(left.values())))} than the newest run; run "
            "them again (make sweep NB=... SEEDS=...) to count them",
            UserWarning,
            stacklevel=2,
        )
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
        "left_out": {str(seed): why for seed, why in left.items()},
    }


def write_summary(results_dir: Path, notebook: str) -> Path | None:
    """Write ``<results_dir>/seeds/<notebook>.json``; None when no run exists."""
    summarised = summarise_seeds(results_dir, notebook)
    if not summarised["seeds"]:
        return None
    text = json.dumps(summarised, indent=1) + "\n"
    path = results_dir / "seeds" / f"{notebook}.json"
    return atomic_write(path, lambda tmp: tmp.write_text(text))
