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
import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import run as runner
import torch
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from wslib.core.models import build_model
from wslib.core.train import Recipe, fit, model_device, pick_device
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
REFINE_STEPS = 40  # assumed mean refinement steps per LLPF tick (r_min = 20)
EVAL_BATCH = 1024  # evaluation batch (forward only, a third of a training step)
ENORM_COST = 1.0  # an ENorm cycle, in small-model steps (assumed)
LBFGS_EVALS = (
    1.25  # evaluations per L-BFGS iteration (one step of max_epochs iterations)
)


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work on the device (measured or assumed).

    ``step_s``: one ResNet-18 training step at ``batch`` (fp32; ``bf16_step_s``
    in bf16); ``floor_s``: one training step of a small MLP, the floor every
    step pays (launches, host syncs); ``tick_s``: one LLPF tick of ResNet-18
    with ``tick_steps`` refinement steps; ``save_s``: one ``torch.save`` of a
    ResNet-18 state; ``solve_s``: one fusion least-squares solve of chapter
    10's size.
    """

    step_s: float
    bf16_step_s: float
    floor_s: float
    tick_s: float
    tick_steps: int
    save_s: float
    solve_s: float
    batch: int = 256


ASSUMED = Rates(
    step_s=0.015,
    bf16_step_s=0.009,
    floor_s=0.0012,
    tick_s=0.015 * 20 + 0.02,
    tick_steps=20,
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


def run_smoke_notebooks(device: torch.device) -> list[str]:
    """Run every notebook in the smoke profile; return those that did not use ``device``."""
    subprocess.run(
        [sys.executable, "notebooks/run.py", "--profile", "smoke", "--jobs", "2"],
        cwd=ROOT,
        check=True,
    )
    wrong = []
    for nb in runner.available_notebooks():
        results = json.loads((ROOT / "results" / "smoke" / f"{nb}.json").read_text())
        if results.get("env", {}).get("device") != device.type:
            wrong.append(nb)
    return wrong


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
    config: dict[str, Any], batch: int, steps: int, device: torch.device, precision: str
) -> float:
    """Seconds per training step of ``config`` (``fit``, after a warm-up epoch of 5 steps)."""
    torch.manual_seed(0)
    model = build_model(config)
    x = torch.randn(batch * steps, *config["in_shape"])
    y = torch.randint(0, config["n_classes"], (batch * steps,))
    recipe = Recipe(epochs=1, batch_size=batch, lr=0.01, precision=precision)
    fit(model, x[: 5 * batch], y[: 5 * batch], recipe, 0, device, progress=False)
    seconds = timed(lambda: fit(model, x, y, recipe, 0, device, progress=False), device)
    if model_device(model).type != device.type:
        raise RuntimeError(f"the model trained on {model_device(model)}, not {device}")
    return seconds / steps


def time_tick(
    config: dict[str, Any], batch: int, steps: int, device: torch.device
) -> float:
    """Seconds of one LLPF M2M tick with exactly ``steps`` refinement steps."""
    from wslib.llpf import Refine, m2m

    torch.manual_seed(0)
    model = build_model(config).to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    dest = {
        k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
        for k, v in start.items()
    }
    x = torch.randn(batch * 4, *config["in_shape"])
    y = torch.randint(0, config["n_classes"], (batch * 4,))
    refine = Refine(lr=1e-3, batch_size=batch, r_min=steps, r_max=steps, threshold=1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds = timed(
            lambda: m2m(
                model, start, dest, x, y, ticks=3, refine=refine, progress=False
            ),
            device,
        )
    return seconds / 3


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
    """Time the steps, the tick, the save and the solve on ``device``."""
    resnet, mlp = (QUICK_RESNET, QUICK_MLP) if quick else (RESNET, MLP)
    steps, b, tick_steps = (5, 16, 2) if quick else (50, batch, 20)
    # chapter 10's widest design: 1000 fusion examples x 16 positions, 512 x 3 x 3 + 1
    size = (20, 4, 65, 8) if quick else (1000, 16, 4609, 512)
    return Rates(
        step_s=time_steps(resnet, b, steps, device, "fp32"),
        bf16_step_s=time_steps(resnet, b, steps, device, "bf16"),
        floor_s=time_steps(mlp, 128 if not quick else 16, steps, device, "fp32"),
        tick_s=time_tick(resnet, b, tick_steps, device),
        tick_steps=tick_steps,
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
    ``solve``: fusion least-squares solves.
    """

    kind: str
    model: dict[str, Any] | None
    amount: float
    batch: int = 256
    record_every: int = 0
    eval_examples: int = 0


