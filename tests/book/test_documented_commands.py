"""Every command in the code blocks of the README, CONTRIBUTING and the book's
"Running the book" pages (``book/running/``), as written there.

Each ``make`` command is expanded (``A|B`` alternatives, ``[optional]`` parts
taken), run as ``make -n`` (the Makefile accepts its variables; nothing
runs), and every script command it would start is parsed by that script's own
argument parser, so a documented command that the Makefile or a script would
refuse fails here; so is a ``bookkit`` command written out. The pytest commands are collected (``--collect-only``).
The chapters themselves run in the smoke profile in the book fixtures.
"""

from __future__ import annotations

import importlib
import itertools
import re
import shlex
import subprocess
import sys

import pytest

from bookkit.__main__ import COMMANDS
from tests.conftest import ROOT

DOCS = (
    "README.md",
    "CONTRIBUTING.md",
    "book/running/profiles.md",
    "book/running/sweeps.md",
    "book/running/gpu.md",
    "book/running/publishing.md",
)
PARSED = {"run", "sweep", "gpu-check"}  # commands with a parse_args of their own


def check_bookkit(words: list[str]) -> None:
    """Parse the arguments of the ``bookkit`` command in ``words``, if there is one,
    with that command's own parser (a refused argument exits with status 2)."""
    starts = [i for i, w in enumerate(words) if w.endswith("bookkit")]
    rest = words[starts[0] + 1 :] if starts else []
    if not rest or rest[0] not in PARSED:
        return
    command, *args = rest
    args = args[: args.index("&&")] if "&&" in args else args
    importlib.import_module(f"bookkit.{COMMANDS[command]}").parse_args(args)


def documented_commands() -> list[str]:
    """The command lines of the shell code blocks, comments dropped."""
    commands = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
            for line in block.splitlines():
                command = line.split(" #")[0].strip()
                if command:
                    commands.append(command)
    return commands


def expansions(command: str) -> list[list[str]]:
    """``command`` as argument lists: ``[opt]`` taken, each ``A|B`` alternative."""
    words = shlex.split(command.replace("[", "").replace("]", ""))
    choices = []
    for word in words:
        name, _, value = word.partition("=")
        if "|" in value:
            choices.append([f"{name}={v}" for v in value.split("|")])
        else:
            choices.append([word])
    return [list(c) for c in itertools.product(*choices)]


CASES = [(c, argv) for c in documented_commands() for argv in expansions(c)]


def test_the_documents_show_commands() -> None:
    makes = {argv[1] for _, argv in CASES if argv[0] == "make"}
    assert {"book", "test", "sweep", "notebook", "publish", "data"} <= makes


@pytest.mark.parametrize(
    "argv", [argv for _, argv in CASES], ids=[" ".join(a) for _, a in CASES]
)
def test_a_documented_command_is_accepted(argv: list[str]) -> None:
    if argv[0] == "make":
        done = subprocess.run(
            ["make", "-n", "-s", "-C", str(ROOT), *argv[1:]],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        for line in done.stdout.splitlines():
            if line.lstrip().startswith("#"):  # a recipe's comment (make -n shows it)
                continue
            check_bookkit(shlex.split(line.strip(" &\\")))
    elif argv[0] == ".venv/bin/bookkit":
        assert argv[1] in COMMANDS, argv
        check_bookkit(argv)
    else:
        assert argv[:3] == [".venv/bin/python", "-m", "pytest"], argv
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", *argv[3:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:]
