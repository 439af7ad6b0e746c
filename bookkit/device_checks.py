"""Numbers that must hold on any device: the checks ``gpu_check.py`` runs on CUDA first.

Each check computes one number on the device and compares it with a bound
that follows from the arithmetic, not from a run: a symmetry leaves the
function unchanged up to float64 rounding of float32 weights, fusing a model
with itself returns it up to its least-squares solve, ``diag G`` from one
backward pass equals the sum over enumerated paths, Theorem 1 splits the
fusion cost exactly, a resumed LLPF path is bit-identical to an unbroken one,
and every model and path ran where it was sent. A check that fails names
itself, its value and its bound; :func:`run_checks` runs them one by one and
reports each as it ends, so a run stopped by its time budget keeps the ones
that finished.
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from wslib.core.configs import build_model
from wslib.core.neurons import (
    neuron_structure,
    permute_state,
    random_permutations,
    random_scales,
    rescale_state,
)
from wslib.core.train import Recipe, devices_used, fit, float64_outputs, model_device

CONV: dict[str, Any] = {
    "name": "resnet18",
    "in_shape": [3, 16, 16],
    "n_classes": 10,
    "width": 0.125,
}
MLP: dict[str, Any] = {
    "name": "mlp",
    "in_shape": [1, 12],
    "n_classes": 4,
    "widths": [6, 5],
}
TINY_MLP: dict[str, Any] = {
    "name": "mlp",
    "in_shape": [1, 3],
    "n_classes": 2,
    "widths": [3, 2],
}
ROUNDING = 1e-9
"""Relative bound of a symmetry's output change: float64 arithmetic on float32
weights that the symmetry moves exactly (a permutation) or scales in float64
(a rescaling) differs by float64 rounding alone, about 1e-15 times the depth."""
SELF_FUSION = 1e-5
"""The claim ``fusion-self``'s bound: a model fused with itself is itself."""


