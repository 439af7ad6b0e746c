"""Low-Loss Path Finding (LLPF): layer-wise paths between modes and towards the origin.

Three path finders share one loop (see the LLPF paper brief):

- :func:`m2m` (Algorithm 1, model to model): every tick, the tensors that have
  started moving take a step towards the destination ``D``; every parameter
  tensor is put back on its *variance sphere* (the variance it had in the start
  model); a few plain SGD steps refine the point until the moving average of
  the batch losses is under a threshold; the tensors are projected on their
  spheres again. The last tick lands exactly on ``D``.
- :func:`m2o` (Algorithm 2, model to origin): the same loop towards the origin,
  without variance correction, with normalisation layers left in place and an
  optional *angular compliance* (the learning rate of each weight tensor scaled
  by its current variance over its start variance).
- :func:`hybrid`: M2O until each tensor reaches the destination's variance,
  then M2M to the destination (modes on different spheres).

Step size. As in the authors' code, a moving tensor takes the constant
fraction ``step`` of its remaining distance to ``D`` at every tick (a weighted
average), so the moves shrink as the path nears ``D``; the last tick sets the
point to ``D``. The authors use ``step = 1e-3`` over 16k ticks; with fewer
ticks, ``step=None`` picks the fraction that leaves the last stage
``final_gap`` of its distance before the last tick. ``schedule="linear"``
instead moves the fraction ``1 / (ticks - t)`` at tick ``t``: equal moves in
absolute size, reaching ``D`` exactly at the last tick.

BatchNorm. Running statistics are buffers, never moved nor variance-corrected;
refinement runs in training mode, where BatchNorm uses batch statistics. The
recorded states keep whatever running statistics the refinement left, and
:mod:`wslib.llpf.evaluation` recomputes them on the training set before evaluating any
point (the endpoints included), so every point is judged the same way.

Layer order, the shared tick loop and its checkpoints are in
:mod:`wslib.llpf.stages` and :mod:`wslib.llpf.ticks`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import nn

from wslib.core.files import code_version, stable_hash, tensor_digest
from wslib.core.neurons import StateDict
from wslib.core.norms import norm_parameter_names
from wslib.core.settings import Settings, not_in_key
from wslib.core.train import model_device
from wslib.llpf.path import LLPFPath, check_same_architecture
from wslib.llpf.stages import data_flow_stages, stage_starts
from wslib.llpf.ticks import (
    Refine,
    TickCallback,
    check_refine,
    check_ticks,
    project_on_spheres,
    run_loop,
    state_distance,
    tensor_variances,
)
from wslib.runs.resumable import Persist

# The modules whose source determines a path (its checkpoint key).
CODE = (
    "wslib.core.files",
    "wslib.core.models",
    "wslib.core.pooling",
    "wslib.core.neurons",
    "wslib.core.norms",
    "wslib.core.settings",
    "wslib.core.train",
    "wslib.core.recipes",
    "wslib.llpf.layerwise",
    "wslib.llpf.path",
    "wslib.llpf.stages",
    "wslib.llpf.ticks",
    "wslib.runs.resumable",
    "wslib.runs.store",
)
# How M2M's moving tensors step towards the destination (see the module docstring).
MoveSchedule = Literal["geometric", "linear"]
MOVE_SCHEDULES: tuple[MoveSchedule, ...] = get_args(MoveSchedule)


def _fingerprint(*items: object) -> str:
    """Checkpoint key: the run's settings, the library code and the data (see wslib.core.files)."""
    return stable_hash([*items, code_version(*CODE)], length=16)


