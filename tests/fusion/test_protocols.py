"""What the fusion chapters share (wslib.fusion.protocols) and the run cache of their settings."""

from __future__ import annotations

import uuid

import grimp
import numpy as np
import pandas as pd
import pytest
import torch

import wslib.runs.cache
from tests.fusion.toy_studies import (
    METHODS,
    MLP,
    RECIPE,
    RESNET,
    toy_fusion_set,
    toy_study,
)
from tests.kit import FakeZoo, balanced_dataset, seeded_model, seeded_models
from wslib.core import describe
from wslib.core.data import balanced_subset, class_counts, shard_split
from wslib.core.describe import in_words
from wslib.core.files import code_version
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.core.train import evaluate, predict
from wslib.fusion import protocols
from wslib.fusion.baselines import (
    USES_IMPORTANCE,
    distill,
    last_layer_kd,
)
from wslib.fusion.hfkf import augment_fusion_set
from wslib.runs.cache import cached_run


def test_accuracy_counts_the_correct_test_predictions() -> None:
    ds = balanced_dataset()
    model = seeded_model(MLP, 0)
    pred = predict(model, ds.x_test).argmax(1)
    y = pred.clone()
    y[::2] = (pred[::2] + 1) % 10  # every other label wrong
    ds.y_test = y
    assert protocols.accuracy(model, ds) == pytest.approx(0.5)
    assert isinstance(protocols.accuracy(model, ds), float)


def test_data_digest_follows_the_content() -> None:
    a, b = balanced_dataset(), balanced_dataset()
    assert protocols.data_digest(a) == protocols.data_digest(b)
    b.x_test[3, 0, 5] += 1e-3
    assert protocols.data_digest(a) != protocols.data_digest(b)
    c = balanced_dataset()
    c.y_train = c.y_train.flip(0)
    assert protocols.data_digest(a) != protocols.data_digest(c)


def test_trained_asks_the_zoo_for_the_config_and_split() -> None:
    zoo = FakeZoo(balanced_dataset())
    protocols.trained(zoo, {"name": "toy"}, MLP, RECIPE, 7)
    split = {"kind": "shards", "n_parts": 2, "part": 1}
    protocols.trained(zoo, {"name": "toy"}, MLP, RECIPE, 8, split)
    assert zoo.requests[0] == {
        "data": {"name": "toy"},
        "model": MLP,
        "recipe": RECIPE,
        "seed": 7,
    }
    assert zoo.requests[1]["split"] == split and zoo.requests[1]["seed"] == 8


def test_regime_models_split_and_seed_every_model() -> None:
    ds = balanced_dataset()
    zoo = FakeZoo(ds)
    models, counts = protocols.regime_models(
        zoo, {}, MLP, RECIPE, {"kind": "shards"}, 2, 3
    )
    assert len(models) == 2
    assert [c["seed"] for c in zoo.requests] == derive_seeds(3, "mode", 2)
    split_seed = derive_seed(3, "split")
    assert [c["split"] for c in zoo.requests] == [
        {"kind": "shards", "n_parts": 2, "part": i, "seed": split_seed}
        for i in range(2)
    ]
    parts = shard_split(ds.y_train.numpy(), 2, split_seed)
    expected = [class_counts(ds.y_train, p, 10) for p in parts]
    np.testing.assert_array_equal(counts, np.array(expected))
    assert ((counts > 0).sum(0) == 1).all()  # each class in one shard


def test_regime_models_full_regime_uses_all_data() -> None:
    zoo = FakeZoo(balanced_dataset())
    _, counts = protocols.regime_models(zoo, {}, MLP, RECIPE, {"kind": "full"}, 3, 1)
    assert [c["split"] for c in zoo.requests] == [{"kind": "full"}] * 3
    assert [c["seed"] for c in zoo.requests] == derive_seeds(1, "mode", 3)
    np.testing.assert_array_equal(counts, np.full((3, 10), 12))


def test_in_words_and_describe_model() -> None:
    assert in_words([2]) == "2" and in_words([]) == ""
    assert in_words([2, 4, 6], last="or") == "2, 4 or 6"
    assert in_words(["a", "b"]) == "a and b"
    assert describe.describe_model(MLP, words="settings") == "mlp (widths [8, 6])"
    assert (
        describe.describe_model(RESNET, words="settings")
        == "resnet1d (widths [4, 8], blocks per stage 1)"
    )
    assert (
        describe.describe_model({"name": "resnet18", "n_classes": 10}, words="settings")
        == "resnet18"
    )


