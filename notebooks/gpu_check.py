"""Check a CUDA machine for the gpu profile and estimate the gpu book's time.

    python notebooks/gpu_check.py [--allow-cpu] [--quick] [--skip-notebooks]
    python notebooks/gpu_check.py --assumed        # the estimate from stated rates only

In about five minutes on one GPU it

1. refuses to start without a usable CUDA device (the message names the torch
   build and the CUDA version it needs; ``--allow-cpu`` forces a CPU run);
2. runs every notebook in the smoke profile through ``notebooks/run.py`` (the
   smoke profile picks its device with :func:`wslib.core.train.pick_device`,
   so on a CUDA machine it runs on CUDA) and checks that each results file
   records a CUDA device;
3. times, on the device: 50 ResNet-18 training steps on CIFAR-size input at
   the gpu profile's batch size in fp32 and in bf16 (``Recipe.precision``),
   50 steps of a small MLP (the per-step overhead floor), one LLPF refinement
   tick of ResNet-18 (:func:`wslib.llpf.m2m`), one ``torch.save`` of a
   ResNet-18 state and one fusion ridge least-squares solve
   (:func:`wslib.fusion.levels.ridge_solve`) at the size of chapter 10's gpu
   profile;
4. prints the estimated time of each chapter of the gpu profile from those
   timings (see :func:`chapter_work` for what is counted).

``--quick`` shrinks every timed model and matrix and skips the notebooks (for
tests on a CPU); ``--assumed`` skips the device and prints the estimate from
:data:`ASSUMED` (the rates the README's table uses). Exit status: 0 when
every check passed, 2 without CUDA (unless forced), 1 when a notebook did not
run on CUDA.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import run as runner
import synthetic_data
import torch
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from wslib.core.configs import complete_model_configs
from wslib.core.models import build_model
from wslib.core.train import (
    PrecisionName,
    Recipe,
    fit,
    model_device,
    pick_device,
    seed_everything,
)
from wslib.synthesis.alignment import STEPS as ALIGNMENT_STEPS

ROOT = Path(__file__).resolve().parent.parent
RESNET = {"name": "resnet18", "in_shape": [3, 32, 32], "n_classes": 10, "width": 1.0}
MLP = {"name": "mlp", "in_shape": [3, 32, 32], "n_classes": 10, "widths": [500] * 3}
QUICK_RESNET = {**RESNET, "in_shape": [3, 16, 16], "width": 0.125}
QUICK_MLP = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10, "widths": [16]}
DATA_SIZES = {  # (training, test) examples
    "cifar10": (50_000, 10_000),
    "cifar100": (50_000, 10_000),
    "mnist": (60_000, 10_000),
    "fashion_mnist": (60_000, 10_000),
    "mnist1d": (4_000, 1_000),
}
EVAL_BATCH = 1024  # evaluation batch (forward only, a third of a training step)
ENORM_COST = 1.0  # an ENorm cycle, in small-model steps (assumed)
LBFGS_EVALS = (
    1.25  # evaluations per L-BFGS iteration (one step of max_epochs iterations)
)


# CPU-side work at the gpu profile, seconds on one CPU thread (measured at
# reduced scale and scaled; the GPU does not change them). Chapter 10's HF/KF
# grouping: its distances, centroids and costs run on the device (a Gram
# matrix of the neurons, seconds at most); the host runs scikit-learn's Lloyd
# iterations on n x n coordinates (n = models x width) and SciPy's Hungarian
# solver. Per fusion of 6 VGG-11s, summed over the levels: 0.70 s per Lloyd
# iteration and 0.19 s of Hungarian matching (measured here by
# print_hot_spots; GROWTH scales them to n models); KF_ITERATIONS Lloyd
# iterations per level is an assumption (the cap is 300; chapter 10's KF
# fusions of the cpu profile's trained models, started at model 0's neurons,
# took a median of 4 and at most 10, 7 and 10 with 6 models). Also a Git Re-Basin
# weight matching of two VGG-11s, and PathCond's solver on one conv net
# (CIFAR-NV or ResNet-18, stopped at 1000 sweeps).
KF_ITERATIONS = 30
CPU_SECONDS = {
    "kf grouping, 6 models": KF_ITERATIONS * 0.70,
    "hf grouping, 6 models": 0.19,
    "weight matching": 10.0,
    "pathcond solver, conv net": 210.0,
}
GROWTH = {  # the grouping of n models against that of 6
    "kf": lambda n: (n / 6) ** 2,  # Lloyd iterations on n x n coordinates
    "hf": lambda n: (n - 1) / 5,  # one Hungarian matching per model after the first
}


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work on the device (measured or assumed).

    ``step_s``: one ResNet-18 training step at ``batch`` with augmentation
    (fp32; ``bf16_step_s`` in bf16); ``floor_s``: one training step of a small
    MLP, the floor every step pays (launches, host syncs); ``refine_step_s``:
    one LLPF refinement step of ResNet-18 at ``batch``, the tick's own work
    (moves, the stop rule) included, and ``tick_steps`` refinement steps per
    tick, both from a pilot path at the gpu settings; ``eval_s``: one
    ResNet-18 example through the forward pass, data resident on the device;
    ``save_s``: one ``torch.save`` of a ResNet-18 state; ``solve_s``: one
    fusion least-squares solve of chapter 10's size.
    """

    step_s: float
    bf16_step_s: float
    floor_s: float
    refine_step_s: float
    tick_steps: float
    eval_s: float
    save_s: float
    solve_s: float
    batch: int = 256


ASSUMED = Rates(
    step_s=0.015,
    bf16_step_s=0.009,
    floor_s=0.0012,
    refine_step_s=0.016,
    tick_steps=40,
    eval_s=0.015 / 256 / 3,
    save_s=0.15,
    solve_s=0.05,
)


