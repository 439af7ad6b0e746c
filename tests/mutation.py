"""Mutation testing of wslib's algorithm and statistics modules with mutmut.

``python -m tests.mutation [MODULE ...] [--jobs J]`` (``make mutation``): every
module of :data:`MODULES` by default, or those named (``wslib/runs/verdicts.py``
or ``runs/verdicts``). mutmut generates the mistakes (a flipped comparison, a
changed constant, a dropped argument, ...) that the hand-written lists of
``make mutants`` do not think of. The modules of one package are mutated together in
a scratch copy of the checkout, against the fast tests of that package
(``tests/<package>``, not marked slow), and each module's counts are printed as one row of a table, which is also
written to ``build/mutation/table.md`` with each surviving mutant's diff beside
it (``build/mutation/<module>.md``). The table keeps the rows of modules
mutated by earlier runs (``build/mutation/<module>.json``), so that mutating a
package at a time still gives the table of every module.

A survivor is either killed by a new test or written down as equivalent (it
changes no behaviour) in ``tests/<package>/equivalent_mutants.yaml``: mutmut's
name of the mutant, then a one-line reason. An entry that names no surviving
mutant any more is reported as stale (mutmut numbers a function's mutants
anew when the function changes). The exit status is 1 unless every module
reaches :data:`GOAL`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.checkout import ROOT, copy_checkout

OUT = ROOT / "build" / "mutation"
GOAL = 0.90
"""The score each module must reach: killed / mutants that are not equivalent."""

CORE = ["matching", "interpolation", "train", "data", "seeds", "neurons", "stacked"]
CORE += ["connectivity", "files", "norms", "pooling", "configs", "settings", "recipes"]
RUNS = ["claims", "verdicts", "sweeps", "stats", "store", "resumable", "cache", "zoo"]
RUNS += ["results", "units", "stages", "steps"]
MODULES = [
    *(f"core/{m}" for m in CORE),
    *(f"runs/{m}" for m in RUNS),
    *(f"llpf/{m}" for m in ("layerwise", "ticks", "stages", "autoneb", "curves")),
    "llpf/evaluation",
    "llpf/methods",
    *(f"pathcond/{m}" for m in ("rescaling", "solver", "lifting", "enorm", "training")),
    *(f"fusion/{m}" for m in ("levels", "checks", "grouping", "retrofit", "hfkf")),
    *(f"fusion/{m}" for m in ("baselines", "residual", "taps")),
    "synthesis/alignment",
]
"""The modules mutated by default, as ``package/module`` under ``wslib``: the
algorithms, the statistics, and what computes a cache key (``files``,
``zoo``, ``cache``, ``resumable``)."""

DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
SURVIVED = {"survived", "no tests", "skipped", "suspicious"}
LINE = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+)$")


@dataclass
class Row:
    """The counts of one module."""

    module: str
    status: dict[str, str] = field(default_factory=dict)  # mutant -> mutmut status
    equivalent: dict[str, str] = field(default_factory=dict)  # survivor -> reason
    stale: list[str] = field(default_factory=list)

    def count(self, statuses: set[str]) -> int:
        return sum(s in statuses for s in self.status.values())

    @property
    def survivors(self) -> list[str]:
        return [
            m
            for m, s in self.status.items()
            if s in SURVIVED and m not in self.equivalent
        ]

    @property
    def score(self) -> float:
        live = len(self.status) - len(self.equivalent)
        return self.count(DETECTED) / live if live else 1.0

    def cells(self) -> list[str]:
        return [
            f"wslib/{self.module}.py",
            str(len(self.status)),
            str(self.count({"killed", "caught by type check"})),
            str(len(self.survivors)),
            str(self.count({"timeout", "segfault"})),
            str(len(self.equivalent)),
            f"{self.score:.1%}",
        ]


HEADER = ["module", "mutants", "killed", "survived", "timed out", "equivalent"]
HEADER += ["score"]


def module_name(arg: str) -> str:
    """``package/module`` from ``wslib/package/module.py`` or ``package/module``."""
    name = arg.removeprefix("wslib/").removesuffix(".py")
    if not (ROOT / "wslib" / f"{name}.py").is_file():
        raise SystemExit(f"error: no module wslib/{name}.py; give e.g. runs/verdicts")
    return name


def equivalents(package: str) -> dict[str, str]:
    """The equivalent mutants written down for ``package``: name -> reason."""
    path = ROOT / "tests" / package / "equivalent_mutants.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def scratch_copy(dest: Path, package: str, modules: list[str]) -> None:
    """The checkout's files (as git lists them) and ``.git`` in ``dest``, with a
    mutmut section that mutates ``modules`` against ``package``'s fast tests."""
    copy_checkout(dest)
    tops = sorted({p.name for p in dest.iterdir()} - {"wslib", "tests"})
    section = {
        "source_paths": ["wslib"],
        "only_mutate": [f"wslib/{m}.py" for m in modules],
        "also_copy": tops,  # the tests read the chapters, the Makefile, ...
        "pytest_add_cli_args_test_selection": [f"tests/{package}", "-m", "not slow"],
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
        # a mutant whose tests take 5 times their usual time has hung (timed
        # out: detected); at mutmut's default of 15, each such mutant of the
        # store's multi-process tests costs a minute
        "timeout_multiplier": 5.0,
    }
    toml = "\n[tool.mutmut]\n" + "".join(
        f"{key} = {json.dumps(value)}\n" for key, value in section.items()
    )
    with open(dest / "pyproject.toml", "a") as f:
        f.write(toml)


ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""mutmut stops a mutant's tests at a limit of CPU time (its timeout). On
several threads OpenMP's waiting threads spin, so under load a test's CPU time
grows far past its wall time and healthy mutants are stopped as "timed out"
(seen: most of core.train's and core.interpolation's mutants on 2 busy cores).
On one thread CPU time is the test's own work."""


