"""``bookkit COMMAND [ARGS]``: run one command of the book's tooling (see :mod:`bookkit`)."""

from __future__ import annotations

import gc
import importlib
import sys
from pathlib import Path

COMMANDS = {
    "run": "run",
    "sweep": "sweep",
    "part": "part",
    "plan": "plan",
    "affected": "affected",
    "build": "build",
    "lint": "lint",
    "download": "download",
    "gpu-check": "gpu_check",
    "synthetic-data": "synthetic_data",
}
"""Command name -> module of :mod:`bookkit` whose ``main(argv)`` it calls."""


def other_checkout(folder: Path, root: Path) -> str | None:
    """Why the bookkit of repository ``root`` must not run from ``folder``: another
    checkout's root (it holds ``notebooks/``), whose files it would not touch
    while reading and writing ``root``'s (None when it may run)."""
    if folder == root or not (folder / "notebooks").is_dir():
        return None
    return (
        f"{folder} holds chapters but no bookkit/ of its own, and the bookkit "
        f"installed from {root} works on that repository's files; run it there, "
        f"or copy bookkit/ into {folder} and run python -m bookkit from it"
    )


def main(argv: list[str] | None = None) -> int:
    """Import the command's module, then call its ``main`` with the other arguments."""
    args = sys.argv[1:] if argv is None else argv
    usage = f"usage: bookkit COMMAND [ARGS]; commands: {' '.join(COMMANDS)}"
    if args[:1] in (["-h"], ["--help"]):
        print(usage)
        return 0
    if not args or args[0] not in COMMANDS:
        problem = f"unknown command {args[0]!r}" if args else "no command given"
        print(f"error: {problem}\n{usage}", file=sys.stderr)
        return 2
    from bookkit.profiles import ROOT  # imports torch: after the usage checks

    refused = other_checkout(Path.cwd().resolve(), ROOT)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    command, *rest = args
    module = importlib.import_module(f"bookkit.{COMMANDS[command]}")
    gc.freeze()  # collections skip the objects of the modules imported so far
    program, sys.argv[0] = sys.argv[0], f"bookkit {command}"  # argparse's usage line
    try:
        return int(module.main(rest) or 0)
    finally:
        sys.argv[0] = program


if __name__ == "__main__":
    sys.exit(main())