# --- the check -----------------------------------------------------------------------


def require_cuda(allow_cpu: bool) -> torch.device:
    """The CUDA device, or exit with status 2 naming why there is none."""
    problem = runner.missing_cuda("gpu", allow_cpu)
    if problem is not None:
        print(f"gpu check: {problem}", file=sys.stderr)
        print(
            "gpu check: --allow-cpu runs the check on the CPU (its timings then say "
            "nothing about a GPU)",
            file=sys.stderr,
        )
        sys.exit(2)
    return pick_device()


SMOKE = "gpu-smoke"  # the gpu profile's shape at smoke size
QUICK_CHAPTER = "02_layerwise"  # the one chapter of --quick
CHAPTER_JOBS = 4  # chapters side by side on the GPU


def make_checkout(root: Path) -> Path:
    """A fresh checkout under ``root``: the library, the notebooks, synthetic data, no cache.

    No model, run or path of an earlier run can stand in for a computation,
    and the data sets are :mod:`synthetic_data`'s small files in the real
    formats (a GPU machine may have no network).
    """
    skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for folder in ("wslib", "notebooks"):
        shutil.copytree(ROOT / folder, root / folder, ignore=skip)
    synthetic_data.write_all(root / "data")
    return root


@dataclass(frozen=True)
class ChapterStatus:
    """How one chapter of the gpu-smoke profile ended: ``error`` is empty when it passed."""

    notebook: str
    error: str = ""
    device: str | None = None

    @property
    def passed(self) -> bool:
        return not self.error


def _failures(log: str) -> dict[str, str]:
    """``{notebook: "cell In [N]: Error: message"}`` from run.py's output."""
    found = re.finditer(
        r"error: notebook (\S+) failed in cell (In \[\d+\])\n\s+(.+)", log
    )
    return {m[1]: f"cell {m[2]}: {m[3].strip()}" for m in found}


def run_chapters(
    checkout: Path, notebooks: list[str], jobs: int, device: torch.device
) -> list[ChapterStatus]:
    """Run ``notebooks`` in the gpu-smoke profile in ``checkout``; the status of each.

    A chapter passed when it ran to its end and its results file records
    ``device``. A failure never stops the others.
    """
    done = subprocess.run(
        [sys.executable, "notebooks/run.py", "--profile", SMOKE, "--jobs", str(jobs)]
        + notebooks,
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=False,
    )
    failures = _failures(done.stdout + done.stderr)
    statuses = []
    for nb in notebooks:
        path = checkout / "results" / SMOKE / f"{nb}.json"
        if nb in failures or not path.is_file():
            statuses.append(ChapterStatus(nb, failures.get(nb, "no results file")))
            continue
        ran_on = json.loads(path.read_text()).get("env", {}).get("device")
        wrong = "" if ran_on == device.type else f"ran on {ran_on}, not {device.type}"
        statuses.append(ChapterStatus(nb, wrong, ran_on))
    return statuses


