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

Gradient steps count one per interior pivot per iteration. BatchNorm layers
use batch statistics during relaxation and checks; :mod:`wslib.llpf.evaluation`
recomputes running statistics when it evaluates the result.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call
from tqdm.auto import tqdm

from wslib.core.neurons import StateDict
from wslib.llpf.path import LLPFPath, check_same_architecture


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


def autoneb(
    model: nn.Module,
    a: StateDict,
    b: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    n_init: int = 3,
    cycles: int = 4,
    steps_per_cycle: int = 100,
    lrs: Sequence[float] = (0.1, 0.05, 0.02, 0.01),
    spring: float = 1.0,
    batch_size: int = 128,
    insert_tol: float = 0.05,
    check_points: int = 3,
    check_examples: int = 1024,
    max_pivots: int = 12,
    seed: int = 0,
    progress: bool = True,
) -> LLPFPath:
    """Relax an AutoNEB chain from ``a`` to ``b``; return its pivots as a path."""
    check_same_architecture(model, a, b)
    if len(lrs) != cycles:
        raise ValueError(
            f"lrs needs one learning rate per cycle ({cycles}), got {len(lrs)}"
        )
    if n_init < 0 or steps_per_cycle < 0 or max_pivots < n_init + 2:
        raise ValueError(
            "need n_init >= 0, steps_per_cycle >= 0 and max_pivots >= n_init + 2"
        )
    probe = copy.deepcopy(model).train()
    dev = next(probe.parameters()).device
    flat = _Flat(probe)
    buffers = {n: v.clone() for n, v in probe.named_buffers()}
    va, vb = flat.flat(a).to(dev), flat.flat(b).to(dev)
    chain = [torch.lerp(va, vb, k / (n_init + 1)) for k in range(n_init + 2)]
    gen = torch.Generator().manual_seed(seed)
    check = torch.randperm(len(x), generator=gen)[:check_examples]
    xc, yc = x[check].to(dev), y[check].to(dev)
    steps = 0
    t0 = time.perf_counter()
    bar = tqdm(
        total=cycles * steps_per_cycle,
        desc="AutoNEB",
        disable=not progress,
        leave=False,
    )
    for lr in lrs:
        for _ in range(steps_per_cycle):
            idx = torch.randint(len(x), (batch_size,), generator=gen)
            xb, yb = x[idx].to(dev), y[idx].to(dev)
            new = list(chain)
            for i in range(1, len(chain) - 1):
                p = chain[i].detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(_loss(probe, flat, buffers, p, xb, yb), p)
                prev, nxt = chain[i] - chain[i - 1], chain[i + 1] - chain[i]
                tau = chain[i + 1] - chain[i - 1]
                tau = tau / tau.norm().clamp_min(1e-12)
                grad_perp = grad - (grad @ tau) * tau
                force = spring * (nxt.norm() - prev.norm()) * tau
                new[i] = (chain[i] - lr * grad_perp + lr * force).detach()
                steps += 1
            chain = new
            bar.update(1)
        chain = _insert_pivots(
            chain, probe, flat, buffers, xc, yc, check_points, insert_tol, max_pivots
        )
    bar.close()
    seconds = time.perf_counter() - t0
    states = []
    for vec in chain:
        state = {n: v.clone() for n, v in a.items()}
        state.update({n: v.detach().cpu().clone() for n, v in flat.unflat(vec).items()})
        states.append(state)
    states[-1] = {n: v.clone() for n, v in b.items()}
    return LLPFPath.of_run(states, steps, seconds, "autoneb")


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
