"""Bezier and PolyChain curves with one trainable bend (Garipov et al., 2018).

The curve between two fixed endpoints ``a`` and ``b`` through a trainable
bend ``theta``:

- Bezier: ``(1 - t)^2 a + 2 t (1 - t) theta + t^2 b``;
- PolyChain: ``a -> theta`` for ``t < 1/2``, ``theta -> b`` after.

Training draws ``t ~ U(0, 1)`` for every batch and takes an SGD step (with
momentum) on the loss of the network at ``t`` with respect to ``theta``
only. The authors' recipe adds ``0.5 * weight_decay * ||w(t)||^2`` (all
parameters of the network at ``t``) to the loss and uses their learning-rate
schedule (``schedule="garipov"``: constant for the first half of the steps,
then linearly down to 1% of it at 90%, then constant). BatchNorm layers use batch statistics during training; when the curve
is evaluated, :mod:`wslib.llpf.evaluation` recomputes the running statistics on the
training set at every evaluated ``t``. The result is an
:class:`wslib.llpf.path.LLPFPath` of the curve sampled at ``n_eval`` values of
``t``, with its gradient steps and wall time, so curves and LLPF paths are
evaluated the same way.

Checkpoints. With ``persist`` naming a ``checkpoint`` (a file, see
:class:`wslib.runs.resumable.Persist`), the run saves its state every
``checkpoint_every`` steps (default 500) and at the end, atomically, in one
small file (an entry of :mod:`wslib.runs.store`, saved by the resumable-run
helper :mod:`wslib.runs.resumable`): the step, the bend, the optimizer's
momentum, the generator, the buffers, the seconds so far and the run's key
(:func:`checkpoint_key`, shared with :mod:`wslib.llpf.autoneb`: a hash of
everything that determines the run, including this module's source). A run
started with a checkpoint of the same key resumes at its step and ends
bit-identical to an uninterrupted run; a finished one returns without
another step. A checkpoint of another run, or one that cannot be read, is
ignored with a warning and the run starts again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from wslib.core.files import code_version, stable_hash, tensor_digest
from wslib.core.neurons import StateDict
from wslib.core.settings import Settings
from wslib.core.train import (
    PrecisionName,
    batch_indices,
    check_precision,
    model_device,
    note_device,
    on_device,
    optimizer_step,
    precision_autocast,
)
from wslib.llpf.path import LLPFPath, check_same_architecture
from wslib.runs.resumable import Persist, Resumable
from wslib.runs.store import Payload

# The curves and learning-rate schedules of fit_curve (the tuples list them at run time).
CurveKind = Literal["bezier", "polychain"]
CurveSchedule = Literal["constant", "garipov"]
KINDS: tuple[CurveKind, ...] = get_args(CurveKind)
SCHEDULES: tuple[CurveSchedule, ...] = get_args(CurveSchedule)
NAMES = {"bezier": "Bezier", "polychain": "PolyChain"}
# The modules whose source determines a curve (its checkpoint key).
CODE = (
    "wslib.core.settings",
    "wslib.core.train",
    "wslib.core.recipes",
    "wslib.llpf.curves",
    "wslib.llpf.path",
    "wslib.runs.resumable",
    "wslib.runs.store",
)
CHECKPOINT_EVERY = 500  # steps between saves when ``persist`` does not say


def model_signature(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint key needs of ``model``: its structure, parameters and buffers."""
    return {
        "structure": repr(model),
        "params": [[n, list(p.shape)] for n, p in model.named_parameters()],
        "buffers": tensor_digest(dict(model.named_buffers())),
    }


def checkpoint_key(
    model: nn.Module, a: StateDict, b: StateDict, *data, **config
) -> str:
    """The key of a baseline run: endpoints, data, model and ``config`` (with its code)."""
    return stable_hash(
        {
            "a": tensor_digest(a),
            "b": tensor_digest(b),
            "data": tensor_digest(*data),
            "model": model_signature(model),
            **config,
        },
        length=16,
    )


def missing_fields(saved: Payload, fields: tuple[str, ...]) -> str | None:
    """Which of ``fields`` a baseline's checkpoint lacks (None: none); shared with AutoNEB."""
    missing = [f for f in fields if f not in saved]
    return f"no {', '.join(missing)}" if missing else None


