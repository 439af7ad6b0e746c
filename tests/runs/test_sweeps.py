"""Seeds summarised: scalar metrics, one run per seed, mean, std and t-interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from wslib.runs.sweeps import (
    scalar_metrics,
    seed_results,
    setting,
    summarise_seeds,
    summary,
    write_summary,
)


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


def run_file(path: Path, seed: int, finished: float, **fields: object) -> None:
    """A results file of ``seed`` that finished at ``finished``, with ``fields``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"params": {"seed": seed}, "metrics": {"x": 1.0}, "finished": finished}
    path.write_text(json.dumps(record | fields))


def test_of_two_runs_of_one_seed_that_finished_together_the_default_run_counts(
    tmp_path: Path,
) -> None:
    run_file(tmp_path / "nb.json", 0, 10.0, metrics={"x": 1.0})
    run_file(tmp_path / "seed-0/nb.json", 0, 10.0, metrics={"x": 2.0})
    assert seed_results(tmp_path, "nb")[0]["metrics"] == {"x": 1.0}


def test_the_setting_ignores_key_order_and_a_missing_params_entry() -> None:
    first = {"params": {"seed": 1, "b": 1, "a": 2}, "code": "c"}
    second = {"params": {"a": 2, "seed": 2, "b": 1}, "code": "c"}
    assert setting(first) == setting(second) == ('{"a": 2, "b": 1}', "c")
    assert setting({"code": "c"}) == ("{}", "c")


def test_runs_of_another_setting_are_named_in_a_warning_at_the_caller(
    tmp_path: Path,
) -> None:
    run_file(
        tmp_path / "seed-0/nb.json", 0, 30.0, params={"seed": 0, "lr": 0.1}, code="new"
    )
    run_file(
        tmp_path / "seed-1/nb.json", 1, 10.0, params={"seed": 1, "lr": 0.2}, code="new"
    )
    run_file(
        tmp_path / "seed-2/nb.json", 2, 20.0, params={"seed": 2, "lr": 0.1}, code="old"
    )
    with pytest.warns(UserWarning) as record:
        summarised = summarise_seeds(tmp_path, "nb")
    [warning] = record
    assert str(warning.message) == (
        "nb: seeds [1, 2] are left out of the summary: they ran with other code, "
        "other parameters than the newest run; run them again (make sweep NB=... "
        "SEEDS=...) to count them"
    )
    assert "wslib" not in Path(warning.filename).parts  # at the caller, not here
    assert summarised["seeds"] == [0]
    assert summarised["left_out"] == {"1": "other parameters", "2": "other code"}


def test_the_devices_of_every_counted_run_are_listed_once(tmp_path: Path) -> None:
    run_file(tmp_path / "seed-0/nb.json", 0, 1.0, env={"devices_used": ["cuda:0"]})
    run_file(
        tmp_path / "seed-1/nb.json", 1, 2.0, env={"devices_used": ["cpu", "cuda:0"]}
    )
    run_file(tmp_path / "seed-2/nb.json", 2, 3.0)  # no environment recorded
    assert summarise_seeds(tmp_path, "nb")["devices"] == ["cpu", "cuda:0"]
