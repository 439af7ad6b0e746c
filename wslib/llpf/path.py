"""The result of every path finder: recorded points along a path and their cost."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from wslib.core.neurons import StateDict


@dataclass
class LLPFPath:
    """A path found by LLPF (or another path finder): recorded points and their cost.

    Attributes
    ----------
    states : list of state dicts, first = start, last = end of the path.
    ticks : tick of each recorded state (a running index for other methods).
    grad_steps : cumulative number of gradient steps at each recorded state.
    seconds : cumulative wall time (s) at each recorded state.
    refine_loss : moving-average batch loss at the end of each tick's
        refinement (what the stop rule saw; not an evaluation).
    phase : name of the phase each recorded state belongs to ("m2m", "m2o").
    """

    states: list[StateDict] = field(default_factory=list)
    ticks: list[int] = field(default_factory=list)
    grad_steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    refine_loss: list[float] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)

    @property
    def total_grad_steps(self) -> int:
        return self.grad_steps[-1] if self.grad_steps else 0

    @property
    def total_seconds(self) -> float:
        return self.seconds[-1] if self.seconds else 0.0

    @classmethod
    def of_run(
        cls, states: list[StateDict], grad_steps: int, seconds: float, phase: str
    ) -> LLPFPath:
        """The points of a method that spends all its steps before returning them (curves, AutoNEB)."""
        n = len(states)
        return cls(
            states,
            list(range(n)),
            [0] * (n - 1) + [grad_steps],
            [0.0] * (n - 1) + [seconds],
            [],
            [phase] * n,
        )

    def extend(self, other: LLPFPath) -> LLPFPath:
        """This path followed by ``other`` (whose first state repeats our last one)."""
        steps, secs, tick = (
            self.total_grad_steps,
            self.total_seconds,
            self.ticks[-1] if self.ticks else 0,
        )
        return LLPFPath(
            self.states + other.states[1:],
            self.ticks + [tick + t for t in other.ticks[1:]],
            self.grad_steps + [steps + g for g in other.grad_steps[1:]],
            self.seconds + [secs + s for s in other.seconds[1:]],
            self.refine_loss + other.refine_loss,
            self.phase + other.phase[1:],
        )


def check_same_architecture(model: nn.Module, *states: StateDict) -> None:
    """Raise ``ValueError`` unless every state has exactly the model's tensors and shapes, all finite."""
    ref = model.state_dict()
    for i, state in enumerate(states):
        missing, extra = ref.keys() - state.keys(), state.keys() - ref.keys()
        if missing or extra:
            raise ValueError(
                f"state {i} does not fit {type(model).__name__} (missing: {sorted(missing)[:3]}, "
                f"unexpected: {sorted(extra)[:3]}); connect two models of the same architecture"
            )
        bad = [k for k in ref if ref[k].shape != state[k].shape]
        if bad:
            k = bad[0]
            raise ValueError(
                f"state {i}: tensor {k} has shape {tuple(state[k].shape)}, the model expects "
                f"{tuple(ref[k].shape)}; connect two models of the same architecture and width"
            )
        bad = [
            k
            for k in ref
            if state[k].is_floating_point() and not bool(torch.isfinite(state[k]).all())
        ]
        if bad:
            raise ValueError(
                f"state {i}: tensor {bad[0]} (and {len(bad) - 1} more) holds NaN or "
                "infinite values; connect two trained models with finite weights"
            )
