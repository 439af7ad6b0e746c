"""Chapter 6 (``06_pathlifting``): the explicit path-lifting of tiny networks.

The lifting of a tiny network before and after PathCond (:func:`tiny_lifting`,
:func:`path_rows`, :func:`lifting_spectra`), the one-pass ``diag(G)`` against
brute force (:func:`diag_g_check`), the function kept by the rescaling
(:func:`function_check`) and two training trajectories from one function
(:func:`trajectories`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wslib.core.configs import build_model
from wslib.core.data import Dataset
from wslib.core.neurons import neuron_structure, random_scales, rescale_state
from wslib.core.train import Recipe, float64_outputs, model_device, seed_everything
from wslib.pathcond.lifting import PathLifting, explicit_path_lifting, mlp_path_labels
from wslib.pathcond.protocols import Run
from wslib.pathcond.rescaling import am_over_gm, diag_g, pathcond_rescale
from wslib.pathcond.training import InitMethod, TrainSettings, prepare_model, train_run


@dataclass
class TinyLifting:
    """The explicit path-lifting of one network ``before`` and ``after`` PathCond."""

    before: PathLifting
    after: PathLifting
    n_neurons: int
    sweeps: int

    @property
    def n_paths(self) -> int:
        """Number of paths (entries of Phi)."""
        return self.before.phi.numel()

    @property
    def n_params(self) -> int:
        """Number of parameters (columns of the Jacobian)."""
        return self.before.jacobian.shape[1]

    @property
    def phi_change(self) -> float:
        """Largest change of an entry of Phi made by the rescaling (0 up to rounding)."""
        return float((self.after.phi - self.before.phi).abs().max())


def tiny_lifting(
    config: dict[str, Any], spread: float, *, seed: int = 0
) -> TinyLifting:
    """Build ``config`` in float64, give its neurons random scales, then apply PathCond.

    The random positive scales (log-spread ``spread``) make a badly scaled
    network with the function of the initialised one; PathCond then rescales
    a copy. Both are lifted explicitly (:func:`~wslib.pathcond.lifting.explicit_path_lifting`).
    """
    seed_everything(seed)
    net = build_model(config).double()
    structure = neuron_structure(net)
    scales = random_scales(
        structure, spread=spread, generator=torch.Generator().manual_seed(seed)
    )
    net.load_state_dict(rescale_state(net.state_dict(), structure, scales))
    before = explicit_path_lifting(net, config["in_shape"])
    conditioned = copy.deepcopy(net)
    solve = pathcond_rescale(conditioned, config["in_shape"])
    after = explicit_path_lifting(conditioned, config["in_shape"])
    n_neurons = sum(g.size for g in structure.groups if g.rescalable)
    return TinyLifting(before, after, n_neurons, int(solve.sweeps))


def path_rows(
    lifting: TinyLifting, config: dict[str, Any], *, n_rows: int = 10
) -> list[dict[str, Any]]:
    """About ``n_rows`` evenly spaced paths of an MLP ``config``: label, Phi before and after."""
    sizes = [math.prod(config["in_shape"]), *config["widths"], config["n_classes"]]
    labels = mlp_path_labels(sizes)
    step = max(1, lifting.n_paths // n_rows)
    return [
        {
            "path": labels[k],
            "Phi (before)": float(lifting.before.phi[k]),
            "Phi (after)": float(lifting.after.phi[k]),
        }
        for k in range(0, lifting.n_paths, step)
    ]


def lifting_spectra(lifting: TinyLifting) -> dict[str, Any]:
    """The spectra of ``P`` and ``G`` and the diagonal ``g``, before and after PathCond.

    ``ev_before`` / ``ev_after``: the non-zero spectrum of ``G`` (decreasing);
    ``p_vs_g``: largest relative difference between it and the top eigenvalues
    of ``P`` before PathCond; ``cond_*``: condition numbers on the range;
    ``g_*``: ``diag(G)`` per tensor; ``amgm_*``: its AM/GM.
    """
    before, after, n = lifting.before, lifting.after, lifting.n_neurons
    ev_before = before.range_spectrum(n).cpu().numpy()
    ev_after = after.range_spectrum(n).cpu().numpy()
    kernel = before.kernel.cpu().numpy()
    ev_p = np.sort(np.linalg.eigvalsh(kernel))[::-1][: len(ev_before)]
    g_before, g_after = before.diag_g(), after.diag_g()
    return {
        "ev_before": ev_before,
        "ev_after": ev_after,
        "p_vs_g": float(np.max(np.abs(ev_p - ev_before) / ev_before)),
        "cond_before": float(ev_before[0] / ev_before[-1]),
        "cond_after": float(ev_after[0] / ev_after[-1]),
        "g_before": g_before,
        "g_after": g_after,
        "amgm_before": am_over_gm(g_before),
        "amgm_after": am_over_gm(g_after),
    }


def diag_g_check(
    archs: dict[str, dict[str, Any]], *, seed: int = 0, noise: float = 0.2
) -> list[dict[str, Any]]:
    """The one-pass ``diag(G)`` against brute force, one row per architecture.

    Each model is built in float64 with ``seed``, its parameters perturbed by
    ``noise`` times a standard normal (so BN and biases are not at their
    defaults), and lifted explicitly; the row gives the largest relative error.
    """
    rows = []
    for name, config in tqdm(archs.items(), desc="brute force"):
        seed_everything(seed)
        model = build_model(config).double()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p))
        lifting = explicit_path_lifting(model, config["in_shape"])
        brute, fast = lifting.diag_g(), diag_g(model, config["in_shape"])
        err = max(
            float(((fast[n] - brute[n]).abs() / brute[n].abs().clamp_min(1e-300)).max())
            for n in brute
        )
        rows.append(
            {
                "architecture": name,
                "paths (incl. structural zeros)": lifting.phi.numel(),
                "parameters": sum(p.numel() for p in model.parameters()),
                "max rel. error": err,
            }
        )
    return rows


def function_check(
    archs: dict[str, dict[str, Any]], *, seed: int = 0, batch: int = 32
) -> list[dict[str, Any]]:
    """How much PathCond changes each model's outputs, in train and eval mode.

    Each model (float32, ``seed``) gets random neuron scales, then PathCond;
    the row gives the relative change of its outputs on ``batch`` random
    inputs against the original model (both evaluated in float64, so the
    change is the float32 weights' rounding on any device), the solver's
    sweeps and seconds.
    """
    rows = []
    for name, config in tqdm(archs.items(), desc="architectures"):
        seed_everything(seed)
        model = build_model(config)
        x = torch.randn(batch, *config["in_shape"])
        structure = neuron_structure(model)
        scales = random_scales(
            structure, spread=1.0, generator=torch.Generator().manual_seed(seed)
        )
        rescaled = copy.deepcopy(model)
        rescaled.load_state_dict(rescale_state(model.state_dict(), structure, scales))
        start = time.perf_counter()
        res = pathcond_rescale(rescaled, config["in_shape"])
        seconds = time.perf_counter() - start
        row = {"architecture": name, "sweeps": res.sweeps, "rescale s": seconds}
        for mode in ("train", "eval"):
            ya, yb = (
                float64_outputs(m, x, train_mode=mode == "train")
                for m in (model, rescaled)
            )
            row[f"rel. change ({mode})"] = float((yb - ya).norm() / ya.norm())
        rows.append(row)
    return rows


def trajectories(
    config: dict[str, Any],
    methods: Sequence[InitMethod],
    ds: Dataset,
    recipe: Recipe,
    *,
    seed: int = 0,
    init_scale: float = 1.0,
) -> dict[str, Run]:
    """One training run per method (not cached), each with its ``initial_loss``.

    ``initial_loss`` is the cross-entropy of the prepared model on the whole
    training set before the first step (the same for every method that keeps
    the function, as PathCond does).
    """
    runs: dict[str, Run] = {
        method: train_run(
            TrainSettings(
                model=config,
                method=method,
                recipe=recipe,
                seed=seed,
                init_scale=init_scale,
            ),
            ds,
        )
        for method in tqdm(methods, desc="training")
    }
    for method in methods:
        model, *_ = prepare_model(config, method, init_scale=init_scale, seed=seed)
        with torch.no_grad():
            out = model(ds.x_train.to(model_device(model)))
            loss = F.cross_entropy(out, ds.y_train.to(out.device))
        runs[method]["initial_loss"] = float(loss)
    return runs
