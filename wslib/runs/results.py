"""Results files: ``results/<profile>/<notebook>.json`` with metrics, timings and environment."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wslib.core.files import atomic_write
from wslib.core.train import devices_used
from wslib.core.workspace import CHECKOUT, in_checkout, workspace


def hardware() -> str:
    """A one-line description of the machine the code runs on."""
    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} threads"


PACKAGES = ("numpy", "scikit-learn", "POT", "captum", "papermill")


def git_commit(root: str | Path | None = None) -> str:
    """The checked-out commit, with ``-dirty`` when the tree has changes; ``unknown`` outside git."""
    if root is None and not in_checkout():
        return "unknown"
    root = CHECKOUT if root is None else Path(root)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(  # bytes: a file name need not be UTF-8
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def environment() -> dict[str, Any]:
    """Versions, hardware and git commit, stored with every results file."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for name in PACKAGES:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name] = "not installed"
    env.update(
        {
            "commit": git_commit(),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "devices_used": devices_used(),
            "threads": torch.get_num_threads(),
            "hardware": hardware(),
        }
    )
    return env


def to_jsonable(value: Any) -> Any:
    """Convert numpy / torch scalars and arrays (nested) to plain JSON values; NaN -> None."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().tolist())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Timings(dict):
    """Named wall-clock timings in seconds; ``with timings("train"):`` adds one."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start


def write_results(
    path: str | Path, metrics: dict[str, Any], timings_s: dict[str, float]
) -> dict[str, Any]:
    """Write one notebook's metrics, timings and environment; return what was written.

    ``bookkit/run.py`` adds the notebook's name, profile and effective
    parameters (defaults overridden by the profile and the injected values).
    A relative ``path`` is taken under the workspace's root
    (:mod:`wslib.core.workspace`).
    """
    record = to_jsonable(
        {
            "metrics": metrics,
            "timings_s": timings_s,
            "env": environment(),
            "finished": time.time(),  # which of two runs of one seed is current
        }
    )
    text = json.dumps(record, indent=2, sort_keys=False) + "\n"
    atomic_write(workspace().path(path), lambda tmp: tmp.write_text(text))
    return record
