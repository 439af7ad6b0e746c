"""The reader's workspace: one root, and absolute folders under it for everything
a chapter reads or writes.

The root is the checkout when the library runs from one (so a chapter opened
from any folder, ``notebooks/`` or a downloaded copy's, finds the same data,
caches and results), and the working directory otherwise (the library
installed as a package). ``WSLIB_WORKSPACE`` names another root:
``bookkit/run.py`` sets it to the checkout it runs from, so the chapters it
executes write where it reads. A relative path a chapter passes (its parameters say
``data/runs``) is taken under that root, never under the working directory:
no library call depends on where the kernel started, and nothing changes the
working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV = "WSLIB_WORKSPACE"
CHECKOUT = Path(__file__).resolve().parents[2]  # the repository, for a source install


@dataclass(frozen=True)
class Workspace:
    """Absolute folders under ``root``: ``data`` (data sets), ``zoo`` (trained
    models), ``runs`` (the run cache), ``checkpoints`` (LLPF paths) and
    ``results`` (results files)."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def zoo(self) -> Path:
        return self.data / "zoo"

    @property
    def runs(self) -> Path:
        return self.data / "runs"

    @property
    def checkpoints(self) -> Path:
        return self.data / "llpf"

    @property
    def results(self) -> Path:
        return self.root / "results"

    def show(self, path: str | Path) -> str:
        """``path`` as a message prints it: relative to ``root`` when under
        it (no page shows the folder of the machine that built it)."""
        path = Path(path)
        return (
            str(path.relative_to(self.root))
            if path.is_relative_to(self.root)
            else str(path)
        )

    def path(self, path: str | Path) -> Path:
        """``path`` made absolute: a relative one is taken under ``root``."""
        path = Path(path).expanduser()
        return path if path.is_absolute() else self.root / path


def in_checkout() -> bool:
    """Whether the library runs from a checkout of the repository."""
    return (CHECKOUT / "notebooks").is_dir() and (CHECKOUT / "wslib").is_dir()


def workspace() -> Workspace:
    """The workspace: ``$WSLIB_WORKSPACE`` when set, else the checkout when the
    library runs from one, else the working directory."""
    if os.environ.get(ENV):
        return Workspace(Path(os.environ[ENV]).expanduser().resolve())
    return Workspace(CHECKOUT if in_checkout() else Path.cwd().resolve())
