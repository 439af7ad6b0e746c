"""The stages of ``make book SEEDS=auto``: seeds added until every claim is decided.

The rule is fixed before any run. Stage 0 runs seeds 0-4 of every chapter;
stage 1 adds seeds 5-9, and stage 2 seeds 10-19, only to the chapters that
still hold an undecided claim in the ledger after the stage before. The stage
boundaries are the ledger's looks (:data:`wslib.runs.verdicts.LOOKS`), whose
level is corrected for them (Bonferroni), so adding seeds until an answer
appears does not manufacture answers. The same plan drives the local sweep,
Slurm and the publishing workflow's job matrix (``bookkit/plan.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from wslib.runs.claim_list import CLAIMS
from wslib.runs.claims import UNDECIDED, Claim, ledger
from wslib.runs.verdicts import LOOKS

STAGES: tuple[tuple[int, ...], ...] = tuple(
    tuple(range(start, end)) for start, end in zip((0, *LOOKS[:-1]), LOOKS)
)
"""The seeds of each stage: 0-4, 5-9, 10-19."""


def undecided_chapters(results_dir: Path, claims: Sequence[Claim] = CLAIMS) -> set[str]:
    """The chapters with at least one undecided claim in the ledger of ``results_dir``."""
    rows = ledger(results_dir, tuple(claims))
    return {r["claim"].chapter for r in rows if r["verdict"] == UNDECIDED}


def stage_notebooks(
    stage: int,
    notebooks: Iterable[str],
    results_dir: Path,
    claims: Sequence[Claim] = CLAIMS,
) -> list[str]:
    """The notebooks stage ``stage`` runs: all of them at stage 0, afterwards those
    whose claims are still undecided after the seeds of the stages before."""
    if not 0 <= stage < len(STAGES):
        raise ValueError(f"stage must be 0 to {len(STAGES) - 1}, got {stage}")
    notebooks = list(notebooks)
    if stage == 0:
        return notebooks
    open_ = undecided_chapters(results_dir, claims)
    return [nb for nb in notebooks if nb in open_]


def stage_jobs(
    stage: int,
    notebooks: Iterable[str],
    results_dir: Path,
    claims: Sequence[Claim] = CLAIMS,
) -> list[tuple[str, int]]:
    """Every (notebook, seed) of stage ``stage``."""
    chosen = stage_notebooks(stage, notebooks, results_dir, claims)
    return [(nb, seed) for nb in chosen for seed in STAGES[stage]]
