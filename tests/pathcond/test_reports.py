"""Result assembly of the PathCond chapters: descriptions, tables, metrics, verdicts."""

from __future__ import annotations

import pytest

from tests.pathcond.planted import (
    BASE,
    CONFIGS,
    FAST,
    NEVER,
    RECIPE,
    SLOW,
    run,
    toy_data,
)
from wslib.pathcond.experiments import RunGrid
from wslib.pathcond.reports import (
    ablation_rows,
    ablation_text,
    activation_rows,
    add_cost_metrics,
    arch_metrics,
    best_rate_text,
    best_rates_text,
    config_list,
    config_text,
    cost_metrics,
    data_text,
    dataset_name,
    epochs_rows,
    grid_edge_text,
    long_rows,
    long_text,
    methods_list,
    mlp_metrics,
    mlp_text,
    model_text,
    percent,
    pooling_text,
    rate_range_text,
    reached_text,
    setup_rows,
    sgd_text,
    size_points,
    solver_text,
    speedup_rows,
    speedup_verdict,
    speedups_text,
    summarise_grid,
    summarise_runs,
    sweep_rows,
    tuned_verdict_text,
)
from wslib.runs.stats import RateSearch, summarise_epochs


@pytest.fixture
def grid() -> RunGrid:
    """A grid whose runs are planted: PathCond twice as fast as the baseline on ``low``."""
    g = RunGrid(BASE, toy_data(), RECIPE, CONFIGS)
    curves = {("const", "baseline"): FAST, ("const", "pathcond"): FAST}
    curves |= {
        ("low", "baseline"): SLOW,
        ("low", "pathcond"): FAST,
        ("low", "enorm"): NEVER,
    }
    for (name, method), acc in curves.items():
        for seed, test in ((0, 0.4), (1, 0.6)):
            g.runs[g.job(name, method, seed)] = run(acc, test)
    return g


# --- descriptions -----------------------------------------------------------------


def test_descriptions_of_data_models_and_recipes():
    assert percent(0.99) == "99%"
    assert dataset_name("cifar10") == "CIFAR-10" and dataset_name("other") == "other"
    assert data_text(toy_data()) == (
        "MNIST-1D (20 training examples of shape 1×40, 10 classes)"
    )
    assert mlp_text({**BASE, "widths": [256, 32]}) == "40-256-32-10"
    assert model_text({**BASE, "widths": [4]}) == "MLP 40-4-10"
    assert (
        model_text({**BASE, "widths": [4], "activation": "gelu"}) == "MLP 40-4-10, GELU"
    )
    cnn = {"name": "cnn1d", "channels": [32, 64], "pool": "avg", "fully_conv": True}
    assert (
        model_text(cnn)
        == "1-D CNN, channels 32-64, average pooling, fully convolutional"
    )
    assert model_text({"name": "cnn2d", "channels": [8], "bn": True}) == (
        "2-D CNN, channels 8, BatchNorm"
    )
    resnet = {"name": "resnet1d", "widths": [16, 32], "blocks_per_stage": 1}
    assert (
        model_text(resnet)
        == "1-D ResNet with BatchNorm, widths 16-32, 1 block per stage"
    )
    assert model_text({"name": "resnet18"}) == "ResNet-18 with BatchNorm"
    assert model_text({"name": "resnet18", "width": 0.25}).endswith(", width 0.25")
    assert model_text({"name": "vgg11", "bn": True}) == "VGG-11 with BatchNorm"
    assert model_text({"name": "vit"}) == "vit"
    recipe = {
        "batch_size": 64,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "schedule": "cosine",
    }
    assert sgd_text(recipe) == (
        "momentum 0.9, weight decay 0.0005, cosine learning rate, batch 64"
    )
    assert sgd_text({"batch_size": 128}) == (
        "momentum 0, weight decay 0, constant learning rate, batch 128"
    )


