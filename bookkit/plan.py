"""The seed stages as a job matrix, and the merge of jobs run on other machines.

Usage::

    bookkit plan matrix --stage K [--profile cpu]
    bookkit plan merge FOLDER [FOLDER ...] [--profile cpu]

``matrix`` prints stage ``K`` of :mod:`wslib.runs.stages` as one JSON line,
``{"include": [{"nb": ..., "seed": ...}, ...], "jobs": n, "longest_s": s}``:
every (notebook, seed) the stage runs given the results present under
``results/<profile>/`` (at stage 0 every notebook, seeds 0-4; later only the
notebooks with an undecided claim), and the longest job's expected seconds
(``notebooks/reference_times.json``, measured on one core of a 2-core
machine). The publishing workflow turns it into a GitHub Actions matrix;
``make book SEEDS=auto`` and ``make sweep SEEDS=auto EXECUTOR=slurm`` follow
the same stages (``bookkit/sweep.py``).

``merge`` copies what each job left in its own checkout (``FOLDER``: its
``results/<profile>/seed-*/`` files and ``build/<profile>/seed-*/`` executed
chapters) into this checkout, joins the jobs' wall times per seed
(``run_times.json``, which the book's course guide reads) and summarises every
notebook's seeds. The same (notebook, seed) from two folders with different
results is refused: two jobs never share a seed.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
from pathlib import Path

from bookkit import profiles
from bookkit import run as runner
from wslib.runs.stages import STAGES, stage_jobs
from wslib.runs.sweeps import write_summary


def matrix(stage: int, profile: str, root: Path) -> dict[str, object]:
    """Stage ``stage``'s jobs, given the results under ``root``, as a GitHub
    Actions matrix, with their count and the longest job's expected seconds
    (None: no reference time)."""
    results = root / "results" / profile
    jobs = stage_jobs(stage, profiles.available_notebooks(), results)
    expected = (
        json.loads(runner.REFERENCE_TIMES.read_text()) if profile == "cpu" else {}
    )
    times = [expected[nb] for nb, _ in jobs if nb in expected]
    return {
        "include": [{"nb": nb, "seed": seed} for nb, seed in jobs],
        "jobs": len(jobs),
        "longest_s": max(times, default=None),
    }


def job_files(folder: Path, profile: str) -> list[Path]:
    """The files one job left: results and executed chapters of its seeds (relative)."""
    patterns = (f"results/{profile}/seed-*/*.json", f"build/{profile}/seed-*/*.ipynb")
    return sorted(p.relative_to(folder) for pat in patterns for p in folder.glob(pat))


def merge(folders: list[Path], profile: str, root: Path) -> list[str]:
    """Copy every job's files into ``root``; return the notebooks merged.

    Raises ValueError when two folders hold different results for the same
    (notebook, seed)."""
    source: dict[Path, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder of job results")
        for rel in job_files(folder, profile):
            first = source.setdefault(rel, folder)
            if first != folder and rel.suffix == ".json":
                if not filecmp.cmp(first / rel, folder / rel, shallow=False):
                    raise ValueError(
                        f"{rel} differs between {first} and {folder}: two jobs ran "
                        "the same notebook and seed; keep one"
                    )
    for rel, folder in source.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(folder / rel, root / rel)
    join_run_times(folders, profile, root)
    notebooks = sorted({rel.stem for rel in source if rel.suffix == ".json"})
    for nb in notebooks:
        write_summary(root / "results" / profile, nb)
    return notebooks


def join_run_times(folders: list[Path], profile: str, root: Path) -> None:
    """Join every job's ``build/<profile>/seed-*/run_times.json`` into ``root``'s,
    one file per seed (each job timed its own notebooks)."""
    joined: dict[Path, dict[str, float]] = {}
    for folder in [root, *folders]:
        for path in folder.glob(f"build/{profile}/seed-*/run_times.json"):
            rel = path.relative_to(folder)
            joined.setdefault(rel, {}).update(json.loads(path.read_text()))
    for rel, times in joined.items():
        text = json.dumps(dict(sorted(times.items())), indent=2) + "\n"
        (root / rel).write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("matrix", help="one stage's (notebook, seed) jobs")
    plan.add_argument("--stage", type=int, required=True, choices=range(len(STAGES)))
    plan.add_argument("--profile", default="cpu")
    joined = commands.add_parser("merge", help="copy jobs' results here")
    joined.add_argument("folders", type=Path, nargs="+")
    joined.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    if args.profile not in profiles.available_profiles():
        runner.fail_usage("profile", args.profile, profiles.available_profiles())
    if args.command == "matrix":
        print(json.dumps(matrix(args.stage, args.profile, profiles.ROOT)))
        return 0
    try:
        merged = merge(args.folders, args.profile, profiles.ROOT)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"merged {len(merged)} notebook(s): {' '.join(merged)}")
    return 0
