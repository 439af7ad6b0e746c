"""Chapter 8's protocol and results: runs per architecture, costs, tables, metrics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kit import mlp
from tests.pathcond import toy
from tests.pathcond.planted import BASE, FAST, RECIPE, run, toy_data
from wslib.pathcond.ch08_conv import (
    arch_metrics,
    cost_metrics,
    pooling_text,
    rescale_costs,
    setup_rows,
    train_archs,
)
from wslib.pathcond.grid import mlp_config


def test_train_archs_uses_an_architecture_s_own_data():
    recipe = {**toy.RECIPE, "epochs": 1}
    archs = {
        "toy": {
            "model": mlp_config(toy.BASE, [8]),
            "recipe": recipe,
            "task": "classify",
        },
        "digits_ae": {
            "data": {"name": "digits"},
            "model": mlp([8], in_shape=[1, 8, 8], n_classes=64),
            "recipe": recipe,
            "task": "autoencoder",
        },
    }
    runs = train_archs(archs, ["baseline", "pathcond"], [0, 1], toy.toy_data())
    assert sorted(runs) == sorted(
        (a, m, s) for a in archs for m in ("baseline", "pathcond") for s in (0, 1)
    )
    assert runs[("toy", "baseline", 0)]["loss"] != runs[("toy", "baseline", 1)]["loss"]
    assert np.isnan(runs[("digits_ae", "pathcond", 0)]["test_acc"])


def test_rescale_costs_names_each_model():
    models = {"a": mlp_config(toy.BASE, [8]), "b": mlp_config(toy.BASE, [8, 8])}
    rows = rescale_costs(models, toy.toy_data())
    assert [r["model"] for r in rows] == ["a", "b"]
    assert rows[0]["n_params"] == 12 * 8 + 8 + 8 * 3 + 3
    assert all(r["rescale_over_epoch"] > 0 for r in rows)


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


def test_pooling_text():
    avg = {"name": "cnn1d", "pool": "avg", "fully_conv": True}
    assert pooling_text(avg).endswith("is exact")
    assert pooling_text({"name": "cifar_nv"}).endswith("an approximation")
    assert pooling_text({**avg, "pool": "max"}).endswith("an approximation")
    assert "(no pooling)" in pooling_text({**avg, "pool": None})
    assert pooling_text({**avg, "pool": None}).endswith("is exact")
    assert pooling_text({"name": "cnn2d", "fully_conv": True}).endswith("approximation")