def print_chapters(statuses: list[ChapterStatus]) -> None:
    """One line per chapter: passed, or failed with its cell and error."""
    for st in statuses:
        print(f"  {st.notebook:<20} {'passed' if st.passed else 'FAILED: ' + st.error}")
    print(f"chapters: {sum(st.passed for st in statuses)} of {len(statuses)} passed")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds ``fn()`` takes on ``device`` (synchronised before and after)."""
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


def time_steps(
    config: dict[str, Any],
    batch: int,
    steps: int,
    device: torch.device,
    precision: PrecisionName,
) -> float:
    """Seconds per training step of ``config`` (``fit``, after a warm-up epoch of 5 steps).

    Image inputs are augmented (flips and crops), as the gpu profile's recipes do.
    """
    torch.manual_seed(0)
    model = build_model(config)
    x = torch.randn(batch * steps, *config["in_shape"])
    y = torch.randint(0, config["n_classes"], (batch * steps,))
    images = len(config["in_shape"]) == 3
    recipe = Recipe(
        epochs=1, batch_size=batch, lr=0.01, precision=precision, augment=images
    )
    fit(
        model,
        x[: 5 * batch],
        y[: 5 * batch],
        recipe,
        seed=0,
        device=device,
        progress=False,
    )
    seconds = timed(
        lambda: fit(model, x, y, recipe, seed=0, device=device, progress=False), device
    )
    if model_device(model).type != device.type:
        raise RuntimeError(f"the model trained on {model_device(model)}, not {device}")
    return seconds / steps


def llpf_pilot(
    config: dict[str, Any], batch: int, device: torch.device, ticks: int, quick: bool
) -> tuple[float, float]:
    """Seconds per refinement step and refinement steps per tick of a pilot M2M path.

    At the gpu profile's settings (chapter 3: SGD at lr 0.001, ``r_min`` 20, the
    stop threshold 0.005 above the worse endpoint's training loss) between
    two models trained for one epoch on random data, over ``ticks`` ticks.
    A pilot of few ticks takes larger moves than the gpu profile's 2000-4000,
    so its steps per tick are an upper bound.
    """
    from wslib.core.train import evaluate
    from wslib.llpf import Refine, m2m
    from wslib.runs.resumable import Persist

    n = batch * (2 if quick else 8)
    x = torch.randn(n, *config["in_shape"])
    y = torch.randint(0, config["n_classes"], (n,))
    recipe = Recipe(epochs=1, batch_size=batch, lr=0.01)
    modes = []
    for s in (0, 1):
        torch.manual_seed(s)
        model = build_model(config)
        fit(model, x, y, recipe, seed=s, device=device, progress=False)
        modes.append(model)
    threshold = max(evaluate(m, x, y)[0] for m in modes) + 0.005
    r_min, r_max = (2, 10) if quick else (20, 2000)
    refine = Refine(1e-3, batch, r_min, r_max, threshold)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        path = m2m(
            modes[0],
            modes[0].state_dict(),
            modes[1].state_dict(),
            x,
            y,
            ticks=ticks,
            refine=refine,
            persist=Persist(progress=False),
        )
        _synchronize(device)
        seconds = time.perf_counter() - start
    steps = max(path.grad_steps[-1], 1)
    return seconds / steps, steps / ticks


def time_eval(config: dict[str, Any], n: int, device: torch.device) -> float:
    """Seconds per example of evaluating ``config`` on ``n`` examples resident on the device."""
    from wslib.core.train import evaluate

    model = build_model(config).to(device)
    x = torch.randn(n, *config["in_shape"], device=device)
    y = torch.randint(0, config["n_classes"], (n,), device=device)
    evaluate(model, x[:EVAL_BATCH], y[:EVAL_BATCH])  # warm-up
    return timed(lambda: evaluate(model, x, y), device) / n


def tf32_difference(
    config: dict[str, Any], device: torch.device
) -> tuple[float, float]:
    """Largest output change of a rescaled copy of ``config``: TF32 on, then off.

    The rescaling is a symmetry (same function), so the difference is rounding
    alone: TF32's on a GPU (cuDNN's default), float32's without it.
    """
    from wslib.core.connectivity import max_output_diff
    from wslib.core.neurons import neuron_structure, random_scales, rescale_state

    torch.manual_seed(0)
    model = build_model(config).to(device).eval()
    structure = neuron_structure(model)
    scales = random_scales(
        structure, spread=1.0, generator=torch.Generator().manual_seed(0)
    )
    state = rescale_state(model.state_dict(), structure, scales)
    x = torch.randn(64, *config["in_shape"])
    other = copy.deepcopy(model)
    other.load_state_dict(state)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        with torch.no_grad():
            xd = x.to(device)
            on = float((model(xd) - other(xd)).abs().max())
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    return on, max_output_diff(model, state, x, False)


def print_hot_spots(quick: bool) -> None:
    """Time the CPU-side hot spots on one thread at reduced scale (they stay on the CPU)."""
    from wslib.core.matching import weight_matching
    from wslib.core.neurons import neuron_structure
    from wslib.fusion.levels import level_widths
    from wslib.pathcond.rescaling import pathcond_rescale

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vgg = {
            "name": "vgg11",
            "in_shape": [3, 32, 32],
            "n_classes": 10,
            "width": 0.125 if quick else 1.0,
        }
        a, b = build_model(vgg), build_model(vgg)
        widths = level_widths(a)
        lloyd, hungarian = (sum(t) for t in zip(*map(grouping_host_seconds, widths)))
        start = time.perf_counter()
        weight_matching(a.state_dict(), b.state_dict(), neuron_structure(a))
        matching = time.perf_counter() - start
        net = build_model(
            {
                "name": "cifar_nv",
                "in_shape": [3, 32, 32],
                "n_classes": 10,
                "width": 0.125 if quick else 1.0,
            }
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            pathcond_rescale(net.double(), [3, 32, 32], max_sweeps=20 if quick else 100)
            solver = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    print("CPU hot spots, one thread:")
    print(
        f"  grouping of 6 VGG-11s (widths {widths}), summed over the levels: "
        f"a Lloyd iteration {lloyd:6.3f} s, Hungarian matching {hungarian:6.3f} s"
    )
    print(f"  weight matching of two VGG-11 (width {vgg['width']})  {matching:8.2f} s")
    sweeps = 20 if quick else 100
    print(f"  PathCond solver, CIFAR-NV, {sweeps} sweeps        {solver:8.2f} s")
    print(f"  counted in the estimate (s, at the gpu profile's size): {CPU_SECONDS}")


def grouping_host_seconds(width: int, n_models: int = 6) -> tuple[float, float]:
    """Seconds of the grouping's host side for ``n_models`` levels of ``width`` neurons.

    One Lloyd iteration of scikit-learn's k-means on the ``n x n``
    coordinates the device hands over (``n = n_models * width``), and the
    Hungarian matchings of every model to model 0.
    """
    from scipy.optimize import linear_sum_assignment
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    n = n_models * width
    rows = rng.standard_normal((n, n))
    with threadpool_limits(1):
        start = time.perf_counter()
        km = KMeans(width, init=rows[:width], n_init=1, tol=0.0, max_iter=20)
        km.fit(rows, sample_weight=np.ones(n))
        lloyd = (time.perf_counter() - start) / (km.n_iter_ + 1)  # + the last labels
        start = time.perf_counter()
        for _ in range(n_models - 1):
            linear_sum_assignment(rng.random((width, width)))
    return lloyd, time.perf_counter() - start


def time_grouping(device: torch.device, quick: bool) -> tuple[str, float]:
    """Seconds of a whole KF grouping of chapter 10's first level on ``device``.

    Six VGG-11s at the gpu profile: 6 x 64 neurons, 1000 fusion examples x
    32 x 32 positions (float64, about 3 GiB); the device side (Gram matrix,
    centroids, costs) and the host side (k-means) together. Returns its
    description and the seconds.
    """
    from wslib.fusion.levels import cost_decomposition, group_labels, weighted_centroids

    width, columns = (8, 2_000) if quick else (64, 1000 * 32 * 32)
    gen = torch.Generator(device=device).manual_seed(0)

    def noise() -> torch.Tensor:
        shape, kind = (width, columns), torch.float64
        return torch.randn(shape, generator=gen, device=device, dtype=kind)

    base = noise()
    points = torch.cat([base + noise() for _ in range(6)])
    weights = np.ones(6 * width)
    _synchronize(device)
    start = time.perf_counter()
    labels = group_labels(points, [width] * 6, weights, width, "kf")
    targets = weighted_centroids(points, weights, labels, width)
    cost_decomposition(points, weights, labels, targets)
    _synchronize(device)
    return f"KF grouping, 6 x {width} neurons x {columns} columns", (
        time.perf_counter() - start
    )


def memory_peaks(device: torch.device) -> tuple[float | None, float]:
    """Peak GPU memory allocated (GiB; None on a CPU) and this process's peak RSS (GiB)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    if device.type != "cuda":
        return None, rss
    return torch.cuda.max_memory_allocated(device) / 2**30, rss


