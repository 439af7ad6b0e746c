"""Chapters 7 and 8 split into units: the lists, and that they train what the notebooks read."""

from __future__ import annotations

import time
import warnings
from types import ModuleType
from typing import Any

import pytest

import bookkit.part
from tests.pathcond.toy import BASE, CONFIGS, RECIPE, toy_data
from wslib.core.seeds import derive_seeds
from wslib.pathcond import ch07_mlp, ch08_conv, protocols, units
from wslib.pathcond import grid as run_grid
from wslib.pathcond.grid import RunGrid
from wslib.runs.units import NotCached, by_stage

MLP_NB, CONV_NB = "07_pathcond_mlp", "08_pathcond_conv"


@pytest.fixture(scope="module")
def part() -> ModuleType:
    """``bookkit/part.py`` as a module."""
    return bookkit.part


@pytest.fixture
def no_work(monkeypatch):
    """Loading data or training anything fails: listing units must do neither."""

    def refuse(*args, **kwargs):
        raise AssertionError("listing units loaded data or trained a run")

    for module in (ch07_mlp, ch08_conv, units):
        monkeypatch.setattr(module, "load_dataset", refuse)
    monkeypatch.setattr(run_grid, "train_runs", refuse)
    monkeypatch.setattr(ch08_conv, "train_run", refuse)


def expected_mlp_units(p: dict[str, Any]) -> int:
    methods = sum(len(cfg["methods"]) for cfg in p["configs"].values())
    sizes = len(p["size_sweep"]["widths"]) * len(ch07_mlp.SWEPT_METHODS)
    acts = len(p["activations"]) * len(ch07_mlp.SWEPT_METHODS)
    swept = len(p["lr_sweep_configs"]) * len(ch07_mlp.SWEPT_METHODS)
    return methods + sizes + acts + 3 * swept  # lr grid, refinement, long runs


@pytest.mark.parametrize("profile", ["smoke", "gpu"])
def test_unit_lists_of_the_profiles(part, no_work, profile):
    p = part.parameters(MLP_NB, profile, None)
    start = time.perf_counter()
    listed = units.mlp_units(p)
    assert time.perf_counter() - start < 1.0
    assert len(listed) == expected_mlp_units(p)
    stages = by_stage(listed)  # unique names
    assert [s[0].stage for s in stages] == [0, 1, 2]
    for pair in ch07_mlp.swept_pairs(p["lr_sweep_configs"]):
        name = " ".join(pair)
        stage = {u.name: u.stage for u in listed}
        assert [
            stage[f"{k} {name}"] for k in ("lr grid", "lr refine", "long runs")
        ] == [
            0,
            1,
            2,
        ]
    assert all(u.stage == 0 for u in listed if u.name.startswith("runs "))

    q = part.parameters(CONV_NB, profile, 5)
    conv = units.conv_units(q)
    assert len(conv) == len(q["archs"]) * len(q["methods"]) * q["n_seeds"]
    by_stage(conv)
    assert {u.stage for u in conv} == {0}
    last = derive_seeds(5, "run", q["n_seeds"])[-1]
    assert f"autoencoder enorm seed {last}" in {u.name for u in conv}


def mlp_params(seed: int = 7) -> dict[str, Any]:
    """Toy parameters of chapter 7 (toy data replaces the data set)."""
    return {
        "seed": seed,
        "n_seeds": 2,
        "n_activation_seeds": 1,
        "data": {"name": "toy"},
        "mlp": BASE,
        "recipe": RECIPE,
        "configs": CONFIGS,
        "workers": 1,
        "stack": None,
        "size_sweep": {"config": "const", "widths": [[4], [8, 8]]},
        "activation_config": "low",
        "activations": ["gelu"],
        "lr_grid": [1.0, 0.1],
        "lr_refine": [10**0.25, 10**-0.25],
        "lr_sweep_configs": ["const", "low"],
        "long_epochs": 3,
        "threshold": 0.99,
    }


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(ch07_mlp, "load_dataset", lambda **_: toy_data())


