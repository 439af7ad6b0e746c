"""The gpu profile's estimated time: each chapter's work times rates.

:func:`bookkit.gpu_work.chapter_work` counts what each chapter of a profile
computes (steps, evaluated examples, LLPF ticks, solves, CPU-side seconds)
from its parameters; :func:`seconds` turns a chapter's work into seconds at
a set of :class:`Rates` (measured by ``gpu_check.py`` on a device, or
:data:`ASSUMED`). The refinement steps per LLPF tick have a stated range
(:data:`TICK_STEPS`), so the estimate is a low / central / high triple, not
one number (:func:`estimate_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bookkit.gpu_work import Work, chapter_work, flops, model_info
from wslib.core.train import PrecisionName

RESNET = {"name": "resnet18", "in_shape": [3, 32, 32], "n_classes": 10, "width": 1.0}
EVAL_BATCH = 1024  # evaluation batch (forward only, a third of a training step)
PATHCOND_SWEEPS = 1000  # the solver's cap on a conv net (chapter 8), against 100 timed
TICK_STEPS = (20, 40, 200)
"""Refinement steps per LLPF tick at the gpu profile: low, central, high (assumed)."""
TICK_STEPS_SOURCE = (
    "low: r_min, the fewest a tick can take; central: the step budget the book's "
    "estimate has used; high: 10 x r_min, above the 3.5-8.6 x r_min that the cpu "
    "profile's chapter-3 paths took over 10 seeds and 4 architectures"
)


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work on the device (measured or assumed).

    ``step_s``: one ResNet-18 training step at ``batch`` with augmentation
    (fp32; ``bf16_step_s`` in bf16); ``floor_s``: one training step of a small
    MLP, the floor every step pays (launches, host syncs); ``refine_step_s``:
    one LLPF refinement step of ResNet-18 at ``batch``, the tick's own work
    (moves, the stop rule) included, and ``tick_steps`` refinement steps per
    tick, both from a pilot path at the gpu settings; ``eval_s``: one
    ResNet-18 example through the forward pass, data resident on the device;
    ``save_s``: one ``torch.save`` of a ResNet-18 state; ``solve_s``: one
    fusion least-squares solve of chapter 10's size; ``pathcond_s``: PathCond
    (diag G and 100 solver sweeps, float64) of a CIFAR-NV on the device.
    """

    step_s: float
    bf16_step_s: float
    floor_s: float
    refine_step_s: float
    tick_steps: float
    eval_s: float
    save_s: float
    solve_s: float
    pathcond_s: float
    batch: int = 256


ASSUMED = Rates(
    step_s=0.015,
    bf16_step_s=0.009,
    floor_s=0.0012,
    refine_step_s=0.016,
    tick_steps=40,
    eval_s=0.015 / 256 / 3,
    save_s=0.15,
    solve_s=0.05,
    pathcond_s=1.0,  # by reading: about 300 small kernels per sweep, none measured
)


# --- the estimate ----------------------------------------------------------------------


def seconds(
    items: list[Work], rates: Rates, precision: PrecisionName | None = None
) -> float:
    """Estimated seconds of ``items`` at ``rates``.

    Each item trains or refines in its own precision (``Work.bf16``, the
    profile as written), or all in ``precision`` when it is given. A training
    step of model ``m`` at batch ``b`` takes the ResNet-18 step time of its
    precision scaled by FLOPs (``flops(m) * b / (flops(ResNet-18) *
    rates.batch)``) but never less than the small-model floor; an evaluated
    example takes ``rates.eval_s`` scaled by FLOPs (floored per batch of
    :data:`EVAL_BATCH`); a tick takes ``rates.tick_steps`` refinement steps,
    each ``rates.refine_step_s`` scaled like a training step (in bf16 also by
    the bf16/fp32 ratio of training steps: LLPF's refinement, Bezier and
    AutoNEB take a ``precision``); saves scale with the number of parameters.
    """
    ref_flops = flops(RESNET)
    ref = ref_flops * rates.batch
    ref_params = model_info(RESNET)[1]
    speedup = rates.bf16_step_s / rates.step_s

    def in_bf16(w: Work) -> bool:
        return w.bf16 if precision is None else precision == "bf16"

    def step(model: dict, batch: int, per: float, runs: int = 1) -> float:
        return max(rates.floor_s, runs * per * flops(model) * batch / ref)

    def evaluation(model: dict, examples: float) -> float:
        per_batch = rates.eval_s * EVAL_BATCH * flops(model) / ref_flops
        return examples / EVAL_BATCH * max(rates.floor_s / 3, per_batch)

    total = 0.0
    for w in items:
        if w.kind == "train":
            assert w.model is not None  # train, eval and ticks name their model
            per = rates.bf16_step_s if in_bf16(w) else rates.step_s
            total += w.amount * step(w.model, w.batch, per, runs=w.runs)
        elif w.kind == "eval":
            assert w.model is not None
            total += evaluation(w.model, w.amount)
        elif w.kind == "floor":
            total += w.amount * rates.floor_s
        elif w.kind == "solve":
            total += w.amount * rates.solve_s
        elif w.kind == "pathcond":
            total += w.amount * rates.pathcond_s * PATHCOND_SWEEPS / 100
        elif w.kind == "cpu":
            total += w.amount
        elif w.kind == "ticks":
            assert w.model is not None
            per = rates.refine_step_s * (speedup if in_bf16(w) else 1.0)
            refine = rates.tick_steps * step(w.model, w.batch, per)
            records = w.amount / max(w.record_every, 1)
            evals = evaluation(w.model, records * w.eval_examples)
            saves = records * rates.save_s * model_info(w.model)[1] / ref_params
            total += w.amount * refine + evals + saves
    return total


def estimate_table(
    rates: Rates, params_file: str | Path | None = None, *, measured: bool = False
) -> str:
    """The per-chapter estimate as a Markdown table, in hours.

    ``fp32``: every item in fp32 at the central rates; ``low``, ``central``,
    ``high``: each item in its profile's precision (as written), with the
    refinement steps per LLPF tick at :data:`TICK_STEPS` (``rates.tick_steps``
    is the central value; ``measured``: it was measured, and low and high
    widen to include it).
    """
    work = chapter_work(params_file)
    low_steps, _, high_steps = TICK_STEPS
    central = rates.tick_steps
    cases = (
        replace(rates, tick_steps=min(low_steps, central)),
        rates,
        replace(rates, tick_steps=max(high_steps, central)),
    )
    lines = [
        "| chapter | fp32 h | low h | central h | high h |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    totals = [0.0] * 4
    for nb, items in work.items():
        hours = [seconds(items, rates, "fp32") / 3600]
        hours += [seconds(items, r) / 3600 for r in cases]
        totals = [t + h for t, h in zip(totals, hours, strict=True)]
        lines.append(f"| {nb} | " + " | ".join(f"{h:.1f}" for h in hours) + " |")
    lines.append("| **total** | " + " | ".join(f"**{h:.1f}**" for h in totals) + " |")
    note = "measured" if measured else "assumed"
    lines.append(
        f"\nrefinement steps per tick: low {cases[0].tick_steps:g}, central "
        f"{central:g} ({note}), high {cases[2].tick_steps:g}"
    )
    return "\n".join(lines)
