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

Layer order. A "layer" is one parameter tensor. :func:`data_flow_stages`
groups the parameter tensors by the block that owns them, in module order,
which for every model of :mod:`wslib.core.models` is the order of the data flow
(input to output). Stage ``k`` starts moving at tick ``start[k]`` ("Follow
Data Flow"); once started, a tensor keeps moving. Every tensor is trained
during refinement from the first tick. ``all_at_once=True`` starts every
stage at tick 0 (the ablation).

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

Checkpoints. With ``persist`` naming a ``checkpoint`` (a folder, see
:class:`wslib.runs.resumable.Persist`), the loop saves its state every
``checkpoint_every`` ticks (default 10) and at the end, incrementally: each
recorded point once, in a file of its own, the current point when it is not
a recorded one, and a small index (random generator, counters, the path's
lists) written last: an entry with parts of :mod:`wslib.runs.store`, saved
by the resumable-run helper :mod:`wslib.runs.resumable`. It resumes from
that folder when called again with the same arguments: an interrupted run
ends on the same path as an uninterrupted one with the same seed. The files
hold only tensors, lists and numbers and are read with
``torch.load(weights_only=True)``; a checkpoint that is unreadable, another
run's, incomplete or changed after it was written is ignored with a warning
and the run starts again.

Refinement cap. ``Refine.r_max`` caps each tick's refinement; a path in
which some ticks stopped there above the threshold warns once, saying how
many and how far above.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import nn

from wslib.core.files import code_version, stable_hash, tensor_digest
from wslib.core.neurons import StateDict
from wslib.core.norms import norm_parameter_names
from wslib.core.settings import Settings, not_in_key
from wslib.core.train import (
    PrecisionName,
    Stepper,
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

# The modules whose source determines a path (its checkpoint key).
CODE = (
    "wslib.core.files",
    "wslib.core.models",
    "wslib.core.pooling",
    "wslib.core.neurons",
    "wslib.core.norms",
    "wslib.core.settings",
    "wslib.core.train",
    "wslib.llpf.layerwise",
    "wslib.llpf.path",
    "wslib.runs.resumable",
    "wslib.runs.store",
)
TickCallback = Callable[[int, nn.Module], None]
# How M2M's moving tensors step towards the destination (see the module docstring).
MoveSchedule = Literal["geometric", "linear"]
MOVE_SCHEDULES: tuple[MoveSchedule, ...] = get_args(MoveSchedule)
CHECKPOINT_EVERY = 10  # ticks between saves when ``persist`` does not say


# --- configuration and result -----------------------------------------------------------------


@dataclass(frozen=True)
class Refine:
    """Refinement by plain SGD (no momentum, no weight decay) after each move.

    At least ``r_min`` steps; stop once the mean of the last ``r_min`` batch
    losses is ``<= threshold``; at most ``r_max`` steps. With ``precision``
    ``"bf16"`` the forward pass and loss run under bfloat16 autocast (the
    weights, moves and projections stay in float32); the threshold should
    then be measured the same way
    (:func:`wslib.llpf.protocols.threshold_loss`).
    """

    lr: float = 0.01
    batch_size: int = 128
    r_min: int = 5
    r_max: int = 100
    threshold: float = 0.05
    precision: PrecisionName = "fp32"

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if not 1 <= self.r_min <= self.r_max:
            raise ValueError(
                f"need 1 <= r_min <= r_max, got r_min={self.r_min}, r_max={self.r_max}"
            )
        if not (math.isfinite(self.lr) and self.lr > 0) or self.batch_size < 1:
            raise ValueError(
                f"lr must be finite and > 0 and batch_size >= 1, got lr={self.lr}, "
                f"batch_size={self.batch_size}"
            )
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(
                f"threshold must be a finite loss >= 0, got {self.threshold} (NaN or "
                "infinity would run every tick to r_max, or stop at once)"
            )


# --- layer order ------------------------------------------------------------------------------


def _block_of(name: str) -> str:
    """The block owning a parameter: its module path up to the first numeric index."""
    parts = name.split(".")[:-1]
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0] if parts else name


def _stages_by_block(model: nn.Module) -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        stages.setdefault(_block_of(name), []).append(name)
    return stages


def data_flow_stages(model: nn.Module) -> list[list[str]]:
    """Parameter names grouped by owning block, in module (= data-flow) order.

    MLP: one stage per Linear; CNN: one per conv, then the head; ResNet: stem,
    one per residual stage, head; transformer: position table, patch
    embedding, one per block, final norm, head.
    """
    return list(_stages_by_block(model).values())


def data_flow_stage_names(model: nn.Module) -> list[str]:
    """Names of the stages of :func:`data_flow_stages` (the owning blocks), in the same order."""
    return list(_stages_by_block(model))


def stage_starts(
    n_stages: int,
    ticks: int,
    stage_ticks: int | Sequence[int] | None,
    *,
    all_at_once: bool = False,
) -> list[int]:
    """Tick at which each stage starts moving.

    ``stage_ticks`` is the number of ticks between the starts of consecutive
    stages: one int for all, a list of ``n_stages - 1`` ints, or ``None`` to
    spread the starts evenly over the first half of the path.
    """
    if all_at_once:
        return [0] * n_stages
    if stage_ticks is None:
        return [round(k * ticks / (2 * n_stages)) for k in range(n_stages)]
    gaps = (
        [stage_ticks] * (n_stages - 1)
        if isinstance(stage_ticks, int)
        else list(stage_ticks)
    )
    if len(gaps) != n_stages - 1 or any(g < 0 for g in gaps):
        raise ValueError(
            f"stage_ticks must be one int or {n_stages - 1} non-negative ints (gaps between "
            f"the starts of {n_stages} stages), got {stage_ticks!r}"
        )
    starts = [sum(gaps[:k]) for k in range(n_stages)]
    if starts[-1] >= ticks:
        raise ValueError(
            f"the last stage would start at tick {starts[-1]} >= ticks={ticks}; "
            "use fewer stage ticks or more ticks"
        )
    return starts


# --- helpers ----------------------------------------------------------------------------------


def tensor_variances(state: StateDict, names: Sequence[str]) -> dict[str, float]:
    """Variance of all elements of each named tensor (0 for single-element tensors)."""
    return {
        n: float(state[n].float().var()) if state[n].numel() > 1 else 0.0 for n in names
    }


@torch.no_grad()
def project_on_spheres(
    model: nn.Module, target: dict[str, float], *, eps: float = 1e-12
) -> None:
    """Rescale each named parameter about its mean so that its variance is ``target[name]``."""
    params = dict(model.named_parameters())
    for name, v in target.items():
        p = params[name]
        if p.numel() < 2:
            continue
        mean = p.mean()
        p.sub_(mean).mul_(torch.sqrt((v + eps) / (p.var() + eps))).add_(mean)


def _distance(state: StateDict, dest: StateDict, names: Sequence[str]) -> float:
    """Euclidean distance between the named tensors of two states."""
    total = sum(
        float(((state[n].detach().float().cpu() - dest[n].float().cpu()) ** 2).sum())
        for n in names
    )
    return total**0.5


def _clone(state: StateDict) -> StateDict:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def _fingerprint(*items: object) -> str:
    """Checkpoint key: the run's settings, the library code and the data (see wslib.core.files)."""
    return stable_hash([*items, code_version(*CODE)], length=16)


def refine_point(
    model: nn.Module,
    opt: Stepper,
    x: torch.Tensor,
    y: torch.Tensor,
    refine: Refine,
    gen: torch.Generator,
) -> tuple[int, float]:
    """SGD steps until the moving-average batch loss is under the threshold; (steps, loss).

    The batch losses stay on the model's device (in float64: the arithmetic
    of a sum of Python floats); the host reads one number per step, and only
    from step ``r_min`` on: whether to stop. ``x`` and ``y`` are best already
    on that device (``_run_loop`` places them once).
    """
    model.train()
    dev = model_device(model)
    x, y = on_device(x, dev), y.to(dev)
    window: list[torch.Tensor] = []
    steps = 0
    autocast = precision_autocast(dev, refine.precision)
    zero_grad, step = optimizer_step(opt, dev)
    while steps < refine.r_max:
        idx = batch_indices(len(x), refine.batch_size, gen, dev)
        with autocast:
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        zero_grad()
        loss.backward()
        step()
        steps += 1
        window = (window + [loss.detach().double()])[-refine.r_min :]
        if steps >= refine.r_min and bool(_mean(window) <= refine.threshold):
            break
    model.eval()
    return steps, float(_mean(window))


def _mean(window: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mean of 0-d tensors, summed left to right like ``sum`` of Python floats."""
    total = window[0]
    for loss in window[1:]:
        total = total + loss
    return total / len(window)


# --- the shared loop --------------------------------------------------------------------------


def _state_part(k: int) -> str:
    """The checkpoint part of recorded state ``k``."""
    return f"state-{k:06d}.pt"


def _snapshot(
    run: Resumable, path: LLPFPath, work: nn.Module, steps: int, memo: set[str] | None
) -> Payload:
    """What a path checkpoint holds besides the run's own state.

    Each recorded state is a part, written once; the current point is one
    more part (named by its tick) when it is not the last recorded state.
    Everything is plain tensors, lists and numbers (readable with
    ``weights_only=True``).
    """
    written = run.stored_parts
    parts = {
        _state_part(k): (None if _state_part(k) in written else state)
        for k, state in enumerate(path.states)
    }
    current = None
    if path.ticks[-1] != run.tick:
        current = f"current-{run.tick:06d}.pt"
        parts[current] = _clone(work.state_dict())
    lists = {
        f.name: getattr(path, f.name) for f in fields(LLPFPath) if f.name != "states"
    }
    return {
        "steps": steps,
        "memo": sorted(memo or ()),
        "current": current,
        "path": lists,
        "parts": parts,
    }


def _restore(
    saved: Payload | None, start: StateDict, phase: str
) -> tuple[LLPFPath, StateDict, int, list[str]]:
    """The path so far, the current point, the gradient steps and the memo of a run."""
    if saved is None:
        path = LLPFPath([_clone(start)], [0], [0], [0.0], [], [phase])
        return path, _clone(start), 0, []
    parts = saved["parts"]
    states = [parts[_state_part(k)] for k in range(len(saved["path"]["ticks"]))]
    path = LLPFPath(states=states, **saved["path"])
    current = states[-1] if saved["current"] is None else parts[saved["current"]]
    return path, current, saved["steps"], saved["memo"]


def _checkpoint_problem(saved: Payload, like: StateDict) -> str | None:
    """What keeps ``saved`` from being a whole path checkpoint of ``like``'s model."""
    kinds: dict[str, type | tuple[type, ...]] = {
        "steps": int,
        "path": dict,
        "current": (str, type(None)),
        "memo": list,
        "parts": dict,
    }
    for name, kind in kinds.items():
        if not isinstance(saved.get(name), kind):
            return f"{name} is a {type(saved.get(name)).__name__}"
    path = saved["path"]
    if set(path) != {f.name for f in fields(LLPFPath)} - {"states"} or not all(
        isinstance(v, list) for v in path.values()
    ):
        return "path does not hold the lists of a path"
    names = {_state_part(k) for k in range(len(path["ticks"]))} | {saved["current"]}
    if not path["ticks"] or set(saved["parts"]) != names - {None}:
        return f"{len(saved['parts'])} parts for {len(path['ticks'])} recorded ticks"
    expected = _shapes(like)
    for name, state in saved["parts"].items():
        if _shapes(state) != expected:
            return f"part {name} has other tensors than the model"
    return None


def _shapes(state: object) -> dict | None:
    if not isinstance(state, dict):
        return None
    return {k: getattr(v, "shape", None) for k, v in state.items()}


def _run_loop(
    model: nn.Module,
    start: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    phase: str,
    move: Callable[[nn.Module, int], bool],
    after_move: Callable[[nn.Module], None],
    make_opt: Callable[[nn.Module], Stepper],
    refine: Refine,
    ticks: int,
    seed: int,
    record_every: int,
    key: str,
    persist: Persist,
    final_state: StateDict | None = None,
    memo: set[str] | None = None,
    on_refined: TickCallback | None = None,
) -> LLPFPath:
    """Move / correct / refine / correct for up to ``ticks`` ticks; record every few ticks.

    ``move(model, t)`` moves the parameters in place and returns ``False``
    when the path is complete (no more moves needed). ``memo`` is a set the
    move may fill (e.g. tensors that reached their target); it is saved in the
    checkpoint and restored on resume. ``persist`` says where the run's
    checkpoint (a folder, keyed by ``key``) is and how often it is saved
    (:class:`wslib.runs.resumable.Persist`); a finished run is marked so in
    it: resuming it returns the same path without another tick.
    """
    if record_every < 1:
        raise ValueError(f"record_every must be >= 1, got {record_every}")
    work = copy.deepcopy(model)
    dev = model_device(work)
    note_device(dev)
    x, y = on_device(x, dev), y.to(dev)  # placed once: no batch copied per step
    run = Resumable(
        persist, "LLPF path", key, seed, ticks, folder=True, every=CHECKPOINT_EVERY
    )
    path, current, steps, saved_memo = _restore(
        run.resume(lambda saved: _checkpoint_problem(saved, start)), start, phase
    )
    if memo is not None:
        memo.clear()
        memo.update(saved_memo)
    work.load_state_dict(current)
    opt = make_opt(work)
    run.begin(f"LLPF {phase}")
    while not run.done:
        t = run.tick
        with torch.no_grad():
            moving = move(work, t)
        last = t == ticks - 1 or not moving
        if last and final_state is not None:
            work.load_state_dict(final_state)
            loss = float("nan")
        else:
            after_move(work)
            taken, loss = refine_point(work, opt, x, y, refine, run.gen)
            steps += taken
            if on_refined is not None:
                on_refined(t + 1, work)
            after_move(work)
        run.count(last)
        path.refine_loss.append(loss)
        if last or run.tick % record_every == 0:
            path.states.append(_clone(work.state_dict()))
            path.ticks.append(run.tick)
            path.grad_steps.append(steps)
            path.seconds.append(run.seconds)
            path.phase.append(phase)
        run.settle(functools.partial(_snapshot, run, path, work, steps, memo), work)
    run.end(functools.partial(_snapshot, run, path, work, steps, memo))
    _warn_capped(path.refine_loss, refine, phase)
    return path


def _warn_capped(refine_loss: Sequence[float], refine: Refine, phase: str) -> None:
    """Warn once per path when refinement stopped at its cap ``r_max`` above the threshold.

    A tick's moving average above the threshold means its refinement ran out
    of steps (it would have stopped as soon as the average was under it).
    """
    over = [loss - refine.threshold for loss in refine_loss if loss > refine.threshold]
    if over:
        warnings.warn(
            f"LLPF {phase}: refinement stopped at its cap r_max={refine.r_max} above "
            f"the threshold {refine.threshold:.4g} in {len(over)} of "
            f"{len(refine_loss)} ticks (moving-average loss up to {max(over):.3g} "
            "above it); those points are less refined than the rule asks: raise "
            "r_max or the learning rate, or use more ticks",
            stacklevel=4,
        )


def _check_ticks(ticks: int) -> None:
    if ticks < 1:
        raise ValueError(f"ticks must be >= 1, got {ticks}")


def _check_refine(refine: object) -> None:
    if not isinstance(refine, Refine):
        raise TypeError(
            f"refine must be a Refine (the refinement's SGD settings), got "
            f"{type(refine).__name__}; leave it out for Refine()"
        )


# --- Algorithm 1: model to model --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class M2MSettings(Settings):
    """The options of LLPF model to model (:func:`m2m`), checked when written.

    ``ticks``: number of ticks; the last one lands on the destination.
    ``refine``: the refinement's SGD settings (:class:`Refine`). ``stages``:
    parameter names per stage, input to output (None:
    :func:`data_flow_stages`); every parameter must be in exactly one.
    ``stage_ticks``, ``all_at_once``: when each stage starts moving (see
    :func:`stage_starts`). ``step``, ``final_gap``: fraction of the
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
        _check_ticks(self.ticks)
        _check_refine(self.refine)
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
        Checkpoint, progress bar and tick callback
        (:class:`wslib.runs.resumable.Persist`; None: no checkpoint, a
        progress bar). ``persist.checkpoint`` is a folder to save the run to
        every ``persist.checkpoint_every`` ticks (default 10; one file per
        recorded state and an index) and to resume from;
        ``persist.on_tick(tick, model)`` is called after each tick (and its
        save).
    on_refined
        Called as ``on_refined(tick, model)`` after each tick's refinement,
        before the projection (not on the last tick, which lands on ``dest``).

    Returns
    -------
    LLPFPath
    """
    settings = settings or M2MSettings()
    ticks, refine, schedule = settings.ticks, settings.refine, settings.schedule
    check_same_architecture(model, start, dest)
    stages = [list(s) for s in (settings.stages or data_flow_stages(model))]
    names = [n for n, _ in model.named_parameters()]
    flat = [n for s in stages for n in s]
    if sorted(flat) != sorted(names):
        raise ValueError(
            "stages must list every parameter exactly once; missing "
            f"{sorted(set(names) - set(flat))[:3]}, unknown or repeated "
            f"{sorted({n for n in flat if n not in names or flat.count(n) > 1})[:3]}"
        )
    starts = stage_starts(
        len(stages), ticks, settings.stage_ticks, all_at_once=settings.all_at_once
    )
    begin = {n: s0 for s, s0 in zip(stages, starts) for n in s}
    step = settings.step
    if step is None:
        step = 1 - settings.final_gap ** (1 / max(1, ticks - 1 - starts[-1]))
        if step <= 0:  # final_gap so close to 1 that the step rounds to 0
            raise ValueError(
                f"final_gap {settings.final_gap} over {ticks} ticks gives a step of "
                "0: no tick would move; use a smaller final_gap or a step"
            )
    target = tensor_variances(start, names)
    dest_dev = {n: dest[n].to(model_device(model)) for n in names}

    start_gap = _distance(start, dest_dev, names)

    def move(work: nn.Module, t: int) -> bool:
        if t == ticks - 1 and ticks > 1:
            gap = _distance(dict(work.named_parameters()), dest_dev, names)
            if start_gap > 0 and gap > settings.jump_warn * start_gap:  # 0: same ends
                warnings.warn(
                    f"M2M's last tick is a straight jump over {gap / start_gap:.0%} "
                    "of the start's distance to the destination, with no refinement "
                    "on it; use more ticks, a larger step or a smaller final_gap",
                    stacklevel=4,
                )
        for n, p in work.named_parameters():
            if t >= begin[n]:
                p.add_(
                    (dest_dev[n] - p)
                    * (step if schedule == "geometric" else 1 / (ticks - t))
                )
        return True

    key = _fingerprint(
        "m2m",
        repr(model),  # the template's structure (activations, layers)
        tensor_digest(start),
        tensor_digest(dest),
        settings.key(),
        tensor_digest(x, y),
    )
    return _run_loop(
        model,
        start,
        x,
        y,
        phase="m2m",
        move=move,
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
    (:class:`Refine`), with angular ``compliance`` (see
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
        _check_ticks(self.ticks)
        _check_refine(self.refine)
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
    ticks, shrink, refine = settings.ticks, settings.shrink, settings.refine
    target_variance, target_tol = settings.target_variance, settings.target_tol
    check_same_architecture(model, start)
    names = [n for n, _ in model.named_parameters()]
    movable = movable_names(model)
    if target_variance is not None:
        unknown = set(target_variance) - set(names)
        if unknown:
            raise ValueError(
                f"target_variance names unknown parameters {sorted(unknown)[:3]}"
            )
    start_var = tensor_variances(start, names)
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
    reached: set[str] = set()

    def move(work: nn.Module, t: int) -> bool:
        params = dict(work.named_parameters())
        for n in movable:
            if n in reached:
                continue
            p = params[n]
            if n in targets:
                # towards the target sphere, never past it
                ideal = (targets[n] / float(p.var())) ** 0.5
                p.mul_(
                    max(1 - shrink, ideal)
                    if ideal < 1
                    else min(1 / (1 - shrink), ideal)
                )
                if abs(float(p.var()) / targets[n] - 1) <= target_tol:
                    reached.add(n)
            else:
                p.mul_(1 - shrink)
        pending = [n for n in targets if n not in reached]
        if target_variance is not None and pending and t == ticks - 1:
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
        return target_variance is None or bool(pending)

    key = _fingerprint(
        "m2o",
        repr(model),  # the template's structure (activations, layers)
        tensor_digest(start),
        settings.key(),
        tensor_digest(x, y),
    )
    return _run_loop(
        model,
        start,
        x,
        y,
        phase="m2o",
        move=move,
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