# --- Algorithm 1: model to model --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class M2MSettings(Settings):
    """The options of LLPF model to model (:func:`m2m`), checked when written.

    ``ticks``: number of ticks; the last one lands on the destination.
    ``refine``: the refinement's SGD settings (:class:`~wslib.llpf.ticks.Refine`). ``stages``:
    parameter names per stage, input to output (None:
    :func:`~wslib.llpf.stages.data_flow_stages`); every parameter must be in exactly one.
    ``stage_ticks``, ``all_at_once``: when each stage starts moving (see
    :func:`~wslib.llpf.stages.stage_starts`). ``step``, ``final_gap``: fraction of the
    remaining distance moved per tick; None chooses ``1 - final_gap ** (1 /
    (ticks - 1 - last start))``. ``schedule``: ``"geometric"`` (constant
    fraction ``step``) or ``"linear"`` (fraction ``1 / (ticks - t)``, equal
    absolute moves). ``seed``: the refinement's batch sampling (the "path
    seed"). ``record_every``: record a point every this many ticks (the
    first and last always). ``eps``: the projection's guard against a zero
    variance. ``jump_warn``: warn when, before the last tick, the point is
    still more than this fraction of the start's distance from the
    destination (the last tick is then a long straight jump that no
    refinement checked).
    """

    ticks: int = 100
    refine: Refine = field(default_factory=Refine)
    stages: Sequence[Sequence[str]] | None = None
    stage_ticks: int | Sequence[int] | None = None
    all_at_once: bool = False
    step: float | None = None
    final_gap: float = 0.01
    schedule: MoveSchedule = "geometric"
    seed: int = 0
    record_every: int = 5
    eps: float = 1e-12
    jump_warn: float = not_in_key(0.2, "it only decides whether a warning is given")

    def __post_init__(self) -> None:
        check_ticks(self.ticks)
        check_refine(self.refine)
        if self.step is None and not 0 < self.final_gap < 1:
            raise ValueError(f"final_gap must be in (0, 1), got {self.final_gap}")
        if self.step is not None and not 0 < self.step <= 1:
            raise ValueError(f"step must be in (0, 1], got {self.step}")
        if self.schedule not in MOVE_SCHEDULES:
            raise ValueError(
                f"schedule must be 'geometric' or 'linear', got {self.schedule!r}"
            )


def m2m(
    model: nn.Module,
    start: StateDict,
    dest: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: M2MSettings | None = None,
    *,
    persist: Persist | None = None,
    on_refined: TickCallback | None = None,
) -> LLPFPath:
    """LLPF model to model (Algorithm 1) from ``start`` to ``dest``.

    Parameters
    ----------
    model
        A module of the architecture of both states (used as a template, not changed).
    start, dest
        State dicts of the two modes.
    x, y
        Training data for the refinement.
    settings
        The run's options (:class:`M2MSettings`; None: the defaults).
    persist
        Checkpoint folder, progress bar and ``on_tick(tick, model)`` callback
        (:class:`wslib.runs.resumable.Persist`; None: no checkpoint, a
        progress bar); the checkpoints are those of :mod:`wslib.llpf.ticks`.
    on_refined
        Called as ``on_refined(tick, model)`` after each tick's refinement,
        before the projection (not on the last tick, which lands on ``dest``).

    Returns
    -------
    LLPFPath
    """
    settings = settings or M2MSettings()
    ticks, refine = settings.ticks, settings.refine
    check_same_architecture(model, start, dest)
    names = [n for n, _ in model.named_parameters()]
    stages = _checked_stages(model, settings.stages, names)
    starts = stage_starts(
        len(stages), ticks, settings.stage_ticks, all_at_once=settings.all_at_once
    )
    begin = {n: s0 for s, s0 in zip(stages, starts) for n in s}
    step = _m2m_step(settings, starts[-1])
    target = tensor_variances(start, names)
    dest_dev = {n: dest[n].to(model_device(model)) for n in names}

    start_gap = state_distance(start, dest_dev, names)

    key = _fingerprint(
        "m2m",
        repr(model),  # the template's structure (activations, layers)
        tensor_digest(start),
        tensor_digest(dest),
        settings.key(),
        tensor_digest(x, y),
    )
    return run_loop(
        model,
        start,
        x,
        y,
        phase="m2m",
        move=functools.partial(
            _move_towards, dest_dev, begin, step, settings, start_gap
        ),
        after_move=lambda w: project_on_spheres(w, target, eps=settings.eps),
        make_opt=lambda w: torch.optim.SGD(w.parameters(), lr=refine.lr),
        refine=refine,
        ticks=ticks,
        seed=settings.seed,
        record_every=settings.record_every,
        key=key,
        persist=persist or Persist(),
        final_state=dest,
        on_refined=on_refined,
    )


def _checked_stages(
    model: nn.Module, stages: Sequence[Sequence[str]] | None, names: list[str]
) -> list[list[str]]:
    """``stages`` (None: :func:`~wslib.llpf.stages.data_flow_stages`), checked to list every parameter once."""
    found = [list(s) for s in (stages or data_flow_stages(model))]
    flat = [n for s in found for n in s]
    if sorted(flat) != sorted(names):
        raise ValueError(
            "stages must list every parameter exactly once; missing "
            f"{sorted(set(names) - set(flat))[:3]}, unknown or repeated "
            f"{sorted({n for n in flat if n not in names or flat.count(n) > 1})[:3]}"
        )
    return found


