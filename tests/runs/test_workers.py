"""Jobs spread over worker processes: same results, same order, errors surface."""

from __future__ import annotations

import pytest
import torch

from wslib.core.data import Dataset
from wslib.core.train import Recipe
from wslib.pathcond.training import train_run
from wslib.runs.stats import epochs_to
from wslib.runs.workers import default_workers, run_jobs


def test_results_do_not_depend_on_the_number_of_workers():
    x = torch.randn(96, 1, 12, generator=torch.Generator().manual_seed(0))
    y = torch.arange(96) % 3
    ds = Dataset("toy", x, y, x[:24], y[:24], 3)
    config = {"name": "mlp", "in_shape": [1, 12], "n_classes": 3, "widths": [16, 16]}
    recipe = Recipe(
        epochs=2, batch_size=16, lr=0.1, momentum=0, weight_decay=0, schedule="constant"
    )
    jobs = [
        {"config": config, "method": method, "ds": ds, "recipe": recipe, "seed": seed}
        for method in ("baseline", "pathcond")
        for seed in (0, 1)
    ]
    parallel = run_jobs(train_run, jobs, workers=2)
    serial = run_jobs(train_run, jobs, workers=1)
    assert [r["loss"] for r in parallel] == [r["loss"] for r in serial]
    assert (
        parallel[0]["loss"] != parallel[1]["loss"]
    )  # the seeds differ, so do the runs


def test_order_is_kept_and_errors_surface():
    jobs = [{"acc": [0.5] * k + [1.0]} for k in range(5)]
    assert run_jobs(epochs_to, jobs, workers=2) == [1, 2, 3, 4, 5]
    with pytest.raises(TypeError):
        run_jobs(epochs_to, [{"acc": [0.5]}, {"accuracy": [1.0]}], workers=2)


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        run_jobs(epochs_to, [{"acc": [1.0]}], workers=0)


def test_workers_follow_the_environment_when_notebooks_share_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WSLIB_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.delenv("WSLIB_WORKERS")
    assert default_workers() >= 1