def lr_factor(schedule: CurveSchedule, fraction: float) -> float:
    """Learning-rate multiplier at ``fraction`` (0..1) of the training steps."""
    if schedule == "constant" or fraction <= 0.5:
        return 1.0
    if fraction <= 0.9:
        return 1.0 - (fraction - 0.5) / 0.4 * 0.99
    return 0.01


def curve_point(
    a: dict[str, torch.Tensor],
    bend: dict[str, torch.Tensor],
    b: dict[str, torch.Tensor],
    t: float,
    kind: CurveKind,
) -> dict[str, torch.Tensor]:
    """The parameters of the curve at ``t`` (differentiable in ``bend``).

    Each term is one ``torch._foreach`` operation over all tensors (a few
    kernel launches per step on a GPU instead of five per tensor); the
    arithmetic is the per-tensor one, element by element, so the result is
    bit-identical to it.
    """
    names = list(a)
    pa, pm, pb = ([d[n] for n in names] for d in (a, bend, b))
    if kind == "bezier":
        ends = torch._foreach_add(
            torch._foreach_mul(pa, (1 - t) ** 2),
            torch._foreach_mul(pm, 2 * t * (1 - t)),
        )
        point = torch._foreach_add(ends, torch._foreach_mul(pb, t**2))
    elif t < 0.5:
        point = torch._foreach_add(
            pa, torch._foreach_mul(torch._foreach_sub(pm, pa), 2 * t)
        )
    else:
        point = torch._foreach_add(
            pm, torch._foreach_mul(torch._foreach_sub(pb, pm), 2 * t - 1)
        )
    return dict(zip(names, point, strict=True))


@dataclass(frozen=True, kw_only=True)
class CurveSettings(Settings):
    """A curve run's options, checked when written; all of them enter its key.

    ``steps`` SGD steps with ``lr`` and ``momentum`` on batches of
    ``batch_size``; ``weight_decay`` and ``schedule`` (see :func:`lr_factor`)
    give the authors' recipe; with ``precision`` ``"bf16"`` the forward pass
    and loss run under bfloat16 autocast (the bend stays in float32); the
    curve is returned sampled at ``n_eval`` evenly spaced ``t``.
    """

    kind: CurveKind = "bezier"
    steps: int = 1000
    lr: float = 0.05
    momentum: float = 0.9
    batch_size: int = 128
    n_eval: int = 21
    seed: int = 0
    weight_decay: float = 0.0
    schedule: CurveSchedule = "constant"
    precision: PrecisionName = "fp32"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown curve kind {self.kind!r}; valid: {KINDS}")
        if self.steps < 0 or self.n_eval < 2:
            raise ValueError("steps must be >= 0 and n_eval >= 2")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: {SCHEDULES}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        check_precision(self.precision)


