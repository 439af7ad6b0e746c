"""wslib.llpf.units: the LLPF chapters' units, listed cheaply, calling what the notebooks call."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch

from bookkit import part
from tests.kit import FakeZoo, mlp, toy_dataset
from wslib.core.configs import build_model
from wslib.core.connectivity import mode_config
from wslib.core.seeds import derive_seeds
from wslib.llpf import ch04_baselines, units
from wslib.llpf.ch04_baselines import methods_by_model, tuning_seed
from wslib.llpf.ch05_spheres import sphere_configs
from wslib.llpf.methods import NOT_KEYED
from wslib.llpf.protocols import CODE, PathSetup
from wslib.llpf.setup import chapter_setup, mode_seeds, path_seed_list
from wslib.runs.steps import cached_step
from wslib.runs.units import Unit, by_stage

CHAPTERS = {
    "03_llpf_m2m": units.m2m_units,
    "04_llpf_baselines": units.baseline_units,
    "05_llpf_spheres": units.sphere_units,
}


def parameters(nb: str, profile: str, seed: int = 0) -> dict[str, Any]:
    """The parameters ``nb`` runs with at ``profile`` (as bookkit/part.py reads them)."""
    return part.parameters(nb, profile, seed)


def names(listed: list[Unit], stage: int | None = None) -> list[str]:
    return [u.name for u in listed if stage is None or u.stage == stage]


def no_zoo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing must not open the zoo or load data."""

    def refuse(*args: object) -> None:
        raise AssertionError("listing units opened the zoo or the data")

    monkeypatch.setattr(units, "chapter_data", refuse)


def expected_m2m(p: dict[str, Any]) -> int:
    n = len(p["models"])
    seeds = p["path_seeds"]
    # every ablation architecture runs all at once on its FDF path seeds
    ablation = sum(seeds if a in p["seed_archs"] else 1 for a in p["ablation_archs"])
    return 2 * n + n + (seeds - 1) * len(p["seed_archs"]) + ablation + 1


def expected_baselines(p: dict[str, Any]) -> int:
    total = 0
    methods = methods_by_model(p["models"], p["llpf"], p["baselines"])
    for base in methods.values():
        total += 2 + 1 + p["n_seeds"]  # modes, budget run, comparisons
        for label, options in p["tuning"].items():
            llpf = base[label]["method"] == "llpf"  # LLPF at base is the budget run
            total += sum(
                not llpf or {**base[label], **o} != base[label] for o in options
            )
    return total


@pytest.mark.parametrize("profile", ["smoke", "gpu", "cpu"])
@pytest.mark.parametrize("nb", sorted(CHAPTERS))
def test_units_are_listed_fast_without_training(
    monkeypatch: pytest.MonkeyPatch, nb: str, profile: str
) -> None:
    no_zoo(monkeypatch)
    p = parameters(nb, profile)
    start = time.perf_counter()
    listed = CHAPTERS[nb](p)
    assert time.perf_counter() - start < 1.0
    assert len(set(names(listed))) == len(listed)
    by_stage(listed)
    if nb == "03_llpf_m2m":
        assert len(listed) == expected_m2m(p)
    elif nb == "04_llpf_baselines":
        assert len(listed) == expected_baselines(p)
    else:
        models = {json.dumps(c, sort_keys=True) for c in configs(p).values()}
        assert len(names(listed, 0)) == len(models)
        assert len(names(listed, 1)) == 6