def time_save(config: dict[str, Any]) -> float:
    """Seconds of one ``torch.save`` of ``config``'s state to a local file."""
    state = build_model(config).state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        torch.save(state, Path(tmp) / "state.pt")
        return time.perf_counter() - start


def time_solve(
    n: int, rows: int, cols: int, targets: int, device: torch.device
) -> float:
    """Seconds of one ridge solve of an ``(n * rows, cols)`` design (float64) on ``device``."""
    from wslib.fusion.levels import ridge_solve

    gen = torch.Generator(device=device).manual_seed(0)
    design = torch.randn(
        n * rows, cols, generator=gen, device=device, dtype=torch.float64
    )
    goal = torch.randn(targets, n * rows, generator=gen, device=device)

    def block(sl: slice) -> torch.Tensor:
        return design[sl.start * rows : min(sl.stop, n) * rows]

    return timed(lambda: ridge_solve(block, goal, n, 1e-8), device)


def measure(device: torch.device, quick: bool, batch: int) -> Rates:
    """Time the steps, the LLPF pilot, the evaluation, the save and the solve on ``device``."""
    seed_everything(0)  # cudnn.benchmark on, as the book sets it
    resnet, mlp = (QUICK_RESNET, QUICK_MLP) if quick else (RESNET, MLP)
    steps, b = (5, 16) if quick else (50, batch)
    # chapter 10's widest design: 1000 fusion examples x 16 positions, 512 x 3 x 3 + 1
    size = (20, 4, 65, 8) if quick else (1000, 16, 4609, 512)
    refine_step_s, tick_steps = llpf_pilot(resnet, b, device, 3 if quick else 6, quick)
    return Rates(
        step_s=time_steps(resnet, b, steps, device, "fp32"),
        bf16_step_s=time_steps(resnet, b, steps, device, "bf16"),
        floor_s=time_steps(mlp, 128 if not quick else 16, steps, device, "fp32"),
        refine_step_s=refine_step_s,
        tick_steps=tick_steps,
        eval_s=time_eval(resnet, 256 if quick else 10_000, device),
        save_s=time_save(resnet),
        solve_s=time_solve(*size, device),
        batch=b,
    )


# --- the estimate ----------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """One item of a chapter's work: ``kind`` and ``amount`` of it for ``model``.

    ``train``: optimizer steps at ``batch``; ``eval``: examples through the
    forward pass; ``ticks``: LLPF ticks (refinement at ``batch``, a record
    every ``record_every`` ticks, each record written once to the checkpoint);
    ``solve``: fusion least-squares solves; ``cpu``: seconds of CPU-side work
    on one thread (:data:`CPU_SECONDS`), the same on any device. ``bf16``:
    the profile trains or refines this item under bfloat16 autocast (its
    recipe's or path settings' ``precision``).
    """

    kind: Literal["train", "eval", "ticks", "floor", "solve", "cpu"]
    model: dict[str, Any] | None  # None for floor, solve and cpu
    amount: float
    batch: int = 256
    record_every: int = 0
    eval_examples: int = 0
    runs: int = 1  # ``train``: runs stacked into one model, every step shared
    bf16: bool = False


def _bf16(settings: dict[str, Any]) -> bool:
    """Whether a recipe or a path's settings ask for bfloat16 autocast."""
    return settings.get("precision", "fp32") == "bf16"


def _steps(n: int, recipe: dict[str, Any]) -> tuple[float, int]:
    r = Recipe(**recipe)
    return r.epochs * math.ceil(n / r.batch_size), r.batch_size


class Counter:
    """Collects a chapter's work; a model the zoo already holds is not trained again."""

    def __init__(self, zoo: set[str]) -> None:
        self.zoo = zoo
        self.items: list[Work] = []

    def train(
        self, data: dict, model: dict, recipe: dict, seed: Any, fraction: float = 1.0
    ) -> None:
        key = json.dumps(
            [data, model, Recipe(**recipe).to_dict(), seed], sort_keys=True
        )
        if key in self.zoo:
            return
        self.zoo.add(key)
        steps, batch = _steps(int(DATA_SIZES[data["name"]][0] * fraction), recipe)
        self.items.append(Work("train", model, steps, batch, bf16=_bf16(recipe)))

    def steps(
        self, model: dict, steps: float, batch: int, recipe: dict | None = None
    ) -> None:
        """``steps`` training steps of ``model`` at ``batch`` (``recipe``: its precision)."""
        self.items.append(Work("train", model, steps, batch, bf16=_bf16(recipe or {})))

    def mlp_runs(self, base: dict, runs: list[tuple], n: int, recipe: dict) -> None:
        """One ``RunGrid.train`` call: ``(shape, count, epochs, method)`` runs on ``n`` examples.

        Runs of one shape and number of epochs stack (one step at the
        ``recipe``'s batch size for all); ENorm's run apart, each step
        followed by an ENorm cycle.
        """
        batch, bf16 = Recipe(**recipe).batch_size, _bf16(recipe)
        batches = math.ceil(n / batch)
        stacks: dict[tuple, int] = {}
        for (widths, bias, act), count, epochs, method in runs:
            model = {**base, "widths": list(widths), "output_bias": bias}
            model["activation"] = act
            steps = epochs * batches
            if method == "enorm":
                self.items.append(Work("train", model, count * steps, batch, bf16=bf16))
                self.items.append(Work("floor", None, ENORM_COST * count * steps))
            else:
                key = (json.dumps(model, sort_keys=True), steps)
                stacks[key] = stacks.get(key, 0) + count
        for (model, steps), count in stacks.items():
            self.items.append(
                Work("train", json.loads(model), steps, batch, runs=count, bf16=bf16)
            )

    def cpu(self, what: str, count: float) -> None:
        """``count`` times the CPU-side work ``what`` (a key of :data:`CPU_SECONDS`)."""
        self.items.append(Work("cpu", None, count * CPU_SECONDS[what]))

    def evaluate(self, model: dict, examples: float) -> None:
        self.items.append(Work("eval", model, examples))

    def path(self, model: dict, settings: dict, batch: int, data: dict) -> None:
        n_train, n_test = DATA_SIZES[data["name"]]
        every = int(settings.get("record_every", 5))
        self.items.append(
            Work(
                "ticks",
                model,
                settings["ticks"],
                batch,
                every,
                n_train + n_test,
                bf16=_bf16(settings),
            )
        )