def test_config_list_names_every_configuration():
    assert config_text(BASE, "const", CONFIGS["const"]) == (
        "`const`: 40-8-8-10, default initialisation"
    )
    assert config_text(BASE, "low", CONFIGS["low"]).endswith("multiplied by $a=0.1$")
    lines = config_list(BASE, CONFIGS).splitlines()
    assert len(lines) == len(CONFIGS) and all(line.startswith("- `") for line in lines)
    assert lines[0].endswith(";")
    assert lines[-1].endswith("$a=0.1$.")
    assert reached_text({"n_reached": 2, "n_runs": 3}) == "2/3"
    assert rate_range_text([0.1, 3.0, 3e-6]) == "from 3 down to 3e-06"


# --- chapter 7 --------------------------------------------------------------------


def test_summarise_runs_and_grid(grid):
    s = summarise_runs([run(FAST, 0.4), run(NEVER, 0.6)])
    assert s["epochs"] == summarise_epochs([FAST, NEVER])
    assert (s["test_acc"], s["test_acc_std"]) == pytest.approx((0.5, 0.1))
    assert s["final_acc"] == pytest.approx((1.0 + 0.7) / 2)
    summaries = summarise_grid(grid, [0, 1])
    assert list(summaries) == [(c, m) for c in CONFIGS for m in CONFIGS[c]["methods"]]
    assert summaries[("low", "baseline")]["epochs"]["mean"] == 3.0
    rows = epochs_rows(summaries)
    assert rows[2] == {
        "config": "low",
        "method": "baseline",
        "epochs to 99%": "3.0 ± 0.0",
        "runs reaching 99%": "2/2",
        "test acc.": "0.500 ± 0.100",
    }
    assert rows[-1]["epochs to 99%"] == "never"


@pytest.fixture
def search() -> RateSearch:
    """A finished search: on ``low`` the baseline never reaches 0.99, PathCond at 0.3."""
    s = RateSearch(0.99)
    curves = {
        (("low", "baseline"), 1.0): NEVER,
        (("low", "baseline"), 0.1): [0.5, 0.6, 0.8],
        (("low", "pathcond"), 1.0): SLOW,
        (("low", "pathcond"), 0.3): FAST,
    }
    s.add(
        {("low", "baseline"): [1.0, 0.1], ("low", "pathcond"): [1.0, 0.3]},
        lambda items: [run(curves[item]) for item in items],
    )
    return s


def test_sweep_rows_and_best_rate_texts(search):
    rows = sweep_rows(search)
    assert [(r["method"], r["lr"], r["epochs to 99%"]) for r in rows] == [
        ("baseline", 1.0, "never"),
        ("baseline", 0.1, "never"),
        ("pathcond", 1.0, 3),
        ("pathcond", 0.3, 2),
    ]
    assert rows[1]["last train acc."] == 0.8
    assert (
        best_rate_text(search, ("low", "pathcond")) == "pathcond at lr 0.3 (2 epochs)"
    )
    assert best_rate_text(search, ("low", "baseline")) == (
        "baseline reaches 99% at none of its 2 rates (best final accuracy 0.800, at lr 0.1)"
    )
    assert best_rates_text(search, ["low"]).startswith("on low, baseline reaches")


def long_summaries() -> dict:
    return {
        ("low", "baseline"): summarise_runs([run(NEVER, 0.3), run(NEVER, 0.5)]),
        ("low", "pathcond"): summarise_runs([run(FAST, 0.6), run(FAST, 0.8)]),
    }


