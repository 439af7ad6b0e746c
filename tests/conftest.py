"""Shared fixtures: every notebook run in the smoke profile and the book built from it."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest
import torch
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from bookkit import chapters, gpu_check
from tests.background import Background
from tests.checkout import copy_checkout
from wslib.core.files import ENTRY_LOG
from wslib.core.workspace import ENV as WORKSPACE_ENV

# The property tests draw the same examples on every run (derandomize): the
# suite gives one answer per commit, and a failure reproduces as it is.
settings.register_profile("book", derandomize=True, database=None, deadline=None)
settings.load_profile("book")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.md"))
PROFILES = sorted(p.stem for p in (ROOT / "notebooks" / "params").glob("*.yaml"))
SMOKE = "smoke"


@dataclass
class Ran:
    """How a script's ``main`` ended: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def run_main(script: ModuleType, *args: str) -> Ran:
    """``bookkit <command> <args>`` in the repository root, in this process.

    For the tests of a script's argument and file checks: no interpreter, torch
    and library to start (about 3 s a call); the working folder and torch's
    threads are restored after it. ``SystemExit`` ends the call as it
    ends the process (a message is printed, status 1); any other exception is
    raised, failing the test, as the process would have printed a traceback.
    """
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()  # part.py computes on one, as a kernel does
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out):
        with contextlib.redirect_stderr(err):
            try:
                code = script.main(list(args))
            except SystemExit as stop:
                code = stop.code
            finally:
                torch.set_num_threads(threads)
    if isinstance(code, str):
        err.write(code + "\n")
        code = 1
    return Ran(code or 0, out.getvalue(), err.getvalue())


def chapter(nb: str) -> nbformat.NotebookNode:
    """The source of chapter ``nb`` (``notebooks/<nb>.md``) as a Jupyter notebook
    (a copy of its parse: a test may change it)."""
    return copy.deepcopy(_parsed_chapter(nb))


@functools.cache
def _parsed_chapter(nb: str) -> nbformat.NotebookNode:
    """Chapter ``nb`` parsed once per session (jupytext takes about 0.1 s a chapter)."""
    return chapters.read(ROOT / "notebooks" / f"{nb}{chapters.SUFFIX}")


def write_notebook(path: Path, parameters: str, body: str) -> None:
    """A two-cell chapter at ``path`` (``NN_name.md``, MyST Markdown like the
    book's): a title, a ``parameters`` cell, then ``body``."""
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# A tiny chapter"),
            nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell(body),
        ],
        metadata={
            "kernelspec": {
                "name": "python3",
                "display_name": "Python 3",
                "language": "python",
            },
            "language_info": {"name": "python"},
        },
    )
    chapters.write(notebook, path)


def script_repo(root: Path) -> Path:
    """A repository root at ``root`` with a copy of :mod:`bookkit` (``python -m
    bookkit`` there runs the copy) and an empty cpu profile; its notebooks folder."""
    notebooks = root / "notebooks"
    (notebooks / "params").mkdir(parents=True)
    shutil.copytree(
        ROOT / "bookkit", root / "bookkit", ignore=shutil.ignore_patterns("__pycache__")
    )
    (notebooks / "params" / "cpu.yaml").write_text("{}\n")
    return notebooks


READER_FOLDERS = ("build", "results", "book/_build", "book/_student", "data")
"""The reader's folders: no test writes there (``test_isolation`` checks)."""
WORK = Path(tempfile.mkdtemp(prefix="wslib-tests-"))
"""The tests' copy of the checkout: the smoke book runs and is built there
(removed when the session ends: a copy and its smoke book take about 150 MB)."""
set_hypothesis_home_dir(WORK / ".hypothesis")  # its caches, not in the checkout


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    BACKGROUND.stop()
    shutil.rmtree(WORK, ignore_errors=True)


BACKGROUND_FIXTURES = {
    "smoke_book": "smoke-book",
    "student_book": "student-book",
    "smoke_other_seed": "seeds",
    "sweep_entries": "seeds",
    "seed_results": "seeds",
    "gpu_smoke_run": "gpu-smoke",
}
"""The fixtures that read a job of :data:`BACKGROUND`, and the job."""
JOB_ORDER = ("smoke-book", "seeds", "gpu-smoke", "student-book")
"""The jobs in the order the background runs them: the smoke book first,
which most of the tests that read a job read."""
READ_ORDER = ("smoke-book", "student-book", "seeds", "gpu-smoke")
"""The order in which the tests that read a job run: the student edition's
reader asks for it while the background still runs the ones before it, so
that the foreground, done with its own tests, builds it itself
(:meth:`tests.background.Background.result`) instead of waiting for the
gpu-smoke run (measured: the foreground waited 70 s of a 650 s run)."""
SMOKE_FIXTURES = {"smoke_book", "student_book", "smoke_other_seed", "sweep_entries"}
SMOKE_FIXTURES |= {"seed_results"}
"""The session fixtures that run and build the smoke book or read the seeds' runs."""