def fit_curve(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: CurveSettings | None = None,
    *,
    persist: Persist | None = None,
) -> LLPFPath:
    """Train the bend of a curve from ``a`` to ``b`` (:class:`CurveSettings`;
    None: the defaults).

    ``persist`` (:class:`wslib.runs.resumable.Persist`; None: no checkpoint,
    a progress bar): with a ``checkpoint`` (a file) the run is saved every
    ``checkpoint_every`` steps (default 500) and at the end, and resumes
    from it (see the module docstring); ``on_tick(k)`` is called after step
    ``k`` (and its save).

    Returns the curve sampled at ``n_eval`` evenly spaced ``t`` (endpoints
    exactly ``a`` and ``b``); ``grad_steps`` and ``seconds`` of the last
    point are those of the training (seconds summed over resumed sessions).
    """
    settings = settings or CurveSettings()
    kind, steps = settings.kind, settings.steps
    persist = persist or Persist()
    check_same_architecture(model, a, b)
    probe = copy.deepcopy(model)
    dev = model_device(probe)
    note_device(dev)
    key = None
    if persist.checkpoint is not None:
        key = checkpoint_key(
            probe, a, b, x, y, **settings.key(), code=code_version(*CODE)
        )
    what = f"{NAMES[kind]} curve"
    run = Resumable(persist, what, key, settings.seed, steps, every=CHECKPOINT_EVERY)
    saved = run.resume(lambda s: missing_fields(s, ("bend", "optimizer", "buffers")))
    x, y = on_device(x, dev), y.to(dev)  # placed once: no batch copied per step
    names = [n for n, _ in probe.named_parameters()]
    pa = {n: a[n].to(dev) for n in names}
    pb = {n: b[n].to(dev) for n in names}
    bend = {n: (0.5 * (pa[n] + pb[n])).clone().requires_grad_(True) for n in names}
    buffers = {n: v.clone() for n, v in probe.named_buffers()}
    opt = torch.optim.SGD(
        list(bend.values()), lr=settings.lr, momentum=settings.momentum
    )
    if saved is not None:
        _restore(saved, bend, buffers, opt)

    def snapshot() -> Payload:
        return {
            "bend": {n: v.detach().cpu().clone() for n, v in bend.items()},
            "optimizer": opt.state_dict(),
            "buffers": {n: v.detach().cpu().clone() for n, v in buffers.items()},
        }

    probe.train()
    zero_grad, step = optimizer_step(opt, dev)
    run.begin(f"{kind} curve")
    autocast = precision_autocast(dev, settings.precision)
    for k in range(run.tick, steps):
        for group in opt.param_groups:
            group["lr"] = settings.lr * lr_factor(settings.schedule, k / steps)
        t = float(torch.rand((), generator=run.gen))
        idx = batch_indices(len(x), settings.batch_size, run.gen, dev)
        point = curve_point(pa, bend, pb, t, kind)
        loss = _loss(probe, point, buffers, x[idx], y[idx], settings, autocast)
        zero_grad()
        loss.backward()
        step()
        run.count()
        run.settle(snapshot)
    run.end(snapshot)
    states = _sampled(a, b, bend, pa, pb, kind, settings.n_eval)
    return LLPFPath.of_run(states, steps, run.seconds, kind)


@torch.no_grad()
def _restore(
    saved: Payload, bend: StateDict, buffers: StateDict, opt: torch.optim.Optimizer
) -> None:
    """Put a checkpoint's bend, buffers and optimizer state back in place."""
    for n in bend:
        bend[n].copy_(saved["bend"][n])
    for n in buffers:
        buffers[n].copy_(saved["buffers"][n])
    opt.load_state_dict(saved["optimizer"])


def _loss(
    probe: nn.Module,
    point: StateDict,
    buffers: StateDict,
    xb: torch.Tensor,
    yb: torch.Tensor,
    settings: CurveSettings,
    autocast: torch.autocast,
) -> torch.Tensor:
    """The cross-entropy of ``probe`` at the curve's ``point`` on a batch (under
    ``autocast``), plus ``weight_decay / 2`` times the point's squared norm
    (in the point's precision) when the decay is positive."""
    with autocast:
        out = functional_call(probe, {**point, **buffers}, xb)
        loss = nn.functional.cross_entropy(out, yb)
    if settings.weight_decay > 0:
        decay = sum((w**2).sum() for w in point.values())
        loss = loss + 0.5 * settings.weight_decay * decay
    return loss


@torch.no_grad()
def _sampled(
    a: StateDict,
    b: StateDict,
    bend: StateDict,
    pa: StateDict,
    pb: StateDict,
    kind: CurveKind,
    n_eval: int,
) -> list[StateDict]:
    """The curve at ``n_eval`` evenly spaced ``t`` as state dicts (``a``'s buffers;
    the endpoints exactly ``a`` and ``b``)."""
    states = []
    for t in np.linspace(0.0, 1.0, n_eval):
        point = curve_point(pa, bend, pb, float(t), kind)
        state = {k: v.detach().cpu().clone() for k, v in a.items()}
        state.update({n: v.detach().cpu().clone() for n, v in point.items()})
        states.append(state)
    states[0] = {k: v.detach().cpu().clone() for k, v in a.items()}
    states[-1] = {k: v.detach().cpu().clone() for k, v in b.items()}
    return states