def test_mlp_metrics_speedups_and_long_texts(grid, search):
    summaries, long = summarise_grid(grid, [0, 1]), long_summaries()
    metrics = mlp_metrics(CONFIGS, summaries, search, long, 3)
    assert metrics["const"]["speedup_pathcond"]["value"] == pytest.approx(1.0)
    assert metrics["const"]["speedup_pathcond_best_lr"] is None
    assert "lr_sweep" not in metrics["const"]
    low = metrics["low"]
    assert low["speedup_pathcond"]["value"] == pytest.approx(1.5)
    assert low["epochs_to_99"]["enorm"]["n_reached"] == 0
    assert low["test_acc"] == {"baseline": 0.5, "pathcond": 0.5, "enorm": 0.5}
    best = low["speedup_pathcond_best_lr"]
    assert best["value"] == pytest.approx(3 / 2) and best["lower_bound"]
    assert (best["lr_baseline"], best["lr_pathcond"], best["epochs"]) == (0.1, 0.3, 3)
    assert low["best_lr_runs"]["pathcond"]["test_acc"] == pytest.approx(0.7)
    assert low["lr_sweep"] == {
        "baseline": {"1.0": None, "0.1": None},
        "pathcond": {"1.0": 3, "0.3": 2},
    }
    assert speedup_rows(metrics) == [
        {
            "config": "const",
            "speed-up (same lr)": "1.00x",
            "speed-up (best lr each)": "not swept",
        },
        {
            "config": "low",
            "speed-up (same lr)": "1.50x",
            "speed-up (best lr each)": ">= 1.50x",
        },
    ]
    assert speedups_text(metrics) == "1.00x on const; 1.50x on low"
    text = long_text(search, long, metrics, "low")
    assert text.startswith(
        "on low, baseline at lr 0.1: 0/2 runs reached 99% (final training accuracy 0.700), "
        "pathcond at lr 0.3: 2/2 runs reached 99% (2.0 ± 0.0 epochs); speed-up >= 1.50x"
    )
    assert "no baseline run of the sweep reached 99%" in text
    rows = long_rows(long, search.best)
    assert rows[1]["lr"] == 0.3 and rows[1]["epochs to 99%"] == "2.0 ± 0.0"
    assert rows[1]["speed-up"] == ">= 1.50x" and rows[0]["speed-up"] == ""
    assert rows[0]["reached"] == "0/2" and rows[0]["test acc."] == "0.400 ± 0.100"
    assert rows[0]["epochs to 99%"] == "never"


def test_long_text_has_no_note_when_the_baseline_reached_the_threshold(search):
    long = long_summaries()
    metrics = {
        "low": {
            "speedup_pathcond_best_lr": {
                "value": 1.5,
                "lower_bound": True,
                "upper_bound": False,
            }
        }
    }
    search.runs[(("low", "baseline"), 0.1)] = run(FAST)  # the sweep now reached it
    assert "no baseline run" not in long_text(search, long, metrics, "low")


def test_size_points_and_activation_rows(grid):
    for method, acc in (("baseline", SLOW), ("pathcond", NEVER)):
        grid.runs[grid.job("const", method, 0, widths=[4])] = run(acc)
        grid.runs[grid.job("const", method, 0, activation="gelu")] = run(acc, 0.25)
    points = size_points(grid, "const", [[4]], [0])
    assert [p["n_params"] for p in points["baseline"]] == [
        40 * 4 + 4 + 4 * 10 + 10,
        40 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10,
    ]
    assert points["baseline"][0] == {
        "n_params": 214,
        "mean": 3.0,
        "std": 0.0,
        "censored": False,
    }
    assert points["pathcond"][0]["mean"] == 3 and points["pathcond"][0]["censored"]
    rows = activation_rows(grid, "const", ["gelu"], [0])
    assert rows == [
        {
            "activation": "gelu",
            "method": "baseline",
            "epochs to 99%": 3.0,
            "reached": "1/1",
            "test acc.": 0.25,
        },
        {
            "activation": "gelu",
            "method": "pathcond",
            "epochs to 99%": None,
            "reached": "0/1",
            "test acc.": 0.25,
        },
    ]


