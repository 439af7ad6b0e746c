"""What ``gpu_check.py`` times: training and evaluation steps, saves, solves and the LLPF pilot.

Every function times one kind of work on a device (synchronised before and
after) and returns seconds; :func:`host_hot_spots` times the work that stays
on the CPU by design, on one thread. The estimate (:mod:`gpu_estimate`) turns
these rates into hours.
"""

from __future__ import annotations

import resource
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wslib.core.configs import build_model
from wslib.core.train import PrecisionName, Recipe, fit, model_device

MLP = {"name": "mlp", "in_shape": [3, 32, 32], "n_classes": 10, "widths": [500] * 3}
QUICK_RESNET = {
    "name": "resnet18",
    "in_shape": [3, 16, 16],
    "n_classes": 10,
    "width": 0.125,
}
QUICK_MLP = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10, "widths": [16]}
EVAL_BATCH = 1024


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


def time_eval(config: dict[str, Any], n: int, device: torch.device) -> float:
    """Seconds per example of evaluating ``config`` on ``n`` examples resident on the device."""
    from wslib.core.train import evaluate

    model = build_model(config).to(device)
    x = torch.randn(n, *config["in_shape"], device=device)
    y = torch.randint(0, config["n_classes"], (n,), device=device)
    evaluate(model, x[:EVAL_BATCH], y[:EVAL_BATCH])  # warm-up
    return timed(lambda: evaluate(model, x, y), device) / n


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
    from wslib.fusion.retrofit import ridge_solve

    gen = torch.Generator(device=device).manual_seed(0)
    design = torch.randn(
        n * rows, cols, generator=gen, device=device, dtype=torch.float64
    )
    goal = torch.randn(targets, n * rows, generator=gen, device=device)

    def block(sl: slice) -> torch.Tensor:
        return design[sl.start * rows : min(sl.stop, n) * rows]

    return timed(lambda: ridge_solve(block, goal, n, 1e-8), device)


def time_grouping(device: torch.device, quick: bool) -> tuple[str, float]:
    """Seconds of a whole KF grouping of chapter 10's first level on ``device``.

    Six VGG-11s at the gpu profile: 6 x 64 neurons, 1000 fusion examples x
    32 x 32 positions (float64, about 3 GiB); the device side (Gram matrix,
    centroids, costs) and the host side (k-means) together. Returns its
    description and the seconds.
    """
    from wslib.fusion.grouping import (
        cost_decomposition,
        group_labels,
        weighted_centroids,
    )

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


def refine_step_seconds(
    config: dict[str, Any],
    batch: int,
    device: torch.device,
    steps: int,
    ticks: int = 3,
) -> tuple[float, float]:
    """Seconds per LLPF refinement step at ``batch``, and the threshold the rule used.

    Two models trained one epoch on random data are joined by an M2M path of
    ``ticks`` ticks with exactly ``steps`` refinement steps each
    (``r_min = r_max``: the stop test runs, but cannot end a tick early), the
    threshold measured as the chapters measure it
    (:func:`wslib.llpf.protocols.threshold_loss`, plus chapter 3's margin
    0.005). The seconds include each tick's move and bookkeeping. How many
    steps a tick needs is not measured here (:func:`zoo_tick_steps`).
    """
    from wslib.core.data import Dataset
    from wslib.llpf import M2MSettings, Refine, m2m
    from wslib.llpf.protocols import threshold_loss
    from wslib.runs.resumable import Persist

    n = batch * 4
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, *config["in_shape"], generator=gen)
    y = torch.randint(0, config["n_classes"], (n,), generator=gen)
    ds = Dataset("random", x, y, x[:batch], y[:batch], config["n_classes"])
    modes = []
    for s in (0, 1):
        torch.manual_seed(s)
        model = build_model(config)
        fit(
            model,
            x,
            y,
            Recipe(epochs=1, batch_size=batch, lr=0.01),
            seed=s,
            device=device,
            progress=False,
        )
        modes.append(model)
    threshold = threshold_loss(modes, ds, batch) + 0.005
    refine = Refine(1e-3, batch, steps, steps, threshold)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # every tick stops at r_max, by design
        path = m2m(
            modes[0],
            modes[0].state_dict(),
            modes[1].state_dict(),
            x,
            y,
            M2MSettings(ticks=1, refine=refine),
            persist=Persist(progress=False),
        )  # warm-up
        _synchronize(device)
        start = time.perf_counter()
        path = m2m(
            modes[0],
            modes[0].state_dict(),
            modes[1].state_dict(),
            x,
            y,
            M2MSettings(ticks=ticks, refine=refine),
            persist=Persist(progress=False),
        )
        _synchronize(device)
    return (time.perf_counter() - start) / path.total_grad_steps, threshold


