"""The seed stages of ``SEEDS=auto``: more seeds only where a claim is undecided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wslib.runs.claims import Claim
from wslib.runs.stages import STAGES, stage_jobs, stage_notebooks, undecided_chapters
from wslib.runs.verdicts import LOOKS

SMALL = Claim("s", "llpf", "x is small", "a", "x", "<", 0.1)
OTHER = Claim("o", "llpf", "y is small", "b", "y", "<", 0.1)


def write_seeds(root: Path, nb: str, metric: str, values: list[float]) -> None:
    for seed, v in enumerate(values):
        path = root / f"seed-{seed}" / f"{nb}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"params": {"seed": seed}, "metrics": {metric: v}}))


def test_the_stages_end_at_the_ledgers_looks() -> None:
    assert STAGES == (tuple(range(5)), tuple(range(5, 10)), tuple(range(10, 20)))
    assert tuple(s[-1] + 1 for s in STAGES) == LOOKS


def test_stage_0_runs_every_notebook_on_seeds_0_to_4(tmp_path: Path) -> None:
    jobs = stage_jobs(0, ["a", "b"], tmp_path, (SMALL, OTHER))
    assert jobs == [(nb, s) for nb in ("a", "b") for s in range(5)]


def test_later_stages_run_only_the_chapters_still_undecided(tmp_path: Path) -> None:
    write_seeds(tmp_path, "a", "x", [0.01, 0.02, 0.03, 0.02, 0.01])  # holds
    write_seeds(tmp_path, "b", "y", [0.02, 0.3, 0.05, 0.2, 0.01])  # undecided
    assert undecided_chapters(tmp_path, (SMALL, OTHER)) == {"b"}
    assert stage_notebooks(1, ["a", "b", "c"], tmp_path, (SMALL, OTHER)) == ["b"]
    assert stage_jobs(2, ["a", "b"], tmp_path, (SMALL, OTHER)) == [
        ("b", s) for s in range(10, 20)
    ]


def test_a_decided_ledger_adds_no_seeds(tmp_path: Path) -> None:
    write_seeds(tmp_path, "a", "x", [0.01, 0.02, 0.03, 0.02, 0.01])
    assert stage_jobs(1, ["a"], tmp_path, (SMALL,)) == []


@pytest.mark.parametrize("stage", [-1, len(STAGES)])
def test_an_unknown_stage_is_named(tmp_path: Path, stage: int) -> None:
    with pytest.raises(ValueError, match="stage must be 0 to 2"):
        stage_notebooks(stage, ["a"], tmp_path, (SMALL,))
