"""The grid of cached MLP runs: jobs, their arguments, training each once, stacking."""

from __future__ import annotations

import pytest

from tests.pathcond.toy import BASE, CONFIGS, RECIPE, toy_data
from wslib.core.configs import build_model
from wslib.core.train import Recipe
from wslib.pathcond import training
from wslib.pathcond.grid import Job, RunGrid


def test_job_defaults_come_from_the_config_and_recipe(toy_grid):
    job = toy_grid.job("low", "pathcond", 3)
    assert job == Job("low", (8, 8), 0.1, "relu", "pathcond", 0.1, 3, 2, True)
    other = toy_grid.job(
        "low", "baseline", 0, lr=0.5, epochs=7, widths=[4], activation="gelu"
    )
    assert other == Job("low", (4,), 0.1, "gelu", "baseline", 0.5, 0, 7, True)


def test_output_bias_from_the_base_or_the_configuration():
    base = {**BASE, "output_bias": False}
    configs = {**CONFIGS, "low_bias": {**CONFIGS["low"], "output_bias": True}}
    grid = RunGrid(base, toy_data(), RECIPE, configs)
    paper, bias = (grid.job(c, "pathcond", 0) for c in ("low", "low_bias"))
    assert not paper.output_bias and bias.output_bias
    for job, expected in ((paper, False), (bias, True)):
        config = dict(grid.arguments(job)["settings"].model)
        assert config["output_bias"] is expected
        assert (build_model(config).linears[-1].bias is not None) is expected


def test_arguments_build_the_model_config_and_recipe(toy_grid):
    kwargs = toy_grid.arguments(
        toy_grid.job("low", "pathcond", 3, lr=0.5, activation="gelu")
    )
    settings = kwargs["settings"]
    assert settings.model == {
        **BASE,
        "widths": [8, 8],
        "activation": "gelu",
        "output_bias": True,
    }
    assert settings.recipe == Recipe(**{**RECIPE, "lr": 0.5})
    assert (settings.method, settings.seed, settings.init_scale) == (
        "pathcond",
        3,
        0.1,
    )
    assert kwargs["ds"] is toy_grid.ds and kwargs["cache_dir"] is None


def test_train_runs_each_job_once_and_returns_runs_in_order(toy_grid, fake_jobs):
    a, b = toy_grid.job("const", "baseline", 0), toy_grid.job("const", "baseline", 1)
    runs = toy_grid.train([a, b, a])
    assert [r["seed"] for r in runs] == [0, 1, 0]
    assert len(fake_jobs[0]) == 2  # the repeated job is trained once
    toy_grid.train([b])
    assert fake_jobs[1] == []  # already trained
    assert [r["seed"] for r in toy_grid.select("const", "baseline", [1, 0])] == [1, 0]
    with pytest.raises(KeyError):
        toy_grid.select("const", "pathcond", [0])


def test_job_lists_cover_configs_sizes_and_activations(toy_grid):
    jobs = toy_grid.config_jobs([0, 1])
    assert len(jobs) == 2 * 2 * 2
    assert {(j.config, j.method) for j in jobs} == {
        (c, m) for c in CONFIGS for m in ("baseline", "pathcond")
    }
    sizes = toy_grid.size_jobs("low", [[4], [4, 4, 4]], [0])
    assert [(j.widths, j.init_scale) for j in sizes] == [((4,), 0.1)] * 2 + [
        ((4, 4, 4), 0.1)
    ] * 2
    acts = toy_grid.activation_jobs(
        "const", ["gelu", "silu"], [0, 1], methods=["pathcond"]
    )
    assert [(j.activation, j.seed) for j in acts] == [
        ("gelu", 0),
        ("gelu", 1),
        ("silu", 0),
        ("silu", 1),
    ]


def test_grid_trains_for_real_with_one_worker(toy_grid):
    (run,) = toy_grid.train([toy_grid.job("const", "pathcond", 0)])
    assert len(run["loss"]) == RECIPE["epochs"] and 0 <= run["test_acc"] <= 1


def test_stacked_runs_equal_their_runs_apart_and_are_cached_apart(
    tmp_path, monkeypatch
):
    """On a GPU chapter 7's runs train stacked: the same runs, each stored on its own."""
    grid = RunGrid(BASE, toy_data(), RECIPE, CONFIGS, cache_dir=tmp_path, workers=1)
    jobs = [
        grid.job("const", "baseline", 0),
        grid.job("low", "pathcond", 1, lr=0.05),
        grid.job("const", "baseline", 2, epochs=3),  # another recipe: its own stack
        grid.job("low", "pathcond", 3, stop_at=0.5),  # another stop: its own stack
        grid.job("low", "pathcond", 3, stop_at=1.1, give_up_after=1),  # and another
    ]
    grid.configs = {**CONFIGS, "en": {**CONFIGS["const"], "methods": ["enorm"]}}
    jobs.append(grid.job("en", "enorm", 4))  # ENorm acts after each step: apart
    arguments = [grid.arguments(j) for j in jobs]
    stacked = training.train_runs(arguments, workers=1, stack=True)
    apart = training.train_runs(arguments, workers=1, stack=False)
    for a, b in zip(stacked, apart, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1 / 24)
        assert a["rescale_converged"] == b["rescale_converged"]
    assert len(list(tmp_path.glob("*.json"))) == 2 * len(jobs) - 1  # ENorm's once

    def refuse(*args, **kwargs):
        raise AssertionError("a stored stacked run was trained again")

    monkeypatch.setattr(training, "fit_stacked", refuse)
    again = training.train_runs(arguments, workers=1, stack=True)
    assert [r["loss"] for r in again] == [r["loss"] for r in stacked]
    assert not training.stackable(arguments[-1])
    assert all(training.stackable(a) for a in arguments[:-1])


def test_a_run_that_gives_up_is_cached_apart_from_the_full_run(tmp_path):
    grid = RunGrid(BASE, toy_data(), RECIPE, CONFIGS, cache_dir=tmp_path, workers=1)
    cut = grid.job("low", "pathcond", 0, epochs=3, stop_at=1.1, give_up_after=1)
    (short,) = grid.train([cut])
    (full,) = grid.train([cut._replace(give_up_after=None)])
    assert len(short["loss"]) == 1 and len(full["loss"]) == 3
    assert full["loss"][:1] == short["loss"]