class _Stop(Exception):
    """Ends the tick-steps pilot after its ticks."""


def zoo_tick_steps(
    params: dict[str, Any], device: torch.device, ticks: int = 2
) -> float | None:
    """Refinement steps per tick of chapter 3's ResNet path on trained modes, if the zoo has them.

    ``params`` are chapter 3's parameters (gpu profile). The modes of book
    seed 0 are looked up in the zoo (None when either is missing, or the
    data set is: nothing is trained here); the path runs with the chapter's
    own settings and threshold rule for its first ``ticks`` ticks. A step is
    a forward pass in training mode, counted by a hook that the path's copy
    of the model inherits.
    """
    from wslib.core.connectivity import mode_config
    from wslib.llpf import M2MSettings, m2m
    from wslib.llpf.protocols import PathRun, PathSetup
    from wslib.llpf.setup import mode_seeds
    from wslib.runs.resumable import Persist
    from wslib.runs.zoo import Zoo

    zoo = Zoo(device=str(device), progress=False)
    name = "resnet"
    configs = [
        mode_config(params["data"], params["models"][name], params["recipes"][name], s)
        for s in mode_seeds(0)
    ]
    try:
        if not all(zoo.path(c).is_file() for c in configs):
            return None
    except (OSError, ValueError):  # the data set is not there
        return None
    modes = [zoo.get(c) for c in configs]
    ds = zoo.dataset(params["data"])
    setup = PathSetup(
        ds, params["batch_size"], params["r_min"], params["threshold_margin"]
    )
    settings = PathRun.of(params["llpf"][name], f"llpf.{name}")
    refine = setup.refine(modes, settings)
    steps = [0]

    def count(module: torch.nn.Module, _: Any) -> None:
        steps[0] += module.training

    def stop(tick: int, _: torch.nn.Module) -> None:
        if tick >= ticks:
            raise _Stop

    template = build_model(params["models"][name]).to(device)
    template.register_forward_pre_hook(count)
    start, dest = (m.state_dict() for m in modes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            m2m(
                template,
                start,
                dest,
                ds.x_train,
                ds.y_train,
                M2MSettings(
                    ticks=settings.ticks,
                    refine=refine,
                    record_every=settings.record_every,
                ),
                persist=Persist(progress=False, on_tick=stop),
            )
        except _Stop:
            pass
    return steps[0] / ticks


def time_pathcond(device: torch.device, quick: bool) -> float:
    """Seconds of PathCond on a CIFAR-NV on ``device`` (float64; diag G and 100 solver sweeps).

    The solver runs where the model lies (:func:`wslib.pathcond.optimize_rescaling`),
    as chapter 8's runs time it.
    """
    from wslib.pathcond.rescaling import pathcond_rescale

    config: dict[str, Any] = {
        "name": "cifar_nv",
        "in_shape": [3, 32, 32],
        "n_classes": 10,
        "width": 0.125 if quick else 1.0,
    }
    torch.manual_seed(0)
    net = build_model(config).double().to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stopped before converging, by design
        return timed(
            lambda: pathcond_rescale(
                net, config["in_shape"], max_sweeps=20 if quick else 100
            ),
            device,
        )


def host_hot_spots(quick: bool) -> dict[str, float]:
    """Seconds of the CPU-side hot spots on one thread, at reduced scale (they stay on the CPU).

    The grouping's host side for 6 VGG-11s, summed over the levels (one
    Lloyd iteration, the Hungarian matchings) and a Git Re-Basin weight
    matching of two VGG-11s.
    """
    from wslib.core.matching import weight_matching
    from wslib.core.neurons import neuron_structure
    from wslib.fusion.levels import level_widths

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        width = 0.125 if quick else 1.0
        vgg = {
            "name": "vgg11",
            "in_shape": [3, 32, 32],
            "n_classes": 10,
            "width": width,
        }
        a, b = build_model(vgg), build_model(vgg)
        lloyd, hungarian = (
            sum(t) for t in zip(*map(grouping_host_seconds, level_widths(a)))
        )
        start = time.perf_counter()
        weight_matching(a.state_dict(), b.state_dict(), neuron_structure(a))
        matching = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    return {
        f"grouping of 6 VGG-11s (width {width}), a Lloyd iteration": lloyd,
        f"grouping of 6 VGG-11s (width {width}), Hungarian matchings": hungarian,
        f"weight matching of two VGG-11s (width {width})": matching,
    }
