"""Results files: ``results/<profile>/<notebook>.json`` with metrics, timings and environment."""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch


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


def environment() -> dict[str, Any]:
    """Versions and hardware, stored with every results file."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "hardware": hardware(),
    }


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
    path: str | Path,
    notebook: str,
    profile: str,
    params: dict[str, Any],
    metrics: dict[str, Any],
    timings_s: dict[str, float],
) -> dict[str, Any]:
    """Write one notebook's results file and return what was written."""
    record = to_jsonable(
        {
            "notebook": notebook,
            "profile": profile,
            "params": params,
            "metrics": metrics,
            "timings_s": timings_s,
            "env": environment(),
        }
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return record
