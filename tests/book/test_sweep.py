"""bookkit/sweep.py: one job per (notebook, seed), resumable, failures named.

The sweeps run a tiny notebook in a temporary repository root holding copies
of run.py and sweep.py, as separate processes, the way ``make sweep`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import script_repo, write_notebook

BODY = (
    "from wslib.runs.results import write_results\n\n"
    'write_results(results_path, {"value": 10 * seed + width}, {})'
)


def tiny_notebook(path: Path, body: str = BODY) -> None:
    parameters = 'profile = "cpu"\nresults_path = "r.json"\nseed = 0\nwidth = 3'
    write_notebook(path, parameters, body)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A repository root with the scripts (run.py, part.py, sweep.py, ...), one tiny notebook and a cpu profile."""
    tiny_notebook(script_repo(tmp_path) / "00_tiny.md")
    return tmp_path


def sweep(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookkit", "sweep", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )


def value(repo: Path, seed: int) -> float:
    results = json.loads((repo / f"results/cpu/seed-{seed}/00_tiny.json").read_text())
    return results["metrics"]["value"]


def test_each_seed_is_a_job_and_the_seeds_are_summarised(repo: Path) -> None:
    done = sweep(repo, "--seeds", "1", "2", "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert (value(repo, 1), value(repo, 2)) == (13, 23)
    summary = json.loads((repo / "results/cpu/seeds/00_tiny.json").read_text())
    stats = summary["metrics"]["value"]
    assert summary["seeds"] == [1, 2]
    assert stats["values"] == {"1": 13.0, "2": 23.0}
    assert (stats["n"], stats["mean"]) == (2, 18.0)
    assert "2/2 done, 0 running, 0 failed" in done.stdout


def test_a_restarted_sweep_runs_only_what_is_missing(repo: Path) -> None:
    assert sweep(repo, "--seeds", "1", "2").returncode == 0
    kept = repo / "results/cpu/seed-1/00_tiny.json"
    stamp = kept.stat().st_mtime_ns
    # a job killed mid-run leaves no results file (run.py removes it first)
    (repo / "results/cpu/seed-2/00_tiny.json").unlink()
    again = sweep(repo, "--seeds", "1", "2")
    assert again.returncode == 0, again.stderr
    assert "2 jobs, 1 already done" in again.stdout
    assert kept.stat().st_mtime_ns == stamp
    assert value(repo, 2) == 23


def test_an_edited_notebook_reruns_its_jobs(repo: Path) -> None:
    assert sweep(repo, "--seeds", "1").returncode == 0
    tiny_notebook(repo / "notebooks/00_tiny.md", BODY.replace("10 *", "100 *"))
    again = sweep(repo, "--seeds", "1")
    assert "1 jobs, 0 already done" in again.stdout
    assert value(repo, 1) == 103


def test_a_failed_job_is_named_and_the_others_go_on(repo: Path) -> None:
    failing = BODY.replace(
        "write_results(", "assert seed != 2, 'planted'\nwrite_results("
    )
    tiny_notebook(repo / "notebooks/00_tiny.md", failing)
    done = sweep(repo, "--seeds", "1", "2")
    assert done.returncode == 1
    assert "00_tiny seed 2 failed" in done.stderr
    assert "build/cpu/seed-2/00_tiny.ipynb" in done.stderr
    assert "planted" in done.stderr
    assert value(repo, 1) == 13


def test_the_cluster_path_runs_through_submitit(repo: Path) -> None:
    config = repo / "sweep.yaml"
    config.write_text("cluster: local\ntimeout_min: 5\n")
    done = sweep(repo, "--seeds", "1", "2", "--executor", "slurm")
    assert done.returncode == 0, done.stderr
    assert (value(repo, 1), value(repo, 2)) == (13, 23)
    assert list((repo / "build/submitit").iterdir())  # submitit's job folder


def test_an_unknown_cluster_setting_is_named(repo: Path) -> None:
    (repo / "sweep.yaml").write_text("cluster: local\npartiton: gpu\n")
    done = sweep(repo, "--seeds", "1", "--executor", "slurm")
    assert done.returncode != 0
    assert "sweep.yaml sets partiton; valid:" in done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cluster: pbs\n", "sets cluster to 'pbs'; valid: slurm local debug"),
        ("timeout_min: ten\n", "sets timeout_min to 'ten'; give a whole number"),
        ("mem_gb: [32]\n", "sets mem_gb to [32]; give a whole number"),
        ("- partition\n", "must map settings to values"),
        ("partition: [gpu\n", "is not valid YAML"),
    ],
)
def test_a_bad_cluster_setting_is_named(repo: Path, text: str, message: str) -> None:
    (repo / "sweep.yaml").write_text(text)
    done = sweep(repo, "--seeds", "1", "--executor", "slurm")
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr


def test_the_seed_make_book_ran_is_not_run_again(repo: Path) -> None:
    book = subprocess.run(
        [sys.executable, "-m", "bookkit", "run", "--profile", "cpu"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert book.returncode == 0, book.stderr
    done = sweep(repo, "--seeds", "0", "1")
    assert done.returncode == 0, done.stderr
    assert "2 jobs, 1 already done" in done.stdout
    # make book's run is adopted as seed 0's: make book SEEDS=... builds from it
    assert (repo / "build/cpu/seed-0/00_tiny.ipynb").is_file()
    assert (repo / "results/cpu/seed-0/00_tiny.json").read_text() == (
        repo / "results/cpu/00_tiny.json"
    ).read_text()
    summary = json.loads((repo / "results/cpu/seeds/00_tiny.json").read_text())
    assert summary["metrics"]["value"]["values"] == {"0": 3.0, "1": 13.0}


def test_auto_seeds_run_stage_0_and_stop_when_nothing_is_undecided(repo: Path) -> None:
    done = sweep(repo, "--seeds", "auto")
    assert done.returncode == 0, done.stderr
    assert [value(repo, s) for s in range(5)] == [3, 13, 23, 33, 43]
    assert "stage 0: seeds 0-4 of 1 notebook(s): 00_tiny" in done.stdout
    assert "stage 1: every claim is decided; no more seeds" in done.stdout
    assert not (repo / "results/cpu/seed-5").exists()


@pytest.mark.parametrize("seeds", [["auto", "1"], ["one"], ["1.5"]])
def test_seeds_are_whole_numbers_or_auto(repo: Path, seeds: list[str]) -> None:
    done = sweep(repo, "--seeds", *seeds)
    assert done.returncode == 2
    assert "--seeds takes whole numbers or the one word auto" in done.stderr
