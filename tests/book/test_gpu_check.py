"""notebooks/gpu_check.py: refuses without CUDA, runs on the CPU when forced, counts right.

The quick run (``--allow-cpu --quick``) times tiny models on the CPU and
prints the estimate table; the counting is checked against the gpu profile's
parameters written out by hand.
"""

from __future__ import annotations

import math
import subprocess
import sys
from types import ModuleType

import nbformat
import pytest
import torch
import yaml

from tests.conftest import ROOT, chapters, load_script
from tests.kit import mlp

SCRIPT = ROOT / "notebooks" / "gpu_check.py"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    """The script as a module."""
    return load_script("notebooks/gpu_check.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_refuses_without_cuda():
    out = _run("--quick")
    assert out.returncode == 2
    assert "needs a CUDA device" in out.stderr
    assert "built for CUDA" in out.stderr or "CPU-only build" in out.stderr
    assert "--allow-cpu" in out.stderr
    assert "ResNet-18 step" not in out.stdout  # nothing was timed


def test_a_missing_parameter_file_is_named():
    out = _run("--assumed", "--params", "notebooks/params/gpu.yml")
    assert out.returncode == 2
    assert "--params notebooks/params/gpu.yml: no such file" in out.stderr
    assert "Traceback" not in out.stderr


def test_quick_run_on_the_cpu_runs_a_chapter_and_prints_timings_and_the_table(check):
    out = _run("--allow-cpu", "--quick")
    assert out.returncode == 0, out.stderr
    assert "gpu-smoke chapters in a fresh checkout" in out.stdout
    assert f"{check.QUICK_CHAPTER}         passed" in out.stdout
    assert "chapters: 1 of 1 passed" in out.stdout
    for timing in (
        "fp32",
        "bf16",
        "LLPF refinement step",
        "steps per tick",
        "evaluation",
        "TF32 on",
        "peak host RSS",
        "CPU hot spots",
        "checkpoint save",
        "least-squares",
        "KF grouping, 6 x 8 neurons",
    ):
        assert timing in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    chapters = [r.split("|")[1].split()[0] for r in rows[2:-1]]
    assert chapters == sorted(p.stem for p in (ROOT / "notebooks").glob("*.md"))
    assert rows[-1].startswith("| **total** |")


def test_chapter_7_counts_every_run(check):
    p = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())[
        "07_pathcond_mlp"
    ]
    steps = math.ceil(50_000 / p["recipe"]["batch_size"])
    n_methods = sum(len(c["methods"]) for c in p["configs"].values())
    main = n_methods * p["n_seeds"] * p["recipe"]["epochs"]
    sizes = len(p["size_sweep"]["widths"]) * 2 * p["n_seeds"] * p["recipe"]["epochs"]
    acts = len(p["activations"]) * 2 * p["n_activation_seeds"] * p["recipe"]["epochs"]
    n_rates = len(p["lr_grid"]) + 2  # the default refinement: two neighbours
    sweeps = len(p["lr_sweep_configs"]) * 2 * (n_rates + p["n_seeds"])
    expected = (main + sizes + acts + sweeps * p["long_epochs"]) * steps
    items = check.chapter_work()["07_pathcond_mlp"]
    train = [w for w in items if w.kind == "train"]
    assert sum(w.amount * w.runs for w in train) == expected
    assert {w.batch for w in train} == {p["recipe"]["batch_size"]}
    # runs of MLP 500x3 without output bias share one stack per call: the
    # main call's methods on each seed, the rate grid's two methods at each rate
    plain = {
        name: [m for m in c["methods"] if m != "enorm"]
        for name, c in p["configs"].items()
        if c["widths"] == [500] * 3 and not c.get("output_bias", False)
    }
    main = sum(map(len, plain.values())) * p["n_seeds"]
    grid = 2 * len(p["lr_grid"]) * len(set(plain) & set(p["lr_sweep_configs"]))
    assert {main, grid} <= {w.runs for w in train}
    assert max(w.runs for w in train) == max(main, grid)
    enorm = [w for w in train if w.runs == 1 and w.model["widths"] == [500] * 3]
    assert enorm, "ENorm's runs are counted apart"