def _llpf_chapter(p: dict, c: Counter, nb: str) -> None:
    data, batch = p["data"], p["batch_size"]
    if nb == "05_llpf_spheres":
        arch, recipe = p["arch"], p["recipe"]
        c.train(data, arch, recipe, 0)
        c.train(data, p["norm_arch"], p["norm_recipe"], 0)
        c.train(data, arch, {**recipe, "weight_decay": p["wd_source"]}, 0)
        c.train(data, arch, {**recipe, "weight_decay": p["wd_dest"]}, 1)
        for s in (0, 1):
            c.train(data, arch, p["sharp_recipe"], s)
        for model in (arch, arch, p["norm_arch"], p["norm_arch"]):  # M2O on and off
            c.path(model, p["m2o_settings"], batch, data)
        c.path(arch, {**p["m2m_settings"], **p["hybrid_m2o"]}, batch, data)
        c.path(arch, p["m2m_settings"], batch, data)  # hybrid's M2M part
        c.path(arch, p["m2m_settings"], batch, data)  # sharp minima
        return
    for name, model in p["models"].items():
        for s in (0, 1):
            c.train(data, model, p["recipes"][name], s)
        if nb == "03_llpf_m2m":
            fdf = 1 + (p["path_seeds"] - 1) * (name in p["seed_archs"])
            paths = fdf * (1 + (name in p["ablation_archs"]))  # all at once: same seeds
            paths += name == next(iter(p["models"]))  # the peak anatomy run
        else:  # 04: every method at LLPF's step budget and precision, each seed and tuning
            n_methods = 1 + len(p["baselines"])
            paths = p["n_seeds"] * n_methods + sum(len(v) for v in p["tuning"].values())
        for _ in range(paths):
            c.path(model, p["llpf"][name], batch, data)


def _connectivity_chapter(p: dict, c: Counter, nb: str) -> None:
    data, (n_train, n_test) = p["data"], DATA_SIZES[p["data"]["name"]]
    for name, model in p["models"].items():
        for s in (0, 1):
            c.train(data, model, p["recipes"][name], s)
        layers = model_info(model)[2]
        lines = 2 if nb == "01_symmetries" else layers + 1  # 02: one line per layer
        c.evaluate(model, lines * p["n_points"] * (n_train + n_test))
    for width in p.get("width_sweep", []):
        model = {**p["models"]["mlp"], "widths": [width, width]}
        for s in (0, 1):
            c.train(data, model, p["width_recipe"], s)
        c.evaluate(model, 2 * p["n_points"] * n_train)


def _pathcond_chapter(p: dict, c: Counter, nb: str) -> None:
    if nb == "06_pathlifting":
        n, _ = DATA_SIZES[p["data"]["name"]]
        steps, batch = _steps(n, p["train_recipe"])
        for _ in ("baseline", "pathcond"):
            c.steps(p["train_model"], steps, batch, p["train_recipe"])
        return
    if nb == "08_pathcond_conv":
        for spec in p["archs"].values():
            n, _ = DATA_SIZES[spec.get("data", p["data"])["name"]]
            steps, batch = _steps(n, spec["recipe"])
            for method in p["methods"]:
                extra = ENORM_COST if method == "enorm" else 0.0
                c.steps(spec["model"], steps * p["n_seeds"], batch, spec["recipe"])
                c.items.append(Work("floor", None, extra * steps * p["n_seeds"]))
        for spec in p["archs"].values():
            if spec["model"]["name"] != "mlp" and "pathcond" in p["methods"]:
                c.cpu("pathcond solver, conv net", p["n_seeds"])
        for model in p["cost_models"].values():
            c.steps(model, math.ceil(n / 128), 128)
            if model["name"] != "mlp":
                c.cpu("pathcond solver, conv net", 1)
        return
    _mlp_chapter(p, c)