def _m2m_step(settings: M2MSettings, last_start: int) -> float:
    """The fraction of its remaining distance a moving tensor takes per tick:
    ``settings.step``, or the one that leaves the last stage (starting at tick
    ``last_start``) ``final_gap`` of its distance before the last tick."""
    if settings.step is not None:
        return settings.step
    step = 1 - settings.final_gap ** (1 / max(1, settings.ticks - 1 - last_start))
    if step <= 0:  # final_gap so close to 1 that the step rounds to 0
        raise ValueError(
            f"final_gap {settings.final_gap} over {settings.ticks} ticks gives a "
            "step of 0: no tick would move; use a smaller final_gap or a step"
        )
    return step


def _move_towards(
    dest: StateDict,
    begin: dict[str, int],
    step: float,
    settings: M2MSettings,
    start_gap: float,
    work: nn.Module,
    t: int,
) -> bool:
    """M2M's move at tick ``t``: each tensor that has started (``begin``) steps
    towards ``dest``; warns when the last tick jumps far with no refinement."""
    ticks = settings.ticks
    if t == ticks - 1 and ticks > 1:
        gap = state_distance(dict(work.named_parameters()), dest, list(dest))
        if start_gap > 0 and gap > settings.jump_warn * start_gap:  # 0: same ends
            warnings.warn(
                f"M2M's last tick is a straight jump over {gap / start_gap:.0%} "
                "of the start's distance to the destination, with no refinement "
                "on it; use more ticks, a larger step or a smaller final_gap",
                stacklevel=4,
            )
    for n, p in work.named_parameters():
        if t >= begin[n]:
            fraction = step if settings.schedule == "geometric" else 1 / (ticks - t)
            p.add_((dest[n] - p) * fraction)
    return True


# --- Algorithm 2: model to origin -------------------------------------------------------------


class ComplianceSGD:
    """Plain SGD (no momentum, no weight decay); weight tensors (dim > 1) get
    ``lr * var(P) / v_start`` when angular compliance is on.

    The scaled learning rate stays on the device: it is computed in float64
    (the arithmetic of Python floats) and applied as ``P -= grad * lr`` with
    the rate in the tensor's precision, which is what ``torch.optim.SGD``
    does with a Python-float rate, without reading ``var(P)`` on the host.
    """

    def __init__(
        self, model: nn.Module, lr: float, start_var: dict[str, float], compliance: bool
    ):
        self.named = list(model.named_parameters())
        self.lr, self.start_var, self.compliance = lr, start_var, compliance

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self.named:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for name, p in self.named:
            if p.grad is None:
                continue
            v0 = self.start_var.get(name, 0.0)
            if self.compliance and p.dim() > 1 and v0 > 0:
                rate = self.lr * p.var().double() / v0
                p.addcmul_(p.grad, (-rate).to(p.dtype))
            else:
                p.add_(p.grad, alpha=-self.lr)


@dataclass(frozen=True, kw_only=True)
class M2OSettings(Settings):
    """The options of LLPF model to origin (:func:`m2o`), checked when written.

    Every tick multiplies each movable parameter by ``1 - shrink``, for at
    most ``ticks`` ticks; ``refine`` is the refinement's SGD
    (:class:`~wslib.llpf.ticks.Refine`), with angular ``compliance`` (see
    :class:`ComplianceSGD`). With ``target_variance`` (name -> variance,
    each at most the start's unless ``grow``), a tensor's move never takes it
    past its target, and the tensor stops moving for good once its variance
    right after a move (before refinement, which may push it away again) is
    within ``target_tol`` (relative) of the target.
    ``grow=True`` (the authors' "to variance sphere" mode) lets a tensor
    whose target is above its variance grow by ``1 / (1 - shrink)`` a tick
    instead. ``seed`` and ``record_every`` are as in :class:`M2MSettings`.
    """

    ticks: int = 100
    shrink: float = 0.02
    refine: Refine = field(default_factory=Refine)
    compliance: bool = True
    target_variance: Mapping[str, float] | None = None
    target_tol: float = 0.01
    grow: bool = False
    seed: int = 0
    record_every: int = 5

    def __post_init__(self) -> None:
        check_ticks(self.ticks)
        check_refine(self.refine)
        if not 0 < self.shrink < 1:
            raise ValueError(f"shrink must be in (0, 1), got {self.shrink}")