def test_study_settings_and_fusion_set() -> None:
    study, _ = toy_study()
    assert study.settings([2, 3], [0, 1]) == [
        (r, n, s) for r in ("full", "sharded") for n in (2, 3) for s in (0, 1)
    ]
    x, y = study.fusion_set(1)
    idx = balanced_subset(study.ds.y_train, 6, 1)
    assert torch.equal(x, study.ds.x_train[idx]) and torch.equal(
        y, study.ds.y_train[idx]
    )


def test_study_trains_every_base_model_of_every_setting() -> None:
    study, zoo = toy_study()
    study.train(study.settings([2, 3], [0]), progress=False)
    assert len(zoo.requests) == 2 * (2 + 3)
    sharded = [c for c in zoo.requests if c["split"]["kind"] == "shards"]
    assert [(c["split"]["n_parts"], c["split"]["part"]) for c in sharded] == [
        (2, 0),
        (2, 1),
        (3, 0),
        (3, 1),
        (3, 2),
    ]


def test_fuse_setting_runs_every_method_and_importance() -> None:
    study, _ = toy_study()
    two = study.fuse_setting("sharded", 2, 0)
    simple = [m for m in METHODS if m not in USES_IMPORTANCE]
    expected = [("individual", "uniform")] + [(m, "uniform") for m in simple]
    expected += [
        (m, imp)
        for m in METHODS
        if m in USES_IMPORTANCE
        for imp in ("uniform", "conductance")
    ]
    assert sorted((r["method"], r["importance"]) for r in two["rows"]) == sorted(
        expected
    )
    assert len(two["times"]) == len(expected) - 1
    models, _ = study.base_models("sharded", 2, 0)
    individual = np.mean([protocols.accuracy(m, study.ds) for m in models])
    assert two["rows"][0]["acc"] == pytest.approx(individual)
    xv, yv = study.validation_set(0)
    val = np.mean([evaluate(m, xv, yv)[1] for m in models])
    assert two["rows"][0]["val"] == pytest.approx(val)
    three = study.fuse_setting("full", 3, 0)  # HF fuses three models too
    assert {r["importance"] for r in three["rows"] if r["method"] == "hf_linear"} == {
        "uniform",
        "conductance",
    }


def test_validation_set_is_balanced_and_outside_the_fusion_set() -> None:
    study, _ = toy_study()
    xv, yv = study.validation_set(0)
    xf, _ = study.fusion_set(0)
    assert torch.bincount(yv).tolist() == [3] * 10
    assert not (xv[:, None] == xf[None]).flatten(2).all(2).any()


def test_setting_key_names_everything_that_determines_a_setting() -> None:
    study, _ = toy_study()
    base = study.setting_key("sharded", 2, 0)
    assert base != study.setting_key("sharded", 2, 1)
    assert base != study.setting_key("sharded", 3, 0)
    assert base != study.setting_key("full", 2, 0)
    for field, value in [
        ("arch", {**MLP, "widths": [8, 8]}),
        ("recipe", {"epochs": 2}),
        ("fusion_per_class", 5),
        ("methods", METHODS[:2]),
        ("importances", ["uniform"]),
        ("ridge", 1e-6),
        ("gradient", {"max_epochs": 4}),
    ]:
        other, _ = toy_study(**{field: value})
        assert other.setting_key("sharded", 2, 0) != base, field
    other, _ = toy_study()
    other.zoo.ds.x_train[0, 0, 0] += 1.0
    assert other.setting_key("sharded", 2, 0)["data"] != base["data"]


def test_fusion_code_covers_what_the_fusion_imports() -> None:
    """Every wslib module the fusion algorithms or the zoo depend on is hashed into the key."""
    graph = grimp.build_graph("wslib", cache_dir=None)
    algorithm = ["hfkf", "baselines", "levels", "residual", "importance"]
    needed = {"wslib.runs.zoo", "wslib.core.data"}
    for name in algorithm:
        needed |= {f"wslib.fusion.{name}"} | graph.find_upstream_modules(
            f"wslib.fusion.{name}"
        )
    needed |= graph.find_upstream_modules("wslib.runs.zoo")
    # hashes and atomic writes, the store that keeps the models, the folders of
    # the workspace, and the cached-only switch of split runs (it refuses to
    # compute): no result depends on them
    needed -= {
        "wslib.core.files",
        "wslib.core.workspace",
        "wslib.runs.store",
        "wslib.runs.units",
    }

    def covered(module: str) -> bool:
        return any(
            module == c or module.startswith(c + ".") for c in protocols.FUSION_CODE
        )

    assert [m for m in sorted(needed) if not covered(m)] == []
    assert "wslib.fusion" in protocols.FUSION_CODE