def test_each_item_has_its_profiles_precision(check, tmp_path):
    """Training recipes and path settings say bf16 or not; the counter keeps it."""
    params = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())
    ch3 = params["03_llpf_m2m"]
    for name in ch3["recipes"]:
        ch3["recipes"][name] = {**ch3["recipes"][name], "precision": "fp32"}
    ch3["recipes"]["resnet"]["precision"] = "bf16"
    ch3["llpf"] = {k: {**v, "precision": "fp32"} for k, v in ch3["llpf"].items()}
    ch3["llpf"]["mlp"]["precision"] = "bf16"
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({"03_llpf_m2m": ch3}))
    items = check.chapter_work(path)["03_llpf_m2m"]
    for w in items:
        if w.kind in ("train", "ticks"):
            expected = "resnet" if w.kind == "train" else "mlp"
            assert w.bf16 == (w.model["name"].startswith(expected)), w
    assert {w.bf16 for w in items if w.kind == "ticks"} == {True, False}


def test_stacked_runs_share_their_steps(check):
    rates = check.ASSUMED
    model = mlp([500], in_shape=[3, 32, 32], n_classes=10)
    one = check.Work("train", model, 100, 128)
    many = check.Work("train", model, 100, 128, runs=8)
    assert check.seconds([one], rates) == pytest.approx(100 * rates.floor_s)
    assert check.seconds([many], rates) == check.seconds([one], rates)  # the floor
    big = check.Work("train", check.RESNET, 100, rates.batch, runs=3)
    assert check.seconds([big], rates) == pytest.approx(3 * 100 * rates.step_s)


def test_a_model_in_the_zoo_is_trained_once(check, tmp_path):
    params = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())
    work = check.chapter_work()
    assert not [w for w in work["02_layerwise"] if w.kind == "train"]  # = chapter 1's
    resnet = params["11_fusion_beyond"]["architectures"]["resnet18"]
    counted = {}
    for width in (None, 1.0):
        model = {k: v for k, v in resnet["model"].items() if k != "width"}
        resnet["model"] = model if width is None else {**model, "width": width}
        path = tmp_path / "gpu.yaml"
        path.write_text(yaml.safe_dump(params))
        items = check.chapter_work(path)["11_fusion_beyond"]
        model = check.complete_model_configs(resnet["model"], {"name": "cifar10"})
        counted[width] = [
            w
            for w in items
            if w.kind == "train" and w.model == model and w.batch == 256
        ]
    epochs = resnet["recipe"]["epochs"]
    assert [w.amount for w in counted[None]] == [epochs * math.ceil(50_000 / 256)] * 2
    assert counted[1.0] == []  # the same config as chapter 1: loaded from the zoo


def test_seconds_scale_by_flops_with_a_floor(check):
    rates = check.ASSUMED
    resnet = check.Work("train", check.RESNET, 10, rates.batch)
    assert check.seconds([resnet], rates) == pytest.approx(10 * rates.step_s)
    assert check.seconds([resnet], rates, "bf16") == pytest.approx(
        10 * rates.bf16_step_s
    )
    # an item the profile writes in bf16 counts at bf16 rates unless fp32 is forced
    written = check.Work("train", check.RESNET, 10, rates.batch, bf16=True)
    assert check.seconds([written], rates) == pytest.approx(10 * rates.bf16_step_s)
    assert check.seconds([written], rates, "fp32") == pytest.approx(10 * rates.step_s)
    half = check.Work("train", check.RESNET, 10, rates.batch // 2)
    assert check.seconds([half], rates) == pytest.approx(5 * rates.step_s)
    tiny = check.Work("train", check.QUICK_MLP, 10, 16)
    assert check.seconds([tiny], rates) == pytest.approx(10 * rates.floor_s)
    solves = check.Work("solve", None, 4)
    assert check.seconds([solves], rates) == pytest.approx(4 * rates.solve_s)


def test_chapter_12_counts_its_paths_and_only_new_models(check):
    p = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())["12_synthesis"]
    pairs = p["n_modes"] * (p["n_modes"] - 1) // 2
    items = check.chapter_work()["12_synthesis"]
    ticks = [w for w in items if w.kind == "ticks"]
    assert len(ticks) == 6 * pairs  # fused-parent (2 variants x 2), parent-parent x 2
    assert {w.amount for w in ticks} == {p["llpf"]["ticks"]}
    trained = [w for w in items if w.kind == "train" and w.batch == 256]
    new_modes = (p["n_modes"] - 2) * len(p["models"])  # seeds 0, 1 are chapter 1's
    shards = 2 * p["n_shard_seeds"]
    assert len(trained) == new_modes + shards + 2 * pairs  # two fine-tunes per pair