def m2o(
    model: nn.Module,
    start: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: M2OSettings | None = None,
    *,
    persist: Persist | None = None,
) -> LLPFPath:
    """LLPF model to origin (Algorithm 2): shrink the weights towards zero while refining.

    ``settings`` (:class:`M2OSettings`; None: the defaults) say how.
    Parameters of normalisation layers never move. With a target variance
    the run ends at the tick where the last tensor reaches its target;
    running out of ticks first warns. ``persist``
    (:class:`wslib.runs.resumable.Persist`; None: no checkpoint, a progress
    bar) is as in :func:`m2m`: a checkpoint folder saved every
    ``checkpoint_every`` ticks (default 10), ``on_tick(tick, model)`` after
    each tick.
    """
    settings = settings or M2OSettings()
    ticks, refine = settings.ticks, settings.refine
    check_same_architecture(model, start)
    names = [n for n, _ in model.named_parameters()]
    movable = movable_names(model)
    start_var = tensor_variances(start, names)
    targets = _m2o_targets(settings, start, names, start_var, movable)
    reached: set[str] = set()

    key = _fingerprint(
        "m2o",
        repr(model),  # the template's structure (activations, layers)
        tensor_digest(start),
        settings.key(),
        tensor_digest(x, y),
    )
    return run_loop(
        model,
        start,
        x,
        y,
        phase="m2o",
        move=functools.partial(_shrink, settings, movable, targets, reached),
        after_move=lambda w: None,
        make_opt=lambda w: ComplianceSGD(w, refine.lr, start_var, settings.compliance),
        refine=refine,
        ticks=ticks,
        seed=settings.seed,
        record_every=settings.record_every,
        key=key,
        persist=persist or Persist(),
        memo=reached,
    )


def _m2o_targets(
    settings: M2OSettings,
    start: StateDict,
    names: list[str],
    start_var: dict[str, float],
    movable: list[str],
) -> dict[str, float]:
    """The target variances M2O steers the movable tensors to (those with more
    than one element), checked: known names, and none above the start's
    unless ``settings.grow``."""
    target_variance, target_tol = settings.target_variance, settings.target_tol
    if target_variance is not None:
        unknown = set(target_variance) - set(names)
        if unknown:
            raise ValueError(
                f"target_variance names unknown parameters {sorted(unknown)[:3]}"
            )
    targets = {
        n: v
        for n, v in (target_variance or {}).items()
        if n in movable and start[n].numel() > 1
    }
    above = [n for n, v in targets.items() if v > start_var[n] * (1 + target_tol)]
    if above and not settings.grow:
        n = above[0]
        raise ValueError(
            f"M2O only shrinks, but the target variance of {len(above)} tensors is "
            f"above the start's (e.g. {n}: {targets[n]:.3g} > {start_var[n]:.3g}); "
            "give targets at most the start's variance, or grow=True"
        )
    return targets


def _shrink(
    settings: M2OSettings,
    movable: list[str],
    targets: dict[str, float],
    reached: set[str],
    work: nn.Module,
    t: int,
) -> bool:
    """M2O's move at tick ``t``: scale each movable tensor towards the origin, or
    towards its target sphere and never past it (``reached`` collects those
    that got there); False once every target is reached."""
    ticks, shrink, target_tol = settings.ticks, settings.shrink, settings.target_tol
    params = dict(work.named_parameters())
    for n in movable:
        if n in reached:
            continue
        p = params[n]
        if n in targets:
            # towards the target sphere, never past it
            ideal = (targets[n] / float(p.var())) ** 0.5
            p.mul_(
                max(1 - shrink, ideal) if ideal < 1 else min(1 / (1 - shrink), ideal)
            )
            if abs(float(p.var()) / targets[n] - 1) <= target_tol:
                reached.add(n)
        else:
            p.mul_(1 - shrink)
    pending = [n for n in targets if n not in reached]
    if settings.target_variance is not None and pending and t == ticks - 1:
        off = {k: float(params[k].var()) / targets[k] for k in pending}
        n = max(off, key=lambda k: abs(off[k] - 1))
        ratio = off[n]
        warnings.warn(
            f"M2O ran out of ticks ({ticks}) before {len(pending)} tensors reached "
            f"their target variance (worst: {n} at {ratio:.2f} x its target); "
            "the path ends off the target sphere: use more ticks or a larger "
            "shrink",
            stacklevel=4,
        )
    return settings.target_variance is None or bool(pending)


