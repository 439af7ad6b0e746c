"""Run the book's notebooks over several seeds, each (notebook, seed) its own job.

Usage::

    bookkit sweep --seeds 0 1 2 [--profile cpu] [--executor local|slurm]
                              [--cluster-config sweep.yaml] [--split] [NB ...]
    bookkit sweep --seeds auto ...

``--seeds auto`` runs the stages of :mod:`wslib.runs.stages`: seeds 0-4 of
every notebook, then seeds 5-9 and 10-19 only of the notebooks that still hold
an undecided claim in the ledger (each stage's wall time is printed).

Each job is ``bookkit run --profile P --seed S --jobs 1 NB``, so its
results land where ``make notebook SEED=S`` puts them
(``results/<profile>/seed-<S>/<NB>.json``), its executed copy and its log
(``<NB>.log``) under ``build/<profile>/seed-<S>/``. A job whose results file
records the same effective parameters and the same code fingerprint (the
library's source and the notebook's) is skipped, so a killed sweep restarted
runs only what is missing; so is a seed that ``make book`` already ran with the
same parameters. Jobs start longest notebook first (as in ``run.py``).

``--split`` spreads the long chapters further: each (notebook, seed) of a
chapter in ``part.SPLIT`` is first run as its units (``bookkit/part.py``,
one job per unit, stage by stage, logs under ``<NB>.units/``; see
:mod:`wslib.runs.units`), and its notebook job then finds every piece cached.
After the jobs, every swept notebook's seeds are summarised in ``results/<profile>/seeds/<NB>.json`` (see
:mod:`wslib.runs.sweeps`).

Executors:

- ``local`` (default): ``--jobs`` jobs at a time (default: one per core), each
  kernel on one CPU thread, so a job's metrics do not depend on the pool size.
- ``slurm``: the same jobs submitted with submitit. ``--cluster-config`` (YAML)
  sets ``partition``, ``timeout_min``, ``cpus_per_task``, ``gpus_per_node``,
  ``mem_gb`` and ``workdir``: the checkout the jobs run in, which must be on a
  file system every node sees (its ``data/``, ``results/`` and caches are
  shared; every cache entry is written atomically and locked while it is
  computed). ``cluster: local`` runs the jobs through submitit's local executor
  (what the tests use; no Slurm needed).

Progress shows jobs done / running / failed; a failed job is named with its
seed, its partial executed copy and the end of its log, and the others go on.
Exit status: 0 when every job succeeded, 1 when one failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import yaml

from bookkit import part, profiles
from bookkit import run as runner
from bookkit.speed import cpu_speed_text
from wslib.core.seeds import check_seed
from wslib.runs.sweeps import write_summary

POLL_S = 2.0  # seconds between looks at the running jobs
GRACE_S = 5.0  # seconds the jobs' run.py get to stop their kernels after Ctrl-C
SLURM_KEYS = {
    "cluster": str,
    "partition": str,
    "timeout_min": int,
    "cpus_per_task": int,
    "gpus_per_node": int,
    "mem_gb": int,
    "workdir": str,
}
CLUSTERS = ("slurm", "local", "debug")  # submitit's executors ("local": tests)


class Handle(Protocol):
    """What both executors return per job (a Future or a submitit Job)."""

    def done(self) -> bool: ...

    def exception(self) -> BaseException | None: ...


@dataclass(frozen=True)
class Job:
    """One notebook at one seed, or one unit of its work (``--split``)."""

    nb: str
    seed: int
    profile: str
    unit: str | None = None

    @property
    def name(self) -> str:
        return f"{self.nb} seed {self.seed}" + (f": {self.unit}" if self.unit else "")

    def folder(self, root: Path) -> Path:
        return root / profiles.run_dir("build", self.profile, self.seed)

    @property
    def log(self) -> str:
        """The log's file name in :meth:`folder`."""
        if self.unit is None:
            return f"{self.nb}.log"
        return f"{self.nb}.units/{re.sub(r'[^A-Za-z0-9.=-]+', '_', self.unit)}.log"

    def command(self) -> list[str]:
        common = ["--profile", self.profile, "--seed", str(self.seed), self.nb]
        if self.unit is None:
            return [*runner.COMMAND, "run", "--jobs", "1", *common]
        return [*runner.COMMAND, "part", *common, self.unit]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line (exit status 2 on a bad value)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds",
        nargs="+",
        required=True,
        help="seeds (whole numbers), or auto: the stages of wslib.runs.stages",
    )
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local")
    parser.add_argument("--cluster-config", type=Path, default=Path("sweep.yaml"))
    parser.add_argument("--jobs", type=int, default=runner.cores())
    parser.add_argument(
        "--split",
        action="store_true",
        help="run the units of the split chapters as jobs of their own first",
    )
    parser.add_argument("notebooks", nargs="*", metavar="NB")
    args = parser.parse_args(argv)
    args.auto = args.seeds == ["auto"]
    if args.auto:  # the stages read the ledger (scipy): imported only for auto
        from wslib.runs.stages import STAGES

        args.seeds = list(STAGES[0])
    elif not all(re.fullmatch(r"-?\d+", s) for s in args.seeds):
        parser.error(
            f"--seeds takes whole numbers or the one word auto, got {' '.join(args.seeds)}"
        )
    args.seeds = [int(s) for s in args.seeds]
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    for seed in args.seeds:
        try:
            check_seed(seed, "each of --seeds")
        except ValueError as error:
            parser.error(str(error))
    runner.refuse_repeats(parser, "seed", args.seeds)
    runner.refuse_repeats(parser, "notebook", args.notebooks)
    if args.profile not in profiles.available_profiles():
        runner.fail_usage("profile", args.profile, profiles.available_profiles())
    for nb in args.notebooks:
        if nb not in profiles.available_notebooks():
            runner.fail_usage("notebook", nb, profiles.available_notebooks())
    args.notebooks = args.notebooks or profiles.available_notebooks()
    return args