def test_add_cost_metrics():
    rows = [
        {
            "config": c,
            "rescale_seconds": r,
            "epoch_seconds": e,
            "rescale_over_epoch": r / e,
        }
        for c, r, e in (("const", 1.0, 4.0), ("low", 3.0, 8.0))
    ]
    solver = [{"config": "low", "F (converged)": 1.0, "s (converged)": 0.5}]
    metrics = {"const": {}, "low": {}}
    add_cost_metrics(metrics, rows, solver)
    assert metrics["const"] == {
        "rescale_seconds": 1.0,
        "epoch_seconds": 4.0,
        "rescale_over_epoch": 0.25,
    }
    assert metrics["low"]["solver"] == {
        "F (converged)": 1.0,
        "seconds (converged)": 0.5,
    }
    assert (metrics["rescale_seconds"], metrics["epoch_seconds"]) == (2.0, 6.0)


def test_speedup_verdict_respects_censoring():
    def s(value, lower=False, upper=False, both=False):
        return {
            "value": value,
            "lower_bound": lower,
            "upper_bound": upper,
            "both_censored": both,
        }

    assert speedup_verdict(s(1.2)) == "faster"
    assert speedup_verdict(s(0.8)) == "slower"
    assert speedup_verdict(s(1.0)) == "tied"
    assert speedup_verdict(s(1.0, upper=True)) == "undecided"
    assert speedup_verdict(s(1.5, lower=True)) == "faster"
    assert speedup_verdict(s(1.5, upper=True)) == "undecided"
    assert speedup_verdict(s(0.5, upper=True)) == "slower"
    assert speedup_verdict(s(0.5, lower=True)) == "undecided"
    assert speedup_verdict(s(1.5, both=True)) == "undecided"
    assert speedup_verdict(s(None)) == "undecided"


def test_tuned_verdict_text():
    long = {
        **long_summaries(),
        ("even", "baseline"): summarise_runs([run(FAST, 0.6), run(FAST, 0.6)]),
        ("even", "pathcond"): summarise_runs([run(SLOW, 0.5), run(SLOW, 0.5)]),
    }
    assert tuned_verdict_text(long, ["low", "even"]) == (
        "PathCond reaches the threshold sooner on average than the baseline on `low` "
        "(2.0 ± 0.0 vs never within 3 epochs over 2 seeds); later on average than "
        "the baseline on `even` (3.0 ± 0.0 vs 2.0 ± 0.0 epochs over 2 seeds); its "
        "mean test accuracy is higher on `low` and not higher on `even`"
    )
    long[("tie", "baseline")] = long[("tie", "pathcond")] = long[("even", "pathcond")]
    assert tuned_verdict_text(long, ["tie"]) == (
        "PathCond reaches the threshold after as many epochs (mean) as the baseline on "
        "`tie` (3.0 ± 0.0 vs 3.0 ± 0.0 epochs over 2 seeds); its mean test accuracy "
        "is not higher on every one"
    )
    assert tuned_verdict_text(long, ["even"]) == (
        "PathCond reaches the threshold later on average than the baseline on `even` "
        "(3.0 ± 0.0 vs 2.0 ± 0.0 epochs over 2 seeds); its mean test accuracy is not "
        "higher on every one"
    )
    # 2.5 ± 0.5 against 2.67 ± 0.47: closer than the larger std, no direction
    long[("close", "pathcond")] = summarise_runs([run(FAST), run(SLOW)])
    long[("close", "baseline")] = summarise_runs([run(FAST), run(SLOW), run(SLOW)])
    assert tuned_verdict_text(long, ["close"]).startswith(
        "PathCond reaches the threshold as soon as the baseline within the spread "
        "between seeds on `close` (2.5 ± 0.5 vs 2.7 ± 0.5 epochs over 2 seeds)"
    )
    # 2.75 ± 0.43 against 3.0 ± 0.0: the larger std decides, not the smaller
    long[("one_sided", "pathcond")] = summarise_runs([run(FAST)] + [run(SLOW)] * 3)
    long[("one_sided", "baseline")] = summarise_runs([run(SLOW), run(SLOW)])
    assert "within the spread between seeds on `one_sided`" in tuned_verdict_text(
        long, ["one_sided"]
    )
    # 2.5 ± 0.5 against 3.0 ± 0.0: a difference only as large as the larger std
    # is a tie (the one rule of wslib.runs.verdicts: it must be larger)
    long[("edge", "pathcond")] = long[("close", "pathcond")]
    long[("edge", "baseline")] = summarise_runs([run(SLOW), run(SLOW)])
    for name in ("edge", "later"):
        if name == "later":
            long[("later", "pathcond")] = long[("edge", "baseline")]
            long[("later", "baseline")] = long[("edge", "pathcond")]
        assert tuned_verdict_text(long, [name]).startswith(
            "PathCond reaches the threshold as soon as the baseline within the "
            f"spread between seeds on `{name}`"
        )
    one = {
        ("one", "pathcond"): summarise_runs([run(FAST)]),
        ("one", "baseline"): summarise_runs([run(SLOW)]),
    }
    assert "(2.0 ± 0.0 vs 3.0 ± 0.0 epochs over 1 seed)" in tuned_verdict_text(
        one, ["one"]
    )
    long[("none", "baseline")] = long[("even", "baseline")]
    long[("none", "pathcond")] = summarise_runs([run(NEVER, 0.7), run(NEVER, 0.7)])
    assert tuned_verdict_text(long, ["none"]).startswith(
        "PathCond reaches the threshold later on average than the baseline on `none` "
        "(never within 3 vs 2.0 ± 0.0 epochs"
    )
    long[("open", "baseline")] = long[("open", "pathcond")] = long[("none", "pathcond")]
    assert "run length leaves open on `open`" in tuned_verdict_text(long, ["open"])
    with pytest.raises(ValueError, match="at least one configuration"):
        tuned_verdict_text(long, [])