def _steps(n: int, recipe: dict[str, Any]) -> tuple[float, int]:
    r = Recipe(**recipe)
    return r.epochs * math.ceil(n / r.batch_size), r.batch_size


class Counter:
    """Collects a chapter's work; a model the zoo already holds is not trained again."""

    def __init__(self, zoo: set[str]) -> None:
        self.zoo, self.items = zoo, []

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
        self.items.append(Work("train", model, steps, batch))

    def steps(self, model: dict, steps: float, batch: int) -> None:
        self.items.append(Work("train", model, steps, batch))

    def evaluate(self, model: dict, examples: float) -> None:
        self.items.append(Work("eval", model, examples))

    def path(self, model: dict, settings: dict, batch: int, data: dict) -> None:
        n_train, n_test = DATA_SIZES[data["name"]]
        every = int(settings.get("record_every", 5))
        self.items.append(
            Work("ticks", model, settings["ticks"], batch, every, n_train + n_test)
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
            paths = 1 + (p["path_seeds"] - 1) * (name in p["seed_archs"])
            paths += p["path_seeds"] * (name in p["ablation_archs"])
            paths += name == next(iter(p["models"]))  # the peak anatomy run
        else:  # 04: every method at LLPF's step budget, on each seed and in tuning
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
            c.steps(p["train_model"], steps, batch)
        return
    if nb == "08_pathcond_conv":
        for spec in p["archs"].values():
            n, _ = DATA_SIZES[spec.get("data", p["data"])["name"]]
            steps, batch = _steps(n, spec["recipe"])
            for method in p["methods"]:
                extra = ENORM_COST if method == "enorm" else 0.0
                c.steps(spec["model"], steps * p["n_seeds"], batch)
                c.items.append(Work("floor", None, extra * steps * p["n_seeds"]))
        for model in p["cost_models"].values():
            c.steps(model, math.ceil(n / 128), 128)
        return
    n, _ = DATA_SIZES[p["data"]["name"]]
    recipe, seeds = p["recipe"], p["n_seeds"]
    runs = []  # (widths, runs, epochs, method), every method counted apart
    for cfg in p["configs"].values():
        for method in cfg["methods"]:
            runs.append((cfg["widths"], seeds, recipe["epochs"], method))
    for widths in p["size_sweep"]["widths"]:
        runs += [(widths, seeds, recipe["epochs"], m) for m in ("baseline", "pathcond")]
    act = p["configs"][p["activation_config"]]["widths"]
    runs += [
        (act, p["n_activation_seeds"], recipe["epochs"], m)
        for _ in p["activations"]
        for m in ("baseline", "pathcond")
    ]
    n_rates = len(p["lr_grid"]) + len(p["lr_refine"])
    for name in p["lr_sweep_configs"]:
        widths = p["configs"][name]["widths"]
        for m in ("baseline", "pathcond"):
            runs += [
                (widths, n_rates, p["long_epochs"], m),
                (widths, seeds, p["long_epochs"], m),
            ]
    batch = recipe["batch_size"]
    for widths, count, epochs, method in runs:
        steps = count * epochs * math.ceil(n / batch)
        c.steps({**p["mlp"], "widths": widths}, steps, batch)
        if method == "enorm":
            c.items.append(Work("floor", None, ENORM_COST * steps))


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
        c.steps(arch, *_steps(n_train, finetune))
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
    mlp, recipe, llpf = p["models"]["mlp"], p["recipes"]["mlp"], p["llpf"]
    per_class, grad = p["fusion_per_class"], p["gradient"]
    finetune = {**recipe, **p["finetune"]}
    points = llpf["ticks"] // llpf["record_every"] + 1 + 2 * p["n_points"]
    for _ in range(pairs):  # questions 2 and 3: per pair of MLP modes
        _fusions(c, mlp, per_class, grad, linear=1, gradient=1)  # KF linear, gradient
        c.steps(mlp, *_steps(n_train, finetune))
        c.steps(mlp, *_steps(n_train, finetune))
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
    :data:`REFINE_STEPS` refinement steps, a record every ``record_every``
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
        p = {**runner.default_parameters(nb), **(params.get(nb) or {})}
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


def seconds(items: list[Work], rates: Rates, bf16: bool = False) -> float:
    """Estimated seconds of ``items`` at ``rates``.

    A training step of model ``m`` at batch ``b`` takes the ResNet-18 step
    time scaled by FLOPs (``flops(m) * b / (flops(ResNet-18) * rates.batch)``)
    but never less than the small-model floor; evaluation costs a third of a
    step per example; a tick adds ``REFINE_STEPS`` steps to the measured
    tick's overhead; saves scale with the number of parameters.
    """
    ref = flops(RESNET) * rates.batch
    ref_params = model_info(RESNET)[1]
    step_ref = rates.bf16_step_s if bf16 else rates.step_s
    overhead = max(0.0, rates.tick_s - rates.tick_steps * rates.step_s)

    def step(model: dict, batch: int) -> float:
        return max(rates.floor_s, step_ref * flops(model) * batch / ref)

    total = 0.0
    for w in items:
        if w.kind == "train":
            total += w.amount * step(w.model, w.batch)
        elif w.kind == "eval":
            total += w.amount / EVAL_BATCH * step(w.model, EVAL_BATCH) / 3
        elif w.kind == "floor":
            total += w.amount * rates.floor_s
        elif w.kind == "solve":
            total += w.amount * rates.solve_s
        elif w.kind == "ticks":
            refine = REFINE_STEPS * step(w.model, w.batch) + overhead
            records = w.amount / max(w.record_every, 1)
            evals = (
                records * w.eval_examples / EVAL_BATCH * step(w.model, EVAL_BATCH) / 3
            )
            saves = records * rates.save_s
            total += (
                w.amount * refine + evals + saves * model_info(w.model)[1] / ref_params
            )
    return total


def estimate_table(rates: Rates, params_file: str | Path | None = None) -> str:
    """The per-chapter estimate as a Markdown table (hours, fp32 and bf16)."""
    work = chapter_work(params_file)
    lines = ["| chapter | fp32 h | bf16 h |", "| --- | ---: | ---: |"]
    total32 = total16 = 0.0
    for nb, items in work.items():
        h32, h16 = seconds(items, rates) / 3600, seconds(items, rates, True) / 3600
        total32, total16 = total32 + h32, total16 + h16
        mark = "" if nb in CHAPTERS else " (base models only)"
        lines.append(f"| {nb}{mark} | {h32:.1f} | {h16:.1f} |")
    lines.append(f"| **total** | **{total32:.1f}** | **{total16:.1f}** |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, no notebooks (tests)"
    )
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument(
        "--assumed", action="store_true", help="estimate from the assumed rates only"
    )
    parser.add_argument(
        "--params",
        help="parameter file to estimate (default: notebooks/params/gpu.yaml)",
    )
    return parser.parse_args(argv)


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
    status = 0
    if args.quick or args.skip_notebooks:
        print("smoke notebooks: skipped")
    else:
        wrong = run_smoke_notebooks(device)
        print(f"smoke notebooks: {'all on ' + device.type if not wrong else wrong}")
        status = 1 if wrong else 0
    batch = yaml.safe_load((runner.PARAMS / "gpu.yaml").read_text())["01_symmetries"][
        "recipes"
    ]["resnet"]["batch_size"]
    rates = measure(device, args.quick, batch)
    print(f"measured: {rates}")
    for name, value in (
        ("ResNet-18 step, fp32", rates.step_s),
        ("ResNet-18 step, bf16", rates.bf16_step_s),
        ("small-MLP step (floor)", rates.floor_s),
        (f"LLPF tick ({rates.tick_steps} refinement steps)", rates.tick_s),
        ("checkpoint save (ResNet-18 state)", rates.save_s),
        ("fusion least-squares solve", rates.solve_s),
    ):
        print(f"  {name:<40} {1000 * value:10.1f} ms")
    print("estimated gpu profile (hours on this device; an estimate, not a run):")
    print(estimate_table(rates, args.params))
    return status


if __name__ == "__main__":
    sys.exit(main())