def same_run(path: Path, params: dict[str, Any], code: str) -> bool:
    """The results file at ``path`` records ``params`` (its own path aside) and ``code``."""
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    recorded = {**results.get("params", {}), "results_path": params["results_path"]}
    return recorded == params and results.get("code") == code


def is_current(job: Job) -> bool:
    """The job's results exist for the same effective parameters and code.

    ``make book``'s own run of the notebook (``results/<profile>/<nb>.json``)
    counts when its seed and every other parameter are the job's: the default
    seed is then not run twice.
    """
    injected = profiles.notebook_parameters(job.nb, job.profile, job.seed)
    params = json.loads(json.dumps(profiles.effective_parameters(job.nb, injected)))
    code = runner.code_fingerprint(job.nb)
    own = profiles.ROOT / params["results_path"]
    default = profiles.ROOT / "results" / job.profile / f"{job.nb}.json"
    if same_run(own, params, code):
        return True
    if same_run(default, params, code):
        adopt(job, default, own)
        return True
    return False


def adopt(job: Job, results: Path, own: Path) -> None:
    """Copy ``make book``'s own run of ``job`` (its results file and executed
    notebook) into the job's seed folders, which ``make book SEEDS=...`` builds
    the book from."""
    executed = profiles.ROOT / "build" / job.profile / f"{job.nb}.ipynb"
    if executed.exists():
        job.folder(profiles.ROOT).mkdir(parents=True, exist_ok=True)
        shutil.copy2(executed, job.folder(profiles.ROOT) / executed.name)
    own.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(results, own)


