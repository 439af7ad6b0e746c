"""What each chapter of a profile computes, counted from its parameters.

:func:`chapter_work` lists each chapter's :class:`Work` (training steps,
evaluated examples, LLPF ticks, fusion solves, PathCond rescalings, CPU-side
seconds) from the notebook's defaults overridden by a profile (default:
gpu); :func:`model_info` gives a model's forward FLOPs, parameters and
weight layers. :mod:`bookkit.gpu_estimate` turns the work into seconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bookkit import profiles
from wslib.core.configs import build_model
from wslib.core.train import Recipe
from wslib.synthesis.alignment import STEPS as ALIGNMENT_STEPS

DATA_SIZES = {  # (training, test) examples
    "cifar10": (50_000, 10_000),
    "cifar100": (50_000, 10_000),
    "mnist": (60_000, 10_000),
    "fashion_mnist": (60_000, 10_000),
    "mnist1d": (4_000, 1_000),
}
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
# weight matching of two VGG-11s. (PathCond's solver runs on the device:
# ``Rates.pathcond_s``.)
KF_ITERATIONS = 30
CPU_SECONDS = {
    "kf grouping, 6 models": KF_ITERATIONS * 0.70,
    "hf grouping, 6 models": 0.19,
    "weight matching": 10.0,
}
GROWTH = {  # the grouping of n models against that of 6
    "kf": lambda n: (n / 6) ** 2,  # Lloyd iterations on n x n coordinates
    "hf": lambda n: (n - 1) / 5,  # one Hungarian matching per model after the first
}


@dataclass(frozen=True)
class Work:
    """One item of a chapter's work: ``kind`` and ``amount`` of it for ``model``.

    ``train``: optimizer steps at ``batch``; ``eval``: examples through the
    forward pass; ``ticks``: LLPF ticks (refinement at ``batch``, a record
    every ``record_every`` ticks, each record written once to the checkpoint);
    ``solve``: fusion least-squares solves; ``pathcond``: PathCond rescalings
    of a conv net (:data:`bookkit.gpu_estimate.PATHCOND_SWEEPS` sweeps); ``cpu``: seconds of CPU-side work
    on one thread (:data:`CPU_SECONDS`), the same on any device. ``bf16``:
    the profile trains or refines this item under bfloat16 autocast (its
    recipe's or path settings' ``precision``).
    """

    kind: Literal["train", "eval", "ticks", "floor", "solve", "pathcond", "cpu"]
    model: dict[str, Any] | None  # None for floor, solve, pathcond and cpu
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
                c.items.append(Work("pathcond", None, p["n_seeds"]))
        for model in p["cost_models"].values():
            c.steps(model, math.ceil(n / 128), 128)
            if model["name"] != "mlp":
                c.items.append(Work("pathcond", None, 1))
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
            c.items.append(Work("pathcond", None, n))  # each mode's PathCond gauge
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
    zoo: set[str] = set()
    work = {}
    for nb in profiles.available_notebooks():
        if nb not in CHAPTERS:
            raise KeyError(
                f"notebook {nb} has no work counter; add one to CHAPTERS in "
                "bookkit/gpu_work.py"
            )
        counter = Counter(zoo)
        CHAPTERS[nb](chapter_params(nb, params_file), counter, nb)
        work[nb] = counter.items
    return work


def chapter_params(nb: str, params_file: str | Path | None = None) -> dict[str, Any]:
    """The parameters of ``nb``: its defaults overridden by ``params_file``'s section (default: gpu).

    Read and checked as ``bookkit run`` reads a profile (:func:`bookkit.profiles.section_parameters`):
    a misspelt section or parameter is refused with the same words.
    """
    path = Path(params_file or profiles.PARAMS / "gpu.yaml")
    sections = profiles.load_profile(path.stem, path)
    where = (
        f"notebooks/params/{path.name}" if path.parent == profiles.PARAMS else str(path)
    )
    return {
        **profiles.default_parameters(nb),
        **profiles.section_parameters(nb, sections, where),
    }


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
