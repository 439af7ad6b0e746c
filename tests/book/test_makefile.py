"""The Makefile's book and sweep commands, as ``make -n`` prints them (nothing runs)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from bookkit import sweep
from tests.conftest import ROOT


def sweep_line(*args: str) -> str:
    """The one ``bookkit sweep`` command of ``make -n``."""
    (line,) = [c for c in recipe(*args) if "bin/bookkit sweep" in c]
    return line


def recipe(*args: str) -> list[str]:
    """The commands ``make -n`` would run, one per line."""
    done = subprocess.run(
        ["make", "-n", "-s", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [line.strip(" &\\") for line in done.stdout.splitlines()]


def test_book_with_seeds_sweeps_then_builds_from_every_seed() -> None:
    lines = recipe("book", "SEEDS=0 1 2 3 4")
    swept = sweep_line("book", "SEEDS=0 1 2 3 4")
    assert swept.endswith("--seeds 0 1 2 3 4")
    build = next(line for line in lines if "bin/bookkit build" in line)
    assert "build/cpu/seed-0 " in build + " "
    assert lines.index(swept) < lines.index(build)


def test_book_without_seeds_runs_one_seed() -> None:
    lines = recipe("book")
    assert not any("bookkit sweep" in line for line in lines)
    assert any("bin/bookkit run --profile cpu" in line for line in lines)


def test_sweep_names_its_notebooks_before_the_seeds() -> None:
    """``--seeds`` takes every word after it: the notebooks must come first."""
    line = sweep_line("sweep", "NB=03_llpf_m2m 07_pathcond_mlp", "SEEDS=0 1")
    argv = shlex.split(line)[2:]
    args = sweep.parse_args(argv)
    assert args.seeds == [0, 1]
    assert args.notebooks == ["03_llpf_m2m", "07_pathcond_mlp"]


def test_seed_and_seeds_together_are_refused() -> None:
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "book", "SEED=1", "SEEDS=0 1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "give SEED=N (one seed) or SEEDS" in done.stderr


@pytest.mark.parametrize("seeds", ["", "0 1 2"])
def test_sweep_defaults_to_three_seeds(seeds: str) -> None:
    args = ["sweep"] + ([f"SEEDS={seeds}"] if seeds else [])
    assert sweep_line(*args).endswith("--seeds 0 1 2")


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("yes", True), ("true", True), ("0", False), ("no", False)]
    + [("false", False), ("", False)],
)
def test_flags_mean_what_they_say(value: str, on: bool) -> None:
    assert ("--split" in sweep_line("sweep", f"SPLIT={value}")) is on
    publish = " ".join(recipe("publish", f"PUSH={value}", "GHP_IMPORT=ghp-import"))
    assert (" -p " in publish) is on


def test_a_flag_with_another_value_is_refused() -> None:
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "sweep", "ALLOW_CPU=maybe"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "ALLOW_CPU='maybe' is not a flag" in done.stderr
