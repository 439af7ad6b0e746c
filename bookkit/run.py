"""Execute the book's notebooks with papermill in one parameter profile.

Usage::

    bookkit run --profile cpu [--seed N] [--jobs J] [NB ...]

Each chapter ``notebooks/<nb>.md`` (a MyST Markdown notebook: jupytext's
``md:myst`` format, the reviewed source) is converted to a Jupyter notebook in a
temporary folder and runs with the repository root as working directory and
every parameter injected: the chapter's defaults (its entry of
``notebooks/params/cpu.yaml``; its parameters cell holds only the profile, seed
and results path) overridden by the entry of ``notebooks/params/<profile>.yaml``,
plus ``profile``, ``results_path`` and the seed (every model config without
``in_shape`` or ``n_classes`` gets them from its data set,
:func:`wslib.core.configs.with_data_shape`). The executed copy goes to
``build/<profile>/<nb>.ipynb`` and the results file to
``results/<profile>/<nb>.json`` (under ``seed-<N>/`` with ``--seed``); the
results file records the notebook, the profile and the effective parameters
(the notebook's defaults overridden by the injected ones). In each executed
copy a "Run info" box is inserted under the title, and papermill's injected
parameters cell is tagged ``hide-input`` (collapsed on the page, one click
shows what ran) with its values wrapped to the page width; the wall times are
merged into ``run_times.json`` next to the executed copies.

Notebooks run ``--jobs`` at a time (default: one per CPU core, at most
:data:`MAX_JOBS`), the longest first (by the last wall times recorded for the
profile, else :data:`REFERENCE_TIMES`; a notebook never timed counts as the
longest), so that no long chapter ends up running alone at the end; each kernel computing on ONE CPU thread, whatever the number
of jobs: the book's small models train no faster on two threads than on one,
and a fixed thread count keeps every metric independent of how many notebooks
run side by side. Two notebooks that need the same zoo model or cached run do
not compute it twice: the second waits for the first (``entry_lock``). The
notebooks' worker pools (``wslib.runs.workers``) share the cores
(``WSLIB_CPU_WORKERS``; on CUDA one worker each).

Each chapter's kernel is forked from a server that has already imported the
modules the chapters import (``bookkit/kernels.py``: on Linux without CUDA;
``WSLIB_FORK_KERNELS=0`` starts every kernel afresh): start-up was about half
of a smoke chapter's run. The executed copy of a running chapter is written
at most every 10 s (``bookkit/engine.py``), not before and after each cell.

The ``gpu`` profile refuses to start without a usable CUDA device (it would
quietly run on the CPU for days), naming the CUDA version torch was built
for; ``--allow-cpu`` runs it anyway.

Every requested notebook's parameters are checked before the first one runs;
a failed notebook is reported (cell, error, partial executed copy) and the
others go on. The last line gives the wall time and the CPU's one-thread
speed (:func:`bookkit.speed.thread_gflops`), to compare timings by. Exit status: 0 on
success, 1 when a notebook fails, 2 for an unknown profile, notebook or
parameter (one line on stderr naming it and the valid ones).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from pathlib import Path
from pprint import pformat
from typing import Any, NoReturn

import nbformat
import papermill
import psutil
from papermill.exceptions import PapermillExecutionError

from bookkit import chapters, engine, kernels, speed
from bookkit.profiles import (
    NOTEBOOKS,
    ROOT,
    UnknownParameter,
    available_notebooks,
    available_profiles,
    chapter_path,
    code_cells,
    effective_parameters,
    missing_sections,
    notebook_parameters,
    run_dir,
)
from wslib.core.files import atomic_write, code_version, entry_lock, stable_hash
from wslib.core.seeds import check_seed

COMMAND = [sys.executable, "-m", "bookkit"]
"""How one command of this package starts another as a process (it runs with
:data:`bookkit.profiles.ROOT` as working folder, so it imports this checkout's ``bookkit``)."""
MAX_JOBS = 4  # notebooks side by side by default (they share one GPU when there is one)
# Wall times of the reference cpu build: they only set the order notebooks start in.
REFERENCE_TIMES = NOTEBOOKS / "reference_times.json"


class MissingResults(RuntimeError):
    """A notebook ran without writing its results file."""


class KernelFailure(RuntimeError):
    """A chapter's kernel died or did not start: no cell failed, the run did."""


def fail_usage(kind: str, name: str, valid: list[str]) -> None:
    """Print one error line naming the valid choices and exit with status 2."""
    print(f"error: unknown {kind} '{name}'; valid: {' '.join(valid)}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", default="cpu", help="parameter profile (default: cpu)"
    )
    parser.add_argument("--seed", type=int, help="seed passed to every notebook")
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help=f"notebooks run side by side (default: one per core, at most {MAX_JOBS})",
    )
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run the gpu profile even when no CUDA device is usable",
    )
    parser.add_argument(
        "notebooks", nargs="*", metavar="NB", help="notebook stems (default: all)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.seed is not None:
        try:
            check_seed(args.seed, "--seed")
        except ValueError as error:
            parser.error(str(error))
    if args.profile not in available_profiles():
        fail_usage("profile", args.profile, available_profiles())
    for nb in args.notebooks:
        if nb not in available_notebooks():
            fail_usage("notebook", nb, available_notebooks())
    refuse_repeats(parser, "notebook", args.notebooks)
    args.notebooks = args.notebooks or available_notebooks()
    return args


def refuse_repeats(
    parser: argparse.ArgumentParser, what: str, values: list[Any]
) -> None:
    """Stop (exit status 2) when a value is given twice: two runs of it would
    write one results file and one log at once."""
    twice = sorted({v for v in values if values.count(v) > 1}, key=str)
    if twice:
        parser.error(f"{what} {', '.join(map(str, twice))} given twice; give each once")


GPU_PROFILES = ("gpu",)  # profiles sized for a CUDA device


def missing_cuda(profile: str, allow_cpu: bool) -> str | None:
    """Why ``profile`` cannot start here (no usable CUDA device), or None."""
    if profile not in GPU_PROFILES or allow_cpu:
        return None
    import torch  # only here: the runner starts without torch (bookkit/speed.py)

    if torch.cuda.is_available():
        return None
    built = torch.version.cuda
    needs = (
        f"this torch {torch.__version__} is built for CUDA {built} and needs an "
        f"NVIDIA driver that supports CUDA {built} or newer"
        if built
        else f"this torch {torch.__version__} is a CPU-only build; install a CUDA build"
    )
    return (
        f"profile '{profile}' needs a CUDA device and torch sees none ({needs}; "
        "check `nvidia-smi`). To run it on the CPU anyway (days, not hours), "
        "pass --allow-cpu (make book PROFILE=gpu ALLOW_CPU=1)."
    )


def cores() -> int:
    """CPU cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_jobs() -> int:
    """One notebook per core, at most :data:`MAX_JOBS`."""
    return min(cores(), MAX_JOBS)


def one_thread_kernels(jobs: int) -> None:
    """Kernels started from now on compute on one thread (worker pools share the
    cores) and take their relative paths under :data:`bookkit.profiles.ROOT` (the workspace)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    os.environ["WSLIB_CPU_WORKERS"] = str(max(1, cores() // jobs))
    os.environ["WSLIB_WORKSPACE"] = str(ROOT)


def describe_seeds(params: dict[str, Any]) -> str:
    """The seed(s) recorded in a results file's ``params``."""
    seeds = params.get("seeds", params.get("seed"))
    if seeds is None:
        return "not recorded"
    return ", ".join(map(str, seeds)) if isinstance(seeds, list) else str(seeds)


def run_info_markdown(
    results: dict[str, Any], nb: str, seed: int | None, seconds: float
) -> str:
    """The "Run info" admonition for an executed notebook."""
    env = results["env"]
    versions = ", ".join(
        f"{name} {value}"
        for name, value in env.items()
        if name not in {"device", "devices_used", "threads", "hardware"}
    )
    rerun = f"make notebook NB={nb} PROFILE={results['profile']}"
    rerun += "" if seed is None else f" SEED={seed}"
    return "\n".join(
        [
            "```{admonition} Run info",
            ":class: note",
            "",
            f"- **Profile:** `{results['profile']}`",
            f"- **Seed(s):** {describe_seeds(results['params'])}",
            f"- **Hardware:** {env.get('hardware', env.get('device'))}",
            f"- **Versions:** {versions}",
            f"- **Wall time:** {seconds:.1f} s",
            f"- **Date:** {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
            f"- **Rerun:** `{rerun}`",
            "```",
        ]
    )


INJECTED_TAG = "hide-input"  # Jupyter Book: source collapsed behind a toggle
PAGE_WIDTH = 80  # characters of code a page shows without scrolling sideways


def injected_source(params: dict[str, Any]) -> str:
    """The injected assignments, one per parameter, wrapped to :data:`PAGE_WIDTH`.

    papermill writes each value on one line (a dict of model configs runs to
    hundreds of characters); the same values, pretty-printed, read better.
    """
    lines = ["# Parameters"]
    for name, value in params.items():
        width = max(PAGE_WIDTH - len(name) - 3, 20)
        text = pformat(value, width=width, sort_dicts=False)
        lines.append(f"{name} = " + text.replace("\n", "\n" + " " * (len(name) + 3)))
    return "\n".join(lines)


def finish_executed_copy(executed: Path, markdown: str, params: dict[str, Any]) -> None:
    """Insert the run info after the title; collapse and wrap the injected parameters.

    The run info is a markdown cell right after the first (title) markdown
    cell; papermill's ``injected-parameters`` cell gets :data:`INJECTED_TAG`
    and its source is rewritten by :func:`injected_source` (same values); its
    record of the input names the chapter's source, not the temporary notebook.
    """
    notebook = nbformat.read(executed, as_version=4)
    papermill_record = notebook.metadata.setdefault("papermill", {})
    papermill_record["input_path"] = f"notebooks/{executed.stem}{chapters.SUFFIX}"
    for cell in notebook.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags:
            cell.source = injected_source(params)
            if INJECTED_TAG not in tags:
                tags.append(INJECTED_TAG)
    title = next(
        (i for i, c in enumerate(notebook.cells) if c.cell_type == "markdown"), -1
    )
    cell = nbformat.v4.new_markdown_cell(markdown, metadata={"tags": ["run-info"]})
    notebook.cells.insert(title + 1, cell)
    nbformat.write(notebook, executed)


def record_time(out_dir: Path, nb: str, seconds: float) -> None:
    """Merge one notebook's wall time into ``<out_dir>/run_times.json``."""
    path = out_dir / "run_times.json"
    with entry_lock(path):  # notebooks side by side finish at any time
        times = json.loads(path.read_text()) if path.exists() else {}
        times[nb] = round(seconds, 2)
        text = json.dumps(dict(sorted(times.items())), indent=2) + "\n"
        atomic_write(path, lambda tmp: tmp.write_text(text))


def code_fingerprint(nb: str) -> str:
    """Hash of the library's source and the notebook's, recorded in its results file.

    ``bookkit/sweep.py`` reruns a job whose results carry another fingerprint.
    """
    notebook = hashlib.sha256(chapter_path(nb).read_bytes()).hexdigest()
    return stable_hash({"wslib": code_version("wslib"), "notebook": notebook})


class ProfileParameters(logging.Filter):
    """Drops papermill's "Passed unknown parameter" warnings. A chapter's
    parameters cell holds only ``profile`` and ``seed``; every other parameter
    comes from the cpu profile and is checked before any chapter runs
    (:class:`~bookkit.profiles.UnknownParameter`). papermill reads only the
    cell, so it would warn about each of them, in every chapter of every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Passed unknown parameter")


PROFILE_PARAMETERS = ProfileParameters()


def run_notebook(
    nb: str,
    profile: str,
    seed: int | None,
    progress_bar: bool = True,
    kernel_manager: type | None = None,
) -> float:
    """Execute one notebook, add its run info and return its wall time in seconds.

    Its kernel starts in the current folder: :func:`run_all` runs in ROOT.

    ``kernel_manager``: the Jupyter kernel manager class that starts its kernel
    (:func:`bookkit.kernels.server`'s); None for Jupyter's own.
    """
    out_dir = ROOT / run_dir("build", profile, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / f"{nb}.ipynb"
    params = notebook_parameters(nb, profile, seed)
    results_file = ROOT / params["results_path"]
    results_file.unlink(missing_ok=True)
    executed.unlink(missing_ok=True)  # no earlier run's copy survives a failure
    code = code_fingerprint(nb)
    logging.getLogger("papermill").addFilter(PROFILE_PARAMETERS)  # once: same filter
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wslib-chapter-") as folder:
        source = Path(folder) / f"{nb}.ipynb"
        nbformat.write(
            chapters.with_setup_cell(chapters.read(chapter_path(nb))), source
        )
        try:
            papermill.execute_notebook(
                source,
                executed,
                parameters=params,
                kernel_name="python3",
                engine_name=engine.NAME,
                progress_bar=progress_bar,
                **({"kernel_manager_class": kernel_manager} if kernel_manager else {}),
                extra_arguments=[
                    "--IPKernelApp.log_level=ERROR"
                ],  # no kernel start-up warnings
            )
        except (RuntimeError, TimeoutError) as error:  # DeadKernelError included
            raise KernelFailure(f"{type(error).__name__}: {error}") from error
    seconds = time.perf_counter() - start
    if not results_file.exists():
        raise MissingResults(f"notebook {nb} did not write {params['results_path']}")
    results = record_parameters(results_file, nb, profile, params, code)
    info = run_info_markdown(results, nb, seed, seconds)
    finish_executed_copy(executed, info, params)
    record_time(out_dir, nb, seconds)
    return seconds


def record_parameters(
    results_file: Path, nb: str, profile: str, injected: dict[str, Any], code: str
) -> dict[str, Any]:
    """Add the notebook name, profile, effective parameters and code fingerprint."""
    results = json.loads(results_file.read_text())
    params = json.loads(json.dumps(effective_parameters(nb, injected)))
    results = {
        "notebook": nb,
        "profile": profile,
        "params": params,
        "code": code,
        **results,
    }
    results_file.write_text(json.dumps(results, indent=2) + "\n")
    return results


def report_failure(nb: str, error: PapermillExecutionError, executed: Path) -> None:
    """Print a short description of a failed notebook (no traceback)."""
    message = str(error.evalue).strip().replace("\n", "\n    ")
    print(
        f"\nerror: notebook {nb} failed in cell In [{error.exec_count}]\n"
        f"    {error.ename}: {message}\n"
        f"    partially executed copy: {executed.relative_to(ROOT)}",
        file=sys.stderr,
    )


def run_one(
    nb: str, args: argparse.Namespace, alone: bool, kernel_manager: type | None = None
) -> bool:
    """Run one notebook (its kernel started by ``kernel_manager``, see
    :func:`run_notebook`); report a failure in a few lines. True on success.

    A :class:`KernelFailure` (its kernel died, or did not start in time) is
    that chapter's failure too: the other chapters go on.
    """
    executed = ROOT / run_dir("build", args.profile, args.seed) / f"{nb}.ipynb"
    try:
        seconds = run_notebook(
            nb,
            args.profile,
            args.seed,
            progress_bar=alone,
            kernel_manager=kernel_manager,
        )
    except PapermillExecutionError as error:
        report_failure(nb, error, executed)
        return False
    except MissingResults as error:
        print(f"\nerror: {error}", file=sys.stderr)
        return False
    except KernelFailure as error:
        print(
            f"\nerror: notebook {nb} failed outside its cells\n"
            f"    {str(error).strip()}\n"
            "    (a kernel that died was most often out of memory; a kernel that "
            "did not start, a machine too busy: run the chapter again)",
            file=sys.stderr,
        )
        return False
    print(f"{nb}: {seconds:.1f} s", flush=True)
    return True


def longest_first(notebooks: list[str], profile: str) -> list[str]:
    """``notebooks`` by expected wall time, longest first; never timed ones first."""
    reference = profile == "cpu" and REFERENCE_TIMES.exists()
    expected = json.loads(REFERENCE_TIMES.read_text()) if reference else {}
    last = ROOT / "build" / profile / "run_times.json"
    if last.exists():
        expected |= json.loads(last.read_text())
    return sorted(notebooks, key=lambda nb: -expected.get(nb, float("inf")))


def stop_children(grace: float = 3.0) -> None:
    """Stop every process this one started (kernels, jobs): SIGTERM, then SIGKILL after ``grace`` s.

    A chapter's kernel runs in a process group of its own, so the terminal's
    Ctrl-C does not reach it; left alone it would compute to its end.
    """
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def exit_interrupted(stopped: list[str], resume: str) -> NoReturn:
    """One line saying what stopped and what will resume; exit status 130 (SIGINT's).

    ``os._exit``: the worker threads still wait on the stopped processes, and a
    normal exit would wait for them.
    """
    print(  # on a line of its own: a progress bar may hold the current one
        f"\ninterrupted: stopped {', '.join(stopped) or 'nothing that was running'}; {resume}",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(130)


def run_all(args: argparse.Namespace) -> list[str]:
    """Run the notebooks ``args.jobs`` at a time, longest first; the names of those that failed.

    Ctrl-C stops the running chapters' kernels, deletes their results files
    (none of them is complete) and exits with status 130.
    """
    jobs = args.jobs  # at most the number of notebooks (main)
    one_thread_kernels(jobs)
    failed: list[str] = []
    modules = kernels.imported_modules(
        [c.source for nb in args.notebooks for c in code_cells(nb)]
    )
    # one chdir for all: papermill's (cwd=), undone by each notebook as it
    # ended, left notebooks side by side in the folder the last but one found
    with (
        contextlib.chdir(ROOT),
        kernels.server(ROOT, modules) as manager,
        ThreadPoolExecutor(jobs) as pool,
    ):
        running: dict[Future, str] = {}
        queue = (
            longest_first(args.notebooks, args.profile)
            if jobs > 1
            else list(args.notebooks)
        )
        try:
            _run_queue(args, pool, queue, running, failed, manager)
        except KeyboardInterrupt:
            stop_children()
            for nb in running.values():
                params = notebook_parameters(nb, args.profile, args.seed)
                (ROOT / params["results_path"]).unlink(missing_ok=True)
            exit_interrupted(
                sorted(running.values()),
                "finished chapters keep their results; the same command runs the others again",
            )
    return failed


def _run_queue(
    args: argparse.Namespace,
    pool: ThreadPoolExecutor,
    queue: list[str],
    running: dict[Future, str],
    failed: list[str],
    kernel_manager: type | None,
) -> None:
    """Submit ``queue`` to ``pool``, ``args.jobs`` at a time, until every notebook ended."""
    jobs = args.jobs
    while queue or running:
        while queue and len(running) < jobs:
            nb = queue.pop(0)
            print(f"== {nb} (profile {args.profile})", flush=True)
            alone = jobs == 1
            running[pool.submit(run_one, nb, args, alone, kernel_manager)] = nb
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            nb = running.pop(future)
            failed += [] if future.result() else [nb]
        if jobs > 1:
            total, left = len(args.notebooks), len(queue) + len(running)
            print(
                f"   {total - left}/{total} done; running: "
                f"{', '.join(running.values()) or 'none'}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    """Run the requested notebooks; 1 if any failed, 2 for bad arguments."""
    args = parse_args(argv)
    for nb in args.notebooks:  # a typo in the last notebook's profile stops the run now
        try:
            notebook_parameters(nb, args.profile, args.seed)
        except UnknownParameter as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    default = missing_sections(args.profile, args.notebooks)
    if default and args.profile != "cpu":  # the cpu profile is the defaults
        print(
            f"note: notebooks/params/{args.profile}.yaml has no section for "
            f"{', '.join(default)}: they run with the notebook's defaults, the cpu "
            "profile's sizes (add a section, '{}' included, to say so)",
            flush=True,
        )
    args.jobs = min(args.jobs, len(args.notebooks))
    problem = missing_cuda(args.profile, args.allow_cpu)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    failed = run_all(args)
    wall = time.perf_counter() - start
    print(
        f"{len(args.notebooks)} notebook(s) in {wall:.1f} s wall, {args.jobs} at a time"
        f" ({speed.cpu_speed_text()})"
    )
    if failed:
        print(f"error: failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0