def pytest_configure(config: pytest.Config) -> None:
    """The tests compute on one thread: the other cores run the background
    jobs (or, under pytest-xdist, the other workers), as the notebooks'
    kernels share the cores. On two threads the small tensors of the tests
    gain nothing and the threads spin while the other process computes."""
    torch.set_num_threads(1)


ISOLATION = "tests/book/test_isolation.py::test_the_readers_folders_are_untouched"
"""The check that no test wrote into the reader's folders: it runs last, so it
sees every test (in a serial run; with pytest-xdist, every test of its worker)."""


def fixture_names(item: pytest.Item) -> set[str]:
    """The fixtures ``item`` uses, those of the fixtures it uses included."""
    return set(getattr(item, "fixturenames", ()))


def last_job(item: pytest.Item) -> int:
    """1 + the place in :data:`READ_ORDER` of the last background job ``item``
    reads; 0 if it reads none."""
    jobs = {BACKGROUND_FIXTURES.get(f) for f in fixture_names(item)}
    return max((i + 1 for i, job in enumerate(READ_ORDER) if job in jobs), default=0)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background jobs that the selected tests will read (after
    ``-m`` and ``-k`` chose them: ``make test-fast`` starts none). Not in a
    pytest-xdist worker, which is given its tests one by one."""
    gc.freeze()  # the collections of the tests' own objects skip the imported modules
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        needed = {
            BACKGROUND_FIXTURES.get(f) for i in session.items for f in fixture_names(i)
        }
        BACKGROUND.start([job for job in JOB_ORDER if job in needed])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that share an expensive fixture go to one pytest-xdist worker
    (``--dist loadgroup``), which builds it once: all the smoke book's tests
    together, and the tests of a file that has a module-scoped fixture.
    The tests that read a background job go last, in the order of the last
    job they read (:data:`READ_ORDER`), so that the others run beside the jobs
    instead of waiting for them; :data:`ISOLATION` goes after them all.
    """
    items.sort(key=lambda item: (last_job(item), item.nodeid == ISOLATION))
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs.values() if fixtures else []
        if SMOKE_FIXTURES & fixture_names(item):
            item.add_marker(pytest.mark.xdist_group("smoke-book"))
        elif any(d.scope == "module" for group in defs for d in group):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def snapshot(root: Path, folders: tuple[str, ...] = READER_FOLDERS) -> dict[str, tuple]:
    """Size and modification time of every file under ``folders`` of ``root``."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file():
                stat = path.stat()
                found[path.relative_to(root).as_posix()] = (
                    stat.st_size,
                    stat.st_mtime_ns,
                )
    return found


READER_SNAPSHOT = snapshot(ROOT)  # taken when the tests start


WORKSPACE_LOCK = threading.Lock()
"""Guards the copy into :data:`WORK`: a test and the smoke book's background
job may ask for it at once."""


def prepare_workspace() -> Path:
    """:data:`WORK`, filled with a copy of the checkout (once per session)."""
    with WORKSPACE_LOCK:
        if not (WORK / "wslib").is_dir():
            copy_checkout(WORK)
    return WORK


@pytest.fixture(scope="session")
def workspace() -> Path:
    """:func:`prepare_workspace`'s folder."""
    return prepare_workspace()


SESSION_ENV: dict[str, str] = {}
"""The environment the session started with (set by :func:`pytest_sessionstart`).
A test may change ``os.environ`` while it runs (``run.py``'s ``main`` sets its
kernels' variables); the scripts that tests and background jobs start see
this one instead."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Take :data:`SESSION_ENV` when each session starts, not when this module is
    imported: mutmut runs several sessions in one process (and its forks), each
    with the mutant to test in ``MUTANT_UNDER_TEST``."""
    SESSION_ENV.clear()
    SESSION_ENV.update(os.environ)


def script_env(workspace: Path, **env: str) -> dict[str, str]:
    """:data:`SESSION_ENV` for a script run in ``workspace``, importing its ``wslib``."""
    return {**SESSION_ENV, "PYTHONPATH": str(workspace), **env}