def _mlp_chapter(p: dict, c: Counter) -> None:
    """Chapter 7: its four calls of ``RunGrid.train``, each run counted as stacked or not.

    A call's runs of one MLP (widths, output bias, activation) and one number
    of epochs train as one stacked model on a GPU
    (:func:`wslib.pathcond.training.train_runs`); ENorm's runs train apart.
    """
    n, _ = DATA_SIZES[p["data"]["name"]]
    epochs, seeds, long = p["recipe"]["epochs"], p["n_seeds"], p["long_epochs"]
    configs, swept = p["configs"], ("baseline", "pathcond")

    def shape(name: str, widths: list | None = None, act: str = "relu") -> tuple:
        cfg = configs[name]
        bias = cfg.get("output_bias", p["mlp"].get("output_bias", True))
        return (tuple(cfg["widths"] if widths is None else widths), bias, act)

    main = [
        (shape(name), seeds, epochs, method)
        for name, cfg in configs.items()
        for method in cfg["methods"]
    ]
    sizes = p["size_sweep"]
    main += [
        (shape(sizes["config"], w), seeds, epochs, m)
        for w in sizes["widths"]
        for m in swept
    ]
    act = p["activation_config"]
    main += [
        (shape(act, act=a), p["n_activation_seeds"], epochs, m)
        for a in p["activations"]
        for m in swept
    ]
    pairs = [(name, m) for name in p["lr_sweep_configs"] for m in swept]
    rounds = [
        [(shape(name), len(p[rates]), long, m) for name, m in pairs]
        for rates in ("lr_grid", "lr_refine")
    ]
    long_runs = [(shape(name), seeds, long, m) for name, m in pairs]
    for call in (main, *rounds, long_runs):
        c.mlp_runs(p["mlp"], call, n, p["recipe"])


def _fusion_chapter(p: dict, c: Counter, nb: str) -> None:
    data, grad = p["data"], p["gradient"]
    per_class = p["fusion_per_class"]
    if nb == "09_fusion_cost":
        for name, arch in p["archs"].items():
            recipe = p["recipes"][name] if "recipes" in p else p["recipe"]
            for s in range(p["n_models"]):
                c.train(data, arch, recipe, s)
            _fusions(c, arch, per_class, grad, linear=3 * 2, gradient=0)
        return
    if nb == "10_fusion_regimes":
        arch = p["arch"]
        for regime in p["regimes"].values():
            for n in p["n_models"]:
                for s in range(p["n_seeds"]):
                    for i in range(n):
                        frac = 1.0 if regime["kind"] == "full" else 1.0 / n
                        c.train(data, arch, p["recipe"], [regime, n, s, i], frac)
                    linear = sum("_linear" in m for m in p["methods"])
                    gradient = sum("_gradient" in m for m in p["methods"])
                    k = len(p["importances"])
                    _fusions(c, arch, per_class, grad, linear * k, gradient * k)
                    for kind in ("hf", "kf"):
                        fusions = k * sum(
                            m.startswith(kind + "_") for m in p["methods"]
                        )
                        c.cpu(f"{kind} grouping, 6 models", fusions * GROWTH[kind](n))
                    if "rebasin_wm" in p["methods"]:  # once per pair, any importance
                        c.cpu("weight matching", n - 1)
        return
    arch, recipe = p["arch"], p["recipe"]
    for s in (0, 1, 2):
        c.train(data, arch, recipe, s)
    for i, v in enumerate(p["width_variants"]):
        c.train(data, {**arch, **v}, recipe, 200 + i)
    c.train(data, {**arch, **p["wide"]}, recipe, 300)
    c.train(data, {**arch, **p["narrow"]}, recipe, 301)
    for i in range(2):
        c.train(data, arch, recipe, ["shards", i], 0.5)
    for spec in p["architectures"].values():
        for i in range(2):
            c.train(data, spec["model"], spec["recipe"], i)
        _fusions(c, spec["model"], per_class, grad, linear=2, gradient=2)
    c.train(data, p["depth_models"]["deep"], p["depth_recipe"], 400)
    n_train, _ = DATA_SIZES[data["name"]]
    finetune = {**recipe, **p["finetune_recipe"], "epochs": p["finetune_epochs"]}
    for _ in range(4):  # fine-tuned fused models and their baselines
        c.steps(arch, *_steps(n_train, finetune), finetune)
    sizes = len(p["fusion_sizes"]) * (1 + p["augment_copies"])
    _fusions(c, arch, per_class, grad, linear=2 * sizes, gradient=2 * sizes)


def _fusions(
    c: Counter, model: dict, per_class: int, grad: dict, linear: int, gradient: int
) -> None:
    """``linear`` ridge fusions (one solve per layer) and ``gradient`` L-BFGS ones."""
    layers = model_info(model)[2]
    c.items.append(Work("solve", None, (linear + gradient) * layers))
    examples = per_class * model["n_classes"]
    c.steps(model, gradient * grad["max_epochs"] * LBFGS_EVALS, examples)


def _synthesis_chapter(p: dict, c: Counter, nb: str) -> None:
    """Chapter 12: modes, alignment lines, the MLP pairs' fusions and paths, the gauge."""
    del nb
    data, n_train = p["data"], DATA_SIZES[p["data"]["name"]][0]
    n = int(p["n_modes"])
    pairs, line = n * (n - 1) // 2, p["n_points"] * p["eval_train"]
    for name, model in p["models"].items():
        for s in range(n):
            c.train(data, model, p["recipes"][name], s)
        c.evaluate(model, pairs * len(ALIGNMENT_STEPS) * line)  # question 1
        c.cpu("weight matching", pairs * 3)  # plain, and after each gauge
        if model["name"] != "mlp":
            c.cpu("pathcond solver, conv net", n)  # each mode's PathCond gauge
    mlp, recipe, llpf = p["models"]["mlp"], p["recipes"]["mlp"], p["llpf"]
    per_class, grad = p["fusion_per_class"], p["gradient"]
    finetune = {**recipe, **p["finetune"]}
    points = llpf["ticks"] // llpf["record_every"] + 1 + 2 * p["n_points"]
    for _ in range(pairs):  # questions 2 and 3: per pair of MLP modes
        _fusions(c, mlp, per_class, grad, linear=1, gradient=1)  # KF linear, gradient
        c.steps(mlp, *_steps(n_train, finetune), finetune)
        c.steps(mlp, *_steps(n_train, finetune), finetune)
        for _ in range(6):  # fused to each parent (2 variants), parents (2 ways)
            c.evaluate(mlp, line)
            c.items.append(
                Work(
                    "ticks",
                    mlp,
                    llpf["ticks"],
                    p["llpf_batch"],
                    llpf["record_every"],
                    p["eval_train"] + p["eval_test"],
                )
            )
        c.steps(mlp, p["bezier"]["steps"], 128)
        c.evaluate(mlp, points * p["eval_train"])  # conditioning along three paths
    for k in range(p["n_shard_seeds"]):  # question 4
        for i in range(2):
            c.train(data, mlp, recipe, ["shards", k, i], 0.5)
    groups = pairs + p["n_shard_seeds"]
    for method in p["fusion_methods"]:
        gradient = int("_gradient" in method)
        _fusions(c, mlp, per_class, grad, 2 * groups, 2 * groups * gradient)


