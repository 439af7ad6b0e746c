"""bookkit/plan.py: the seed stages as a job matrix, and the merge of jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bookkit import plan
from tests.conftest import NOTEBOOKS, SMOKE, copy_checkout, run_in


def job_folder(root: Path, nb: str, seed: int, value: float) -> Path:
    """What one job leaves in its checkout: a results file and an executed chapter."""
    result = root / f"results/cpu/seed-{seed}/{nb}.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"params": {"seed": seed}, "metrics": {"v": value}}))
    chapter = root / f"build/cpu/seed-{seed}/{nb}.ipynb"
    chapter.parent.mkdir(parents=True)
    chapter.write_text("{}")
    (chapter.parent / "run_times.json").write_text(json.dumps({nb: 10.0 + seed}))
    return root


def test_stage_0_is_every_chapter_on_seeds_0_to_4(tmp_path: Path) -> None:
    stage = plan.matrix(0, "cpu", tmp_path)
    assert stage["jobs"] == 5 * len(NOTEBOOKS) == len(stage["include"])
    assert {(j["nb"], j["seed"]) for j in stage["include"]} == {
        (nb, s) for nb in NOTEBOOKS for s in range(5)
    }
    times = json.loads(plan.runner.REFERENCE_TIMES.read_text())
    assert stage["longest_s"] == max(times[nb] for nb in NOTEBOOKS if nb in times)


def test_no_results_means_no_later_stage_jobs(tmp_path: Path) -> None:
    # nothing ran: every claim is "not run", none undecided
    assert plan.matrix(1, "cpu", tmp_path)["include"] == []


def test_jobs_merge_into_one_checkout_with_summaries(tmp_path: Path) -> None:
    one = job_folder(tmp_path / "one", "nb", 0, 1.0)
    two = job_folder(tmp_path / "two", "nb", 1, 3.0)
    root = tmp_path / "root"
    assert plan.merge([one, two], "cpu", root) == ["nb"]
    summary = json.loads((root / "results/cpu/seeds/nb.json").read_text())
    assert summary["metrics"]["v"]["values"] == {"0": 1.0, "1": 3.0}
    assert (root / "build/cpu/seed-1/nb.ipynb").exists()
    assert json.loads((root / "build/cpu/seed-1/run_times.json").read_text()) == {
        "nb": 11.0
    }


def test_the_jobs_wall_times_of_one_seed_are_joined(tmp_path: Path) -> None:
    one = job_folder(tmp_path / "one", "a", 0, 1.0)
    two = job_folder(tmp_path / "two", "b", 0, 2.0)
    root = tmp_path / "root"
    assert plan.merge([one, two], "cpu", root) == ["a", "b"]
    times = json.loads((root / "build/cpu/seed-0/run_times.json").read_text())
    assert times == {"a": 10.0, "b": 10.0}


def test_two_jobs_with_different_results_for_one_seed_are_refused(
    tmp_path: Path,
) -> None:
    one = job_folder(tmp_path / "one", "nb", 0, 1.0)
    two = job_folder(tmp_path / "two", "nb", 0, 2.0)
    with pytest.raises(ValueError, match="two jobs ran the same notebook and seed"):
        plan.merge([one, two], "cpu", tmp_path / "root")


def test_a_missing_job_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a folder of job results"):
        plan.merge([tmp_path / "absent"], "cpu", tmp_path / "root")


@pytest.mark.slow
def test_two_smoke_jobs_run_in_separate_checkouts_merge(tmp_path: Path) -> None:
    """One chapter with seeds 1 and 2, each in its own checkout as a matrix job
    runs it, merged into a third folder: both seeds summarised, files unchanged."""
    nb = "06_pathlifting"  # a short chapter
    folders = []
    for seed in (1, 2):
        folder = copy_checkout(tmp_path / f"job-{seed}")
        run_in(
            folder,
            ["-m", "bookkit", "run", "--profile", SMOKE, "--seed", str(seed), nb],
        )
        folders.append(folder)
    root = tmp_path / "merged"
    assert plan.merge(folders, SMOKE, root) == [nb]
    for seed, folder in zip((1, 2), folders):
        rel = f"results/{SMOKE}/seed-{seed}/{nb}.json"
        assert (root / rel).read_bytes() == (folder / rel).read_bytes()
        times = json.loads(
            (root / f"build/{SMOKE}/seed-{seed}/run_times.json").read_text()
        )
        assert set(times) == {nb}
    summary = json.loads((root / f"results/{SMOKE}/seeds/{nb}.json").read_text())
    assert set(summary["seeds"]) == {1, 2}
    with pytest.raises(ValueError, match="two jobs ran the same notebook and seed"):
        broken = folders[1] / f"results/{SMOKE}/seed-1/{nb}.json"
        broken.parent.mkdir(parents=True, exist_ok=True)
        broken.write_text(json.dumps({"params": {"seed": 1}, "metrics": {}}))
        plan.merge(folders, SMOKE, tmp_path / "again")