def test_editing_the_fusion_package_recomputes_a_cached_setting(tmp_path, monkeypatch):
    """The issue's requirement: an edit of wslib/fusion recomputes chapter 10's accuracies."""
    sources = {"wslib.fusion": "v1"}
    monkeypatch.setattr(
        wslib.runs.cache,
        "code_version",
        lambda *packages: "|".join(
            f"{p}:{sources.get(p, '')}" for p in sorted(packages)
        ),
    )
    study, _ = toy_study(tmp_path)
    calls = []

    def fake_setting(regime: str, n: int, s: int) -> dict:
        calls.append((regime, n, s))
        return {
            "rows": [{"method": "individual", "importance": "uniform", "acc": 0.5}],
            "times": [],
        }

    monkeypatch.setattr(study, "fuse_setting", fake_setting)
    first = study.cached_setting("full", 2, 0)
    assert study.cached_setting("full", 2, 0) == first
    assert len(calls) == 1
    sources["wslib.fusion"] = "v2"  # an edit of the fusion package
    study.cached_setting("full", 2, 0)
    assert len(calls) == 2
    sources["wslib.llpf"] = "edited"  # another paper's package: not part of the key
    study.cached_setting("full", 2, 0)
    assert len(calls) == 2


def test_code_version_changes_with_a_module_source(tmp_path, monkeypatch) -> None:
    name = f"probe_fusion_{uuid.uuid4().hex[:8]}"  # a fresh module in this process
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "algo.py").write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code_version.cache_clear()
    calls = []
    compute = lambda: calls.append(1) or {"value": 1}  # noqa: E731
    before = code_version(name)
    cached_run(tmp_path / "runs", {"k": 1}, compute, code=(name,))
    cached_run(tmp_path / "runs", {"k": 1}, compute, code=(name,))
    assert len(calls) == 1
    (package / "algo.py").write_text("SCALE = 2\n")
    code_version.cache_clear()
    assert code_version(name) != before
    cached_run(tmp_path / "runs", {"k": 1}, compute, code=(name,))
    assert len(calls) == 2
    code_version.cache_clear()


def test_study_run_collects_rows_and_times(tmp_path) -> None:
    study, _ = toy_study(tmp_path, methods=["averaging", "kf_linear"])
    settings = study.settings([2], [0])
    runs, seconds = study.run(settings, progress=False)
    assert set(runs.regime) == {"full", "sharded"}
    assert list(runs.columns[:3]) == ["regime", "n", "seed"]
    assert len(runs) == 2 * (1 + 1 + 2)  # individual, averaging, kf_linear x 2
    assert runs["val"].between(0, 1).all()
    assert [len(v) for v in seconds.values()] == [2, 4]
    again, _ = study.run(settings, progress=False)  # read back from the run cache
    pd.testing.assert_frame_equal(runs, again)


def test_fusion_examples_are_training_examples_of_their_seed() -> None:
    ds = balanced_dataset(n_test=100)
    x, y = protocols.fusion_examples(ds, 3, seed=4)
    rows = {tuple(r.flatten().tolist()): int(c) for r, c in zip(ds.x_train, ds.y_train)}
    assert all(rows.get(tuple(r.flatten().tolist())) == int(c) for r, c in zip(x, y))
    other, _ = protocols.fusion_examples(ds, 3, seed=5)
    assert torch.equal(x, protocols.fusion_examples(ds, 3, seed=4)[0])
    assert not torch.equal(x, other)


def test_augmented_copies_follow_their_seed() -> None:
    x, y = toy_fusion_set(balanced_dataset())
    first, again, other = (augment_fusion_set(x, y, 2, seed=s)[0] for s in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("method", ["distill", "last_layer_kd"])
def test_distillation_draws_its_batches_from_its_seed(method: str) -> None:
    # 200 examples: two batches
    x, _ = toy_fusion_set(balanced_dataset(per_class=30), 20)
    teachers = seeded_models(MLP, range(2))

    def student(seed: int) -> torch.Tensor:
        if method == "distill":
            out = distill(
                seeded_model(MLP, 0), teachers[0], x, epochs=2, batch_size=8, seed=seed
            )
        else:
            out = last_layer_kd(teachers, x, epochs=2, seed=seed)
        return torch.cat([p.detach().flatten() for p in out.parameters()])

    assert torch.equal(student(1), student(1))
    assert not torch.equal(student(1), student(2))
