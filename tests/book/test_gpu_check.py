"""bookkit/gpu_check.py: refuses without CUDA, runs on the CPU when forced, counts right.

The quick run (``--allow-cpu --quick``) times tiny models on the CPU and
prints the estimate table; the counting is checked against the gpu profile's
parameters written out by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from types import ModuleType

import nbformat
import pytest
import torch
import yaml

from bookkit import gpu_check, gpu_estimate, gpu_timings, gpu_work
from tests.conftest import ROOT, SESSION_ENV, chapters, run_main
from tests.kit import mlp
from wslib.core.configs import complete_model_configs


@pytest.fixture(scope="module")
def check() -> ModuleType:
    """The script as a module."""
    return gpu_check


@pytest.fixture(scope="module")
def est() -> ModuleType:
    """The estimate (``bookkit/gpu_estimate.py``) as a module."""
    return gpu_estimate


@pytest.fixture(scope="module")
def timing() -> ModuleType:
    """The timings (``bookkit/gpu_timings.py``) as a module."""
    return gpu_timings


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookkit", "gpu-check", *args],
        cwd=ROOT,
        env=SESSION_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_failures_are_read_in_a_cell_and_outside_the_cells(check):
    """run.py's two kinds of failure both reach the chapter's status."""
    log = (
        "error: notebook 03_a failed in cell In [7]\n    ValueError: bad\n"
        "error: notebook 12_b failed outside its cells\n"
        "    DeadKernelError: Kernel died\n"
    )
    assert check._failures(log) == {
        "03_a": "cell In [7]: ValueError: bad",
        "12_b": "outside its cells: DeadKernelError: Kernel died",
    }


def test_refuses_without_cuda(check):
    out = run_main(check, "--quick")
    assert out.returncode == 2
    assert "needs a CUDA device" in out.stderr
    assert "built for CUDA" in out.stderr or "CPU-only build" in out.stderr
    assert "--allow-cpu" in out.stderr
    assert "ResNet-18 step" not in out.stdout  # nothing was timed


def test_a_missing_parameter_file_is_named(check):
    out = run_main(check, "--assumed", "--params", "notebooks/params/gpu.yml")
    assert out.returncode == 2
    assert "--params notebooks/params/gpu.yml: no such file" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow  # it runs a chapter
def test_quick_run_on_the_cpu_runs_every_phase_and_reports_each(check, tmp_path):
    report = tmp_path / "report.json"
    out = _run("--allow-cpu", "--quick", "--report", str(report))
    assert out.returncode == 0, out.stderr
    names = ["checks", "pilot", "timings", "chapters", "host", "estimate"]
    phases = json.loads(report.read_text())["phases"]
    assert [p["phase"] for p in phases] == names
    assert all(p["status"] == "passed" for p in phases), phases
    checks = phases[0]["results"]["checks"]
    assert len(checks) == len(check.device_checks.CHECKS)
    assert all(c["passed"] and c["value"] <= c["bound"] for c in checks)
    for name in names:
        assert f"== phase {name}: passed" in out.stdout
    assert f"{check.QUICK_CHAPTER}         passed" in out.stdout
    timings = phases[2]["results"]
    for key in ("step_s", "bf16_step_s", "floor_s", "eval_s", "save_s", "solve_s"):
        assert timings[key] > 0
    assert phases[1]["results"]["refine_step_s"] > 0
    assert "assumed 40" in phases[1]["results"]["tick_steps"]
    (chapter,) = phases[3]["results"]["chapters"]
    assert chapter["devices"] == ["cpu"]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    chapters = [r.split("|")[1].split()[0] for r in rows[2:-1]]
    assert chapters == sorted(p.stem for p in (ROOT / "notebooks").glob("*.md"))
    assert rows[-1].startswith("| **total** |")
    assert "Traceback" not in out.stderr


def _in_process(check, tmp_path, *args: str) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    status = check.main(
        ["--allow-cpu", "--quick", "--skip-notebooks", "--report", str(report), *args]
    )
    return status, json.loads(report.read_text())


def test_a_planted_wrong_number_fails_the_check_and_names_it(
    check, tmp_path, monkeypatch, capsys
):
    """An invariance broken by one scale: exit 1, the check named, the rest still run."""
    real = check.device_checks.rescale_state

    def broken(state, structure, scales):  # noqa: ANN001
        out = real(state, structure, scales)
        name = next(k for k in out if k.endswith("weight"))
        return {**out, name: out[name] * 1.001}

    monkeypatch.setattr(check.device_checks, "rescale_state", broken)
    status, report = _in_process(check, tmp_path)
    assert status == 1
    assert "check rescaling invariance:" in capsys.readouterr().err
    checks = {c["name"]: c for c in report["phases"][0]["results"]["checks"]}
    assert not checks["rescaling invariance"]["passed"]
    assert (
        checks["permutation invariance"]["passed"] and checks["resumed path"]["passed"]
    )
    assert report["phases"][0]["status"] == "failed"
    assert [p["phase"] for p in report["phases"]][-1] == "estimate"


def test_a_check_that_raises_is_a_failed_check(check, tmp_path, monkeypatch, capsys):
    def crash(device):  # noqa: ANN001
        raise RuntimeError("CUDA error: an illegal memory access")

    crash.__name__ = "diag_g_check"
    checks = list(check.device_checks.CHECKS)
    checks[checks.index(check.device_checks.diag_g_check)] = crash
    monkeypatch.setattr(check.device_checks, "CHECKS", checks)
    status, report = _in_process(check, tmp_path)
    assert status == 1
    assert "check diag g: nan" in capsys.readouterr().err
    failed = [c for c in report["phases"][0]["results"]["checks"] if not c["passed"]]
    assert [c["what"] for c in failed] == [
        "RuntimeError: CUDA error: an illegal memory access"
    ]


def test_a_phase_past_its_budget_stops_and_keeps_what_it_measured(
    check, tmp_path, monkeypatch
):
    """The timings phase hangs after its first timing: it stops at its share of
    the budget, its first number is in the report, and the later phases run."""
    calls = []

    def slow_steps(*args, **kwargs):  # noqa: ANN002, ANN003
        calls.append(1)
        if len(calls) > 1:
            time.sleep(60)
        return 0.01

    monkeypatch.setattr(check.timing, "time_steps", slow_steps)
    start = time.perf_counter()
    status, report = _in_process(check, tmp_path, "--budget", "20")
    assert time.perf_counter() - start < 30
    phases = {p["phase"]: p for p in report["phases"]}
    assert phases["timings"]["status"] == "stopped at its budget"
    assert phases["timings"]["results"] == {"step_s": 0.01}
    assert phases["estimate"]["status"] == "passed"
    assert "bf16_step_s" in phases["estimate"]["results"]["assumed"]
    assert status == 0  # a timing stopped is reported, not a failure


def test_phases_share_the_time_left(check):
    names = list(check.SHARES)
    limits = {}
    left = 300.0
    for name in names:
        limits[name] = check.phase_limit(name, left, names)
        left -= limits[name]  # each phase uses its whole limit
    assert sum(limits.values()) == pytest.approx(300.0)
    assert limits["chapters"] == max(limits.values())
    assert check.phase_limit("estimate", 10.0, names) == 10.0  # the last takes the rest


def test_chapter_7_counts_every_run(est):
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
    items = gpu_work.chapter_work()["07_pathcond_mlp"]
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


def test_each_item_has_its_profiles_precision(tmp_path, est):
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
    items = gpu_work.chapter_work(path)["03_llpf_m2m"]
    for w in items:
        if w.kind in ("train", "ticks"):
            expected = "resnet" if w.kind == "train" else "mlp"
            assert w.bf16 == (w.model["name"].startswith(expected)), w
    assert {w.bf16 for w in items if w.kind == "ticks"} == {True, False}


def test_stacked_runs_share_their_steps(est):
    rates = est.ASSUMED
    model = mlp([500], in_shape=[3, 32, 32], n_classes=10)
    one = gpu_work.Work("train", model, 100, 128)
    many = gpu_work.Work("train", model, 100, 128, runs=8)
    assert est.seconds([one], rates) == pytest.approx(100 * rates.floor_s)
    assert est.seconds([many], rates) == est.seconds([one], rates)  # the floor
    big = gpu_work.Work("train", est.RESNET, 100, rates.batch, runs=3)
    assert est.seconds([big], rates) == pytest.approx(3 * 100 * rates.step_s)


def test_a_model_in_the_zoo_is_trained_once(tmp_path, est):
    params = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())
    work = gpu_work.chapter_work()
    assert not [w for w in work["02_layerwise"] if w.kind == "train"]  # = chapter 1's
    resnet = params["11_fusion_beyond"]["architectures"]["resnet18"]
    counted = {}
    for width in (None, 1.0):
        model = {k: v for k, v in resnet["model"].items() if k != "width"}
        resnet["model"] = model if width is None else {**model, "width": width}
        path = tmp_path / "gpu.yaml"
        path.write_text(yaml.safe_dump(params))
        items = gpu_work.chapter_work(path)["11_fusion_beyond"]
        model = complete_model_configs(resnet["model"], {"name": "cifar10"})
        counted[width] = [
            w
            for w in items
            if w.kind == "train" and w.model == model and w.batch == 256
        ]
    epochs = resnet["recipe"]["epochs"]
    assert [w.amount for w in counted[None]] == [epochs * math.ceil(50_000 / 256)] * 2
    assert counted[1.0] == []  # the same config as chapter 1: loaded from the zoo


def test_seconds_scale_by_flops_with_a_floor(est, timing):
    rates = est.ASSUMED
    resnet = gpu_work.Work("train", est.RESNET, 10, rates.batch)
    assert est.seconds([resnet], rates) == pytest.approx(10 * rates.step_s)
    assert est.seconds([resnet], rates, "bf16") == pytest.approx(10 * rates.bf16_step_s)
    # an item the profile writes in bf16 counts at bf16 rates unless fp32 is forced
    written = gpu_work.Work("train", est.RESNET, 10, rates.batch, bf16=True)
    assert est.seconds([written], rates) == pytest.approx(10 * rates.bf16_step_s)
    assert est.seconds([written], rates, "fp32") == pytest.approx(10 * rates.step_s)
    half = gpu_work.Work("train", est.RESNET, 10, rates.batch // 2)
    assert est.seconds([half], rates) == pytest.approx(5 * rates.step_s)
    tiny = gpu_work.Work("train", timing.QUICK_MLP, 10, 16)
    assert est.seconds([tiny], rates) == pytest.approx(10 * rates.floor_s)
    solves = gpu_work.Work("solve", None, 4)
    assert est.seconds([solves], rates) == pytest.approx(4 * rates.solve_s)


def test_chapter_12_counts_its_paths_and_only_new_models(est):
    p = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())["12_synthesis"]
    pairs = p["n_modes"] * (p["n_modes"] - 1) // 2
    items = gpu_work.chapter_work()["12_synthesis"]
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
        checkout, ["02_layerwise", "06_pathlifting"], torch.device("cpu"), 300
    )
    failed, passed = statuses
    assert not failed.passed and "RuntimeError: planted" in failed.error
    assert failed.error.startswith("cell In [")
    assert passed.passed and passed.devices == ("cpu",)


def test_a_chapter_whose_work_ran_elsewhere_fails(check, tmp_path):
    """The results' ``devices_used``, not the machine's devices, decide."""
    results = tmp_path / "02_layerwise.json"
    results.write_text(json.dumps({"env": {"device": "cuda", "devices_used": ["cpu"]}}))
    status = check.chapter_status("02_layerwise", results, torch.device("cuda"), "")
    assert not status.passed and "ran on ['cpu'], not ['cuda']" in status.error
    results.write_text(json.dumps({"env": {"device": "cuda", "devices_used": []}}))
    assert not check.chapter_status("x", results, torch.device("cuda"), "").passed
    results.write_text(json.dumps({"env": {"devices_used": ["cuda"]}}))
    assert check.chapter_status("x", results, torch.device("cuda"), "").passed


def test_a_fresh_checkout_holds_no_cache_and_synthetic_data(check, tmp_path):
    checkout = check.make_checkout(tmp_path)
    assert not (checkout / "results").exists() and not (checkout / "build").exists()
    assert sorted(p.name for p in (checkout / "data").iterdir()) == sorted(
        ["cifar10", "cifar100", "mnist", "fashion_mnist"]
    )


def test_chapter_10_counts_its_cpu_side_grouping_and_matching(est):
    p = yaml.safe_load((ROOT / "notebooks/params/gpu.yaml").read_text())[
        "10_fusion_regimes"
    ]
    defaults = gpu_work.profiles.default_parameters("10_fusion_regimes")
    methods, k = defaults["methods"], len(defaults["importances"])
    per = gpu_work.CPU_SECONDS
    expected = 0.0
    for n in p["n_models"]:
        runs = len(p["regimes"]) * p["n_seeds"]
        for kind in ("hf", "kf"):
            fusions = k * sum(m.startswith(kind + "_") for m in methods)
            # k-means on (models x width)^2 coordinates; a matching per extra model
            scale = (n / 6) ** 2 if kind == "kf" else (n - 1) / 5
            expected += runs * fusions * scale * per[f"{kind} grouping, 6 models"]
        expected += runs * (n - 1) * per["weight matching"]  # once per pair
    items = gpu_work.chapter_work()["10_fusion_regimes"]
    assert sum(w.amount for w in items if w.kind == "cpu") == pytest.approx(expected)


def test_llpf_ticks_are_counted_by_the_pilot_rates(est):
    rates = est.ASSUMED
    tick = gpu_work.Work("ticks", est.RESNET, 10, rates.batch, record_every=0)
    # each tick a record (record_every 0 counts as 1), so a save each
    expected = 10 * rates.tick_steps * rates.refine_step_s + 10 * rates.save_s
    assert est.seconds([tick], rates) == pytest.approx(expected)
    bf16 = expected - 10 * rates.tick_steps * rates.refine_step_s * (
        1 - rates.bf16_step_s / rates.step_s
    )
    assert est.seconds([tick], rates, "bf16") == pytest.approx(bf16)
    written = gpu_work.Work(
        "ticks", est.RESNET, 10, rates.batch, record_every=0, bf16=True
    )
    assert est.seconds([written], rates) == pytest.approx(bf16)


def test_the_gpu_page_table_is_the_estimate(est):
    """The hours of the book's gpu page (``book/running/gpu.md``) are what
    ``gpu_check.py --assumed`` prints today."""
    printed = {}
    for line in est.estimate_table(est.ASSUMED).splitlines()[2:]:
        if not line.startswith("| "):
            continue
        name, *hours = (c.strip(" *") for c in line.strip("|").split("|"))
        printed[name[:2].lstrip("0") if name[0].isdigit() else name] = hours
    page = {}
    for line in (ROOT / "book" / "running" / "gpu.md").read_text().splitlines():
        cells = [c.strip(" *") for c in line.strip("|").split("|")]
        if len(cells) == 7 and (
            cells[0].split(" ")[0].isdigit() or cells[0] == "total"
        ):
            page[cells[0].split(" ")[0]] = cells[3:]
    assert page == printed


def test_the_estimate_has_a_range_from_the_steps_per_tick(est):
    low, central, high = est.TICK_STEPS
    assert low < central == est.ASSUMED.tick_steps < high
    table = est.estimate_table(est.ASSUMED)
    total = next(line for line in table.splitlines() if "**total**" in line)
    h32, h_low, h_central, h_high = (
        float(c.strip(" *")) for c in total.strip("|").split("|")[1:]
    )
    assert h_low < h_central < h_high
    ticks = [
        w
        for items in gpu_work.chapter_work().values()
        for w in items
        if w.kind == "ticks"
    ]
    assert ticks  # the range comes from the LLPF chapters' ticks
    measured = est.estimate_table(
        est.ASSUMED.__class__(**{**est.ASSUMED.__dict__, "tick_steps": 500}),
        measured=True,
    )
    assert "high 500" in measured and "central 500 (measured)" in measured


def test_pathcond_on_conv_nets_counts_at_the_device_rate(est):
    items = gpu_work.chapter_work()["08_pathcond_conv"]
    solves = [w for w in items if w.kind == "pathcond"]
    assert solves and not [w for w in items if w.kind == "cpu"]
    rates = est.ASSUMED
    one = gpu_work.Work("pathcond", None, 1)
    assert est.seconds([one], rates) == pytest.approx(
        rates.pathcond_s * est.PATHCOND_SWEEPS / 100
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "03_llpf_m2m:\n  tickz: 5\n",
            "sets tickz for 03_llpf_m2m, which has no such parameter",
        ),
        ("03_llpf_mm: {}\n", "has a section for 03_llpf_mm, which is no notebook"),
        ("03_llpf_m2m:\n  r_min: fast\n", "sets r_min of 03_llpf_m2m to 'fast'"),
    ],
)
def test_a_parameter_file_is_checked_as_run_py_checks_a_profile(
    check, tmp_path, text, message
):
    """The same words as run.py, not an estimate of 0.0 h for a misspelt section."""
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    out = run_main(check, "--assumed", "--params", str(path))
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
