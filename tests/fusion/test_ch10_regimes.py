"""Chapter 10's protocol: the main table (wslib.fusion.ch10_regimes)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.fusion.toy_studies import (
    IMPORTANCES,
    METHODS_10,
    MLP,
    toy_cell,
    toy_fusion_set,
    toy_runs,
    toy_study,
)
from tests.kit import balanced_dataset, seeded_model
from wslib.fusion import ch10_regimes, ch10_results, protocols
from wslib.fusion.baselines import (
    HF_KF,
    fuse_by,
)
from wslib.fusion.hfkf import class_share
from wslib.fusion.retrofit import GradientConfig


def test_head_rules_fuse_with_each_head_target() -> None:
    study, _ = toy_study()
    out = ch10_regimes.head_rules(
        study, "sharded", 2, 0, method="kf_linear", importance="uniform"
    )
    assert list(out) == ["equal", "data share", "attribution"]
    models, counts = study.base_models("sharded", 2, 0)
    xf, yf = study.fusion_set(0)
    grad = GradientConfig(**study.gradient)
    for name, weights in (("equal", None), ("data share", class_share(counts))):
        fused = fuse_by(
            "kf_linear",
            models,
            xf,
            yf,
            class_weights=weights,
            ridge=study.ridge,
            gradient=grad,
        )
        assert out[name] == protocols.accuracy(fused, study.ds)


def test_summarise_runs_mean_and_std_over_seeds() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    row = toy_cell(summary, "full", 2, "kf_linear", "uniform")
    assert row["mean"] == 0.8125
    assert row["std"] == pytest.approx(np.std([0.75, 0.875], ddof=1))
    assert toy_cell(summary, "full", 2, "averaging", "uniform")["std"] == 0.0
    one_seed = ch10_results.summarise_runs(toy_runs().query("seed == 0"))
    assert (one_seed["std"] == 0).all()


def test_accuracy_table_cells_order_and_gaps() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    table = ch10_results.accuracy_table(
        summary, ["sharded", "full"], [2, 4], METHODS_10, IMPORTANCES
    )
    assert list(table.columns) == [
        ("sharded", 2),
        ("sharded", 4),
        ("full", 2),
        ("full", 4),
    ]
    assert table.index[0] == ("individual", "uniform")
    assert table.index[1] == ("averaging", "uniform")
    assert list(table.index[-3:]) == [("kf_gradient", imp) for imp in IMPORTANCES]
    assert table.loc[("kf_linear", "uniform"), ("full", 2)] == "81.2 ± 8.8"
    assert table.loc[("ensemble", "uniform"), ("sharded", 4)] == "62.5 ± 0.0"
    assert table.loc[("hf_linear", "conductance"), ("full", 4)] == "n/a"


def test_the_page_table_marks_the_best_fused_model_of_each_column() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    args = (summary, ["sharded", "full"], [2, 4], METHODS_10, IMPORTANCES)
    styled = ch10_results.styled_accuracy_table(*args)
    assert styled.data.equals(ch10_results.accuracy_table(*args))
    styles = styled._compute().ctx  # (row, column) -> CSS of the cell
    means = summary.set_index(["method", "importance", "regime", "n"])["mean"]
    for j, (regime, n) in enumerate(styled.data.columns):
        bold = [
            styled.data.index[i]
            for (i, c), css in styles.items()
            if c == j and ("font-weight", "bold") in css
        ]
        column = means.xs((regime, n), level=("regime", "n"))
        fused = column.drop(
            list(ch10_results.NOT_FUSED), level="method", errors="ignore"
        )
        assert set(bold) == set(fused[fused == fused.max()].index), (regime, n)


def test_nested_accuracies_for_the_results_file() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    acc = ch10_results.nested_accuracies(summary, ["full", "sharded"], [2, 4, 6])
    assert acc["full"]["6"] == {}
    cell = acc["sharded"]["2"]["kf_linear"]["uniform"]
    assert cell["mean"] == 0.5625
    assert cell["std"] == pytest.approx(np.std([0.5, 0.625], ddof=1))
    assert acc["full"]["4"]["ensemble"] == {"uniform": {"mean": 0.875, "std": 0.0}}
    assert "hf_linear" not in acc["sharded"]["4"]


def test_best_importance_picks_the_best_on_validation() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    best = ch10_results.best_importance(summary, "hf_linear")
    assert best.n.tolist() == [2, 2]  # HF ran with two models only here
    assert set(best.importance) == {"conductance"}
    assert sorted(best["mean"]) == [0.75, 1.0]
    assert "deeplift" not in set(
        ch10_results.best_importance(summary, "kf_linear").importance
    )
    assert set(ch10_results.best_importance(summary, "kf_gradient").importance) == {
        "deeplift"
    }
    no_val = ch10_results.summarise_runs(toy_runs().drop(columns="val"))
    assert no_val["val"].isna().all()
    with pytest.warns(UserWarning, match="lacks validation accuracies"):
        by_test = ch10_results.best_importance(no_val, "kf_gradient")
    assert "deeplift" not in set(by_test.importance)


def test_importance_gains_and_pivot() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    assert "otfusion" in set(
        ch10_results.importance_pivot(summary).index.get_level_values("method")
    )
    wide = ch10_results.importance_pivot(summary, methods=HF_KF)
    assert set(wide.index.get_level_values("method")) == {
        "hf_linear",
        "kf_linear",
        "kf_gradient",
    }
    gains = ch10_results.importance_gains(summary, IMPORTANCES, methods=HF_KF)
    assert list(gains.columns) == ["conductance", "deeplift"]
    kf = gains.xs("kf_linear", level="method")
    assert (kf["conductance"] == 0.0).all()
    assert (kf["deeplift"] == -12.5).all()
    assert (gains.xs("kf_gradient", level="method") == 0.0).all().all()
    assert (gains.xs("hf_linear", level="method")["conductance"] == 12.5).all()


def test_summary_cell_and_headline_numbers() -> None:
    summary = ch10_results.summarise_runs(toy_runs())
    assert ch10_results.summary_cell(summary, "full", 2, "ensemble") == 87.5
    assert math.isnan(
        ch10_results.summary_cell(
            summary, "full", 4, "hf_linear", importance="conductance"
        )
    )
    head = ch10_results.headline_numbers(summary, [2, 4], IMPORTANCES)
    words = {k: head.pop(k) for k in list(head) if isinstance(head[k], str)}
    hf_gap = head.pop("hf_lin_minus_grad")
    assert math.isnan(hf_gap)  # no HF-Gradient runs in this table
    expected = {
        "n0": 2,
        "n_max": 4,
        "sh_best": 50.0,  # chosen on validation, though HF-Linear tests higher
        "sh_ot": 37.5,
        "sh_avg": 25.0,
        "sh_ens": 62.5,
        "sh_gap_ot": 12.5,
        "sh_gap_avg": 25.0,
        "full_best": 75.0,
        "full_indiv": 75.0,
        "full_gap": 0.0,
        "kf_lin_minus_grad": 6.25 / 3,
        "shmax_best": 50.0,
        "shmax_ens": 62.5,
        "shmax_indiv": 50.0,
        "shmax_ot": 37.5,
        "shmax_gap_ot": 12.5,
        "gain_conductance": 2.5,  # +12.5 in the 2 HF cells of 10
        "gain_deeplift": -6.25,
        "gain_positive_share": 0.1,
    }
    assert head == pytest.approx(expected)
    assert words == {
        "sh_best_name": "kf_gradient (deeplift)",
        "full_best_name": "kf_gradient (deeplift)",
        "shmax_best_name": "kf_gradient (deeplift)",
        "sh_vs_ot": "beats",
        "sh_vs_avg": "beats",
        "full_vs_indiv": "is level (within 1 point) with",  # gap 0
        "shmax_vs_ot": "beats",
        # per-cell gaps of 0 to -12.5 points over 3 cells: the interval reaches zero
        "gradient_vs_linear": "is undecided against",
    }
    assert ch10_results.select_variant(summary, "sharded", 2, ["hf_linear"]) == (
        "hf_linear (conductance)",
        75.0,
    )
    high, low = [80.0, 81.0, 79.0], [70.0, 71.0, 69.0]
    assert protocols.beats(high, low) == "beats"
    assert protocols.beats(low, high) == "does not beat"
    assert protocols.beats([80.1, 80.0, 79.9], [80.0, 80.1, 79.9]).startswith(
        "is level"
    )
    assert protocols.beats([80.0, 60.0, 90.0], low).startswith("is undecided")
    # a gap of 1.2 points, Welch's 95% interval about [-2.4, 4.8]: not yet a win
    # (a 55% interval, [0.33, 2.0], would call it one)
    assert protocols.beats([81.0, 79.0, 82.0], [79.0, 80.0, 79.5]).startswith(
        "is undecided"
    )
    assert (
        protocols.beats([80.0], [70.0]) == "beats (one seed: undecided, spread unknown)"
    )
    # within GRADIENT_TIE = 0.5 on the 90% interval: a match
    assert ch10_results.gradient_word([-0.1, 0.1, 0.05, -0.05]) == "matches"
    assert ch10_results.gradient_word([-3.0, -3.1, -2.9]) == "is behind"
    assert ch10_results.gradient_word([3.0, 3.1, 2.9]) == "is ahead of"
    assert ch10_results.gradient_word([0.6]).startswith("is ahead of (one seed")
    with pytest.raises(ValueError, match="no runs of"):
        ch10_results.select_variant(summary, "sharded", 4, ["hf_linear"])


def test_mean_seconds_and_method_groups() -> None:
    assert ch10_results.mean_seconds({"a": [1.0, 3.0], "b": []}) == {"a": 2.0}
    groups = ch10_regimes.method_groups(
        ["averaging", "ensemble", "hf_linear", "kf_gradient"]
    )
    assert groups == {
        "baselines": ["individual", "averaging", "ensemble"],
        "HF / KF": ["individual", "ensemble", "hf_linear", "kf_gradient"],
    }
    assert ch10_regimes.method_groups(["kf_linear"])["HF / KF"] == [
        "individual",
        "kf_linear",
    ]


def test_self_fusion_returns_the_model() -> None:
    ds = balanced_dataset(per_class=12)
    x, y = toy_fusion_set(
        ds, per_class=12
    )  # 120 samples > 41 inputs of the first layer
    diffs = ch10_regimes.self_fusion(seeded_model(MLP, 0), x, y, ds.x_test)
    assert list(diffs) == list(ch10_regimes.SELF_FUSION_METHODS)
    assert max(diffs.values()) < 1e-4
    # fewer samples than inputs: the ridge term's prior (the model itself) decides
    x, y = toy_fusion_set(ds, per_class=2)
    few = ch10_regimes.self_fusion(
        seeded_model(MLP, 0), x, y, ds.x_test, methods=["kf_linear"]
    )
    assert few["kf_linear"] < 1e-6