def test_ablation_rows_and_text(grid):
    summaries = summarise_grid(grid, [0, 1])
    rows = ablation_rows(summaries, {"low": "const"}, BASE, CONFIGS)
    assert [(r["config"], r["method"]) for r in rows] == [
        ("const", "baseline"),
        ("const", "pathcond"),
        ("low", "baseline"),
        ("low", "pathcond"),
    ]
    assert rows[0]["layout"] == "with output bias"
    paper = {**CONFIGS, "const": {**CONFIGS["const"], "output_bias": False}}
    assert ablation_rows(summaries, {"low": "const"}, BASE, paper)[0]["layout"] == (
        "no output bias (paper)"
    )
    gaps = [
        summaries[(n, "pathcond")]["final_acc"]
        - summaries[(n, "baseline")]["final_acc"]
        for n in ("const", "low")
    ]
    assert ablation_text(summaries, {"low": "const"}) == (
        f"on `const` {gaps[0]:+.3f} without the output bias and {gaps[1]:+.3f} with it "
        "(`low`)"
    )


# --- chapter 8 --------------------------------------------------------------------


def test_arch_metrics_for_classifiers_and_the_autoencoder():
    archs = {
        "net": {"task": "classify", "model": {"name": "resnet18"}, "recipe": RECIPE},
        "ae": {
            "task": "autoencoder",
            "model": {**BASE, "widths": [4]},
            "recipe": RECIPE,
            "data": {"name": "mnist"},
        },
    }
    methods, seeds = ["baseline", "pathcond"], [0, 1]
    runs = {}
    for arch in archs:
        for method, final in (("baseline", 0.4), ("pathcond", 0.1)):
            for s in seeds:
                runs[(arch, method, s)] = run(
                    FAST, 0.5 + s / 10, loss=[1.0, final + s / 10], test_loss=0.2
                )
    metrics, rows = arch_metrics(runs, archs, methods, seeds)
    net, ae = metrics["net"], metrics["ae"]
    assert net["final_train_loss"]["baseline"] == pytest.approx(
        {"mean": 0.45, "std": 0.05}
    )
    assert net["final_loss_ratio_pathcond_over_baseline"] == pytest.approx(0.15 / 0.45)
    assert net["test_acc"]["pathcond"] == pytest.approx(0.55)
    assert net["epochs_to_99"]["baseline"]["mean"] == 2.0
    assert ae["test_acc"] == {"baseline": None, "pathcond": None}
    assert ae["epochs_to_99"] == {} and ae["test_loss"]["pathcond"] == pytest.approx(
        0.2
    )
    assert (
        rows[0]["final train loss"] == "0.45 ± 0.05"
        and rows[0]["epochs to 99%"] == "2.0 ± 0.0"
    )
    assert "epochs to 99%" not in rows[-1]
    setup = setup_rows(archs, toy_data(), methods)
    assert [r["data"] for r in setup] == ["MNIST-1D", "MNIST"]
    assert (
        setup[1]["model"] == "MLP 40-4-10"
        and setup[0]["methods"] == "baseline, pathcond"
    )


