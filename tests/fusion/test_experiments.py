"""The protocols and result assembly of the fusion chapters (wslib.fusion.experiments)."""

from __future__ import annotations

import math

import grimp
import numpy as np
import pandas as pd
import pytest
import torch

import wslib.runs.cache
from wslib.core.data import Dataset, balanced_subset, class_counts, shard_split
from wslib.core.describe import in_words
from wslib.core.files import code_version
from wslib.core.models import build_model
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.core.train import evaluate, predict
from wslib.fusion import experiments as fx
from wslib.fusion.baselines import (
    HF_KF,
    USES_IMPORTANCE,
    distill,
    fuse_by,
    last_layer_kd,
)
from wslib.fusion.hfkf import augment_fusion_set, class_share
from wslib.fusion.levels import GradientConfig, chain_levels
from wslib.runs.cache import cached_run

QUICK = GradientConfig(max_epochs=3, patience=2)
MLP = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10, "widths": [8, 6]}
RESNET = {
    "name": "resnet1d",
    "in_shape": [1, 40],
    "n_classes": 10,
    "widths": [4, 8],
    "blocks_per_stage": 1,
}
RECIPE = {"epochs": 1}


def _dataset(per_class: int = 12, n_test: int = 50, seed: int = 0) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    y_train = torch.arange(10).repeat(per_class)
    y_test = torch.arange(n_test) % 10
    return Dataset(
        name="toy",
        x_train=torch.randn(len(y_train), 1, 40, generator=gen),
        y_train=y_train,
        x_test=torch.randn(n_test, 1, 40, generator=gen),
        y_test=y_test,
        n_classes=10,
    )


