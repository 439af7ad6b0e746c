"""Check a CUDA machine for the gpu profile and estimate the gpu book's time.

    bookkit gpu-check [--allow-cpu] [--quick] [--budget SECONDS] [--report FILE]
    bookkit gpu-check --assumed        # the estimate from stated rates only

The check runs in phases, each with its share of ``--budget`` (default 300 s,
what a lent device gives one command). After each phase it rewrites its
report (``--report``, JSON) and prints a summary line, so a run stopped at
its budget, or killed, still tells what it measured:

1. ``checks``: numbers that must hold on any device (:mod:`device_checks`):
   permutation and rescaling invariance in float64, self-fusion, diag G
   against enumerated paths, Theorem 1's split, a resumed LLPF path against
   an unbroken one, and that the work ran on the device;
2. ``pilot``: seconds per LLPF refinement step of ResNet-18 at the gpu
   profile's batch, on a fixed number of steps per tick with the chapters'
   threshold rule; refinement steps per tick on trained modes when the zoo
   holds chapter 3's (else the assumption and its range are reported);
3. ``timings``: ResNet-18 training steps in fp32 and bf16, the small-model
   floor, evaluation, a checkpoint save, a fusion solve, a KF grouping,
   PathCond's solver on the device, and peak memory;
4. ``chapters``: every chapter in the gpu-smoke profile in a fresh checkout;
   a chapter passes when it ends and its results file says that all its
   training, evaluation and paths ran on the device (``env["devices_used"]``);
5. ``host``: the CPU-side hot spots, on one thread;
6. ``estimate``: the gpu profile's hours per chapter, low / central / high.

Exit status: 0 when every check and chapter passed, 1 when one failed or
did not run in its budget (each named on stderr), 2 without CUDA
(``--allow-cpu`` forces a CPU run). ``--quick`` shrinks every timed model
and runs one chapter (tests on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from bookkit import device_checks, gpu_work, profiles, synthetic_data
from bookkit import gpu_estimate as estimate
from bookkit import gpu_timings as timing
from bookkit import run as runner
from bookkit.profiles import ROOT
from wslib.core.train import pick_device, seed_everything

SMOKE = "gpu-smoke"  # the gpu profile's shape at smoke size
QUICK_CHAPTER = "02_layerwise"  # the one chapter of --quick
CHAPTER_JOBS = 4  # chapters side by side on the GPU
BUDGET = 300.0  # seconds: one command on a lent device
PILOT_STEPS = 20  # refinement steps per pilot tick (r_min = r_max); --quick: 3
SHARES = {  # each phase's share of the budget left when it starts (see phase_limit)
    "checks": 0.15,
    "pilot": 0.15,
    "timings": 0.2,
    "chapters": 0.4,
    "host": 0.05,
    "estimate": 0.05,
}


class OverBudget(BaseException):
    """A phase ran past its time limit (a BaseException: no check may swallow it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`OverBudget` in the main thread after ``seconds``."""

    def stop(signum: int, frame: Any) -> None:
        raise OverBudget

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Context:
    """What every phase reads: the device, the sizes, the clock and the measured rates."""

    device: torch.device
    quick: bool
    batch: int
    params: Path | None
    notebooks: list[str]
    deadline: float  # time.perf_counter() at which the budget ends
    rates: dict[str, Any] = field(default_factory=dict)  # measured Rates fields

    def left(self) -> float:
        return self.deadline - time.perf_counter()


@dataclass
class Outcome:
    """How one phase ended, with what it measured (``results``) and its failures."""

    phase: str
    limit_s: float
    status: str = "skipped"  # passed | failed | stopped at its budget | skipped
    seconds: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


class Report:
    """The phases so far, written as JSON after each one."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.header = header
        self.outcomes: list[Outcome] = []

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {**self.header, "phases": [asdict(o) for o in self.outcomes]}
        self.path.write_text(json.dumps(body, indent=1, default=str) + "\n")
        print(
            f"== phase {outcome.phase}: {outcome.status} in {outcome.seconds:.1f} s "
            f"(limit {outcome.limit_s:.0f} s); report: {self.path.name}",
            flush=True,
        )

    @property
    def failures(self) -> list[str]:
        return [f for o in self.outcomes for f in o.failures]


# --- the phases ------------------------------------------------------------------------


def checks_phase(ctx: Context, out: Outcome) -> None:
    """Each numeric check on the device, printed and kept as it ends."""
    out.results["checks"] = []
    for check in device_checks.run_checks(ctx.device):
        print("  " + check.line(), flush=True)
        out.results["checks"].append(asdict(check) | {"passed": check.passed})
        if not check.passed:
            out.failures.append(
                f"check {check.name}: {check.value:.3g} > {check.bound:g}"
            )
    missing = len(device_checks.CHECKS) - len(out.results["checks"])
    if missing:
        out.failures.append(f"checks: {missing} did not run")


def pilot_phase(ctx: Context, out: Outcome) -> None:
    """Seconds per refinement step (fixed steps); steps per tick from the zoo, if it can."""
    config = timing.QUICK_RESNET if ctx.quick else estimate.RESNET
    batch = 16 if ctx.quick else ctx.batch
    steps = 3 if ctx.quick else PILOT_STEPS
    seconds, threshold = timing.refine_step_seconds(config, batch, ctx.device, steps)
    ctx.rates["refine_step_s"] = out.results["refine_step_s"] = seconds
    out.results["threshold"] = threshold
    print(
        f"  LLPF refinement step, {steps} per tick: {1000 * seconds:.1f} ms", flush=True
    )
    low, central, high = estimate.TICK_STEPS
    measured = None if ctx.quick else timing.zoo_tick_steps(chapter_3(ctx), ctx.device)
    if measured is None:
        out.results["tick_steps"] = f"assumed {central} (range {low}-{high})"
        print(
            f"  steps per tick: no trained modes of chapter 3 in the zoo; assumed "
            f"{central}, range {low}-{high} ({estimate.TICK_STEPS_SOURCE})"
        )
    else:
        ctx.rates["tick_steps"] = out.results["tick_steps"] = measured
        print(f"  steps per tick on chapter 3's trained modes: {measured:.1f}")


def chapter_3(ctx: Context) -> dict[str, Any]:
    return gpu_work.chapter_params("03_llpf_m2m", ctx.params)


def timings_phase(ctx: Context, out: Outcome) -> None:
    """The training, evaluation, save, solve, grouping and PathCond timings."""
    quick, dev = ctx.quick, ctx.device
    resnet = timing.QUICK_RESNET if quick else estimate.RESNET
    mlp = timing.QUICK_MLP if quick else timing.MLP
    steps, b = (5, 16) if quick else (50, ctx.batch)
    size = (20, 4, 65, 8) if quick else (1000, 16, 4609, 512)
    items: list[tuple[str, str, Callable[[], float]]] = [
        (
            "step_s",
            "ResNet-18 step, fp32, augmented",
            lambda: timing.time_steps(resnet, b, steps, dev, "fp32"),
        ),
        (
            "bf16_step_s",
            "ResNet-18 step, bf16, augmented",
            lambda: timing.time_steps(resnet, b, steps, dev, "bf16"),
        ),
        (
            "floor_s",
            "small-MLP step (floor)",
            lambda: timing.time_steps(mlp, 16 if quick else 128, steps, dev, "fp32"),
        ),
        (
            "eval_s",
            "evaluation, per example on the device",
            lambda: timing.time_eval(resnet, 256 if quick else 10_000, dev),
        ),
        (
            "save_s",
            "checkpoint save (ResNet-18 state)",
            lambda: timing.time_save(resnet),
        ),
        (
            "solve_s",
            "fusion least-squares solve",
            lambda: timing.time_solve(*size, dev),
        ),
        (
            "pathcond_s",
            "PathCond solver, CIFAR-NV, 100 sweeps",
            lambda: timing.time_pathcond(dev, quick),
        ),
        (
            "kf_grouping_s",
            "KF grouping of chapter 10's first level",
            lambda: timing.time_grouping(dev, quick)[1],
        ),
    ]
    seed_everything(0)  # cudnn.benchmark on, as the book sets it
    for key, what, measure in items:
        seconds = measure()
        out.results[key] = seconds
        if key in {f.name for f in estimate.Rates.__dataclass_fields__.values()}:
            ctx.rates[key] = seconds
        print(f"  {what:<45} {1000 * seconds:10.2f} ms", flush=True)
    ctx.rates["batch"] = b
    gpu, rss = timing.memory_peaks(dev)
    out.results["max_memory_allocated_gib"], out.results["peak_rss_gib"] = gpu, rss
    print(
        f"  peak GPU memory {'n/a (CPU)' if gpu is None else f'{gpu:.2f} GiB'}, peak host RSS {rss:.2f} GiB"
    )


def chapters_phase(ctx: Context, out: Outcome, limit: float) -> None:
    """The chapters in the gpu-smoke profile, in a fresh checkout, within ``limit`` seconds."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        checkout = make_checkout(Path(tmp))
        print(
            f"  {len(ctx.notebooks)} chapter(s), {CHAPTER_JOBS} at a time", flush=True
        )
        statuses = run_chapters(checkout, ctx.notebooks, ctx.device, limit)
    for st in statuses:
        print(f"  {st.notebook:<20} {'passed' if st.passed else 'FAILED: ' + st.error}")
        if not st.passed:
            out.failures.append(f"chapter {st.notebook}: {st.error}")
    out.results["chapters"] = [asdict(st) for st in statuses]


def host_phase(ctx: Context, out: Outcome) -> None:
    """The CPU-side hot spots on one thread (the same on any device)."""
    out.results.update(timing.host_hot_spots(ctx.quick))
    for what, seconds in out.results.items():
        print(f"  {what:<55} {seconds:8.3f} s")
    print(
        f"  counted in the estimate (s, at the gpu profile's size): {gpu_work.CPU_SECONDS}"
    )


def estimate_phase(ctx: Context, out: Outcome) -> None:
    """The per-chapter estimate from the measured rates, the others assumed."""
    measured = {k: v for k, v in ctx.rates.items() if k != "batch"}
    rates = replace(estimate.ASSUMED, **ctx.rates)
    assumed = sorted(set(estimate.Rates.__dataclass_fields__) - set(ctx.rates))
    out.results.update(measured=measured, assumed=assumed)
    out.results["table"] = estimate.estimate_table(
        rates, ctx.params, measured="tick_steps" in ctx.rates
    )
    print(f"  measured: {sorted(measured)}; assumed: {assumed}")
    print("estimated gpu profile (hours on this device; an estimate, not a run):")
    print(out.results["table"])


PHASES: dict[str, Callable[..., None]] = {
    "checks": checks_phase,
    "pilot": pilot_phase,
    "timings": timings_phase,
    "chapters": chapters_phase,
    "host": host_phase,
    "estimate": estimate_phase,
}


def phase_limit(name: str, left: float, names: list[str]) -> float:
    """``name``'s share of the ``left`` seconds among itself and the phases after it."""
    later = names[names.index(name) :]
    return left * SHARES[name] / sum(SHARES[n] for n in later)


def run_phase(name: str, ctx: Context, names: list[str]) -> Outcome:
    """Run one phase within its limit; what it measured survives a stop."""
    limit = phase_limit(name, ctx.left(), names)
    out = Outcome(name, limit)
    if limit < 1.0:
        out.failures.append(f"phase {name}: no time left in the budget")
        return out
    start = time.perf_counter()
    try:
        if name == "chapters":  # a subprocess: stopped by its own timeout
            chapters_phase(ctx, out, limit)
        else:
            with time_limit(limit):
                PHASES[name](ctx, out)
        out.status = "failed" if out.failures else "passed"
    except OverBudget:
        out.status = "stopped at its budget"
        if name == "checks":
            out.failures.append("checks: stopped at their budget before all ran")
    out.seconds = time.perf_counter() - start
    return out


# --- the chapters ----------------------------------------------------------------------


def make_checkout(root: Path) -> Path:
    """A fresh checkout under ``root``: the library, the tooling, the notebooks, synthetic
    data, no cache.

    No model, run or path of an earlier run can stand in for a computation,
    and the data sets are :mod:`synthetic_data`'s small files in the real
    formats (a GPU machine may have no network).
    """
    skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for folder in ("wslib", "bookkit", "notebooks"):
        shutil.copytree(ROOT / folder, root / folder, ignore=skip)
    synthetic_data.write_all(root / "data")
    return root


@dataclass(frozen=True)
class ChapterStatus:
    """How one chapter of the gpu-smoke profile ended: ``error`` is empty when it passed."""

    notebook: str
    error: str = ""
    devices: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.error


def _failures(log: str) -> dict[str, str]:
    """``{notebook: "cell In [N]: Error: message"}`` (or ``"outside its cells:
    Error: message"``) from run.py's output."""
    found = re.finditer(
        r"error: notebook (\S+) failed (?:in cell (In \[\d+\])|outside its cells)"
        r"\n\s+(.+)",
        log,
    )
    return {
        m[1]: f"{f'cell {m[2]}' if m[2] else 'outside its cells'}: {m[3].strip()}"
        for m in found
    }


def chapter_status(
    nb: str, results: Path, device: torch.device, error: str
) -> ChapterStatus:
    """A chapter passed when it ended, wrote its results, and every fit and path ran on ``device``."""
    if error or not results.is_file():
        return ChapterStatus(nb, error or "no results file")
    used = tuple(json.loads(results.read_text()).get("env", {}).get("devices_used", []))
    if set(used) != {device.type}:
        return ChapterStatus(
            nb,
            f"its training and paths ran on {list(used)}, not [{device.type!r}]",
            used,
        )
    return ChapterStatus(nb, "", used)


def run_chapters(
    checkout: Path,
    notebooks: list[str],
    device: torch.device,
    limit: float,
    jobs: int = CHAPTER_JOBS,
) -> list[ChapterStatus]:
    """Run ``notebooks`` in the gpu-smoke profile in ``checkout`` for at most ``limit`` seconds.

    A failure never stops the others; at the limit the whole process group
    (run.py and its kernels) is stopped and the unfinished chapters say so.
    """
    command = [
        *runner.COMMAND,
        "run",
        "--profile",
        SMOKE,
        "--jobs",
        str(jobs),
    ]
    proc = subprocess.Popen(
        command + notebooks,
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=limit)
        late = ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        late = f"not finished within the phase's {limit:.0f} s"
    failures = _failures(log)
    return [
        chapter_status(
            nb,
            checkout / "results" / SMOKE / f"{nb}.json",
            device,
            failures.get(nb, ""),
        )
        if nb in failures or (checkout / "results" / SMOKE / f"{nb}.json").is_file()
        else ChapterStatus(nb, late or "no results file")
        for nb in notebooks
    ]


# --- the command -----------------------------------------------------------------------


def require_cuda(allow_cpu: bool) -> torch.device:
    """The CUDA device, or exit with status 2 naming why there is none."""
    problem = runner.missing_cuda("gpu", allow_cpu)
    if problem is not None:
        print(f"gpu check: {problem}", file=sys.stderr)
        print(
            "gpu check: --allow-cpu runs the check on the CPU (its timings then say "
            "nothing about a GPU)",
            file=sys.stderr,
        )
        sys.exit(2)
    return pick_device()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny timed sizes and one chapter (tests on a CPU)",
    )
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument(
        "--notebooks", nargs="+", help="chapters to run (default: all; --quick: one)"
    )
    parser.add_argument(
        "--assumed", action="store_true", help="estimate from the assumed rates only"
    )
    parser.add_argument(
        "--params",
        help="parameter file to estimate (default: notebooks/params/gpu.yaml)",
    )
    parser.add_argument(
        "--budget", type=float, default=BUDGET, help="seconds for all phases together"
    )
    parser.add_argument(
        "--report",
        default="build/gpu-check/report.json",
        help="the JSON report, rewritten after each phase",
    )
    args = parser.parse_args(argv)
    if args.params is not None and not Path(args.params).is_file():
        parser.error(
            f"--params {args.params}: no such file; give a profile's parameter file, "
            "such as notebooks/params/gpu.yaml"
        )
    if not args.budget > 0:
        parser.error(f"--budget {args.budget:g}: give a positive number of seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # the parameter file is read as run.py reads a profile, first
        gpu_work.chapter_work(args.params)
    except profiles.UnknownParameter as error:
        print(f"gpu check: {error}", file=sys.stderr)
        return 2
    if args.assumed:
        print(f"assumed rates: {estimate.ASSUMED}")
        print(estimate.estimate_table(estimate.ASSUMED, args.params))
        return 0
    device = require_cuda(args.allow_cpu)
    start = time.perf_counter()
    gpu = profiles.read_yaml((profiles.PARAMS / "gpu.yaml").read_text())
    notebooks = args.notebooks or (
        [QUICK_CHAPTER] if args.quick else profiles.available_notebooks()
    )
    ctx = Context(
        device,
        args.quick,
        gpu["01_symmetries"]["recipes"]["resnet"]["batch_size"],
        Path(args.params) if args.params else None,
        notebooks,
        start + args.budget,
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    header = {
        "device": f"{device} ({name})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "budget_s": args.budget,
    }
    print(
        f"gpu check on {header['device']} (torch {torch.__version__}, CUDA {torch.version.cuda}), budget {args.budget:.0f} s"
    )
    report = Report(Path(args.report), header)
    names = [n for n in PHASES if not (n == "chapters" and args.skip_notebooks)]
    for phase in names:
        print(f"== phase {phase}", flush=True)
        report.add(run_phase(phase, ctx, names))
    for failure in report.failures:
        print(f"gpu check: {failure}", file=sys.stderr)
    print(
        f"gpu check: {time.perf_counter() - start:.0f} s; {len(report.failures)} failure(s)"
    )
    return 1 if report.failures else 0
