"""The tick loop LLPF's path finders share: move, project, refine, record, checkpoint.

Each tick moves the parameters (the path finder's own move), projects them
(M2M: onto their variance spheres), refines the point by plain SGD
(:class:`Refine`, :func:`refine_point`) and projects again; every few ticks
the point is recorded. :func:`run_loop` runs the ticks for
:func:`wslib.llpf.layerwise.m2m` and :func:`wslib.llpf.layerwise.m2o`.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn

from wslib.core.neurons import StateDict
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
from wslib.llpf.path import LLPFPath
from wslib.runs.resumable import Persist, Resumable
from wslib.runs.store import Payload

TickCallback = Callable[[int, nn.Module], None]
CHECKPOINT_EVERY = 10  # ticks between saves when ``persist`` does not say


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


def state_distance(state: StateDict, dest: StateDict, names: Sequence[str]) -> float:
    """Euclidean distance between the named tensors of two states."""
    total = sum(
        float(((state[n].detach().float().cpu() - dest[n].float().cpu()) ** 2).sum())
        for n in names
    )
    return total**0.5


def _clone(state: StateDict) -> StateDict:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


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
    on that device (``run_loop`` places them once).
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


def run_loop(
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


def check_ticks(ticks: int) -> None:
    if ticks < 1:
        raise ValueError(f"ticks must be >= 1, got {ticks}")


def check_refine(refine: object) -> None:
    if not isinstance(refine, Refine):
        raise TypeError(
            f"refine must be a Refine (the refinement's SGD settings), got "
            f"{type(refine).__name__}; leave it out for Refine()"
        )
