"""Chapter 9's protocol: the representation cost (wslib.fusion.ch09_cost)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.fusion.toy_studies import (
    MLP,
    QUICK,
    toy_cost_frame,
    toy_fusion_set,
)
from tests.kit import balanced_dataset, seeded_models
from wslib.core.train import evaluate
from wslib.fusion import ch09_cost
from wslib.fusion.baselines import (
    fuse_by,
)
from wslib.fusion.levels import chain_levels


def test_cost_decompositions_check_theorem1_at_every_level() -> None:
    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    models = {"mlp": seeded_models(MLP, range(3))}
    costs = ch09_cost.cost_decompositions(
        models, x, y, ds, ["uniform", "conductance"], QUICK, progress=False
    )
    hidden = len(chain_levels(models["mlp"][0])) - 1
    assert len(costs) == 2 * 2 * 2 * hidden  # groupings x retrofits x importances
    assert set(costs.method) == {"HF-linear", "HF-gradient", "KF-linear", "KF-gradient"}
    assert costs["rel err"].max() < 1e-8
    parts = costs["clustering"] + costs["approximation"]
    np.testing.assert_allclose(parts, costs["cost"], rtol=1e-8)
    # the accuracy is that of the fusion: HF-linear fuses the first two models
    hf = fuse_by("hf_linear", models["mlp"][:2], x, y)
    first = costs[(costs.method == "HF-linear") & (costs.importance == "uniform")]
    assert first["test acc"].iloc[0] == pytest.approx(
        evaluate(hf, ds.x_test, ds.y_test)[1]
    )


def test_theorem1_gaps_are_the_largest_errors() -> None:
    gaps = ch09_cost.theorem1_gaps(toy_cost_frame())
    assert gaps == {"max_abs": 4e-9, "max_rel": 1e-9, "n_checks": 6}


def test_cost_and_approximation_shares() -> None:
    costs = toy_cost_frame()
    view = ch09_cost.cost_shares(costs, "uniform")
    assert len(view) == 5
    np.testing.assert_allclose(
        view["clustering share"] + view["approximation share"], 1
    )
    shares = ch09_cost.approximation_shares(costs, "uniform")
    # linear rows (uniform): 0/1, 1/2, 1/2, 1/4; gradient rows (uniform): 3/4
    assert shares["linear"] == pytest.approx((0 + 0.5 + 0.5 + 0.25) / 4)
    assert shares["gradient"] == pytest.approx(0.75)


def test_fused_accuracies_one_value_per_fusion() -> None:
    costs = toy_cost_frame()
    acc = ch09_cost.fused_accuracies(costs)
    assert acc == {
        "mlp": {
            "HF-linear": {"uniform": 0.5},
            "KF-gradient": {"uniform": 0.7, "deeplift": 0.6},
        },
        "cnn": {"KF-linear": {"uniform": 0.8}},
    }
    table = ch09_cost.fused_accuracy_table(costs)
    assert table.loc[("mlp", "KF-gradient"), "deeplift"] == 0.6
    assert math.isnan(table.loc[("cnn", "KF-linear"), "deeplift"])


def test_importance_agreement() -> None:
    cond = [{"a": torch.arange(1.0, 11.0)}, {"a": torch.arange(11.0, 21.0)}]
    same = {"conductance": cond, "deeplift": cond}
    table = ch09_cost.importance_agreement(same, ["a"])
    row = table.iloc[0]
    assert row["neurons"] == 20
    assert row["Spearman(conductance, deeplift)"] == pytest.approx(1.0)
    # the top tenth (2 of 20 neurons) holds (20 + 19) / 210 of the total
    assert row["share of top 10% (conductance)"] == pytest.approx(39 / 210)
    reversed_ = {"conductance": cond, "deeplift": [{"a": -s["a"]} for s in cond]}
    row = ch09_cost.importance_agreement(reversed_, ["a"]).iloc[0]
    assert row["Spearman(conductance, deeplift)"] == pytest.approx(-1.0)


def test_kf_target_map_uniform_targets_are_group_means() -> None:
    ds = balanced_dataset()
    x, _ = toy_fusion_set(ds)
    models = seeded_models(MLP, range(3))
    level = chain_levels(models[0])[0]
    width = 8
    scores = {
        "uniform": [{level: torch.ones(width)} for _ in models],
        "skewed": [{level: torch.arange(1.0, width + 1)} for _ in models],
    }
    neurons = ch09_cost.kf_target_map(models, x, level, scores)
    assert neurons["width"] == width
    assert neurons["xy"].shape == (3 * width, 2)
    np.testing.assert_array_equal(np.bincount(neurons["owner"]), [width] * 3)
    np.testing.assert_allclose(neurons["weights"]["uniform"], 1.0)
    w = neurons["weights"]["skewed"].reshape(3, width)
    np.testing.assert_allclose(w.mean(1), 1.0)  # mean 1 per model
    for imp in scores:
        assert neurons["targets"][imp].shape == (width, 2)
    assert not np.allclose(neurons["targets"]["uniform"], neurons["targets"]["skewed"])