def notebook_protocol(p: dict[str, Any]) -> dict:
    """Chapter 7's calls in the notebook's order; returns the long runs."""
    seeds, tuning, act_seeds = ch07_mlp.mlp_seeds(
        p["seed"], p["n_seeds"], p["n_activation_seeds"]
    )
    grid = ch07_mlp.mlp_grid(p["data"], p["mlp"], p["recipe"], p["configs"], workers=1)
    jobs = ch07_mlp.default_jobs(
        grid,
        seeds,
        p["size_sweep"],
        p["activation_config"],
        p["activations"],
        act_seeds,
    )
    with ch07_mlp.activation_warnings_ignored():
        grid.train(jobs)
    swept = ch07_mlp.swept_pairs(p["lr_sweep_configs"])
    search = ch07_mlp.tune_rates(
        grid, swept, p["lr_grid"], p["lr_refine"], tuning, p["long_epochs"]
    )
    return ch07_mlp.evaluate_rates(grid, search.best, seeds, p["long_epochs"])


def run_all(listed) -> None:
    for stage in by_stage(listed):
        for unit in stage:
            unit.run()


@pytest.fixture
def recorded(monkeypatch, toy) -> list[tuple]:
    """Fake training: each run's accuracy is its rate; returns the runs trained."""
    calls: list[tuple] = []

    def train_runs(jobs, workers=None, desc="runs", stack=None):
        out = []
        for job in jobs:
            run = job["settings"]
            recipe = run.recipe
            key = (tuple(run.model["widths"]), run.model["activation"])
            calls.append((*key, run.method, run.seed, run.init_scale))
            calls[-1] += (recipe.lr, recipe.epochs)
            out.append({"acc": [recipe.lr] * recipe.epochs})
        return out

    monkeypatch.setattr(run_grid, "train_runs", train_runs)
    return calls


def test_mlp_units_train_exactly_the_notebook_s_runs(recorded):
    p = mlp_params()
    evaluation, tuning, _ = ch07_mlp.mlp_seeds(p["seed"], p["n_seeds"], 1)
    per_unit = {}
    for stage in by_stage(units.mlp_units(p)):
        for unit in stage:
            start = len(recorded)
            unit.run()
            per_unit[unit.name] = recorded[start:]
    for name, calls in per_unit.items():  # each unit trains its own share
        rates, seeds = {c[5] for c in calls}, {c[3] for c in calls}
        assert calls, name
        if name.startswith("lr grid"):
            assert rates == set(p["lr_grid"]) and seeds == {tuning}
        elif name.startswith("lr refine"):
            assert rates == {1.78, 0.562} and seeds == {tuning}
        elif name.startswith("long runs"):
            assert rates == {1.78} and seeds == set(evaluation)
        else:
            assert rates == {RECIPE["lr"]} and len(seeds) == len(calls)
    by_units = list(recorded)
    assert len(by_units) == len(set(by_units))  # no run trained twice
    recorded.clear()
    long_runs = notebook_protocol(p)
    assert set(recorded) == set(by_units)
    # accuracy = rate: the refinement above the grid's best (1.0) wins
    assert {r["acc"][0] for runs in long_runs.values() for r in runs} == {1.78}
    seeds = {c[3] for c in by_units}
    assert seeds == {*evaluation, tuning}  # evaluation seeds and the tuning seed


def test_mlp_units_fill_the_cache_the_notebook_reads(toy, monkeypatch, tmp_path):
    monkeypatch.setattr(ch07_mlp, "RUNS_DIR", tmp_path)
    p = {
        **mlp_params(seed=3),
        "long_epochs": 2,
        "size_sweep": {"config": "const", "widths": []},
    }
    listed = units.mlp_units(p)
    stages = by_stage(listed)
    monkeypatch.setenv("WSLIB_CACHED_ONLY", "1")
    with pytest.raises(NotCached, match="is not cached"):
        stages[1][0].run()  # a refinement needs its grid first
    monkeypatch.delenv("WSLIB_CACHED_ONLY")
    run_all(listed)
    monkeypatch.setenv("WSLIB_CACHED_ONLY", "1")
    long_runs = notebook_protocol(p)  # everything is cached: nothing computes
    assert all(len(r["acc"]) == 2 for runs in long_runs.values() for r in runs)