def run_in(workspace: Path, script: list[str], **env: str) -> None:
    """``python <script>`` in ``workspace``, importing the workspace's ``wslib``;
    RuntimeError naming the script and the end of its output if it fails (a
    background job reports it; in a test it is the test's failure)."""
    done = subprocess.run(
        [sys.executable, *script],
        cwd=workspace,
        env=script_env(workspace, **env),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(
            f"{' '.join(script)} failed with exit status {done.returncode}\n{output}"
        )


def run_smoke(workspace: Path, seed: int | None, entry_log: Path) -> None:
    """Every notebook in the smoke profile (``seed`` None: the notebooks' default, 0),
    listing the cache entries it used in ``entry_log``."""
    script = ["-m", "bookkit", "run", "--profile", SMOKE]
    script += [] if seed is None else ["--seed", str(seed)]
    run_in(workspace, script, **{ENTRY_LOG: str(entry_log)})


def build_smoke_book(folder: Path) -> Path:
    """Run all notebooks in the smoke profile and build the book, as `make book`
    does, in :data:`WORK` (``build/smoke``, ``results/smoke`` and ``book/_build``
    there); the run's entry log is ``folder/seed-0.log``. Returns ``folder``."""
    work = prepare_workspace()
    run_smoke(work, None, folder / "seed-0.log")
    run_in(work, ["-m", "bookkit", "build", f"build/{SMOKE}"])
    return folder


def build_student_book(folder: Path) -> Path:
    """The student edition of the smoke book (every solution removed), built
    after :func:`build_smoke_book` (the job before it); its HTML folder."""
    work = prepare_workspace()
    run_in(work, ["-m", "bookkit", "build", f"build/{SMOKE}", "--edition", "student"])
    return work / "book" / "_student" / "_build" / "html"


@pytest.fixture(scope="session")
def smoke_book() -> Path:
    """The smoke book (:func:`build_smoke_book`, a background job): the folder
    of its HTML."""
    background_result("smoke-book")
    return WORK / "book" / "_build" / "html"


OTHER_SEED = 1  # the smoke book runs each notebook's default seed (0)
SWEEP_SEEDS = range(5)  # the seeds whose runs must share no cache entry


def run_seeds(folder: Path) -> Path:
    """The smoke runs of seeds 1-4 (OTHER_SEED and the rest of SWEEP_SEEDS) in a
    copy of the checkout under ``folder`` (returned), each listing the cache
    entries it used in ``folder/seed-<N>.log``."""
    checkout = copy_checkout(folder / "checkout")
    failed = []
    for seed in SWEEP_SEEDS[1:]:
        try:
            run_smoke(checkout, seed, folder / f"seed-{seed}.log")
        except RuntimeError as error:  # the other seeds still run
            failed.append(f"seed {seed}: {error}")
    if failed:
        raise RuntimeError("the smoke runs of " + "\n".join(failed))
    return checkout


def run_gpu_smoke(folder: Path) -> list[Any]:
    """Every chapter in the gpu-smoke profile in a fresh checkout under ``folder``,
    one at a time; each chapter's status (it passes only if its work ran on
    the CPU it was sent to)."""
    checkout = gpu_check.make_checkout(folder)
    return gpu_check.run_chapters(
        checkout, NOTEBOOKS, torch.device("cpu"), 1800, jobs=1
    )


BACKGROUND = Background(
    {
        "smoke-book": build_smoke_book,
        "student-book": build_student_book,
        "seeds": run_seeds,
        "gpu-smoke": run_gpu_smoke,
    }
)
"""The long runs that need nothing else of the session (:mod:`tests.background`)."""


def background_result(name: str) -> Any:
    """The result of :data:`BACKGROUND`'s job ``name``, once it ended; a failed
    job fails the test that needs it."""
    try:
        return BACKGROUND.result(name)
    except RuntimeError as error:
        pytest.fail(str(error))


def seed_log(seed: int) -> Path:
    """The entry log of ``seed``'s run (1-4) in the background job ``seeds``."""
    return background_result("seeds").parent / f"seed-{seed}.log"


@pytest.fixture(scope="session")
def smoke_other_seed(smoke_book: Path) -> Path:
    """Every notebook run in the smoke profile with ``seed`` = OTHER_SEED (the
    smoke book ran the default seed); the results folder of that run."""
    return background_result("seeds") / "results" / SMOKE / f"seed-{OTHER_SEED}"


@pytest.fixture(scope="session")
def seed_results() -> Path:
    """``results/smoke`` of the runs of seeds 1-4 (``seed-<N>/`` in it)."""
    return background_result("seeds") / "results" / SMOKE


def relative_entries(log: Path, root: Path) -> set[str]:
    """The cache entries listed in ``log``, as paths relative to the workspace ``root``."""
    root, entries = root.resolve(), map(Path, log.read_text().split())
    return {
        (e.relative_to(root) if e.is_relative_to(root) else e).as_posix()
        for e in entries
    }


@pytest.fixture(scope="session")
def sweep_entries(smoke_book: Path, workspace: Path) -> dict[int, set[str]]:
    """The cache entries (zoo, run cache, LLPF checkpoints) each of SWEEP_SEEDS
    used, relative to its workspace (seed 0's and the background runs' differ)."""
    seed_0 = background_result("smoke-book") / "seed-0.log"
    checkout = background_result("seeds")
    entries = {0: relative_entries(seed_0, workspace)}
    for seed in SWEEP_SEEDS[1:]:
        entries[seed] = relative_entries(seed_log(seed), checkout)
    return entries


@pytest.fixture(scope="session")
def student_book(smoke_book: Path) -> Path:
    """The student edition of the smoke book (:func:`build_student_book`, a
    background job); its HTML folder."""
    return background_result("student-book")


@pytest.fixture(autouse=True)
def checkout_workspace() -> Iterator[None]:
    """Every test starts with the checkout as the workspace and leaves the
    environment as it found it: a runner test whose ``run.py`` sets
    ``WSLIB_WORKSPACE`` or its kernels' variables leaves them set for no other.
    What the environment held when the test started stays (mutmut's
    ``MUTANT_UNDER_TEST`` among it)."""
    os.environ.pop(WORKSPACE_ENV, None)
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[name]  # pytest's own variable: it removes it itself
    os.environ.update(before)
