"""The PathCond chapters' protocols: lifting demos, the run grid, the rate search, costs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wslib.core.data import Dataset
from wslib.core.models import build_model
from wslib.core.neurons import random_scales, rescale_state
from wslib.core.train import Recipe, seed_everything
from wslib.pathcond import experiments, training
from wslib.pathcond.experiments import (
    PAPER_SWEEPS,
    Job,
    RunGrid,
    diag_g_check,
    evaluate_rates,
    first_layer_fan,
    function_check,
    g_share,
    head_bias,
    layer_scale_rows,
    lifting_spectra,
    mlp_config,
    path_rows,
    rescale_costs,
    solver_comparison,
    tiny_lifting,
    train_archs,
    trajectories,
    tune_rates,
)
from wslib.pathcond.lifting import explicit_path_lifting, mlp_path_labels
from wslib.pathcond.rescaling import am_over_gm

TINY = {"name": "mlp", "in_shape": [1, 3], "n_classes": 2, "widths": [4, 2]}
BASE = {"name": "mlp", "in_shape": [1, 12], "n_classes": 3}
RECIPE = {
    "epochs": 2,
    "lr": 0.1,
    "batch_size": 16,
    "momentum": 0.0,
    "weight_decay": 0.0,
    "schedule": "constant",
}
CONFIGS = {
    "const": {"widths": [8, 8], "init_scale": 1.0, "methods": ["baseline", "pathcond"]},
    "low": {"widths": [8, 8], "init_scale": 0.1, "methods": ["baseline", "pathcond"]},
}


def toy_data(n: int = 96, length: int = 12, classes: int = 3) -> Dataset:
    x = torch.randn(n, 1, length, generator=torch.Generator().manual_seed(0))
    y = torch.arange(n) % classes
    return Dataset("toy", x, y, x[:24], y[:24], classes)


# --- chapter 6 --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return tiny_lifting(TINY, spread=1.0, seed=0)


def test_tiny_lifting_counts_paths_and_keeps_phi(tiny):
    d, (h1, h2), o = 3, TINY["widths"], TINY["n_classes"]
    # input paths, paths from the biases of layers 1, 2 and the output layer
    assert tiny.n_paths == d * h1 * h2 * o + h1 * h2 * o + h2 * o + o
    assert tiny.n_params == sum(p.numel() for p in build_model(TINY).parameters())
    assert tiny.n_neurons == h1 + h2
    assert tiny.sweeps >= 1
    assert tiny.phi_change < 1e-10
    # the badly scaled network: PathCond did change the parameters
    assert not torch.allclose(tiny.before.jacobian, tiny.after.jacobian)


def test_path_rows_are_evenly_spaced_labelled_paths(tiny):
    rows = path_rows(tiny, TINY, n_rows=5)
    labels = mlp_path_labels([3, 4, 2, 2])
    step = tiny.n_paths // 5
    assert [r["path"] for r in rows] == labels[::step]
    assert rows[1]["Phi (before)"] == pytest.approx(float(tiny.before.phi[step]))
    assert rows[1]["Phi (after)"] == pytest.approx(rows[1]["Phi (before)"])


def test_lifting_spectra_of_p_and_g_agree_and_pathcond_evens_g(tiny):
    s = lifting_spectra(tiny)
    assert len(s["ev_before"]) == tiny.n_params - tiny.n_neurons
    assert np.all(np.diff(s["ev_before"]) <= 0)  # decreasing
    assert s["p_vs_g"] < 1e-8
    assert s["cond_before"] == pytest.approx(s["ev_before"][0] / s["ev_before"][-1])
    assert s["cond_after"] == pytest.approx(s["ev_after"][0] / s["ev_after"][-1])
    assert s["amgm_before"] == pytest.approx(am_over_gm(s["g_before"]))
    assert 1.0 <= s["amgm_after"] < s["amgm_before"]


def test_diag_g_check_reports_brute_force_agreement():
    archs = {
        "mlp": {"name": "mlp", "in_shape": [1, 5], "n_classes": 3, "widths": [4, 3]},
        "cnn": {
            "name": "cnn1d",
            "in_shape": [1, 8],
            "n_classes": 3,
            "channels": [2, 3],
            "kernel_size": 3,
            "pool": "avg",
        },
    }
    rows = diag_g_check(archs)
    assert [r["architecture"] for r in rows] == ["mlp", "cnn"]
    assert (
        rows[0]["paths (incl. structural zeros)"]
        == 5 * 4 * 3 * 3 + 4 * 3 * 3 + 3 * 3 + 3
    )
    assert rows[0]["parameters"] == 5 * 4 + 4 + 4 * 3 + 3 + 3 * 3 + 3
    assert all(r["max rel. error"] < 1e-10 for r in rows)


def test_function_check_finds_outputs_unchanged_in_both_modes():
    archs = {
        "bn": {
            "name": "cnn1d",
            "in_shape": [1, 16],
            "n_classes": 4,
            "channels": [4, 4],
            "bn": True,
        }
    }
    (row,) = function_check(archs)
    assert row["architecture"] == "bn" and row["sweeps"] >= 1
    assert row["rel. change (train)"] < 1e-5 and row["rel. change (eval)"] < 1e-5


def test_trajectories_start_from_the_same_loss():
    ds = toy_data()
    config = mlp_config(BASE, [16, 16])
    runs = trajectories(config, ["baseline", "pathcond"], ds, Recipe(**RECIPE))
    assert list(runs) == ["baseline", "pathcond"]
    first = runs["baseline"]["initial_loss"]
    assert runs["pathcond"]["initial_loss"] == pytest.approx(first, rel=1e-5)
    assert math.log(3) * 0.5 < first < math.log(3) * 2  # a fresh 3-class classifier
    assert all(len(r["loss"]) == RECIPE["epochs"] for r in runs.values())
    assert runs["baseline"]["loss"] != runs["pathcond"]["loss"]


# --- chapter 7 --------------------------------------------------------------------


@pytest.fixture
def grid():
    return RunGrid(BASE, toy_data(), RECIPE, CONFIGS, cache_dir=None, workers=1)


@pytest.fixture
def fake_jobs(monkeypatch):
    """Replace train_runs by a recorder returning the job's arguments as its run."""
    calls: list[list[dict]] = []

    def train_runs(jobs, workers=None, desc="runs", stack=None):
        calls.append(list(jobs))
        return [{**job, "acc": [job["recipe"].lr]} for job in jobs]

    monkeypatch.setattr(experiments, "train_runs", train_runs)
    return calls