@dataclass(frozen=True)
class Check:
    """One number measured on the device against its bound (``value <= bound`` passes)."""

    name: str
    value: float
    bound: float
    what: str

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.value)) and self.value <= self.bound

    def line(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return f"{self.name:<28} {self.value:10.2e} <= {self.bound:.0e}  {verdict}  ({self.what})"


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _model(config: dict, device: torch.device, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(config).to(device)


def _symmetry_change(model: nn.Module, state: dict[str, torch.Tensor]) -> float:
    """Largest relative output change (train and eval mode, float64) of ``model``
    loaded with ``state``, on 16 random inputs."""
    other = copy.deepcopy(model)
    other.load_state_dict(state)
    x = torch.randn(16, *CONV["in_shape"], generator=torch.Generator().manual_seed(2))
    return max(
        _relative(
            float64_outputs(other, x, train_mode=t),
            float64_outputs(model, x, train_mode=t),
        )
        for t in (False, True)
    )


def permutation_check(device: torch.device) -> Check:
    """A ResNet's neurons permuted at random: outputs (train and eval mode) unchanged."""
    model = _model(CONV, device)
    structure = neuron_structure(model)
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(1))
    value = _symmetry_change(model, permute_state(model.state_dict(), structure, perms))
    return Check(
        "permutation invariance", value, ROUNDING, "ResNet-18/8, float64 outputs"
    )


def rescaling_check(device: torch.device) -> Check:
    """A ResNet's neurons rescaled (log-normal, spread 1, in float64): outputs unchanged."""
    model = _model(CONV, device).double()
    structure = neuron_structure(model)
    scales = random_scales(structure, generator=torch.Generator().manual_seed(1))
    value = _symmetry_change(
        model, rescale_state(model.state_dict(), structure, scales)
    )
    return Check("rescaling invariance", value, ROUNDING, "ResNet-18/8, float64")


def self_fusion_check(device: torch.device) -> Check:
    """An MLP fused with a copy of itself by chapter 10's methods: the largest output change."""
    from wslib.fusion.ch10_regimes import SELF_FUSION_METHODS, self_fusion

    model = _model(MLP, device).eval()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, *MLP["in_shape"], generator=gen)
    y = torch.randint(0, MLP["n_classes"], (64,), generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        value = max(self_fusion(model, x, y, x).values())
    return Check(
        "self-fusion", value, SELF_FUSION, f"MLP 6-5, {', '.join(SELF_FUSION_METHODS)}"
    )


def diag_g_check(device: torch.device) -> Check:
    """``diag G`` of one backward pass against the sum over explicitly enumerated paths."""
    from wslib.pathcond.lifting import explicit_path_lifting
    from wslib.pathcond.rescaling import diag_g

    model = _model(TINY_MLP, device).double()
    fast = diag_g(model, TINY_MLP["in_shape"])
    slow = explicit_path_lifting(model, TINY_MLP["in_shape"]).diag_g()
    value = max(_relative(fast[k], slow[k].to(fast[k])) for k in fast)
    return Check("diag G = path enumeration", value, ROUNDING, "MLP 3-2, float64")


def theorem1_check(device: torch.device) -> Check:
    """Fusion cost = clustering + approximation error (Theorem 1), on random points."""
    from wslib.fusion.grouping import cost_decomposition

    gen = torch.Generator(device=device).manual_seed(4)
    points = torch.randn(60, 40, generator=gen, device=device, dtype=torch.float64)
    fused = torch.randn(6, 40, generator=gen, device=device, dtype=torch.float64)
    rng = np.random.default_rng(4)
    labels, weights = rng.integers(0, 6, 60), rng.random(60)
    parts = cost_decomposition(points, weights, labels, fused)
    value = abs(parts["cost"] - parts["clustering"] - parts["approximation"])
    value /= parts["cost"]
    return Check("Theorem 1 split", value, ROUNDING, "60 points, 6 groups")


def resume_check(device: torch.device) -> Check:
    """An LLPF path killed after tick 2 and resumed: its states against an unbroken path."""
    from wslib.llpf import M2MSettings, Refine, m2m
    from wslib.runs.resumable import Persist

    class Stop(Exception):
        pass

    def kill(tick: int, _: nn.Module) -> None:
        if tick == 2:
            raise Stop

    model = _model(MLP, device)
    a, b = (_model(MLP, device, seed).state_dict() for seed in (1, 2))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(128, *MLP["in_shape"], generator=gen)
    y = torch.randint(0, MLP["n_classes"], (128,), generator=gen)
    refine = Refine(0.05, 32, 2, 4, 0.0)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore", UserWarning)  # every tick stops at r_max
        whole = m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=4, refine=refine, record_every=1),
            persist=Persist(progress=False),
        )
        persist = Persist(Path(tmp) / "path", checkpoint_every=1, progress=False)
        try:
            m2m(
                model,
                a,
                b,
                x,
                y,
                M2MSettings(ticks=4, refine=refine, record_every=1),
                persist=replace(persist, on_tick=kill),
            )
        except Stop:
            pass
        resumed = m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=4, refine=refine, record_every=1),
            persist=persist,
        )
    differ = sum(
        not torch.equal(s[k], t[k])
        for s, t in zip(whole.states, resumed.states, strict=True)
        for k in s
    )
    value = float(differ + (whole.grad_steps != resumed.grad_steps))
    return Check(
        "resumed path", value, 0.0, "tensors that differ from an unbroken path"
    )


def device_check(device: torch.device) -> Check:
    """Models fitted here and paths refined here ran on ``device`` (``devices_used``)."""
    model = _model(MLP, device)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(64, *MLP["in_shape"], generator=gen)
    y = torch.randint(0, MLP["n_classes"], (64,), generator=gen)
    fit(model, x, y, Recipe(epochs=1, batch_size=32), device=device, progress=False)
    wrong = {model_device(model).type, *devices_used()} - {device.type}
    return Check(
        "ran on the device",
        float(len(wrong)),
        0.0,
        f"others than {device.type}: {sorted(wrong)}",
    )


CHECKS: list[Callable[[torch.device], Check]] = [
    device_check,
    permutation_check,
    rescaling_check,
    diag_g_check,
    theorem1_check,
    self_fusion_check,
    resume_check,
]


def run_checks(device: torch.device) -> Iterator[Check]:
    """Each check of :data:`CHECKS` on ``device``, as it ends; an error is a failed check."""
    for check in CHECKS:
        try:
            yield check(device)
        except Exception as error:  # noqa: BLE001  # a check that cannot run has failed
            name = check.__name__.removesuffix("_check").replace("_", " ")
            yield Check(name, float("nan"), 0.0, f"{type(error).__name__}: {error}")
