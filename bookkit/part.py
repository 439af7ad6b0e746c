"""Run units of a chapter's work (see :mod:`wslib.runs.units`) outside its notebook.

Usage::

    bookkit part --profile gpu --seed 0 03_llpf_m2m --list
    bookkit part --profile gpu --seed 0 03_llpf_m2m [UNIT ...]

The units come from the notebook's effective parameters (its defaults, the
profile, the seed), as in ``run.py``; each fills the cache the notebook reads.
Without unit names every unit runs, stage by stage. ``bookkit sweep --split`` sends
each unit to a job of its own. Chapters not in :data:`SPLIT` are one job each:
they take under an hour on one GPU by the estimate of ``gpu_check.py``.

Exit status: 0 on success, 1 when a unit fails, 2 for an unknown profile,
notebook, parameter or unit.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any

from bookkit import profiles
from bookkit import run as runner
from wslib.core import workspace
from wslib.runs.units import Unit, by_stage

# The chapters split into units: notebook -> "module:function(params) -> units".
SPLIT = {
    "03_llpf_m2m": "wslib.llpf.units:m2m_units",
    "04_llpf_baselines": "wslib.llpf.units:baseline_units",
    "05_llpf_spheres": "wslib.llpf.units:sphere_units",
    "07_pathcond_mlp": "wslib.pathcond.units:mlp_units",
    "08_pathcond_conv": "wslib.pathcond.units:conv_units",
}


def parameters(nb: str, profile: str, seed: int | None) -> dict[str, Any]:
    """The parameters ``nb`` runs with at ``profile`` and ``seed`` (as in ``run.py``)."""
    return profiles.effective_parameters(
        nb, profiles.notebook_parameters(nb, profile, seed)
    )


def chapter_units(nb: str, params: dict[str, Any]) -> list[Unit]:
    """The units of ``nb`` run with ``params`` (empty when it is not split)."""
    if nb not in SPLIT:
        return []
    module, function = SPLIT[nb].split(":")
    units = getattr(importlib.import_module(module), function)(params)
    by_stage(units)  # unique names
    return units


def run_units(units: list[Unit], seed: int) -> None:
    """Run ``units`` stage by stage, each from the chapter's seed, printing times."""
    from wslib.core.train import seed_everything  # torch: not for a sweep's import

    for stage in by_stage(units):
        for unit in stage:
            start = time.perf_counter()
            seed_everything(seed)
            unit.run()
            print(f"{unit.name}: {time.perf_counter() - start:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--list", action="store_true", help="print the units, run none")
    parser.add_argument(
        "--allow-cpu", action="store_true", help="run a gpu profile without CUDA"
    )
    parser.add_argument("notebook")
    parser.add_argument("units", nargs="*", metavar="UNIT")
    args = parser.parse_args(argv)
    if args.profile not in profiles.available_profiles():
        runner.fail_usage("profile", args.profile, profiles.available_profiles())
    if args.notebook not in SPLIT:
        runner.fail_usage("split notebook", args.notebook, sorted(SPLIT))
    # the caches' root, whatever the working folder (no change of folder)
    os.environ[workspace.ENV] = str(profiles.ROOT)
    import torch  # here: a sweep imports this module and starts without torch

    torch.set_num_threads(1)  # as in the notebooks' kernels: the same metrics
    try:
        params = parameters(args.notebook, args.profile, args.seed)
        units = chapter_units(args.notebook, params)
    except (profiles.UnknownParameter, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.list:
        for unit in units:
            print(f"stage {unit.stage}: {unit.name}")
        return 0
    names = {u.name: u for u in units}
    problem = runner.missing_cuda(args.profile, args.allow_cpu)
    if problem:  # listing needs no GPU; running does
        print(f"error: {problem}", file=sys.stderr)
        return 2
    unknown = [name for name in args.units if name not in names]
    if unknown:
        print(
            f"error: {args.notebook} has no unit {unknown[0]!r}; "
            f"list its units with --list",
            file=sys.stderr,
        )
        return 2
    chosen = [names[n] for n in args.units] if args.units else units
    run_units(chosen, params["seed"])
    return 0