def configs(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keys = ("arch", "recipe", "norm_arch", "norm_recipe", "wd_source", "wd_dest")
    return sphere_configs(
        p["data"], *(p[k] for k in keys), p["sharp_recipe"], p["seed"]
    )


def test_gpu_unit_lists_name_each_path_and_setting() -> None:
    p = parameters("03_llpf_m2m", "gpu", seed=5)
    listed = units.m2m_units(p)
    a, b = mode_seeds(5)
    assert names(listed, 0)[:2] == [f"mode mlp seed {a}", f"mode mlp seed {b}"]
    m2m = names(listed, 1)
    first, *_, last = path_seed_list(5, p["path_seeds"])
    assert f"m2m resnet seed {last}" in m2m and f"m2m cnn seed {last}" in m2m
    assert f"m2m transformer seed {last}" not in m2m
    assert f"all-at-once cnn seed {last}" in m2m
    assert f"all-at-once resnet seed {last}" in m2m  # the paper's deeper nets
    assert f"all-at-once transformer seed {first}" in m2m  # its one path seed
    assert f"all-at-once transformer seed {last}" not in m2m
    assert m2m[-1] == "peak anatomy mlp"
    p4 = parameters("04_llpf_baselines", "gpu")
    four = units.baseline_units(p4)
    # the gpu profile's chapter-4 conv net (ResNet-18) is keyed "cnn", as its claim
    assert "tuning cnn LLPF base settings" in names(four, 1)
    assert 'tuning cnn Bezier {"lr": 0.005}' in names(four, 2)
    seeds = path_seed_list(0, p4["n_seeds"])
    assert len(seeds) > 1
    assert names(four, 3) == [
        f"compare {m} seed {s}" for m in ("mlp", "cnn") for s in seeds
    ]


def test_chapter_5_trains_each_distinct_model_once() -> None:
    p = parameters("05_llpf_spheres", "gpu")
    listed = units.sphere_units(p)  # the gpu profile's base and normed models agree
    assert names(listed, 0) == [
        "model base",
        "model source",
        "model dest",
        "model sharp a",
        "model sharp b",
    ]


@pytest.mark.parametrize("nb", ["03_llpf_m2m", "05_llpf_spheres"])
def test_paths_without_checkpoints_cannot_be_units(nb: str) -> None:
    p = {**parameters(nb, "smoke"), "checkpoint_dir": None}
    with pytest.raises(ValueError, match="checkpoint_dir is None"):
        CHAPTERS[nb](p)


# --- what the units call ---------------------------------------------------------

TOY = mlp([5])


@pytest.fixture
def zoo(monkeypatch: pytest.MonkeyPatch) -> FakeZoo:
    fake = FakeZoo(train=True)
    monkeypatch.setattr(units, "chapter_data", lambda data: (fake, toy_dataset(32)))
    return fake


def record(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(units, name, lambda *a, **k: calls.append((a, k)))
    return calls


def chapter_params(nb: str, tmp_path, **changes: Any) -> dict[str, Any]:
    p = parameters(nb, "smoke", seed=3)
    p.update(checkpoint_dir=str(tmp_path), run_cache=str(tmp_path / "runs"))
    if nb != "05_llpf_spheres":
        widths = iter(range(3, 9))
        p["models"] = {k: {**TOY, "widths": [next(widths)]} for k in p["models"]}
    p.update(changes)
    return p


def test_m2m_units_call_m2m_path_as_the_notebook_does(
    monkeypatch: pytest.MonkeyPatch, zoo: FakeZoo, tmp_path
) -> None:
    calls = record(monkeypatch, "m2m_path")
    anatomy = record(monkeypatch, "peak_anatomy")
    p = chapter_params("03_llpf_m2m", tmp_path, seed_archs=["cnn"])
    listed = units.m2m_units(p)
    for unit in listed:
        unit.run()
    assert [c["seed"] for c in zoo.requests[:2]] == mode_seeds(3)
    setup = chapter_setup(toy_dataset(32), 128, 2, 0.03, 1, str(tmp_path), "smoke")
    got = [(a[2], a[3], k["name"], k["all_at_once"]) for a, k in calls]
    paths = path_seed_list(3, 2)
    want = [(p["llpf"][n], paths[0], n, False) for n in p["models"]]
    want.insert(2, (p["llpf"]["cnn"], paths[1], "cnn", False))
    want += [
        (p["llpf"][n], s, n, True)
        for n in p["ablation_archs"]
        for s in (paths if n == "cnn" else paths[:1])  # cnn alone in seed_archs
    ]
    assert got == want
    assert all(a[0].checkpoint_dir == setup.checkpoint_dir for a, _ in calls)
    for a, k in calls:  # the path joins its model's two modes
        n = k["name"]
        want_modes = [
            mode_config(p["data"], p["models"][n], p["recipes"][n], s)
            for s in mode_seeds(3)
        ]
        assert [m.config for m in a[1]] == want_modes
    ((args, kwargs),) = anatomy
    first_modes = [
        mode_config(p["data"], p["models"]["mlp"], p["recipes"]["mlp"], s)
        for s in mode_seeds(3)
    ]
    assert (
        [m.config for m in args[1]] == first_modes
        and args[2] == p["llpf"]["mlp"]
        and args[3:] == (paths[0],)
        and kwargs == {"run_cache": p["run_cache"]}
    )


def test_tuning_units_give_baselines_the_budget_of_the_llpf_run(
    monkeypatch: pytest.MonkeyPatch, zoo: FakeZoo, tmp_path
) -> None:
    budgets: list[tuple] = []
    monkeypatch.setattr(
        units,
        "tuning_budget",
        lambda *a, run_cache: budgets.append((a[-1], run_cache)) or 17,
    )
    runs = record(monkeypatch, "tuning_run")
    p = chapter_params("04_llpf_baselines", tmp_path, seed=2)
    listed = [u for u in units.baseline_units(p) if u.name.startswith("tuning")]
    for unit in listed:
        unit.run()
    seed = tuning_seed(2)
    assert seed not in path_seed_list(2, p["n_seeds"])
    assert set(budgets) == {(seed, p["run_cache"])}
    model_name = {json.dumps(m): n for n, m in p["models"].items()}
    got = [
        (model_name[json.dumps(a[1][0].config["model"])], *a[3:], k["run_cache"])
        for a, k in runs
    ]
    want = [
        (n, label, o, seed, None if label == "LLPF" else 17, p["run_cache"])
        for n in p["models"]
        for label, options in p["tuning"].items()
        for o in options
        if label != "LLPF" or o["lr"] != p["llpf"][n]["lr"]
    ]
    assert sorted(got, key=str) == sorted(want, key=str)
    assert len(listed) == len(want) + 2  # and one budget run per model


def test_compare_units_use_the_tuned_settings_on_their_seed(
    monkeypatch: pytest.MonkeyPatch, zoo: FakeZoo, tmp_path
) -> None:
    sweeps: list[tuple] = []

    def sweep(*args: Any, run_cache: str) -> str:
        sweeps.append((*args, run_cache))
        return "sweep"

    monkeypatch.setattr(units, "tuning_sweep", sweep)
    monkeypatch.setattr(units, "tuned_methods", lambda methods, s: {"tuned": s})
    calls = record(monkeypatch, "compare_methods")
    p = chapter_params("04_llpf_baselines", tmp_path, seed=2)
    for unit in units.baseline_units(p):
        if unit.stage == 3:
            unit.run()
    got = [(list(a[1]), a[3], a[4], k["run_cache"]) for a, k in calls]
    tuned = {"tuned": "sweep"}
    assert got == [
        ([name], tuned, [s], p["run_cache"])
        for name in ("mlp", "cnn")
        for s in path_seed_list(2, p["n_seeds"])
    ]
    assert all(s[5] == tuning_seed(2) and s[4] == p["tuning"] for s in sweeps)
    assert all(s[6] == p["run_cache"] for s in sweeps)


def test_sphere_units_call_the_chapters_runs(
    monkeypatch: pytest.MonkeyPatch, zoo: FakeZoo, tmp_path
) -> None:
    m2o = record(monkeypatch, "m2o_path")
    hybrid = record(monkeypatch, "hybrid_path")
    m2m = record(monkeypatch, "m2m_path")
    p = chapter_params("05_llpf_spheres", tmp_path, seed=6)
    for unit in units.sphere_units(p):
        unit.run()
    want = configs(p)
    a, b = mode_seeds(6)
    assert [c["seed"] for c in zoo.requests[:6]] == [a, a, a, b, a, b]
    assert zoo.requests[:6] == list(want.values())
    (path,) = path_seed_list(6, 1)
    assert [(a[2], a[3], k["compliance"], k["name"]) for a, k in m2o] == [
        (p["m2o_settings"], path, True, "spheres-m2o"),
        (p["m2o_settings"], path, False, "spheres-m2o"),
        (p["m2o_settings"], path, True, "spheres-norm"),
        (p["m2o_settings"], path, False, "spheres-norm"),
    ]
    ((args, kwargs),) = hybrid
    assert args[3:] == (p["hybrid_m2o"], p["m2m_settings"], path)
    assert kwargs == {"name": "spheres-hybrid"}
    ((args, kwargs),) = m2m
    assert args[2:] == (p["m2m_settings"], path)
    assert kwargs == {"name": "spheres-sharp"}


def test_derived_seeds() -> None:
    paths = path_seed_list(4, 3)
    assert paths[:2] == path_seed_list(4, 2) and len(set(paths)) == 3
    assert mode_seeds(4) == derive_seeds(4, "mode", 2)
    assert not {*paths, *mode_seeds(4)} & {*path_seed_list(5, 3), *mode_seeds(5)}
    assert tuning_seed(4) not in paths
    with pytest.raises(ValueError, match="at least one path seed"):
        path_seed_list(0, 0)


def test_chapter_setup_keeps_checkpoints_per_profile(tmp_path) -> None:
    setup = chapter_setup(toy_dataset(32), 8, 2, 0.1, 3, tmp_path, "gpu")
    assert setup.checkpoint_dir == tmp_path / "gpu"
    assert (setup.batch_size, setup.r_min, setup.margin, setup.dense) == (8, 2, 0.1, 3)
    assert (
        chapter_setup(toy_dataset(32), 8, 2, 0.1, 1, None, "gpu").checkpoint_dir is None
    )


def test_sphere_configs_name_each_model() -> None:
    got = sphere_configs(
        {"name": "d"}, TOY, {"lr": 1}, {"m": 2}, {"lr": 2}, 0.1, 0.2, {"lr": 3}, 5
    )
    a, b = mode_seeds(5)
    assert got["base"] == {
        "data": {"name": "d"},
        "model": TOY,
        "recipe": {"lr": 1},
        "seed": a,
    }
    assert got["normed"]["model"] == {"m": 2} and got["normed"]["recipe"] == {"lr": 2}
    assert got["source"]["recipe"] == {"lr": 1, "weight_decay": 0.1}
    assert got["dest"]["recipe"] == {"lr": 1, "weight_decay": 0.2}
    assert (got["source"]["seed"], got["dest"]["seed"]) == (a, b)
    assert [got[k]["seed"] for k in ("sharp a", "sharp b")] == [a, b]
    assert got["sharp b"]["recipe"] == {"lr": 3}


def test_methods_by_model_puts_each_models_llpf_first() -> None:
    got = methods_by_model(
        {"a": 0, "b": 0}, {"a": {"lr": 1}, "b": {"lr": 2}}, {"B": {"method": "curve"}}
    )
    assert list(got["a"]) == ["LLPF", "B"]
    assert got["b"]["LLPF"] == {"method": "llpf", "lr": 2}


def test_tuning_budget_and_run_read_the_method_run_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    seen = []

    @cached_step(code=CODE, not_keyed=NOT_KEYED)
    def fake(setup, pair, settings, seed, *, budget=None, name=None, run_cache=None):
        seen.append((settings["method"], settings["lr"], seed, budget))
        return {"peak_excess": 0.0, "grad_steps": 11}

    monkeypatch.setattr(ch04_baselines, "method_run", fake)
    setup = chapter_setup(toy_dataset(32), 8, 2, 0.1, 1, None, "smoke")
    pair = [build_model(TOY), build_model(TOY)]
    methods = methods_by_model(
        {"m": TOY}, {"m": {"lr": 0.1}}, {"B": {"method": "curve", "lr": 1}}
    )["m"]
    args = (setup, pair, methods)
    assert ch04_baselines.tuning_budget(*args, 4, run_cache=tmp_path) == 11
    settings, _ = ch04_baselines.tuning_run(
        *args, "B", {"lr": 2}, 4, 11, run_cache=tmp_path
    )
    assert settings == {"method": "curve", "lr": 2}
    ch04_baselines.tuning_run(*args, "LLPF", {"lr": 3}, 4, 11, run_cache=tmp_path)
    assert ch04_baselines.tuning_budget(*args, 4, run_cache=tmp_path) == 11  # cached
    assert seen == [("llpf", 0.1, 4, None), ("curve", 2, 4, 11), ("llpf", 3, 4, None)]


def test_checkpoint_names_differ_by_endpoint_models(tmp_path) -> None:
    """Two sweep seeds run path seed 1 between other modes: other folders."""
    spec = mlp([3], [1, 4], 2)
    torch.manual_seed(0)
    a, b, c = (build_model(spec) for _ in range(3))
    setup = PathSetup(None, 8, 2, 0.0, checkpoint_dir=tmp_path)  # type: ignore[arg-type]
    first = setup.checkpoint("mlp", 1, settings={"lr": 0.1}, ends=[a, b])
    assert first == setup.checkpoint("mlp", 1, settings={"lr": 0.1}, ends=[a, b])
    assert first != setup.checkpoint("mlp", 1, settings={"lr": 0.1}, ends=[b, c])
