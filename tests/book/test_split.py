"""bookkit/part.py: a split chapter's units fill every cache its notebook reads.

For each split notebook, in a temporary checkout (copies of ``wslib/``,
``notebooks/`` and the MNIST-1D files, empty caches): run all of its smoke
units, then the notebook with ``WSLIB_CACHED_ONLY=1`` (any cache asked to
compute raises). The notebook must succeed and report the metrics of the smoke
book's unsplit run, wall-clock timings aside: the units computed the same
pieces, with the same keys and values, as the notebook would have.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bookkit import part
from tests.conftest import ROOT, SMOKE, WORK, run_main, script_env
from wslib.core import workspace

SPLIT = sorted(part.SPLIT)
TIMING = re.compile(r"seconds|time|wall|_s$|over_epoch")  # wall-clock metric keys


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A repository root with the library, the tooling, the notebooks and MNIST-1D;
    no caches.

    One per test, so that no chapter's units fill a cache another chapter's
    notebook reads.
    """
    root = tmp_path
    skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for source, folder in (
        (ROOT, "wslib"),
        (ROOT, "bookkit"),
        (ROOT, "notebooks"),
        (WORK, "data/mnist1d"),
    ):
        if (source / folder).exists():
            shutil.copytree(source / folder, root / folder, ignore=skip)
    return root


def run(checkout: Path, *args: str, cached_only: bool = False) -> None:
    env = script_env(checkout, **({"WSLIB_CACHED_ONLY": "1"} if cached_only else {}))
    done = subprocess.run(
        [sys.executable, *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def untimed(metrics: Any) -> Any:
    """``metrics`` without the entries whose key names a wall-clock time."""
    if isinstance(metrics, dict):
        return {k: untimed(v) for k, v in metrics.items() if not TIMING.search(k)}
    if isinstance(metrics, list):
        return [untimed(v) for v in metrics]
    return metrics


def metrics(path: Path) -> Any:
    return untimed(json.loads(path.read_text())["metrics"])


@pytest.mark.slow  # it runs notebooks, and compares with the smoke book
@pytest.mark.parametrize("nb", SPLIT)
def test_units_fill_every_cache_the_notebook_reads(
    checkout: Path, smoke_book: Path, nb: str
) -> None:
    run(checkout, "-m", "bookkit", "part", "--profile", SMOKE, nb)
    run(checkout, "-m", "bookkit", "run", "--profile", SMOKE, nb, cached_only=True)
    split = metrics(checkout / "results" / SMOKE / f"{nb}.json")
    assert split == metrics(WORK / "results" / SMOKE / f"{nb}.json")


def test_a_missing_unit_is_named(checkout: Path) -> None:
    """A cached-only run at a seed whose units never ran names what is missing."""
    nb = SPLIT[0]
    env = script_env(checkout, WSLIB_CACHED_ONLY="1")
    done = subprocess.run(
        [sys.executable, "-m", "bookkit", "run", "--profile", SMOKE, "--seed", "9", nb],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "is not cached" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["01_symmetries"], "unknown split notebook '01_symmetries'"),
        (["03_llpf_m2m", "no such unit"], "has no unit 'no such unit'"),
        (["--profile", "tpu", "03_llpf_m2m"], "unknown profile 'tpu'"),
        pytest.param(
            ["--profile", "gpu", "05_llpf_spheres"],
            "needs a CUDA device",
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="a GPU is here: it would run"
            ),
        ),
    ],
)
def test_bad_part_arguments_are_named(args: list[str], message: str) -> None:
    done = run_main(part, *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_list_names_each_unit_with_its_stage() -> None:
    done = run_main(part, "--profile", "gpu", "05_llpf_spheres", "--list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "stage 1: hybrid" in lines
    assert lines == sorted(lines, key=lambda line: int(line.split(":")[0][6:]))


def test_units_use_the_repository_as_workspace_wherever_they_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No change of working folder: the caches' root is set for the units."""
    monkeypatch.delenv(workspace.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()  # part computes on one thread
    try:
        assert part.main(["--profile", "smoke", "03_llpf_m2m", "--list"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert os.environ[workspace.ENV] == str(ROOT)
    assert Path.cwd() == tmp_path
