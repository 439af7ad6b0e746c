"""Jobs spread over worker processes: same results, same order, errors surface."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.kit import mlp, toy_dataset
from wslib.core.train import Recipe
from wslib.pathcond.training import TrainSettings, train_run
from wslib.runs.stats import epochs_to
from wslib.runs.workers import default_workers, run_jobs


def test_results_do_not_depend_on_the_number_of_workers():
    ds = toy_dataset(96, 24, [1, 12], labels="cyclic", test_from_train=True)
    config = mlp([16, 16], in_shape=[1, 12])
    recipe = Recipe(
        epochs=2, batch_size=16, lr=0.1, momentum=0, weight_decay=0, schedule="constant"
    )
    jobs = [
        {
            "settings": TrainSettings(
                model=config, method=method, recipe=recipe, seed=seed
            ),
            "ds": ds,
        }
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
    monkeypatch.delenv("WSLIB_WORKERS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WSLIB_CPU_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.delenv("WSLIB_CPU_WORKERS")
    assert default_workers() >= 1


def test_one_worker_on_cuda_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cores' share run.py sets never starts one CUDA context per worker."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("WSLIB_WORKERS", raising=False)
    monkeypatch.setenv("WSLIB_CPU_WORKERS", "8")
    assert default_workers() == 1
    monkeypatch.setenv("WSLIB_WORKERS", "2")  # the user's own choice
    assert default_workers() == 2


def test_jobs_carry_a_data_key_and_each_worker_loads_the_data_set_once() -> None:
    """A job's arguments pickle to a few hundred bytes, not to the data set's tensors."""
    import pickle

    from wslib.core.data import DataKey, load_dataset
    from wslib.pathcond.grid import RunGrid

    ds = load_dataset("digits")
    key = DataKey.of({"name": "digits"}, ds)
    assert key.load() is ds  # the caller's own copy is not loaded again
    config = {"widths": [8], "init_scale": 1.0, "methods": ["baseline"]}
    base = {"name": "mlp", "in_shape": [1, 64], "n_classes": 10}
    grid = RunGrid(base, key, {"epochs": 1, "lr": 0.1}, {"c": config})
    args = grid.arguments(grid.job("c", "baseline", 0))
    assert isinstance(args["ds"], DataKey) and len(pickle.dumps(args)) < 2000
    assert grid.dataset is ds
    other = {**args, "settings": dataclasses.replace(args["settings"], seed=1)}
    two = run_jobs(train_run, [args, other], workers=2)
    one = [train_run(**args), train_run(**other)]
    assert [r["loss"] for r in two] == [r["loss"] for r in one]


@pytest.mark.parametrize("name", ["WSLIB_WORKERS", "WSLIB_CPU_WORKERS"])
@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_bad_worker_count_names_the_variable(monkeypatch, name, value) -> None:
    from wslib.runs import workers

    monkeypatch.delenv("WSLIB_WORKERS", raising=False)
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(workers.torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=rf"{name}='{value}': give a whole number"):
        workers.default_workers()


def test_a_worker_count_is_read(monkeypatch) -> None:
    from wslib.runs import workers

    monkeypatch.setenv("WSLIB_WORKERS", " 3 ")
    assert workers.default_workers() == 3
