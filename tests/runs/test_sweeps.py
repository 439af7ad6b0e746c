"""Seeds summarised: scalar metrics, one run per seed, mean, std and t-interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from wslib.runs.sweeps import scalar_metrics, summarise_seeds, summary, write_summary


def write(path: Path, seed: int, metrics: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"params": {"seed": seed}, "metrics": metrics}))


def test_scalar_metrics_flatten_nested_numbers_only() -> None:
    metrics = {"a": {"b": 1, "c": [1, 2], "ok": True}, "d": 2.5, "e": "x"}
    metrics["f"] = float("nan")
    assert dict(scalar_metrics(metrics)) == {"a/b": 1.0, "d": 2.5}


def test_summary_is_the_t_interval_of_the_mean() -> None:
    values = [1.0, 2.0, 4.0]
    result = summary(values)
    mean, std = 7 / 3, math.sqrt(sum((v - 7 / 3) ** 2 for v in values) / 2)
    half = stats.t.ppf(0.975, 2) * std / math.sqrt(3)
    assert result["n"] == 3
    assert result["mean"] == pytest.approx(mean)
    assert result["std"] == pytest.approx(std)
    assert result["ci95"] == pytest.approx([mean - half, mean + half])
    assert summary([5.0]) == {"n": 1, "mean": 5.0, "std": None, "ci95": None}


def test_each_seed_counts_once_and_the_seed_run_wins(tmp_path: Path) -> None:
    write(tmp_path / "nb.json", 0, {"x": 1.0})  # make book: the default seed
    write(tmp_path / "seed-0/nb.json", 0, {"x": 2.0})  # the same seed, swept
    write(tmp_path / "seed-3/nb.json", 3, {"x": 4.0, "only_here": 1})
    result = summarise_seeds(tmp_path, "nb")
    assert result["seeds"] == [0, 3]
    assert result["metrics"]["x"]["values"] == {"0": 2.0, "3": 4.0}
    assert result["metrics"]["x"]["mean"] == 3.0
    assert result["metrics"]["only_here"]["n"] == 1


def test_summary_file_lands_under_seeds(tmp_path: Path) -> None:
    assert write_summary(tmp_path, "nb") is None  # no run yet: no file
    write(tmp_path / "seed-1/nb.json", 1, {"x": 1.0})
    path = write_summary(tmp_path, "nb")
    assert path == tmp_path / "seeds/nb.json"
    assert json.loads(path.read_text())["metrics"]["x"]["n"] == 1