def test_job_defaults_come_from_the_config_and_recipe(grid):
    job = grid.job("low", "pathcond", 3)
    assert job == Job("low", (8, 8), 0.1, "relu", "pathcond", 0.1, 3, 2, True)
    other = grid.job(
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
        config = grid.arguments(job)["config"]
        assert config["output_bias"] is expected
        assert (build_model(config).linears[-1].bias is not None) is expected


def test_arguments_build_the_model_config_and_recipe(grid):
    kwargs = grid.arguments(grid.job("low", "pathcond", 3, lr=0.5, activation="gelu"))
    assert kwargs["config"] == {
        **BASE,
        "widths": [8, 8],
        "activation": "gelu",
        "output_bias": True,
    }
    assert kwargs["recipe"] == Recipe(**{**RECIPE, "lr": 0.5})
    assert (kwargs["method"], kwargs["seed"], kwargs["init_scale"]) == (
        "pathcond",
        3,
        0.1,
    )
    assert kwargs["ds"] is grid.ds and kwargs["cache_dir"] is None


def test_train_runs_each_job_once_and_returns_runs_in_order(grid, fake_jobs):
    a, b = grid.job("const", "baseline", 0), grid.job("const", "baseline", 1)
    runs = grid.train([a, b, a])
    assert [r["seed"] for r in runs] == [0, 1, 0]
    assert len(fake_jobs[0]) == 2  # the repeated job is trained once
    grid.train([b])
    assert fake_jobs[1] == []  # already trained
    assert [r["seed"] for r in grid.select("const", "baseline", [1, 0])] == [1, 0]
    with pytest.raises(KeyError):
        grid.select("const", "pathcond", [0])


def test_job_lists_cover_configs_sizes_and_activations(grid):
    jobs = grid.config_jobs([0, 1])
    assert len(jobs) == 2 * 2 * 2
    assert {(j.config, j.method) for j in jobs} == {
        (c, m) for c in CONFIGS for m in ("baseline", "pathcond")
    }
    sizes = grid.size_jobs("low", [[4], [4, 4, 4]], [0])
    assert [(j.widths, j.init_scale) for j in sizes] == [((4,), 0.1)] * 2 + [
        ((4, 4, 4), 0.1)
    ] * 2
    acts = grid.activation_jobs("const", ["gelu", "silu"], [0, 1], methods=["pathcond"])
    assert [(j.activation, j.seed) for j in acts] == [
        ("gelu", 0),
        ("gelu", 1),
        ("silu", 0),
        ("silu", 1),
    ]


def test_grid_trains_for_real_with_one_worker(grid):
    (run,) = grid.train([grid.job("const", "pathcond", 0)])
    assert len(run["loss"]) == RECIPE["epochs"] and 0 <= run["test_acc"] <= 1


def test_tune_rates_trains_on_the_tuning_seed_for_the_given_epochs(grid, fake_jobs):
    pairs = [("const", "baseline"), ("low", "pathcond")]
    search = tune_rates(grid, pairs, [1.0, 0.1], [10**0.25], seed=9, epochs=5)
    trained = [job for call in fake_jobs for job in call]
    assert {(j["seed"], j["recipe"].epochs) for j in trained} == {(9, 5)}
    # the fake accuracy is [lr]: only lr >= 0.99 reaches the threshold at once
    assert search.best[("const", "baseline")] == 1.78
    assert search.tried[("low", "pathcond")] == [1.78, 1.0, 0.1]


def test_evaluate_rates_trains_each_pair_at_its_rate_on_every_seed(grid, fake_jobs):
    rates = {("const", "baseline"): 0.3, ("low", "pathcond"): 0.03}
    runs = evaluate_rates(grid, rates, [0, 1], epochs=4)
    assert list(runs) == list(rates)
    for pair, pair_runs in runs.items():
        assert [r["seed"] for r in pair_runs] == [0, 1]
        assert {r["recipe"].lr for r in pair_runs} == {rates[pair]}
        assert {r["recipe"].epochs for r in pair_runs} == {4}
        assert {r["init_scale"] for r in pair_runs} == {CONFIGS[pair[0]]["init_scale"]}


def test_g_share_and_the_names_of_mlp_parts():
    g = {"linears.0.weight": torch.ones(3), "linears.0.bias": torch.ones(1)}
    g["linears.1.bias"] = torch.full((2,), 2.0)
    assert g_share(g, "linears.0.") == pytest.approx(4 / 8)
    assert g_share(g, head_bias([5])) == pytest.approx(4 / 8)
    assert head_bias([5, 6, 7]) == "linears.3.bias"
    assert first_layer_fan(BASE, [16, 8]) == (13, 8)
    assert first_layer_fan(BASE, [16]) == (13, 3)


def test_layer_scale_rows_describe_every_layer_before_and_after():
    rows, g_pairs = layer_scale_rows(BASE, CONFIGS, seed=0)
    assert [(r["config"], r["layer"]) for r in rows] == [
        (c, i) for c in CONFIGS for i in range(3)
    ]
    low = [r for r in rows if r["config"] == "low"]
    for when in ("before", "after"):
        assert sum(r[f"share of Σg {when}"] for r in low) == pytest.approx(1.0)
    n_params = 12 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3
    assert low[0]["share of params"] == pytest.approx(12 * 8 / n_params)
    g_before, g_after = g_pairs["low"]
    assert low[0]["share of Σg after"] == pytest.approx(g_share(g_after, "linears.0."))
    assert low[0]["share of Σg after"] != pytest.approx(low[0]["share of Σg before"])
    assert low[0]["log10 GM g before"] == pytest.approx(
        float(g_before["linears.0.weight"].double().log10().mean())
    )
    assert am_over_gm(g_after) < am_over_gm(g_before)
    assert low[-1]["AM/GM of g before -> after"] == (
        f"{am_over_gm(g_before):.3g} -> {am_over_gm(g_after):.3g}"
    )
    # PathCond keeps the output biases' g (no hidden neuron owns them)
    head = head_bias(CONFIGS["low"]["widths"])
    assert torch.allclose(g_before[head], g_after[head])


def test_solver_comparison_converged_against_ten_sweeps():
    cfg = {"widths": [8, 24, 6], "init_scale": 0.1}
    row = solver_comparison(BASE, "low", cfg, 0, 2)
    assert row["config"] == "low"
    full = row["F (converged)"]
    block, neuron = (
        row[f"F ({k}, {PAPER_SWEEPS} sweeps)"] for k in ("block", "per neuron")
    )
    assert full <= block * (1 - 1e-12) and full <= neuron  # F < 0 here
    assert block <= neuron + 1e-9 * abs(neuron)
    assert row["sweeps (converged)"] > PAPER_SWEEPS
    assert 0 < row["median scale diff. (10 sweeps vs converged)"] < 1
    with pytest.raises(ValueError, match="repeats"):
        solver_comparison(BASE, "low", CONFIGS["low"], 0, 0)


def test_cost_rows_one_per_configuration():
    rows = experiments.cost_rows(BASE, CONFIGS, toy_data(), 8, 0, 2)
    assert [r["config"] for r in rows] == list(CONFIGS)
    for r in rows:
        assert r["rescale_over_epoch"] == pytest.approx(
            r["rescale_seconds"] / r["epoch_seconds"]
        )


# --- chapter 8 and costs ----------------------------------------------------------


def test_train_archs_uses_an_architecture_s_own_data():
    recipe = {**RECIPE, "epochs": 1}
    archs = {
        "toy": {
            "model": mlp_config(BASE, [8]),
            "recipe": recipe,
            "task": "classify",
        },
        "digits_ae": {
            "data": {"name": "digits"},
            "model": {
                "name": "mlp",
                "in_shape": [1, 8, 8],
                "n_classes": 64,
                "widths": [8],
            },
            "recipe": recipe,
            "task": "autoencoder",
        },
    }
    runs = train_archs(archs, ["baseline", "pathcond"], [0, 1], toy_data())
    assert sorted(runs) == sorted(
        (a, m, s) for a in archs for m in ("baseline", "pathcond") for s in (0, 1)
    )
    assert runs[("toy", "baseline", 0)]["loss"] != runs[("toy", "baseline", 1)]["loss"]
    assert np.isnan(runs[("digits_ae", "pathcond", 0)]["test_acc"])


def test_rescale_costs_names_each_model():
    models = {"a": mlp_config(BASE, [8]), "b": mlp_config(BASE, [8, 8])}
    rows = rescale_costs(models, toy_data())
    assert [r["model"] for r in rows] == ["a", "b"]
    assert rows[0]["n_params"] == 12 * 8 + 8 + 8 * 3 + 3
    assert all(r["rescale_over_epoch"] > 0 for r in rows)


def test_the_rate_search_stops_each_run_at_the_threshold_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid, seen = RunGrid(BASE, None, RECIPE, CONFIGS), []

    def train(jobs, desc="runs"):
        seen.extend(jobs)
        return [{"acc": [0.5, 0.99]} for _ in jobs]

    monkeypatch.setattr(grid, "train", train)
    pair = (next(iter(CONFIGS)), "baseline")
    experiments.tune_rates(grid, [pair], [0.1, 0.01], [2.0], seed=5, epochs=9)
    assert seen and {j.stop_at for j in seen} == {0.99}
    assert {j.epochs for j in seen} == {9}
    assert grid.job(*pair, 0).stop_at is None  # evaluation runs go the full length


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


def test_tiny_lifting_scales_its_seed_s_model_by_its_seed_s_scales():
    for seed in (1, 2):
        got = tiny_lifting(TINY, spread=1.0, seed=seed)
        seed_everything(seed)
        net = build_model(TINY).double()
        structure = net.neuron_structure()
        scales = random_scales(structure, 1.0, torch.Generator().manual_seed(seed))
        net.load_state_dict(rescale_state(net.state_dict(), structure, scales))
        ref = explicit_path_lifting(net, TINY["in_shape"])
        torch.testing.assert_close(got.before.jacobian, ref.jacobian)
