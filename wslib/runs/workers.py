"""Independent training runs spread over worker processes, one CPU thread each.

The book's small models train no faster on two CPU threads than on one (their
matrices are too small to split well), so on a CPU the cores are best used by
running one job per core. Workers are fresh (spawned) processes, started on
first use and kept for later calls (starting one takes seconds); each uses one
thread, and so does a job run here when there is a single worker, so a job's
result does not depend on the number of workers. Each job runs under the
caller's warning filters, so ``warnings.catch_warnings`` around
:func:`run_jobs` acts on the jobs too. On a GPU the jobs run here, one after
the other, since they would share the one device. ``bookkit/run.py`` sets
``WSLIB_CPU_WORKERS`` when it runs notebooks side by side, so that on a CPU
they share the cores instead of each taking all of them. Workers ignore Ctrl-C (the notebook's
process handles it and shuts the pool down), so stopping a kernel prints no
traceback from each worker.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import torch
from tqdm.auto import tqdm

T = TypeVar("T")


def workers_from_env(name: str) -> int:
    """The positive whole number of workers environment variable ``name`` sets."""
    text = os.environ[name].strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(
            f"{name}={os.environ[name]!r}: give a whole number of worker processes, "
            f"at least 1 (e.g. {name}=2), or unset it"
        )
    return int(text)


def default_workers() -> int:
    """The number of worker processes when a caller names none.

    ``WSLIB_WORKERS`` if set (the user's own choice, on any device); else one
    when CUDA is available (every worker would hold a CUDA context of its own
    on the one device); else ``WSLIB_CPU_WORKERS`` (the share of the cores
    ``bookkit/run.py`` gives each notebook it runs side by side); else one
    per CPU core.
    """
    if os.environ.get("WSLIB_WORKERS"):
        return workers_from_env("WSLIB_WORKERS")
    if torch.cuda.is_available():
        return 1
    if os.environ.get("WSLIB_CPU_WORKERS"):
        return workers_from_env("WSLIB_CPU_WORKERS")
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` one-thread processes, kept until the interpreter exits."""
    if workers not in _POOLS:
        context = multiprocessing.get_context("spawn")
        _POOLS[workers] = ProcessPoolExecutor(
            workers, mp_context=context, initializer=_one_thread
        )
    return _POOLS[workers]


@atexit.register
def _shutdown_pools() -> None:
    for pool in _POOLS.values():
        pool.shutdown(cancel_futures=True)
    _POOLS.clear()


def _one_thread() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)


def _call(fn: Callable[..., T], job: dict[str, Any], filters: list[Any]) -> T:
    cast("list[Any]", warnings.filters)[:] = filters  # a list at run time
    return fn(**job)


@contextmanager
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_jobs(
    fn: Callable[..., T],
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int | None = None,
    desc: str = "runs",
) -> list[T]:
    """``[fn(**job) for job in jobs]``, spread over ``workers`` processes.

    ``fn`` must be importable (a module-level function) and the jobs picklable.
    ``workers=None`` uses :func:`default_workers`. Results come back in the
    order of ``jobs``; an exception in a job is raised here.
    """
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1 or len(jobs) <= 1:
        with _single_thread():
            return [fn(**job) for job in tqdm(jobs, desc=desc)]
    filters = list(warnings.filters)
    futures = [_pool(workers).submit(_call, fn, job, filters) for job in jobs]
    try:
        for _ in tqdm(as_completed(futures), total=len(futures), desc=desc):
            pass
        return [future.result() for future in futures]
    except BrokenProcessPool:
        del _POOLS[
            workers
        ]  # a worker died (e.g. out of memory); the next call starts afresh
        raise