def test_conv_units_train_exactly_the_notebook_s_runs(monkeypatch):
    calls: list[tuple] = []

    def train_run(run, ds, cache_dir=None):
        calls.append(
            (run.model["name"], run.method, ds.name, run.recipe.epochs, run.seed)
            + (run.task, cache_dir)
        )
        return {"acc": [0.5]}

    monkeypatch.setattr(ch08_conv, "train_run", train_run)
    own = toy_data()
    own.name = "own"
    monkeypatch.setattr(ch08_conv, "load_dataset", lambda **_: own)
    monkeypatch.setattr(units, "load_dataset", lambda **_: toy_data())
    spec = {"recipe": RECIPE, "task": "classify"}
    archs = {
        "a": {**spec, "model": {**BASE, "name": "mlp", "widths": [4]}},
        "b": {**spec, "model": {**BASE, "name": "cnn1d"}, "data": {"name": "x"}},
    }
    p = {"seed": 4, "n_seeds": 2, "data": {}, "archs": archs, "methods": ["m", "n"]}
    run_all(units.conv_units(p))
    by_units = list(calls)
    calls.clear()
    ch08_conv.train_archs(
        archs,
        p["methods"],
        derive_seeds(4, "run", 2),
        toy_data(),
        cache_dir=protocols.RUNS_DIR,
    )
    assert sorted(by_units) == sorted(calls) and len(calls) == 8
    assert {c[2] for c in calls if c[0] == "cnn1d"} == {"own"}


def test_groups_named_alike_are_an_error():
    grid = RunGrid(BASE, None, RECIPE, CONFIGS)
    jobs = [grid.job("const", "baseline", 0, lr=lr) for lr in (0.1, 0.2)]
    with pytest.raises(ValueError, match="both named 'const baseline'"):
        units.group_by_seed(grid, jobs)
    named = units.group_by_seed(grid, [grid.job("low", "pathcond", s) for s in (0, 1)])
    assert [[j.seed for j in g] for g in named.values()] == [[0, 1]]
    wide = grid.job("low", "pathcond", 0, widths=[4, 4], activation="silu")
    assert units.job_group(grid, wide) == "low widths 4x4 silu pathcond"


def test_a_grid_without_data_lists_but_does_not_train():
    grid = ch07_mlp.mlp_grid({"name": "unused"}, BASE, RECIPE, CONFIGS, load=False)
    assert grid.ds is None and grid.cache_dir == protocols.RUNS_DIR
    assert grid.train([]) == []
    with pytest.raises(ValueError, match="no data set"):
        grid.train([grid.job("const", "baseline", 0)])


def test_setup_helpers():
    evaluation, tuning, activation = ch07_mlp.mlp_seeds(4, 2, 3)
    assert evaluation == derive_seeds(4, "run", 2) and activation[:2] == evaluation
    assert len(activation) == 3 and tuning not in activation
    other = ch07_mlp.mlp_seeds(5, 2, 1)  # the next sweep seed shares nothing
    assert not {*evaluation, tuning} & {*other.evaluation, other.tuning}
    assert ch07_mlp.swept_pairs(["a", "b"]) == [
        ("a", "baseline"),
        ("a", "pathcond"),
        ("b", "baseline"),
        ("b", "pathcond"),
    ]
    grid = RunGrid(BASE, None, RECIPE, CONFIGS)
    jobs = ch07_mlp.default_jobs(
        grid, [0, 1], {"config": "low", "widths": [[4]]}, "const", ["gelu", "silu"], [2]
    )
    assert len(jobs) == 8 + 4 + 4
    assert {(j.widths, j.init_scale) for j in jobs[8:12]} == {((4,), 0.1)}
    assert {(j.activation, j.seed, j.config) for j in jobs[12:]} == {
        ("gelu", 2, "const"),
        ("silu", 2, "const"),
    }


def test_activation_warnings_ignored_only_silences_gelu_silu():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ch07_mlp.activation_warnings_ignored():
            warnings.warn("GELU/SiLU are not positively homogeneous", stacklevel=2)
            warnings.warn("something else", stacklevel=2)
        warnings.warn("GELU/SiLU again", stacklevel=2)
    assert [str(w.message) for w in caught] == ["something else", "GELU/SiLU again"]