def test_a_failed_chapter_is_reported_with_its_cell_and_error_and_the_others_go_on(
    check, tmp_path
):
    checkout = check.make_checkout(tmp_path)
    path = checkout / "notebooks" / "02_layerwise.md"
    nb = chapters.read(path)
    nb.cells.insert(3, nbformat.v4.new_code_cell('raise RuntimeError("planted")'))
    chapters.write(nb, path)
    statuses = check.run_chapters(
        checkout, ["02_layerwise", "06_pathlifting"], 2, torch.device("cpu")
    )
    failed, passed = statuses
    assert not failed.passed and "RuntimeError: planted" in failed.error
    assert failed.error.startswith("cell In [")
    assert passed.passed and passed.device == "cpu"


def test_a_fresh_checkout_holds_no_cache_and_synthetic_data(check, tmp_path):
    checkout = check.make_checkout(tmp_path)
    assert not (checkout / "results").exists() and not (checkout / "build").exists()
    assert sorted(p.name for p in (checkout / "data").iterdir()) == sorted(
        ["cifar10", "cifar100", "mnist", "fashion_mnist"]
    )


def test_chapter_10_counts_its_cpu_side_grouping_and_matching(check):
    p = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())[
        "10_fusion_regimes"
    ]
    defaults = check.runner.default_parameters("10_fusion_regimes")
    methods, k = defaults["methods"], len(defaults["importances"])
    per = check.CPU_SECONDS
    expected = 0.0
    for n in p["n_models"]:
        runs = len(p["regimes"]) * p["n_seeds"]
        for kind in ("hf", "kf"):
            fusions = k * sum(m.startswith(kind + "_") for m in methods)
            # k-means on (models x width)^2 coordinates; a matching per extra model
            scale = (n / 6) ** 2 if kind == "kf" else (n - 1) / 5
            expected += runs * fusions * scale * per[f"{kind} grouping, 6 models"]
        expected += runs * (n - 1) * per["weight matching"]  # once per pair
    items = check.chapter_work()["10_fusion_regimes"]
    assert sum(w.amount for w in items if w.kind == "cpu") == pytest.approx(expected)


def test_llpf_ticks_are_counted_by_the_pilot_rates(check):
    rates = check.ASSUMED
    tick = check.Work("ticks", check.RESNET, 10, rates.batch, record_every=0)
    # each tick a record (record_every 0 counts as 1), so a save each
    expected = 10 * rates.tick_steps * rates.refine_step_s + 10 * rates.save_s
    assert check.seconds([tick], rates) == pytest.approx(expected)
    bf16 = expected - 10 * rates.tick_steps * rates.refine_step_s * (
        1 - rates.bf16_step_s / rates.step_s
    )
    assert check.seconds([tick], rates, "bf16") == pytest.approx(bf16)
    written = check.Work(
        "ticks", check.RESNET, 10, rates.batch, record_every=0, bf16=True
    )
    assert check.seconds([written], rates) == pytest.approx(bf16)


def test_the_readme_table_is_the_estimate(check):
    """The README's hours are what ``gpu_check.py --assumed`` prints today."""
    printed = {}
    for line in check.estimate_table(check.ASSUMED).splitlines()[2:]:
        name, h32, h16 = (c.strip(" *") for c in line.strip("|").split("|"))
        printed[name[:2].lstrip("0") if name[0].isdigit() else name] = (h32, h16)
    readme = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip(" *") for c in line.strip("|").split("|")]
        if len(cells) == 5 and (
            cells[0].split(" ")[0].isdigit() or cells[0] == "total"
        ):
            readme[cells[0].split(" ")[0]] = (cells[3], cells[4])
    assert readme == printed