CHAPTERS: dict[str, Callable[[dict, Counter, str], None]] = {
    "01_symmetries": _connectivity_chapter,
    "02_layerwise": _connectivity_chapter,
    "03_llpf_m2m": _llpf_chapter,
    "04_llpf_baselines": _llpf_chapter,
    "05_llpf_spheres": _llpf_chapter,
    "06_pathlifting": _pathcond_chapter,
    "07_pathcond_mlp": _pathcond_chapter,
    "08_pathcond_conv": _pathcond_chapter,
    "09_fusion_cost": _fusion_chapter,
    "10_fusion_regimes": _fusion_chapter,
    "11_fusion_beyond": _fusion_chapter,
    "12_synthesis": _synthesis_chapter,
}


def chapter_work(params_file: str | Path | None = None) -> dict[str, list[Work]]:
    """What each chapter computes, counted from its parameters.

    The parameters are the notebook's defaults overridden by ``params_file``
    (default: ``notebooks/params/gpu.yaml``). Counted, chapter by chapter in book
    order: every base model trained (epochs x batches of the training set, or
    of its share for the fusion chapters' split data; a model with the same
    data, config, recipe and seed as one an earlier chapter trained is loaded
    from the zoo, not counted again); every other training run (the PathCond
    chapters' runs, each method and seed apart, the learning-rate sweeps and
    long runs, fine-tuning); evaluations (forward passes over training and
    test sets along lines and paths); LLPF paths as ticks (each with
    ``Rates.tick_steps`` refinement steps, a record every ``record_every``
    ticks, each written once to the checkpoint; chapter 4's baselines
    and tuning runs get LLPF's step budget, as the chapter gives them); fusion
    solves (one per layer of each ridge fusion) and L-BFGS retrofits
    (``max_epochs`` full-batch iterations on the fusion set, :data:`LBFGS_EVALS`
    evaluations each, line search included). Not counted: data loading, figures, small CPU-side
    work (chapter 6's tiny lifts, solver timings), the ENorm cycles beyond
    :data:`ENORM_COST` steps each.
    """
    path = Path(params_file or runner.PARAMS / "gpu.yaml")
    params = yaml.safe_load(path.read_text()) or {}
    zoo: set[str] = set()
    work = {}
    for nb in runner.available_notebooks():
        if nb not in CHAPTERS:
            raise KeyError(
                f"notebook {nb} has no work counter; add one to CHAPTERS in "
                "notebooks/gpu_check.py"
            )
        count = CHAPTERS[nb]
        defaults = runner.default_parameters(nb)
        section = complete_model_configs(params.get(nb) or {}, defaults.get("data"))
        p = {**defaults, **section}
        counter = Counter(zoo)
        count(p, counter, nb)
        work[nb] = counter.items
    return work


_INFO: dict[str, tuple[float, int, int]] = {}


def model_info(config: dict[str, Any]) -> tuple[float, int, int]:
    """Forward FLOPs of one example, parameters and weight layers of ``config`` (cached).

    FLOPs are counted on the CPU (``FlopCounterMode``, matrix products and
    convolutions); weight layers are the Linear and Conv modules.
    """
    key = json.dumps(config, sort_keys=True)
    if key not in _INFO:
        model = build_model(config).eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(torch.zeros(1, *config["in_shape"]))
        layers = sum(
            isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)) for m in model.modules()
        )
        params = sum(p.numel() for p in model.parameters())
        _INFO[key] = (float(counter.get_total_flops()), params, layers)
    return _INFO[key]


def flops(config: dict[str, Any]) -> float:
    """Forward FLOPs of one example of ``config``."""
    return model_info(config)[0]