def job_env() -> dict[str, str]:
    """The environment of a job: one CPU thread, one worker."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "WSLIB_WORKERS": "1",
    }


def run_local(job: Job) -> None:
    """Run one job here; raise with the end of its log when it fails."""
    log = job.folder(profiles.ROOT) / job.log
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(
            job.command(),
            cwd=profiles.ROOT,
            env=job_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-6:]
        raise RuntimeError("\n".join([f"log: {log}", *tail]))


def local_submitter(jobs: int) -> tuple[Callable[[Job], Handle], Callable[[], None]]:
    """Submit to a pool of ``jobs`` threads, each running one job's process."""
    pool = ThreadPoolExecutor(jobs)

    def submit(job: Job) -> Future:
        return pool.submit(run_local, job)

    return submit, pool.shutdown


def read_cluster_config(path: Path) -> dict[str, Any]:
    """The Slurm settings; a clear error for a missing file or an unknown key."""
    if not path.exists():
        raise SystemExit(
            f"error: no cluster config {path}; write one with the keys "
            f"{', '.join(SLURM_KEYS)} (see book/running/sweeps.md)"
        )
    try:
        config = profiles.read_yaml(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SystemExit(f"error: {path} is not valid YAML: {error}") from None
    if not isinstance(config, dict):
        raise SystemExit(
            f"error: {path} must map settings to values, got a list or text"
        )
    unknown = sorted(set(config) - set(SLURM_KEYS))
    if unknown:
        raise SystemExit(
            f"error: {path} sets {', '.join(unknown)}; valid: {' '.join(SLURM_KEYS)}"
        )
    for key, value in config.items():
        kind = SLURM_KEYS[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SystemExit(
                f"error: {path} sets {key} to {value!r}; give "
                + ("a whole number" if kind is int else "text")
            )
    if config.get("cluster", "slurm") not in CLUSTERS:
        raise SystemExit(
            f"error: {path} sets cluster to {config['cluster']!r}; valid: "
            f"{' '.join(CLUSTERS)}"
        )
    return config


def slurm_submitter(path: Path) -> tuple[Callable[[Job], Handle], Callable[[], None]]:
    """Submit each job with submitit (Slurm, or its local executor for tests)."""
    import submitit

    config = read_cluster_config(path)
    workdir = Path(config.pop("workdir", profiles.ROOT))
    cluster = config.pop("cluster", "slurm")
    executor = submitit.AutoExecutor(folder=workdir / "build/submitit", cluster=cluster)
    partition = config.pop("partition", None)
    if partition and cluster == "slurm":
        config["slurm_partition"] = partition
    executor.update_parameters(name="wslib-sweep", **config)

    def submit(job: Job) -> Handle:
        command = submitit.helpers.CommandFunction(
            job.command(), cwd=workdir, env=job_env(), verbose=False
        )
        return executor.submit(command)

    return submit, lambda: None


def progress(done: int, running: int, failed: int, total: int) -> None:
    print(f"   {done}/{total} done, {running} running, {failed} failed", flush=True)


def sweep(jobs: list[Job], submit: Callable[[Job], Handle], width: int) -> list[Job]:
    """Run ``jobs``, at most ``width`` at once; return those that failed.

    Ctrl-C reaches the running jobs' ``run.py`` too (one process group), which
    stop their kernels and delete their unfinished results; the sweep gives
    them :data:`GRACE_S` seconds, stops what is left, says what will resume,
    and exits with status 130. Finished jobs keep their results: the same
    command runs only what is missing.
    """
    running: dict[Job, Handle] = {}
    try:
        return _sweep(jobs, submit, width, running)
    except KeyboardInterrupt:
        children = psutil.Process().children()
        psutil.wait_procs(children, timeout=GRACE_S)
        runner.stop_children()
        runner.exit_interrupted(
            sorted(job.name for job in running),
            "the jobs that finished keep their results; the same command runs only "
            "what is missing",
        )


def _sweep(
    jobs: list[Job],
    submit: Callable[[Job], Handle],
    width: int,
    running: dict[Job, Handle],
) -> list[Job]:
    queue, failed, finished = list(jobs), [], 0
    while queue or running:
        while queue and len(running) < width:
            job = queue.pop(0)
            running[job] = submit(job)
        time.sleep(POLL_S if running else 0)
        for job in [j for j, h in running.items() if h.done()]:
            error = running.pop(job).exception()
            finished += 1
            if error is not None:
                failed.append(job)
                copy = job.folder(profiles.ROOT) / f"{job.nb}.ipynb"
                where = "its log" if job.unit else f"partial executed copy: {copy}"
                print(
                    f"error: {job.name} failed; {where}\n"
                    f"    {str(error).strip()}".replace("\n", "\n    "),
                    file=sys.stderr,
                    flush=True,
                )
            else:
                print(f"{job.name}: done", flush=True)
            progress(finished, len(running), len(failed), len(jobs))
    return failed


def split(jobs: list[Job]) -> list[list[Job]]:
    """The phases of a split sweep: each stage's units of every job, then the notebooks.

    A notebook not split (see ``part.SPLIT``) has no units; its job runs in
    the last phase with the others. A failed unit does not stop the sweep: its
    notebook computes what is missing itself.
    """
    units = [
        (unit.stage, Job(job.nb, job.seed, job.profile, unit.name))
        for job in jobs
        for unit in part.chapter_units(
            job.nb, part.parameters(job.nb, job.profile, job.seed)
        )
    ]
    stages = sorted({stage for stage, _ in units})
    return [[j for s, j in units if s == stage] for stage in stages] + [jobs]


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (stage by stage with ``--seeds auto``), then summarise each
    notebook's seeds."""
    args = parse_args(argv)
    if not args.auto:
        return run_stage(args, args.notebooks, args.seeds)
    from wslib.runs.stages import STAGES, stage_notebooks

    results = profiles.ROOT / "results" / args.profile
    status = 0
    for stage, seeds in enumerate(STAGES):
        notebooks = stage_notebooks(stage, args.notebooks, results)
        if not notebooks:
            print(f"stage {stage}: every claim is decided; no more seeds", flush=True)
            break
        print(
            f"stage {stage}: seeds {seeds[0]}-{seeds[-1]} of {len(notebooks)} "
            f"notebook(s): {' '.join(notebooks)}",
            flush=True,
        )
        start = time.perf_counter()
        status = max(status, run_stage(args, notebooks, list(seeds)))
        seconds = time.perf_counter() - start
        print(f"stage {stage}: {seconds:.0f} s", flush=True)
        if status == 2:
            break
    return status


def run_stage(args: argparse.Namespace, notebooks: list[str], seeds: list[int]) -> int:
    """Run every (notebook, seed) not current, then summarise the notebooks' seeds."""
    notebooks = runner.longest_first(notebooks, args.profile)
    jobs = [Job(nb, s, args.profile) for nb in notebooks for s in seeds]
    try:
        todo = [job for job in jobs if not is_current(job)]
    except profiles.UnknownParameter as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} already done", flush=True)
    if args.executor == "local":
        submit, close = local_submitter(args.jobs)
        width = args.jobs
    else:
        submit, close = slurm_submitter(args.cluster_config)
        width = None  # every job of a phase at once: Slurm queues them
    start = time.perf_counter()
    try:
        phases = split(todo) if args.split else [todo]
        failed = [
            job
            for phase in phases
            for job in sweep(phase, submit, width or max(len(phase), 1))
        ]
    finally:
        close()
    n_jobs = sum(len(phase) for phase in phases)
    seconds = time.perf_counter() - start
    cpu = f" ({cpu_speed_text()})" if args.executor == "local" else ""
    print(f"sweep: {n_jobs} jobs run in {seconds:.0f} s{cpu}")
    try:
        for nb in notebooks:
            write_summary(profiles.ROOT / "results" / args.profile, nb)
    except ValueError as error:  # a results file that is not one
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if failed else 0
