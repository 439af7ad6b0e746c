"""PathCond's solver reports whether it converged, and the chapter says which runs did not."""

from __future__ import annotations

from tests.kit import mlp, toy_dataset
from wslib.core.data import Dataset
from wslib.core.train import Recipe
from wslib.pathcond.ch08_conv import convergence_rows, convergence_text
from wslib.pathcond.training import TrainSettings, prepare_model, train_run

MLP = mlp([5, 4], in_shape=[1, 6])


def _ds() -> Dataset:
    return toy_dataset(30, 9, [1, 6], labels="cyclic", test_from_train=True)


def test_runs_record_the_solver_outcome() -> None:
    recipe = Recipe(epochs=1, batch_size=10)
    run = train_run(
        TrainSettings(model=MLP, method="pathcond", recipe=recipe, seed=0), _ds()
    )
    assert run["rescale_converged"] is True and run["rescale_sweeps"] >= 1
    assert 0 <= run["rescale_last_drop"] <= 1e-12
    base = train_run(
        TrainSettings(model=MLP, method="baseline", recipe=recipe, seed=0), _ds()
    )
    assert base["rescale_converged"] is None and base["rescale_sweeps"] == 0


def test_paper_setting_runs_at_most_its_sweeps_and_no_solver_without_rescaling() -> (
    None
):
    _, seconds, solver = prepare_model(MLP, "pathcond_10", init_scale=0.1, seed=1)
    assert 1 <= solver.sweeps <= 10 and seconds > 0
    assert prepare_model(MLP, "kaiming").solver is None


def test_the_text_names_each_run_that_did_not_converge() -> None:
    rows = [
        {
            "architecture": "fully_conv",
            "seed": 0,
            "converged": False,
            "sweeps": 1000,
            "last relative drop of F": 5e-8,
        },
        {
            "architecture": "resnet_bn",
            "seed": 0,
            "converged": True,
            "sweeps": 40,
            "last relative drop of F": 1e-13,
        },
    ]
    text = convergence_text(rows)
    assert "1 of 2 runs" in text and "fully_conv (seed 0: 1000 sweeps" in text
    assert "5.0e-08" in text and "resnet_bn" not in text
    assert "converged in every run" in convergence_text(rows[1:])
    runs = {
        ("a", "pathcond", 0): {
            "rescale_converged": False,
            "rescale_sweeps": 7,
            "rescale_last_drop": 0.1,
        },
        ("a", "baseline", 0): {"rescale_converged": None},
    }
    assert convergence_rows(runs, {"a": {}}, [0]) == [
        {
            "architecture": "a",
            "seed": 0,
            "converged": False,
            "sweeps": 7,
            "last relative drop of F": 0.1,
        }
    ]