def sphere_variance_ratio(
    source: StateDict, dest: StateDict, names: Sequence[str]
) -> float:
    """Mean over the named tensors (those with variance > 0 in ``source``) of var(dest) / var(source)."""
    vs, vd = tensor_variances(source, names), tensor_variances(dest, names)
    ratios = [vd[n] / vs[n] for n in names if vs[n] > 0]
    if not ratios:
        raise ValueError("no named tensor has a positive variance in the source state")
    return float(sum(ratios) / len(ratios))


def movable_names(model: nn.Module) -> list[str]:
    """Parameter names that M2O moves: all but those of normalisation layers."""
    frozen = norm_parameter_names(model)
    return [n for n, _ in model.named_parameters() if n not in frozen]


def hybrid(
    model: nn.Module,
    start: StateDict,
    dest: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    m2o_ticks: int = 100,
    shrink: float = 0.02,
    m2m_ticks: int = 100,
    refine: Refine | None = None,
    compliance: bool = True,
    seed: int = 0,
    record_every: int = 5,
    target_tol: float = 0.01,
    persist: Persist | None = None,
    **m2m_options,
) -> LLPFPath:
    """M2O from ``start`` until each movable tensor reaches ``dest``'s variance, then M2M to ``dest``.

    The M2O phase runs in the authors' "to variance sphere" mode
    (``grow=True``): a tensor whose destination variance is above its own
    grows towards it instead of shrinking, so a destination on a larger sphere
    is reached too. It ends at the tick where every tensor is within
    ``target_tol`` of the destination's variance (see :func:`m2o`; it warns
    when it runs out of ``m2o_ticks`` first). ``persist``
    (:class:`wslib.runs.resumable.Persist`; None: no checkpoint, a progress
    bar) applies to both phases: with a ``checkpoint``, they are
    checkpointed in the folders ``<checkpoint>-m2o`` and ``<checkpoint>-m2m``
    (a killed run resumes in the phase it was in), and ``on_tick(tick,
    model)`` is called after every tick of both, ``tick`` counted along the
    whole path (as in the path's ``ticks``). Extra keyword arguments are
    fields of the M2M phase's :class:`M2MSettings`; both phases' settings are
    checked before either runs.
    """
    check_same_architecture(model, start, dest)
    persist = persist or Persist()
    movable = movable_names(model)
    refine = refine or Refine()
    to_sphere = M2OSettings(
        ticks=m2o_ticks,
        shrink=shrink,
        refine=refine,
        compliance=compliance,
        target_variance=tensor_variances(dest, movable),
        target_tol=target_tol,
        grow=True,
        seed=seed,
        record_every=record_every,
    )
    to_dest = M2MSettings(
        ticks=m2m_ticks,
        refine=refine,
        seed=seed,
        record_every=record_every,
        **m2m_options,
    )  # both phases' settings are checked before either runs
    first = m2o(model, start, x, y, to_sphere, persist=_phase_persist(persist, "m2o"))
    second = m2m(
        model,
        first.states[-1],
        dest,
        x,
        y,
        to_dest,
        persist=_phase_persist(persist, "m2m", first.ticks[-1]),
    )
    return first.extend(second)


def _phase_persist(persist: Persist, phase: str, ticks_before: int = 0) -> Persist:
    """``persist`` for one phase of a hybrid run: the phase's checkpoint folder, and
    ``on_tick`` told the tick along the whole path (``ticks_before`` ticks precede it)."""
    on_tick = persist.on_tick
    if on_tick is not None and ticks_before:
        on_tick = functools.partial(_tick_after, on_tick, ticks_before)
    checkpoint = _phase_folder(persist.checkpoint, phase)
    return replace(persist, checkpoint=checkpoint, on_tick=on_tick)


def _tick_after(
    on_tick: Callable[..., None], ticks_before: int, tick: int, *extra: object
) -> None:
    """Call ``on_tick`` with the tick along the whole path."""
    on_tick(ticks_before + tick, *extra)


def _phase_folder(checkpoint: str | Path | None, phase: str) -> Path | None:
    """The checkpoint folder of one phase of a hybrid run."""
    if checkpoint is None:
        return None
    folder = Path(checkpoint)
    return folder.with_name(f"{folder.name}-{phase}")