def mutmut(copy: Path, *args: str) -> str:
    """Run mutmut in ``copy`` (one thread per process); its standard output."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **ONE_THREAD)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mutmut"), *args],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"error: mutmut {' '.join(args)} failed:\n"
            f"{(done.stdout + done.stderr)[-2000:]}"
        )
    return done.stdout


def mutate(package: str, modules: list[str], jobs: int) -> list[tuple[Row, str]]:
    """Run mutmut over ``modules`` of ``package`` in one scratch copy (the tests'
    coverage is collected once): each module's row and its survivors' diffs."""
    written = equivalents(package)
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy = Path(tmp)
        scratch_copy(copy, package, modules)
        mutmut(copy, "run", "--max-children", str(jobs))
        listed = mutmut(copy, "results", "--all", "true")
        found = {
            m["name"]: m["status"] for m in map(LINE.match, listed.splitlines()) if m
        }
        rows = []
        for module in modules:
            prefix = "wslib." + module.replace("/", ".") + "."
            row = Row(module, {k: v for k, v in found.items() if k.startswith(prefix)})
            mine = {k: v for k, v in written.items() if k.startswith(prefix)}
            row.equivalent = {
                k: v for k, v in mine.items() if row.status.get(k) in SURVIVED
            }
            row.stale = sorted(set(mine) - set(row.equivalent))
            diffs = "\n".join(
                f"## {name} ({row.status[name]})\n\n```diff\n{mutmut(copy, 'show', name)}```\n"
                for name in row.survivors
            )
            rows.append((row, diffs))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    live = sum(len(r.status) - len(r.equivalent) for r in rows)
    detected = sum(r.count(DETECTED) for r in rows)
    score = detected / live if live else 1.0
    lines.append(
        f"\nOverall: {detected} of {live} non-equivalent mutants detected ({score:.1%})."
    )
    return "\n".join(lines) + "\n"


def save(row: Row) -> None:
    """``row``'s counts in ``OUT/<module>.json``, for the tables of later runs."""
    keep = {"module": row.module, "status": row.status}
    keep |= {"equivalent": row.equivalent, "stale": row.stale}
    (OUT / f"{row.module.replace('/', '.')}.json").write_text(json.dumps(keep))


def saved() -> list[Row]:
    """The rows written by :func:`save`, in the order of :data:`MODULES`."""
    rows = {}
    for path in OUT.glob("*.json"):
        row = Row(**json.loads(path.read_text()))
        rows[row.module] = row
    order = {m: i for i, m in enumerate(MODULES)}
    return sorted(rows.values(), key=lambda r: order.get(r.module, len(order)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="default: every module of MODULES")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    modules = [module_name(m) for m in args.modules] or MODULES
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for package in dict.fromkeys(m.split("/")[0] for m in modules):
        mine = [m for m in modules if m.split("/")[0] == package]
        for row, diffs in mutate(package, mine, args.jobs):
            rows.append(row)
            name = row.module.replace("/", ".")
            save(row)
            (OUT / f"{name}.md").write_text(
                f"# Survivors of wslib/{row.module}.py\n\n{diffs}"
            )
            print("| " + " | ".join(row.cells()) + " |", flush=True)
            for entry in row.stale:
                print(
                    f"  stale entry in tests/{package}/equivalent_mutants.yaml: {entry}"
                )
    text = table(saved())
    (OUT / "table.md").write_text(text)
    print(text, end="")
    return 0 if all(r.score >= GOAL for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
