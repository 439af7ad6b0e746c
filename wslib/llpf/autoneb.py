"""AutoNEB (Draxler et al., 2018): a chain of pivots relaxed by nudged elastic band dynamics.

The chain starts as ``n_init`` pivots evenly spaced on the straight line
between the fixed endpoints. Each *cycle* relaxes the interior pivots for
``steps_per_cycle`` iterations with its own learning rate (``lrs``, usually
decreasing): every iteration takes, for every interior pivot, the minibatch
loss gradient, removes its component along the chain's tangent and adds a
spring force along the tangent that evens out the distances to the two
neighbours. After a cycle, each segment between neighbouring pivots is
evaluated at ``check_points`` interior points on ``check_examples``
training examples; where the loss exceeds the linear estimate between the
two pivots' losses by more than ``insert_tol``, a new pivot is inserted at
the worst point (at most ``max_pivots`` pivots in all).

This is a *simplified* AutoNEB: the published algorithm (and its code) uses
Adam per pivot, an upwind tangent, a redistribution of the pivots at every
step, more cycles and insertion by a normalised residual; here the pivots
take plain SGD steps, the tangent is the central difference of the two
neighbours, nothing is redistributed, and insertion uses an absolute
threshold.

Gradient steps count one per interior pivot per iteration; with
``total_steps`` the run spends exactly that many (each cycle gets its share,
the last iteration of a cycle updates only as many pivots as its share has
steps left, from the first interior pivot on). BatchNorm layers
use batch statistics during relaxation and checks; :mod:`wslib.llpf.evaluation`
recomputes running statistics when it evaluates the result.

With ``persist`` naming a ``checkpoint`` (a file, see
:class:`wslib.runs.resumable.Persist`) the run is saved after every cycle
(the pivots, the next cycle, the generator, the buffers, the gradient steps
and seconds so far, under a key of everything that determines the run) and
resumes from it, bit-identical to an uninterrupted run; a finished one
returns without another step. Foreign or unreadable checkpoints warn and the
run starts again (the resumable-run helper :mod:`wslib.runs.resumable`, as
for the curves of :mod:`wslib.llpf.curves`, whose key it uses).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from wslib.core.files import code_version
from wslib.core.neurons import StateDict
from wslib.core.settings import Settings
from wslib.core.train import (
    PrecisionName,
    batch_indices,
    check_precision,
    model_device,
    note_device,
    on_device,
    precision_autocast,
)
from wslib.llpf.curves import checkpoint_key, missing_fields
from wslib.llpf.path import LLPFPath, check_same_architecture
from wslib.runs.resumable import Persist, Resumable
from wslib.runs.store import Payload

# The modules whose source determines an AutoNEB run (its checkpoint key).
CODE = (
    "wslib.core.settings",
    "wslib.core.train",
    "wslib.core.recipes",
    "wslib.llpf.autoneb",
    "wslib.llpf.curves",
    "wslib.llpf.path",
    "wslib.runs.resumable",
    "wslib.runs.store",
)
FIELDS = ("chain", "buffers", "steps")
CHECKPOINT_EVERY = 1  # cycles between saves when ``persist`` does not say


class _Flat:
    """Flatten the parameters of a model to one vector and back."""

    def __init__(self, model: nn.Module) -> None:
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.sizes = [p.numel() for _, p in model.named_parameters()]

    def flat(self, state: StateDict) -> torch.Tensor:
        return torch.cat([state[n].reshape(-1).float() for n in self.names])

    def unflat(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(vec, self.sizes)
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes)}


def _loss(
    probe: nn.Module, flat: _Flat, buffers: dict, vec: torch.Tensor, xb, yb
) -> torch.Tensor:
    return nn.functional.cross_entropy(
        functional_call(probe, {**flat.unflat(vec), **buffers}, xb), yb
    )


@dataclass(frozen=True, kw_only=True)
class AutoNEBSettings(Settings):
    """An AutoNEB run's options, checked when written; all of them enter its key.

    ``n_init`` pivots between the ends to start; ``cycles`` cycles, cycle
    ``c`` at learning rate ``lrs[c]`` with spring constant ``spring``, of
    ``steps_per_cycle`` iterations, or, with ``total_steps``, exactly
    ``total_steps`` gradient steps in all (``round(total_steps * c /
    cycles)`` by the end of cycle ``c``); batches of ``batch_size``. After
    each cycle a pivot is inserted where ``check_points`` points between two
    pivots, on ``check_examples`` training examples, rise more than
    ``insert_tol`` above them, up to ``max_pivots``. With ``precision``
    ``"bf16"`` the gradients' forward passes run under bfloat16 autocast (the
    pivots and the insertion checks stay in float32).
    """

    n_init: int = 3
    cycles: int = 4
    steps_per_cycle: int = 100
    lrs: Sequence[float] = (0.1, 0.05, 0.02, 0.01)
    spring: float = 1.0
    batch_size: int = 128
    insert_tol: float = 0.05
    check_points: int = 3
    check_examples: int = 1024
    max_pivots: int = 12
    seed: int = 0
    total_steps: int | None = None
    precision: PrecisionName = "fp32"

    def __post_init__(self) -> None:
        if len(self.lrs) != self.cycles:
            raise ValueError(
                f"lrs needs one learning rate per cycle ({self.cycles}), "
                f"got {len(self.lrs)}"
            )
        if (
            self.n_init < 0
            or self.steps_per_cycle < 0
            or self.max_pivots < self.n_init + 2
        ):
            raise ValueError(
                "need n_init >= 0, steps_per_cycle >= 0 and max_pivots >= n_init + 2"
            )
        if self.total_steps is not None and (self.total_steps < 0 or self.n_init < 1):
            raise ValueError(
                f"total_steps needs n_init >= 1 and total_steps >= 0, got "
                f"n_init={self.n_init}, total_steps={self.total_steps}"
            )
        check_precision(self.precision)


def autoneb(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: AutoNEBSettings | None = None,
    *,
    persist: Persist | None = None,
) -> LLPFPath:
    """Relax an AutoNEB chain from ``a`` to ``b`` (:class:`AutoNEBSettings`;
    None: the defaults); return its pivots as a path.

    ``persist`` (:class:`wslib.runs.resumable.Persist`; None: no checkpoint,
    a progress bar): with a ``checkpoint`` (a file) the run is saved after
    every cycle (unless ``checkpoint_every`` says otherwise) and at the end,
    and resumes from it (see the module docstring); ``on_tick(c)`` is called
    after cycle ``c`` (1-based) is saved.
    """
    settings = settings or AutoNEBSettings()
    check_same_architecture(model, a, b)
    persist = persist or Persist()
    probe = copy.deepcopy(model).train()
    dev = model_device(probe)
    note_device(dev)
    flat = _Flat(probe)
    run = _resumable(probe, a, b, x, y, settings, persist)
    buffers = {n: v.clone() for n, v in probe.named_buffers()}
    va, vb = flat.flat(a).to(dev), flat.flat(b).to(dev)
    chain = [
        torch.lerp(va, vb, k / (settings.n_init + 1))
        for k in range(settings.n_init + 2)
    ]
    check = torch.randperm(len(x), generator=run.gen)[: settings.check_examples]
    saved = run.resume(lambda s: missing_fields(s, FIELDS))
    x, y = on_device(x, dev), y.to(dev)  # placed once: no batch copied per step
    xc, yc = x[check.to(dev)], y[check.to(dev)]
    steps = 0
    if saved is not None:
        chain = [v.to(dev) for v in saved["chain"]]
        with torch.no_grad():
            for n in buffers:
                buffers[n].copy_(saved["buffers"][n])
        steps = int(saved["steps"])

    def snapshot() -> Payload:
        return {
            "chain": torch.stack([v.detach() for v in chain]).cpu(),
            "buffers": {n: v.detach().cpu().clone() for n, v in buffers.items()},
            "steps": steps,
        }

    autocast = precision_autocast(dev, settings.precision)
    run.begin("AutoNEB")
    for c in range(run.tick, settings.cycles):
        iteration = 0
        while (todo := _todo(settings, c, iteration, len(chain), steps)) > 0:
            idx = batch_indices(len(x), settings.batch_size, run.gen, dev)
            grads = _gradients(
                chain[1 : todo + 1], probe, flat, buffers, x[idx], y[idx], autocast
            )
            chain = neb_step(chain, grads, settings.lrs[c], settings.spring)
            steps += todo
            iteration += 1
        chain = _insert_pivots(
            chain,
            probe,
            flat,
            buffers,
            xc,
            yc,
            settings.check_points,
            settings.insert_tol,
            settings.max_pivots,
        )
        run.count()
        run.settle(snapshot)
    run.end(snapshot)
    return LLPFPath.of_run(_states(chain, flat, a, b), steps, run.seconds, "autoneb")


def _resumable(
    probe: nn.Module,
    a: StateDict,
    b: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: AutoNEBSettings,
    persist: Persist,
) -> Resumable:
    """The run's progress, generator and checkpoint (keyed by the model, the
    ends, the data, every setting and the code; no key without a checkpoint)."""
    key = None
    if persist.checkpoint is not None:
        key = checkpoint_key(
            probe, a, b, x, y, **settings.key(), code=code_version(*CODE)
        )
    return Resumable(
        persist, "AutoNEB", key, settings.seed, settings.cycles, every=CHECKPOINT_EVERY
    )


def _todo(settings: AutoNEBSettings, c: int, iteration: int, n: int, steps: int) -> int:
    """How many inner pivots of a chain of ``n`` take a step at ``iteration`` of
    cycle ``c`` (0 or less: the cycle's steps are done), ``steps`` taken so far."""
    if settings.total_steps is None:
        return n - 2 if iteration < settings.steps_per_cycle else 0
    return min(n - 2, round(settings.total_steps * (c + 1) / settings.cycles) - steps)


def _gradients(
    pivots: Sequence[torch.Tensor],
    probe: nn.Module,
    flat: _Flat,
    buffers: dict[str, torch.Tensor],
    xb: torch.Tensor,
    yb: torch.Tensor,
    autocast: torch.autocast,
) -> list[torch.Tensor]:
    """The loss gradient at each of ``pivots`` on the batch ``xb``, ``yb``."""
    grads = []
    for pivot in pivots:
        p = pivot.detach().requires_grad_(True)
        with autocast:
            loss = _loss(probe, flat, buffers, p, xb, yb)
        (grad,) = torch.autograd.grad(loss, p)
        grads.append(grad)
    return grads


def _states(
    chain: Sequence[torch.Tensor], flat: _Flat, a: StateDict, b: StateDict
) -> list[StateDict]:
    """The chain's pivots as state dicts (``a``'s buffers; the last one is ``b``)."""
    states = []
    for vec in chain:
        state = {n: v.detach().cpu().clone() for n, v in a.items()}
        state.update({n: v.detach().cpu().clone() for n, v in flat.unflat(vec).items()})
        states.append(state)
    states[-1] = {n: v.detach().cpu().clone() for n, v in b.items()}
    return states


@torch.no_grad()
def neb_step(
    chain: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    lr: float,
    spring: float,
) -> list[torch.Tensor]:
    """One nudged-elastic-band update of the interior pivots ``1..len(grads)``.

    Each pivot moves by ``-lr * (g - (g . tau) tau) + lr * spring * (|p_{i+1} -
    p_i| - |p_i - p_{i-1}|) tau``, ``tau`` the unit central tangent
    ``p_{i+1} - p_{i-1}``: the loss gradient without its component along the
    chain, and a spring along it that evens out the neighbours' distances.
    All pivots are updated from the same (old) chain.
    """
    new = list(chain)
    for i, grad in enumerate(grads, start=1):
        prev, nxt = chain[i] - chain[i - 1], chain[i + 1] - chain[i]
        tau = chain[i + 1] - chain[i - 1]
        tau = tau / tau.norm().clamp_min(1e-12)
        grad_perp = grad - (grad @ tau) * tau
        force = spring * (nxt.norm() - prev.norm()) * tau
        new[i] = (chain[i] - lr * grad_perp + lr * force).detach()
    return new


@torch.no_grad()
def _insert_pivots(
    chain: list[torch.Tensor],
    probe: nn.Module,
    flat: _Flat,
    buffers: dict,
    xc: torch.Tensor,
    yc: torch.Tensor,
    check_points: int,
    tol: float,
    max_pivots: int,
) -> list[torch.Tensor]:
    """Insert a pivot in each segment whose dense loss exceeds the linear estimate by ``tol``."""
    losses = [float(_loss(probe, flat, buffers, p, xc, yc)) for p in chain]
    out = [chain[0]]
    for i in range(len(chain) - 1):
        if len(chain) + len(out) - i - 1 < max_pivots:
            fractions = [(j + 1) / (check_points + 1) for j in range(check_points)]
            excess = []
            for f in fractions:
                loss = float(
                    _loss(
                        probe,
                        flat,
                        buffers,
                        torch.lerp(chain[i], chain[i + 1], f),
                        xc,
                        yc,
                    )
                )
                excess.append(loss - ((1 - f) * losses[i] + f * losses[i + 1]))
            worst = max(range(check_points), key=lambda j: excess[j])
            if excess[worst] > tol:
                out.append(torch.lerp(chain[i], chain[i + 1], fractions[worst]))
        out.append(chain[i + 1])
    return out