class FakeZoo:
    """A zoo that hands out untrained models (seeded by the config) and records the requests."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds
        self.configs: list[dict] = []

    def dataset(self, data: dict) -> Dataset:
        return self.ds

    def get(self, config: dict) -> torch.nn.Module:
        self.configs.append(config)
        torch.manual_seed(config["seed"])
        return build_model(config["model"]).eval()


def _models(n: int, config: dict = MLP) -> list[torch.nn.Module]:
    out = []
    for s in range(n):
        torch.manual_seed(s)
        out.append(build_model(config).eval())
    return out


def _fusion_set(ds: Dataset, per_class: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    idx = balanced_subset(ds.y_train, per_class, 0)
    return ds.x_train[idx], ds.y_train[idx]


# --- shared helpers ---------------------------------------------------------------------------


def test_accuracy_counts_the_correct_test_predictions() -> None:
    ds = _dataset()
    model = _models(1)[0]
    pred = predict(model, ds.x_test).argmax(1)
    y = pred.clone()
    y[::2] = (pred[::2] + 1) % 10  # every other label wrong
    ds.y_test = y
    assert fx.accuracy(model, ds) == pytest.approx(0.5)
    assert isinstance(fx.accuracy(model, ds), float)


def test_data_digest_follows_the_content() -> None:
    a, b = _dataset(), _dataset()
    assert fx.data_digest(a) == fx.data_digest(b)
    b.x_test[3, 0, 5] += 1e-3
    assert fx.data_digest(a) != fx.data_digest(b)
    c = _dataset()
    c.y_train = c.y_train.flip(0)
    assert fx.data_digest(a) != fx.data_digest(c)


def test_trained_asks_the_zoo_for_the_config_and_split() -> None:
    zoo = FakeZoo(_dataset())
    fx.trained(zoo, {"name": "toy"}, MLP, RECIPE, 7)
    split = {"kind": "shards", "n_parts": 2, "part": 1}
    fx.trained(zoo, {"name": "toy"}, MLP, RECIPE, 8, split)
    assert zoo.configs[0] == {
        "data": {"name": "toy"},
        "model": MLP,
        "recipe": RECIPE,
        "seed": 7,
    }
    assert zoo.configs[1]["split"] == split and zoo.configs[1]["seed"] == 8


def test_regime_models_split_and_seed_every_model() -> None:
    ds = _dataset()
    zoo = FakeZoo(ds)
    models, counts = fx.regime_models(zoo, {}, MLP, RECIPE, {"kind": "shards"}, 2, 3)
    assert len(models) == 2
    assert [c["seed"] for c in zoo.configs] == derive_seeds(3, "mode", 2)
    split_seed = derive_seed(3, "split")
    assert [c["split"] for c in zoo.configs] == [
        {"kind": "shards", "n_parts": 2, "part": i, "seed": split_seed}
        for i in range(2)
    ]
    parts = shard_split(ds.y_train.numpy(), 2, split_seed)
    expected = [class_counts(ds.y_train, p, 10) for p in parts]
    np.testing.assert_array_equal(counts, np.array(expected))
    assert ((counts > 0).sum(0) == 1).all()  # each class in one shard


def test_regime_models_full_regime_uses_all_data() -> None:
    zoo = FakeZoo(_dataset())
    _, counts = fx.regime_models(zoo, {}, MLP, RECIPE, {"kind": "full"}, 3, 1)
    assert [c["split"] for c in zoo.configs] == [{"kind": "full"}] * 3
    assert [c["seed"] for c in zoo.configs] == derive_seeds(1, "mode", 3)
    np.testing.assert_array_equal(counts, np.full((3, 10), 12))


def test_in_words_and_describe_model() -> None:
    assert in_words([2]) == "2" and in_words([]) == ""
    assert in_words([2, 4, 6], "or") == "2, 4 or 6"
    assert in_words(["a", "b"]) == "a and b"
    assert fx.describe_model(MLP) == "mlp (widths [8, 6])"
    assert fx.describe_model(RESNET) == "resnet1d (widths [4, 8], blocks per stage 1)"
    assert fx.describe_model({"name": "resnet18", "n_classes": 10}) == "resnet18"


# --- chapter 9 --------------------------------------------------------------------------------


def _cost_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arch": ["mlp"] * 4 + ["cnn"] * 2,
            "method": ["HF-linear", "HF-linear", "KF-gradient", "KF-gradient"]
            + ["KF-linear", "KF-linear"],
            "importance": ["uniform", "uniform", "uniform", "deeplift"]
            + ["uniform", "uniform"],
            "level": [0, 1, 0, 0, 0, 1],
            "cost": [1.0, 2.0, 4.0, 8.0, 2.0, 4.0],
            "clustering": [1.0, 1.0, 1.0, 2.0, 1.0, 3.0],
            "approximation": [0.0, 1.0, 3.0, 6.0, 1.0, 1.0],
            "test acc": [0.5, 0.5, 0.7, 0.6, 0.8, 0.8],
            "abs err": [0.0, 1e-9, 2e-9, 0.0, 0.0, 4e-9],
            "rel err": [0.0, 5e-10, 5e-10, 0.0, 0.0, 1e-9],
        }
    )


def test_cost_decompositions_check_theorem1_at_every_level() -> None:
    ds = _dataset()
    x, y = _fusion_set(ds)
    models = {"mlp": _models(3)}
    costs = fx.cost_decompositions(
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
    gaps = fx.theorem1_gaps(_cost_frame())
    assert gaps == {"max_abs": 4e-9, "max_rel": 1e-9, "n_checks": 6}


def test_cost_and_approximation_shares() -> None:
    costs = _cost_frame()
    view = fx.cost_shares(costs, "uniform")
    assert len(view) == 5
    np.testing.assert_allclose(
        view["clustering share"] + view["approximation share"], 1
    )
    shares = fx.approximation_shares(costs, "uniform")
    # linear rows (uniform): 0/1, 1/2, 1/2, 1/4; gradient rows (uniform): 3/4
    assert shares["linear"] == pytest.approx((0 + 0.5 + 0.5 + 0.25) / 4)
    assert shares["gradient"] == pytest.approx(0.75)


def test_fused_accuracies_one_value_per_fusion() -> None:
    costs = _cost_frame()
    acc = fx.fused_accuracies(costs)
    assert acc == {
        "mlp": {
            "HF-linear": {"uniform": 0.5},
            "KF-gradient": {"uniform": 0.7, "deeplift": 0.6},
        },
        "cnn": {"KF-linear": {"uniform": 0.8}},
    }
    table = fx.fused_accuracy_table(costs)
    assert table.loc[("mlp", "KF-gradient"), "deeplift"] == 0.6
    assert math.isnan(table.loc[("cnn", "KF-linear"), "deeplift"])


def test_importance_agreement() -> None:
    cond = [{"a": torch.arange(1.0, 11.0)}, {"a": torch.arange(11.0, 21.0)}]
    same = {"conductance": cond, "deeplift": cond}
    table = fx.importance_agreement(same, ["a"])
    row = table.iloc[0]
    assert row["neurons"] == 20
    assert row["Spearman(conductance, deeplift)"] == pytest.approx(1.0)
    # the top tenth (2 of 20 neurons) holds (20 + 19) / 210 of the total
    assert row["share of top 10% (conductance)"] == pytest.approx(39 / 210)
    reversed_ = {"conductance": cond, "deeplift": [{"a": -s["a"]} for s in cond]}
    row = fx.importance_agreement(reversed_, ["a"]).iloc[0]
    assert row["Spearman(conductance, deeplift)"] == pytest.approx(-1.0)


def test_kf_target_map_uniform_targets_are_group_means() -> None:
    ds = _dataset()
    x, _ = _fusion_set(ds)
    models = _models(3)
    level = chain_levels(models[0])[0]
    width = 8
    scores = {
        "uniform": [{level: torch.ones(width)} for _ in models],
        "skewed": [{level: torch.arange(1.0, width + 1)} for _ in models],
    }
    neurons = fx.kf_target_map(models, x, level, scores)
    assert neurons["width"] == width
    assert neurons["xy"].shape == (3 * width, 2)
    np.testing.assert_array_equal(np.bincount(neurons["owner"]), [width] * 3)
    np.testing.assert_allclose(neurons["weights"]["uniform"], 1.0)
    w = neurons["weights"]["skewed"].reshape(3, width)
    np.testing.assert_allclose(w.mean(1), 1.0)  # mean 1 per model
    for imp in scores:
        assert neurons["targets"][imp].shape == (width, 2)
    assert not np.allclose(neurons["targets"]["uniform"], neurons["targets"]["skewed"])


# --- chapter 10 -------------------------------------------------------------------------------

METHODS = ["averaging", "ensemble", "otfusion", "hf_linear", "kf_linear"]


def _study(tmp_path=None, **changes) -> tuple[fx.RegimeStudy, FakeZoo]:
    zoo = FakeZoo(_dataset())
    settings = {
        "zoo": zoo,
        "data": {"name": "toy"},
        "arch": MLP,
        "recipe": RECIPE,
        "regimes": {"full": {"kind": "full"}, "sharded": {"kind": "shards"}},
        "fusion_per_class": 6,
        "methods": METHODS,
        "importances": ["uniform", "conductance"],
        "ridge": 1e-8,
        "gradient": {"max_epochs": 3, "patience": 2},
        "run_cache": tmp_path,
        "val_per_class": 3,
    }
    return fx.RegimeStudy(**{**settings, **changes}), zoo


def test_study_settings_and_fusion_set() -> None:
    study, _ = _study()
    assert study.settings([2, 3], [0, 1]) == [
        (r, n, s) for r in ("full", "sharded") for n in (2, 3) for s in (0, 1)
    ]
    x, y = study.fusion_set(1)
    idx = balanced_subset(study.ds.y_train, 6, 1)
    assert torch.equal(x, study.ds.x_train[idx]) and torch.equal(
        y, study.ds.y_train[idx]
    )


def test_study_trains_every_base_model_of_every_setting() -> None:
    study, zoo = _study()
    study.train(study.settings([2, 3], [0]), progress=False)
    assert len(zoo.configs) == 2 * (2 + 3)
    sharded = [c for c in zoo.configs if c["split"]["kind"] == "shards"]
    assert [(c["split"]["n_parts"], c["split"]["part"]) for c in sharded] == [
        (2, 0),
        (2, 1),
        (3, 0),
        (3, 1),
        (3, 2),
    ]


def test_fuse_setting_runs_every_method_and_importance() -> None:
    study, _ = _study()
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
    individual = np.mean([fx.accuracy(m, study.ds) for m in models])
    assert two["rows"][0]["acc"] == pytest.approx(individual)
    xv, yv = study.validation_set(0)
    val = np.mean([evaluate(m, xv, yv)[1] for m in models])
    assert two["rows"][0]["val"] == pytest.approx(val)
    three = study.fuse_setting("full", 3, 0)  # HF fuses three models too
    assert {r["importance"] for r in three["rows"] if r["method"] == "hf_linear"} == {
        "uniform",
        "conductance",
    }


def test_head_rules_fuse_with_each_head_target() -> None:
    study, _ = _study()
    out = fx.head_rules(study, "sharded", 2, 0, "kf_linear", "uniform")
    assert list(out) == ["equal", "data share", "attribution"]
    models, counts = study.base_models("sharded", 2, 0)
    xf, yf = study.fusion_set(0)
    grad = GradientConfig(**study.gradient)
    for name, weights in (("equal", None), ("data share", class_share(counts))):
        fused = fuse_by(
            "kf_linear", models, xf, yf, weights, ridge=study.ridge, gradient=grad
        )
        assert out[name] == fx.accuracy(fused, study.ds)


def test_validation_set_is_balanced_and_outside_the_fusion_set() -> None:
    study, _ = _study()
    xv, yv = study.validation_set(0)
    xf, _ = study.fusion_set(0)
    assert torch.bincount(yv).tolist() == [3] * 10
    assert not (xv[:, None] == xf[None]).flatten(2).all(2).any()


def test_setting_key_names_everything_that_determines_a_setting() -> None:
    study, _ = _study()
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
        other, _ = _study(**{field: value})
        assert other.setting_key("sharded", 2, 0) != base, field
    other, _ = _study()
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
    # hashes and atomic writes, the store that keeps the models, and the
    # cached-only switch of split runs (it refuses to compute): no result
    # depends on them
    needed -= {"wslib.core.files", "wslib.runs.store", "wslib.runs.units"}

    def covered(module: str) -> bool:
        return any(module == c or module.startswith(c + ".") for c in fx.FUSION_CODE)

    assert [m for m in sorted(needed) if not covered(m)] == []
    assert "wslib.fusion" in fx.FUSION_CODE


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
    study, _ = _study(tmp_path)
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
    package = tmp_path / "probe_fusion_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "algo.py").write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code_version.cache_clear()
    calls = []
    compute = lambda: calls.append(1) or {"value": 1}  # noqa: E731
    before = code_version("probe_fusion_pkg")
    cached_run(tmp_path / "runs", {"k": 1}, compute, code=("probe_fusion_pkg",))
    cached_run(tmp_path / "runs", {"k": 1}, compute, code=("probe_fusion_pkg",))
    assert len(calls) == 1
    (package / "algo.py").write_text("SCALE = 2\n")
    code_version.cache_clear()
    assert code_version("probe_fusion_pkg") != before
    cached_run(tmp_path / "runs", {"k": 1}, compute, code=("probe_fusion_pkg",))
    assert len(calls) == 2
    code_version.cache_clear()


def test_study_run_collects_rows_and_times(tmp_path) -> None:
    study, _ = _study(tmp_path, methods=["averaging", "kf_linear"])
    settings = study.settings([2], [0])
    runs, seconds = study.run(settings, progress=False)
    assert set(runs.regime) == {"full", "sharded"}
    assert list(runs.columns[:3]) == ["regime", "n", "seed"]
    assert len(runs) == 2 * (1 + 1 + 2)  # individual, averaging, kf_linear x 2
    assert runs["val"].between(0, 1).all()
    assert [len(v) for v in seconds.values()] == [2, 4]
    again, _ = study.run(settings, progress=False)  # read back from the run cache
    pd.testing.assert_frame_equal(runs, again)


VAL_BONUS = {("kf_gradient", "deeplift"): 0.5}  # best on validation, not on test


def _runs() -> pd.DataFrame:
    """Two seeds of a small table; binary fractions, so every mean is exact."""
    offsets = {
        ("individual", "uniform"): 0.0,
        ("averaging", "uniform"): -0.25,
        ("ensemble", "uniform"): 0.125,
        ("otfusion", "uniform"): -0.125,
        ("kf_linear", "conductance"): 0.0625,
        ("kf_linear", "deeplift"): -0.0625,
        ("kf_gradient", "uniform"): 0.0,
        ("kf_gradient", "conductance"): 0.0,
        ("kf_gradient", "deeplift"): 0.0,
    }
    hf = {("hf_linear", "uniform"): 0.125, ("hf_linear", "conductance"): 0.25}
    rows = []
    for s, shift in [(0, 0.0), (1, 0.125)]:
        for regime, base in [("full", 0.75), ("sharded", 0.5)]:
            for n in (2, 4):
                cells = {**offsets, ("kf_linear", "uniform"): shift}
                cells.update(hf if n == 2 else {})
                rows += [
                    {"regime": regime, "n": n, "seed": s, "method": m}
                    | {"importance": imp, "acc": base + off}
                    | {"val": base + off + VAL_BONUS.get((m, imp), 0.0)}
                    for (m, imp), off in cells.items()
                ]
    return pd.DataFrame(rows)


IMPORTANCES = ["uniform", "conductance", "deeplift"]
METHODS_10 = [
    "averaging",
    "ensemble",
    "otfusion",
    "hf_linear",
    "kf_linear",
    "kf_gradient",
]


def _cell(
    summary: pd.DataFrame, regime: str, n: int, method: str, imp: str
) -> pd.Series:
    return summary[
        (summary.regime == regime)
        & (summary.n == n)
        & (summary.method == method)
        & (summary.importance == imp)
    ].iloc[0]


def test_summarise_runs_mean_and_std_over_seeds() -> None:
    summary = fx.summarise_runs(_runs())
    row = _cell(summary, "full", 2, "kf_linear", "uniform")
    assert row["mean"] == 0.8125
    assert row["std"] == pytest.approx(np.std([0.75, 0.875], ddof=1))
    assert _cell(summary, "full", 2, "averaging", "uniform")["std"] == 0.0
    one_seed = fx.summarise_runs(_runs().query("seed == 0"))
    assert (one_seed["std"] == 0).all()


def test_accuracy_table_cells_order_and_gaps() -> None:
    summary = fx.summarise_runs(_runs())
    table = fx.accuracy_table(
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
    summary = fx.summarise_runs(_runs())
    args = (summary, ["sharded", "full"], [2, 4], METHODS_10, IMPORTANCES)
    styled = fx.styled_accuracy_table(*args)
    assert styled.data.equals(fx.accuracy_table(*args))
    styles = styled._compute().ctx  # (row, column) -> CSS of the cell
    means = summary.set_index(["method", "importance", "regime", "n"])["mean"]
    for j, (regime, n) in enumerate(styled.data.columns):
        bold = [
            styled.data.index[i]
            for (i, c), css in styles.items()
            if c == j and ("font-weight", "bold") in css
        ]
        column = means.xs((regime, n), level=("regime", "n"))
        fused = column.drop(list(fx.NOT_FUSED), level="method", errors="ignore")
        assert set(bold) == set(fused[fused == fused.max()].index), (regime, n)


def test_nested_accuracies_for_the_results_file() -> None:
    summary = fx.summarise_runs(_runs())
    acc = fx.nested_accuracies(summary, ["full", "sharded"], [2, 4, 6])
    assert acc["full"]["6"] == {}
    cell = acc["sharded"]["2"]["kf_linear"]["uniform"]
    assert cell["mean"] == 0.5625
    assert cell["std"] == pytest.approx(np.std([0.5, 0.625], ddof=1))
    assert acc["full"]["4"]["ensemble"] == {"uniform": {"mean": 0.875, "std": 0.0}}
    assert "hf_linear" not in acc["sharded"]["4"]


def test_best_importance_picks_the_best_on_validation() -> None:
    summary = fx.summarise_runs(_runs())
    best = fx.best_importance(summary, "hf_linear")
    assert best.n.tolist() == [2, 2]  # HF ran with two models only here
    assert set(best.importance) == {"conductance"}
    assert sorted(best["mean"]) == [0.75, 1.0]
    assert "deeplift" not in set(fx.best_importance(summary, "kf_linear").importance)
    assert set(fx.best_importance(summary, "kf_gradient").importance) == {"deeplift"}
    no_val = fx.summarise_runs(_runs().drop(columns="val"))
    assert no_val["val"].isna().all()
    with pytest.warns(UserWarning, match="lacks validation accuracies"):
        by_test = fx.best_importance(no_val, "kf_gradient")
    assert "deeplift" not in set(by_test.importance)


def test_importance_gains_and_pivot() -> None:
    summary = fx.summarise_runs(_runs())
    assert "otfusion" in set(
        fx.importance_pivot(summary).index.get_level_values("method")
    )
    wide = fx.importance_pivot(summary, HF_KF)
    assert set(wide.index.get_level_values("method")) == {
        "hf_linear",
        "kf_linear",
        "kf_gradient",
    }
    gains = fx.importance_gains(summary, IMPORTANCES, HF_KF)
    assert list(gains.columns) == ["conductance", "deeplift"]
    kf = gains.xs("kf_linear", level="method")
    assert (kf["conductance"] == 0.0).all()
    assert (kf["deeplift"] == -12.5).all()
    assert (gains.xs("kf_gradient", level="method") == 0.0).all().all()
    assert (gains.xs("hf_linear", level="method")["conductance"] == 12.5).all()


def test_summary_cell_and_headline_numbers() -> None:
    summary = fx.summarise_runs(_runs())
    assert fx.summary_cell(summary, "full", 2, "ensemble") == 87.5
    assert math.isnan(fx.summary_cell(summary, "full", 4, "hf_linear", "conductance"))
    head = fx.headline_numbers(summary, [2, 4], IMPORTANCES)
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
        "full_vs_indiv": "is level (within the spread between seeds) with",  # gap 0
        "shmax_vs_ot": "beats",
        "gradient_vs_linear": "is behind",  # 6.25 / 3 points: more than a tie
    }
    assert fx.select_variant(summary, "sharded", 2, ["hf_linear"]) == (
        "hf_linear (conductance)",
        75.0,
    )
    assert fx.beats(0.4, 0.5).startswith("is level")
    assert fx.beats(-0.6, 0.5) == "does not beat"
    assert fx.beats(0.6, 0.5) == "beats"
    assert fx.beats(0.6, None) == "beats (one seed, spread unknown)"
    assert fx.gradient_word(-0.4) == "matches"  # within GRADIENT_TIE = 0.5
    assert fx.gradient_word(-0.6) == "is behind"
    assert fx.gradient_word(0.6) == "is ahead of"
    with pytest.raises(ValueError, match="no runs of"):
        fx.select_variant(summary, "sharded", 4, ["hf_linear"])


def test_mean_seconds_and_method_groups() -> None:
    assert fx.mean_seconds({"a": [1.0, 3.0], "b": []}) == {"a": 2.0}
    groups = fx.method_groups(["averaging", "ensemble", "hf_linear", "kf_gradient"])
    assert groups == {
        "baselines": ["individual", "averaging", "ensemble"],
        "HF / KF": ["individual", "ensemble", "hf_linear", "kf_gradient"],
    }
    assert fx.method_groups(["kf_linear"])["HF / KF"] == ["individual", "kf_linear"]


def test_self_fusion_returns_the_model() -> None:
    ds = _dataset(per_class=12)
    x, y = _fusion_set(ds, per_class=12)  # 120 samples > 41 inputs of the first layer
    diffs = fx.self_fusion(_models(1)[0], x, y, ds.x_test)
    assert list(diffs) == list(fx.SELF_FUSION_METHODS)
    assert max(diffs.values()) < 1e-4
    # fewer samples than inputs: the ridge term's prior (the model itself) decides
    x, y = _fusion_set(ds, per_class=2)
    few = fx.self_fusion(_models(1)[0], x, y, ds.x_test, methods=["kf_linear"])
    assert few["kf_linear"] < 1e-6


# --- chapter 11 -------------------------------------------------------------------------------


def test_epochs_within() -> None:
    assert fx.epochs_within([0.5, 0.6, 0.79, 0.8], 0.8) == 2
    assert fx.epochs_within([0.795, 0.5], 0.8) == 0
    assert fx.epochs_within([0.5, 0.6], 0.8) is None
    assert fx.epochs_within([0.5, 0.6, 0.75], 0.8, gap=0.05) == 2


def test_finetune_curves_start_from_the_zero_shot_fusion() -> None:
    from wslib.core.train import Recipe

    ds = _dataset()
    x, y = _fusion_set(ds)
    pair = _models(2)
    curves = fx.finetune_curves(
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
    assert curves["KF-Linear"][0] == fx.accuracy(fuse_by("kf_linear", pair, x, y), ds)
    assert curves["averaging"][0] == fx.accuracy(fuse_by("averaging", pair, x, y), ds)
    assert all(0 <= a <= 1 for c in curves.values() for a in c)


def test_width_fusions_fuse_into_every_width() -> None:
    ds = _dataset()
    x, y = _fusion_set(ds)
    variants = [{"widths": [4, 4]}, {"widths": [8, 6]}]
    models = [_models(1, {**MLP, **v})[0] for v in variants]
    rows = fx.width_fusions(models, variants, MLP, x, y, ds, QUICK)
    assert [r["model"] for r in rows] == [
        "base {'widths': [4, 4]}",
        "base {'widths': [8, 6]}",
        "KF-linear -> {'widths': [4, 4]}",
        "KF-gradient -> {'widths': [4, 4]}",
        "KF-linear -> {'widths': [8, 6]}",
        "KF-gradient -> {'widths': [8, 6]}",
    ]
    assert rows[0]["test acc"] == fx.accuracy(models[0], ds)


def test_compression_variants_and_distillation() -> None:
    ds = _dataset()
    x, y = _fusion_set(ds)
    wide = _models(1, {**MLP, "widths": [16, 16]})[0]
    out = fx.compression(wide, {**MLP, "widths": [4, 4]}, x, y, ds, QUICK, kd_epochs=2)
    assert list(out["variants"]) == [
        "KF-linear (uniform)",
        "KF-gradient (uniform)",
        "KF-linear (conductance)",
        "KF-gradient (conductance)",
    ]
    again = fx.compression(
        wide, {**MLP, "widths": [4, 4]}, x, y, ds, QUICK, kd_epochs=2
    )
    assert again == out  # seeded: the same numbers every time


def test_depth_compression_rows_and_verdict() -> None:
    ds = _dataset()
    deep = _models(1, {**MLP, "widths": [8, 8, 6]})[0]
    shallow = {**MLP, "widths": [8, 6]}
    rows = fx.depth_compression(deep, shallow, ds, [2, 4], QUICK, kd_epochs=2)
    assert [(r["size"], r["method"]) for r in rows] == [
        (s, m) for s in (20, 40) for m in ("kf_linear", "kf_gradient", "distillation")
    ]
    assert rows == fx.depth_compression(deep, shallow, ds, [2, 4], QUICK, 2)
    fake = [
        {"size": 20, "method": "kf_linear", "test acc": 0.5},
        {"size": 20, "method": "kf_gradient", "test acc": 0.625},
        {"size": 20, "method": "distillation", "test acc": 0.75},
        {"size": 40, "method": "kf_linear", "test acc": 0.875},
        {"size": 40, "method": "kf_gradient", "test acc": 0.5},
        {"size": 40, "method": "distillation", "test acc": 0.75},
    ]
    out = fx.kf_versus_distillation(fake)
    assert out == {"gap": {20: -12.5, 40: 12.5}, "kf_wins_at": [40], "n_sizes": 2}


def test_size_sweep_rows_and_augmentation_gain() -> None:
    ds = _dataset()
    pair = _models(2)
    share = np.full((2, 10), 0.5)
    rows = fx.size_sweep(pair, share, ds, [2, 4], 1, QUICK, progress=False)
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
    assert fx.augmentation_gain(synthetic) == pytest.approx(5.0)


def test_cached_size_sweep_reads_back_and_keys_the_data(tmp_path, monkeypatch) -> None:
    calls = []

    def fake_sweep(models, share, ds, sizes, copies, gradient, seed=0, progress=True):
        calls.append(len(models))
        return [{"size": 1}]

    monkeypatch.setattr(fx, "size_sweep", fake_sweep)
    zoo = FakeZoo(_dataset())
    args = (zoo, {"name": "toy"}, MLP, RECIPE, [2], 1, {"max_epochs": 3}, 0, tmp_path)
    assert fx.cached_size_sweep(*args) == [{"size": 1}]
    assert fx.cached_size_sweep(*args) == [{"size": 1}]
    assert calls == [2]
    zoo.ds.x_test[0, 0, 0] += 1.0  # other data: computed anew
    fx.cached_size_sweep(*args)
    assert calls == [2, 2]


def test_architecture_zero_shot_marks_what_does_not_apply() -> None:
    ds = _dataset()
    x, y = _fusion_set(ds)
    zoo = FakeZoo(ds)
    archs = {
        "mlp": {"model": MLP, "recipe": RECIPE},
        "resnet": {"model": RESNET, "recipe": RECIPE},
    }
    rows, skipped = fx.architecture_zero_shot(
        zoo, {}, archs, ["averaging", "otfusion"], x, y, QUICK, seed=1, progress=False
    )
    assert [r["architecture"] for r in rows] == ["mlp", "resnet"]
    assert [c["seed"] for c in zoo.configs] == derive_seeds(1, "model", 2) * 2
    assert rows[0]["otfusion"] is not None and rows[1]["otfusion"] is None
    assert rows[1]["averaging"] is not None
    assert len(skipped) == 1 and skipped[0].startswith(
        "resnet / otfusion: not applicable"
    )


# --- chapter 11: the Gradient variant on whole blocks -------------------------------------------


def test_residual_gradient_variants_fit_blocks_only_in_the_block_variant():
    ds = _dataset()
    x, y = _fusion_set(ds)
    models = _models(2, RESNET)
    rows = fx.residual_gradient_variants(
        models, x, y, ds, GradientConfig(max_epochs=15)
    )
    assert [(r["method"], r["variant"]) for r in rows] == [
        (g, v) for g in ("HF", "KF") for v in fx.GRADIENT_VARIANTS
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


def _block_rows(lin: float, blk: float, start: float = 2.0) -> list[dict]:
    return [
        {"method": "KF", "variant": "Linear", "test acc": lin},
        {"method": "KF", "variant": "Gradient, affine steps", "test acc": lin},
        {
            "method": "KF",
            "variant": "Gradient, whole blocks",
            "test acc": blk,
            "block MSE start": start,
            "block MSE end": 0.5,
        },
    ]


def test_block_fit_text_states_the_verdict_from_the_numbers():
    up = fx.block_fit_text("resnet", _block_rows(0.50, 0.60))
    assert up.startswith("resnet: KF: Linear 50.0 %")
    assert "lowers the block-output error by 75 %" in up
    assert "raises the accuracy, +10.0 points" in up
    assert "lowers the accuracy, -10.0 points" in fx.block_fit_text(
        "r", _block_rows(0.6, 0.5)
    )
    assert "leaves the accuracy" in fx.block_fit_text("r", _block_rows(0.6, 0.6005))
    assert "error as it was" in fx.block_fit_text("r", _block_rows(0.6, 0.6, start=0.0))
    assert (
        fx.describe_recipe({"epochs": 3, "batch_size": 32}) == "3 epochs, batch size 32"
    )


def test_residual_architectures_are_the_resnets_and_transformers():
    archs = {
        "mlp": {"model": MLP},
        "resnet": {"model": RESNET},
        "transformer": {
            "model": {
                "name": "transformer1d",
                "in_shape": [1, 40],
                "n_classes": 10,
                "embed_dim": 8,
                "depth": 1,
                "heads": 2,
                "mlp_dim": 8,
            }
        },
    }
    assert fx.residual_architectures(archs) == ["resnet", "transformer"]


def test_block_fit_study_runs_the_residual_nets_on_the_zero_shot_models():
    ds = _dataset()
    x, y = _fusion_set(ds)
    zoo = FakeZoo(ds)
    archs = {
        "mlp": {"model": MLP, "recipe": RECIPE},
        "r": {"model": RESNET, "recipe": RECIPE},
    }
    out = fx.block_fit_study(zoo, {"name": "toy"}, archs, x, y, QUICK, seed=1)
    assert list(out) == ["r"]
    assert [c["seed"] for c in zoo.configs] == derive_seeds(1, "model", 2)
    models = [
        zoo.get({"model": RESNET, "seed": s}) for s in derive_seeds(1, "model", 2)
    ]
    rows = fx.residual_gradient_variants(models, x, y, ds, QUICK, 1)
    assert [r["test acc"] for r in out["r"]] == [r["test acc"] for r in rows]


# --- unlisted behaviours: seeds and splits ------------------------------------------------------


def test_fusion_examples_are_training_examples_of_their_seed() -> None:
    ds = _dataset(n_test=100)
    x, y = fx.fusion_examples(ds, 3, seed=4)
    rows = {tuple(r.flatten().tolist()): int(c) for r, c in zip(ds.x_train, ds.y_train)}
    assert all(rows.get(tuple(r.flatten().tolist())) == int(c) for r, c in zip(x, y))
    other, _ = fx.fusion_examples(ds, 3, seed=5)
    assert torch.equal(x, fx.fusion_examples(ds, 3, seed=4)[0])
    assert not torch.equal(x, other)


def test_augmented_copies_follow_their_seed() -> None:
    x, y = _fusion_set(_dataset())
    first, again, other = (augment_fusion_set(x, y, 2, seed=s)[0] for s in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("method", ["distill", "last_layer_kd"])
def test_distillation_draws_its_batches_from_its_seed(method: str) -> None:
    x, _ = _fusion_set(_dataset(per_class=30), 20)  # 200 examples: two batches
    teachers = _models(2)

    def student(seed: int) -> torch.Tensor:
        if method == "distill":
            out = distill(
                _models(1)[0], teachers[0], x, epochs=2, batch_size=8, seed=seed
            )
        else:
            out = last_layer_kd(teachers, x, epochs=2, seed=seed)
        return torch.cat([p.detach().flatten() for p in out.parameters()])

    assert torch.equal(student(1), student(1))
    assert not torch.equal(student(1), student(2))
