"""Results files: what write_results stores, the environment block, the git commit."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from wslib.runs.results import (
    PACKAGES,
    Timings,
    environment,
    git_commit,
    to_jsonable,
    write_results,
)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_environment_names_versions_hardware_and_commit() -> None:
    env = environment()
    expected = {"python", "torch", *PACKAGES, "commit", "device", "devices_used"}
    expected |= {"threads"}
    assert set(env) == expected | {"hardware"}
    assert {"numpy", "scikit-learn", "POT", "captum", "papermill"} <= set(env)
    assert all(isinstance(env[name], str) and env[name] for name in PACKAGES)
    assert env["numpy"] == np.__version__


@needs_git
def test_git_commit_is_marked_dirty_when_the_tree_has_changes(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = git(tmp_path, "rev-parse", "--short=12", "HEAD")
    assert git_commit(tmp_path) == head
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(tmp_path) == f"{head}-dirty"


def test_git_commit_outside_a_repository_is_unknown(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"


def test_write_results_stores_metrics_timings_and_environment(tmp_path: Path) -> None:
    """Only these four: run.py adds the notebook, profile and parameters."""
    path = tmp_path / "deep" / "nb.json"
    metrics = {
        "acc": np.float32(0.5),
        "curve": torch.tensor([1.0, 2.0]),
        "nan": float("nan"),
        "by_seed": {0: np.array([1, 2])},
    }
    written = write_results(path, metrics, {"train": 1.5})
    stored = json.loads(path.read_text())
    assert stored == written
    assert set(stored) == {"metrics", "timings_s", "env", "finished"}
    assert abs(stored["finished"] - time.time()) < 60
    assert stored["metrics"] == {
        "acc": 0.5,
        "curve": [1.0, 2.0],
        "nan": None,
        "by_seed": {"0": [1, 2]},
    }
    assert stored["timings_s"] == {"train": 1.5}


def test_to_jsonable_keeps_plain_values_and_drops_non_finite() -> None:
    assert to_jsonable((1, "a", None, True)) == [1, "a", None, True]
    assert to_jsonable([math.inf, -math.inf, np.float64(2.5)]) == [None, None, 2.5]


def test_timings_add_up_per_name() -> None:
    timings = Timings()
    for _ in range(2):
        with timings("step"):
            pass
    assert set(timings) == {"step"} and timings["step"] >= 0
