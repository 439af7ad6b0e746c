"""Chapter 11's protocol: beyond the table (wslib.fusion.ch11_beyond)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.fusion.toy_studies import (
    MLP,
    QUICK,
    RECIPE,
    RESNET,
    toy_block_rows,
    toy_fusion_set,
)
from tests.kit import (
    SIGNAL,
    FakeZoo,
    balanced_dataset,
    seeded_model,
    seeded_models,
    transformer1d,
)
from wslib.core import describe
from wslib.core.seeds import derive_seeds
from wslib.core.train import evaluate
from wslib.fusion import ch11_beyond, protocols
from wslib.fusion.baselines import (
    fuse_by,
)
from wslib.fusion.retrofit import GradientConfig


def test_epochs_within() -> None:
    assert ch11_beyond.epochs_within([0.5, 0.6, 0.79, 0.8], 0.8) == 2
    assert ch11_beyond.epochs_within([0.795, 0.5], 0.8) == 0
    assert ch11_beyond.epochs_within([0.5, 0.6], 0.8) is None
    assert ch11_beyond.epochs_within([0.5, 0.6, 0.75], 0.8, gap=0.05) == 2


def test_finetune_curves_start_from_the_zero_shot_fusion() -> None:
    from wslib.core.train import Recipe

    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    pair = seeded_models(MLP, range(2))
    curves = ch11_beyond.finetune_curves(
        pair,
        x,
        y,
        ds,
        Recipe(epochs=2, lr=0.01, schedule="constant"),
        QUICK,
        progress=False,
    )
    assert list(curves) == ["KF-Linear", "KF-Gradient", "averaging"]
    assert all(len(c) == 3 for c in curves.values())
    assert curves["KF-Linear"][0] == protocols.accuracy(
        fuse_by("kf_linear", pair, x, y), ds
    )
    assert curves["averaging"][0] == protocols.accuracy(
        fuse_by("averaging", pair, x, y), ds
    )
    assert all(0 <= a <= 1 for c in curves.values() for a in c)


def test_width_fusions_fuse_into_every_width() -> None:
    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    variants = [{"widths": [4, 4]}, {"widths": [8, 6]}]
    models = [seeded_model({**MLP, **v}, 0) for v in variants]
    rows = ch11_beyond.width_fusions(models, variants, MLP, x, y, ds, QUICK)
    assert [r["model"] for r in rows] == [
        "base {'widths': [4, 4]}",
        "base {'widths': [8, 6]}",
        "KF-linear -> {'widths': [4, 4]}",
        "KF-gradient -> {'widths': [4, 4]}",
        "KF-linear -> {'widths': [8, 6]}",
        "KF-gradient -> {'widths': [8, 6]}",
    ]
    assert rows[0]["test acc"] == protocols.accuracy(models[0], ds)


def test_compression_variants_and_distillation() -> None:
    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    wide = seeded_model({**MLP, "widths": [16, 16]}, 0)
    out = ch11_beyond.compression(
        wide, {**MLP, "widths": [4, 4]}, x, y, ds, QUICK, kd_epochs=2
    )
    assert list(out["variants"]) == [
        "KF-linear (uniform)",
        "KF-gradient (uniform)",
        "KF-linear (conductance)",
        "KF-gradient (conductance)",
    ]
    again = ch11_beyond.compression(
        wide, {**MLP, "widths": [4, 4]}, x, y, ds, QUICK, kd_epochs=2
    )
    assert again == out  # seeded: the same numbers every time


def test_depth_compression_rows_and_verdict() -> None:
    ds = balanced_dataset()
    deep = seeded_model({**MLP, "widths": [8, 8, 6]}, 0)
    shallow = {**MLP, "widths": [8, 6]}
    rows = ch11_beyond.depth_compression(deep, shallow, ds, [2, 4], QUICK, kd_epochs=2)
    assert [(r["size"], r["method"]) for r in rows] == [
        (s, m) for s in (20, 40) for m in ("kf_linear", "kf_gradient", "distillation")
    ]
    assert rows == ch11_beyond.depth_compression(deep, shallow, ds, [2, 4], QUICK, 2)
    fake = [
        {"size": 20, "method": "kf_linear", "test acc": 0.5},
        {"size": 20, "method": "kf_gradient", "test acc": 0.625},
        {"size": 20, "method": "distillation", "test acc": 0.75},
        {"size": 40, "method": "kf_linear", "test acc": 0.875},
        {"size": 40, "method": "kf_gradient", "test acc": 0.5},
        {"size": 40, "method": "distillation", "test acc": 0.75},
    ]
    out = ch11_beyond.kf_versus_distillation(fake)
    assert out == {"gap": {20: -12.5, 40: 12.5}, "kf_wins_at": [40], "n_sizes": 2}


def test_size_sweep_rows_and_augmentation_gain() -> None:
    ds = balanced_dataset()
    pair = seeded_models(MLP, range(2))
    share = np.full((2, 10), 0.5)
    rows = ch11_beyond.size_sweep(pair, share, ds, [2, 4], 1, QUICK, progress=False)
    assert len(rows) == 2 * 2 * 2
    assert sorted({r["size"] for r in rows}) == [20, 40]
    assert {(r["augmented"], r["method"]) for r in rows} == {
        (a, m) for a in (False, True) for m in ("kf_linear", "kf_gradient")
    }
    synthetic = [
        {"method": m, "size": s, "augmented": a, "test acc": acc}
        for m, s, a, acc in [
            ("kf_linear", 20, False, 0.5),
            ("kf_linear", 20, True, 0.6),
            ("kf_gradient", 20, False, 0.4),
            ("kf_gradient", 20, True, 0.4),
            ("kf_linear", 40, False, 0.5),
            ("kf_linear", 40, True, 0.9),
        ]
    ]
    assert ch11_beyond.augmentation_gain(synthetic) == pytest.approx(5.0)


def test_the_size_sweep_reads_back_and_is_keyed_by_the_data(
    tmp_path, monkeypatch
) -> None:
    fusions = []
    real = ch11_beyond.fuse_by

    def counted(method, *args, **kwargs):
        fusions.append(method)
        return real(method, *args, **kwargs)

    monkeypatch.setattr(ch11_beyond, "fuse_by", counted)
    ds = balanced_dataset()
    pair = seeded_models(MLP, range(2))
    share = np.full((2, 10), 0.5)
    options = {"progress": False, "run_cache": tmp_path}
    first = ch11_beyond.size_sweep(pair, share, ds, [2], 1, QUICK, **options)
    assert ch11_beyond.size_sweep(pair, share, ds, [2], 1, QUICK, **options) == first
    assert len(fusions) == 4  # two methods, with and without augmentation, once
    other = dataclasses.replace(ds, x_test=ds.x_test + 1.0)  # other data: computed anew
    ch11_beyond.size_sweep(pair, share, other, [2], 1, QUICK, **options)
    assert len(fusions) == 8


def test_architecture_zero_shot_marks_what_does_not_apply() -> None:
    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    zoo = FakeZoo(ds)
    archs = {
        "mlp": {"model": MLP, "recipe": RECIPE},
        "resnet": {"model": RESNET, "recipe": RECIPE},
    }
    rows, skipped = ch11_beyond.architecture_zero_shot(
        zoo, {}, archs, ["averaging", "otfusion"], x, y, QUICK, seed=1, progress=False
    )
    assert [r["architecture"] for r in rows] == ["mlp", "resnet"]
    assert [c["seed"] for c in zoo.requests] == derive_seeds(1, "model", 2) * 2
    assert rows[0]["otfusion"] is not None and rows[1]["otfusion"] is None
    assert rows[1]["averaging"] is not None
    assert len(skipped) == 1 and skipped[0].startswith(
        "resnet / otfusion: not applicable"
    )


def test_residual_gradient_variants_fit_blocks_only_in_the_block_variant():
    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    models = seeded_models(RESNET, range(2))
    rows = ch11_beyond.residual_gradient_variants(
        models, x, y, ds, GradientConfig(max_epochs=15)
    )
    assert [(r["method"], r["variant"]) for r in rows] == [
        (g, v) for g in ("HF", "KF") for v in ch11_beyond.GRADIENT_VARIANTS
    ]
    for r in rows:
        has_fit = r["variant"] == "Gradient, whole blocks"
        assert (r["block MSE start"] is not None) == has_fit
        if has_fit:
            assert r["block MSE end"] < r["block MSE start"]
    linear = fuse_by("hf_linear", models, x, y)
    assert rows[0]["test acc"] == pytest.approx(
        evaluate(linear, ds.x_test, ds.y_test)[1]
    )


def test_block_fit_text_states_the_verdict_from_the_numbers():
    up = ch11_beyond.block_fit_text("resnet", toy_block_rows(0.50, 0.60))
    assert up.startswith("resnet: KF: Linear 50.0 %")
    assert "lowers the block-output error by 75 %" in up
    assert "raises the accuracy, +10.0 points" in up
    assert "lowers the accuracy, -10.0 points" in ch11_beyond.block_fit_text(
        "r", toy_block_rows(0.6, 0.5)
    )
    assert "leaves the accuracy" in ch11_beyond.block_fit_text(
        "r", toy_block_rows(0.6, 0.6)
    )
    assert "error as it was" in ch11_beyond.block_fit_text(
        "r", toy_block_rows(0.6, 0.6, start=0.0)
    )
    assert (
        describe.describe_recipe({"epochs": 3, "batch_size": 32})
        == "3 epochs, batch size 32"
    )


def test_residual_architectures_are_the_resnets_and_transformers():
    archs = {
        "mlp": {"model": MLP},
        "resnet": {"model": RESNET},
        "transformer": {
            "model": transformer1d(**SIGNAL, embed_dim=8, depth=1, heads=2, mlp_dim=8)
        },
    }
    assert ch11_beyond.residual_architectures(archs) == ["resnet", "transformer"]


def test_block_fit_study_runs_the_residual_nets_on_the_zero_shot_models():
    ds = balanced_dataset()
    x, y = toy_fusion_set(ds)
    zoo = FakeZoo(ds)
    archs = {
        "mlp": {"model": MLP, "recipe": RECIPE},
        "r": {"model": RESNET, "recipe": RECIPE},
    }
    out = ch11_beyond.block_fit_study(zoo, {"name": "toy"}, archs, x, y, QUICK, seed=1)
    assert list(out) == ["r"]
    assert [c["seed"] for c in zoo.requests] == derive_seeds(1, "model", 2)
    models = [
        zoo.get({"model": RESNET, "seed": s}) for s in derive_seeds(1, "model", 2)
    ]
    rows = ch11_beyond.residual_gradient_variants(models, x, y, ds, QUICK, seed=1)
    assert [r["test acc"] for r in out["r"]] == [r["test acc"] for r in rows]
