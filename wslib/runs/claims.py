"""The claims ledger: each headline claim, the metric that tests it, a verdict rule.

Every claim names the chapter (notebook) and the metric (a ``/``-joined key
path of its results file) that test it, and a rule written down before any
run: the claim holds when the metric (or its ratio to another metric of the
same run, ``per``) is below (``"<"``) or above (``">"``) a bound. The verdict
reads the per-seed values (:mod:`wslib.runs.sweeps`) and their summary:

- one seed: ``holds`` or ``does not hold`` for that seed;
- several seeds: ``holds`` when the whole 95% interval of the mean satisfies
  the rule, ``does not hold`` when none of it does, ``mixed`` when the
  interval straddles the bound;
- ``not run in this profile`` when the metric is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from wslib.runs.sweeps import summarise_seeds, summary

HOLDS, FAILS, MIXED, NOT_RUN = (
    "holds",
    "does not hold",
    "mixed",
    "not run in this profile",
)


@dataclass(frozen=True)
class Claim:
    """One claim and the rule that decides it."""

    id: str
    paper: str
    text: str
    chapter: str
    metric: str
    op: Literal["<", ">"]
    bound: float
    per: str | None = None

    @property
    def quantity(self) -> str:
        return self.metric if self.per is None else f"{self.metric} / {self.per}"

    @property
    def rule(self) -> str:
        return f"{self.quantity} {self.op} {self.bound:g}"

    def satisfied(self, value: float) -> bool:
        return value < self.bound if self.op == "<" else value > self.bound


def verdict(claim: Claim, stats: dict[str, Any] | None) -> str:
    """The claim's verdict from the metric's summary over seeds."""
    if stats is None:
        return NOT_RUN
    if stats["n"] == 1:
        return HOLDS if claim.satisfied(stats["mean"]) else FAILS
    low, high = stats["ci95"]
    inside = [claim.satisfied(low), claim.satisfied(high)]
    return HOLDS if all(inside) else FAILS if not any(inside) else MIXED


def claim_stats(
    claim: Claim, metrics: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """Per-seed values of the claim's quantity and their summary (None: not run)."""
    values = metrics.get(claim.metric, {}).get("values", {})
    if claim.per is not None:
        per = metrics.get(claim.per, {}).get("values", {})
        values = {s: v / per[s] for s, v in values.items() if per.get(s)}
    if not values:
        return None
    return {"values": values} | summary(list(values.values()))


def ledger(results_dir: Path, claims: tuple[Claim, ...]) -> list[dict[str, Any]]:
    """One row per claim: the claim, its quantity over seeds, the verdict."""
    metrics = {
        nb: summarise_seeds(results_dir, nb)["metrics"]
        for nb in sorted({c.chapter for c in claims})
    }
    rows = []
    for claim in claims:
        stats = claim_stats(claim, metrics[claim.chapter])
        rows.append({"claim": claim, "stats": stats, "verdict": verdict(claim, stats)})
    return rows


PAPERS = {
    "foundations": "Foundations (chapter 1)",
    "llpf": "Low-Loss Path Finding",
    "pathcond": "PathCond",
    "fusion": "HF / KF fusion",
}

CHAPTER_1 = "01_symmetries"
CLAIMS: tuple[Claim, ...] = (
    *(
        Claim(
            f"barrier-{name}",
            "foundations",
            f"Two independently trained {name} modes are separated by a loss "
            "barrier on the straight line between them.",
            CHAPTER_1,
            f"{name}/linear_barrier",
            ">",
            0.1,
        )
        for name in ("mlp", "cnn", "resnet")
    ),
    *(
        Claim(
            f"alignment-{name}",
            "foundations",
            f"Aligning the {name}'s neurons (weight matching) removes at least "
            "half of that barrier.",
            CHAPTER_1,
            f"{name}/aligned_barrier",
            "<",
            0.5,
            per=f"{name}/linear_barrier",
        )
        for name in ("mlp", "cnn", "resnet")
    ),
    *(
        Claim(
            f"symmetry-{kind}",
            "foundations",
            f"A {kind} of ReLU neurons leaves the function unchanged (largest "
            "output change below float32 noise).",
            CHAPTER_1,
            f"{kind}_invariance_max_abs_diff",
            "<",
            1e-4,
        )
        for kind in ("permutation", "rescaling")
    ),
)