def test_cost_metrics():
    rows = [
        {
            "model": "m",
            "n_params": 10.0,
            "rescale_over_epoch": 0.5,
            "epoch_seconds": 1.0,
        }
    ]
    assert cost_metrics(rows) == {"m": {"n_params": 10.0, "ratio": 0.5}}


def test_solver_text():
    row = {
        "config": "low",
        "F (converged)": 1.0,
        "F (block, 10 sweeps)": 1.5,
        "F (per neuron, 10 sweeps)": 2.0,
        "s (converged)": 0.2,
        "s (block, 10 sweeps)": 0.05,
        "s (per neuron, 10 sweeps)": 0.5,
        "sweeps (converged)": 40,
        "median scale diff. (10 sweeps vs converged)": 0.125,
    }
    assert solver_text([row]) == (
        "on `low` the converged solver takes 0.2 s (40 sweeps), 10 block sweeps "
        "0.05 s and 10 per-neuron sweeps 0.5 s; 10 block sweeps leave F 0.5 above "
        "the converged value and neuron scales that differ from the converged ones "
        "by a median 12.5%"
    )


def test_methods_list_in_first_use_order():
    text = methods_list(
        {
            "a": {"methods": ["pathcond", "baseline"]},
            "b": {"methods": ["baseline", "enorm"]},
        }
    )
    lines = text.splitlines()
    assert len(lines) == 3 and "(`pathcond`)" in lines[0] and lines[-1].endswith(".")
    assert "**baseline**" in lines[1] and "(`enorm`)" in lines[2]


def test_pooling_text():
    avg = {"name": "cnn1d", "pool": "avg", "fully_conv": True}
    assert pooling_text(avg).endswith("is exact")
    assert pooling_text({"name": "cifar_nv"}).endswith("an approximation")
    assert pooling_text({**avg, "pool": "max"}).endswith("an approximation")
    assert "(no pooling)" in pooling_text({**avg, "pool": None})
    assert pooling_text({**avg, "pool": None}).endswith("is exact")
    assert pooling_text({"name": "cnn2d", "fully_conv": True}).endswith("approximation")


def test_model_text_names_cifar_nv():
    config = {"name": "cifar_nv", "in_shape": [3, 32, 32], "n_classes": 10}
    assert model_text(config) == "CIFAR-NV-like net (9 convolutions, max pooling)"
    assert model_text({**config, "width": 0.5}).endswith(", width 0.5")


def test_grid_edge_text():
    search = RateSearch(0.99)
    search.best = {("low", "baseline"): 0.1, ("low", "pathcond"): 0.01}
    assert grid_edge_text(search, [1.0, 0.1, 0.01]) == (
        "At an end of the grid (a better rate may lie outside it): pathcond on `low` "
        "(lr 0.01)"
    )
    assert grid_edge_text(search, [1.0, 0.1, 0.01, 0.001]).startswith("No best rate")