def seconds(
    items: list[Work], rates: Rates, precision: PrecisionName | None = None
) -> float:
    """Estimated seconds of ``items`` at ``rates``.

    Each item trains or refines in its own precision (``Work.bf16``, the
    profile as written), or all in ``precision`` when it is given. A training
    step of model ``m`` at batch ``b`` takes the ResNet-18 step time of its
    precision scaled by FLOPs (``flops(m) * b / (flops(ResNet-18) *
    rates.batch)``) but never less than the small-model floor; an evaluated
    example takes ``rates.eval_s`` scaled by FLOPs (floored per batch of
    :data:`EVAL_BATCH`); a tick takes ``rates.tick_steps`` refinement steps,
    each ``rates.refine_step_s`` scaled like a training step (in bf16 also by
    the bf16/fp32 ratio of training steps: LLPF's refinement, Bezier and
    AutoNEB take a ``precision``); saves scale with the number of parameters.
    """
    ref_flops = flops(RESNET)
    ref = ref_flops * rates.batch
    ref_params = model_info(RESNET)[1]
    speedup = rates.bf16_step_s / rates.step_s

    def in_bf16(w: Work) -> bool:
        return w.bf16 if precision is None else precision == "bf16"

    def step(model: dict, batch: int, per: float, runs: int = 1) -> float:
        return max(rates.floor_s, runs * per * flops(model) * batch / ref)

    def evaluation(model: dict, examples: float) -> float:
        per_batch = rates.eval_s * EVAL_BATCH * flops(model) / ref_flops
        return examples / EVAL_BATCH * max(rates.floor_s / 3, per_batch)

    total = 0.0
    for w in items:
        if w.kind == "train":
            assert w.model is not None  # train, eval and ticks name their model
            per = rates.bf16_step_s if in_bf16(w) else rates.step_s
            total += w.amount * step(w.model, w.batch, per, runs=w.runs)
        elif w.kind == "eval":
            assert w.model is not None
            total += evaluation(w.model, w.amount)
        elif w.kind == "floor":
            total += w.amount * rates.floor_s
        elif w.kind == "solve":
            total += w.amount * rates.solve_s
        elif w.kind == "cpu":
            total += w.amount
        elif w.kind == "ticks":
            assert w.model is not None
            per = rates.refine_step_s * (speedup if in_bf16(w) else 1.0)
            refine = rates.tick_steps * step(w.model, w.batch, per)
            records = w.amount / max(w.record_every, 1)
            evals = evaluation(w.model, records * w.eval_examples)
            saves = records * rates.save_s * model_info(w.model)[1] / ref_params
            total += w.amount * refine + evals + saves
    return total


def estimate_table(rates: Rates, params_file: str | Path | None = None) -> str:
    """The per-chapter estimate as a Markdown table: hours with every item in
    fp32, and with each item in its profile's precision (as written)."""
    work = chapter_work(params_file)
    lines = ["| chapter | fp32 h | as written h |", "| --- | ---: | ---: |"]
    total32 = total = 0.0
    for nb, items in work.items():
        h32 = seconds(items, rates, "fp32") / 3600
        h = seconds(items, rates) / 3600
        total32, total = total32 + h32, total + h
        mark = "" if nb in CHAPTERS else " (base models only)"
        lines.append(f"| {nb}{mark} | {h32:.1f} | {h:.1f} |")
    lines.append(f"| **total** | **{total32:.1f}** | **{total:.1f}** |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny timed sizes and one chapter (tests on a CPU)",
    )
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument(
        "--notebooks", nargs="+", help="chapters to run (default: all; --quick: one)"
    )
    parser.add_argument(
        "--assumed", action="store_true", help="estimate from the assumed rates only"
    )
    parser.add_argument(
        "--params",
        help="parameter file to estimate (default: notebooks/params/gpu.yaml)",
    )
    args = parser.parse_args(argv)
    if args.params is not None and not Path(args.params).is_file():
        parser.error(
            f"--params {args.params}: no such file; give a profile's parameter file, "
            "such as notebooks/params/gpu.yaml"
        )
    return args


def check_chapters(args: argparse.Namespace, device: torch.device) -> int:
    """Run the chapters in a fresh checkout; print each one's status; 1 if any failed."""
    if args.skip_notebooks:
        print("gpu-smoke chapters: skipped")
        return 0
    notebooks = args.notebooks or (
        [QUICK_CHAPTER] if args.quick else runner.available_notebooks()
    )
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        checkout = make_checkout(Path(tmp))
        print(f"gpu-smoke chapters in a fresh checkout, {CHAPTER_JOBS} at a time:")
        start = time.perf_counter()
        statuses = run_chapters(checkout, notebooks, CHAPTER_JOBS, device)
        print_chapters(statuses)
        print(f"  ({time.perf_counter() - start:.0f} s)")
    return 0 if all(st.passed for st in statuses) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.assumed:
        print(f"assumed rates: {ASSUMED}")
        print(estimate_table(ASSUMED, args.params))
        return 0
    device = require_cuda(args.allow_cpu)
    print(
        f"gpu check on {device} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    )
    status = check_chapters(args, device)
    batch = yaml.safe_load((runner.PARAMS / "gpu.yaml").read_text())["01_symmetries"][
        "recipes"
    ]["resnet"]["batch_size"]
    rates = measure(device, args.quick, batch)
    print(f"measured: {rates}")
    for name, value in (
        ("ResNet-18 step, fp32, augmented", rates.step_s),
        ("ResNet-18 step, bf16, augmented", rates.bf16_step_s),
        ("small-MLP step (floor)", rates.floor_s),
        ("LLPF refinement step (pilot)", rates.refine_step_s),
        ("evaluation, per 1000 examples on the device", 1000 * rates.eval_s),
        ("checkpoint save (ResNet-18 state)", rates.save_s),
        ("fusion least-squares solve", rates.solve_s),
    ):
        print(f"  {name:<45} {1000 * value:10.1f} ms")
    print(f"  {'LLPF refinement steps per tick (pilot)':<45} {rates.tick_steps:10.1f}")
    resnet = QUICK_RESNET if args.quick else RESNET
    on, off = tf32_difference(resnet, device)
    print(f"  rescaled ResNet-18, max output change: TF32 on {on:.1e}, off {off:.1e}")
    what, seconds = time_grouping(device, args.quick)
    print(f"  {what}: {seconds:.2f} s (chapter 10 counts its host side only)")
    gpu_peak, rss = memory_peaks(device)
    gpu_text = "n/a (CPU)" if gpu_peak is None else f"{gpu_peak:.2f} GiB"
    print(f"  peak GPU memory {gpu_text}, peak host RSS {rss:.2f} GiB")
    print_hot_spots(args.quick)
    print("estimated gpu profile (hours on this device; an estimate, not a run):")
    print(estimate_table(rates, args.params))
    return status


if __name__ == "__main__":
    sys.exit(main())
