"""bookkit/kernels.py: a forked kernel is the kernel Jupyter would have started.

The smoke book's chapters all run in forked kernels (the suite runs on Linux
without CUDA); the smoke metrics test (``test_notebooks``) compares them with
the book's expectations. Here: what a chapter's cells can see of their
process (folder, import path, environment, matplotlib backend, figures) is
the same with and without the server, and Jupyter's signals and kills reach
a forked kernel through its stub.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from bookkit import kernels
from tests.conftest import ROOT, script_repo, write_notebook

PROBE = """\
import json, os, sys
import matplotlib
import matplotlib.pyplot as plt

plt.plot([0, 1])
plt.show()
seen = {
    "cwd": os.getcwd(),
    "path": sys.path,
    "probe": os.environ.get("WSLIB_PROBE"),
    "backend": matplotlib.get_backend(),
    "session_leader": os.getsid(0) == os.getpid(),
    "interrupt": str(__import__("signal").getsignal(__import__("signal").SIGINT)),
}
with open("seen.json", "w") as file:
    json.dump(seen, file)
from wslib.runs.results import write_results

write_results(results_path, {}, {})
"""


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A repository root with the scripts and one probing chapter."""
    notebooks = script_repo(tmp_path)
    parameters = 'profile = "cpu"\nresults_path = "r.json"\nseed = 0'
    write_notebook(notebooks / "00_probe.md", parameters, PROBE)
    return tmp_path


def probe(repo: Path, fork: str) -> tuple[dict, list[str], bool]:
    """What the probing chapter saw, the output types of its cells, and whether
    ipykernel printed its note for a kernel without a parent on the console."""
    env = {**os.environ, kernels.SWITCH: fork, "WSLIB_PROBE": "seen"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "bookkit", "run", "--profile", "cpu"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads((repo / "seen.json").read_text())
    executed = nbformat.read(repo / "build/cpu/00_probe.ipynb", as_version=4)
    kinds = [
        k
        for c in executed.cells
        for o in c.get("outputs", [])
        for k in o.get("data", {})
    ]
    return seen, sorted(kinds), "Ctrl-C will not work" in done.stdout + done.stderr


def test_a_forked_kernel_sees_what_a_started_kernel_sees(repo: Path) -> None:
    forked = probe(repo, "1")
    started = probe(repo, "0")
    assert forked == started
    assert forked[0]["probe"] == "seen" and forked[0]["session_leader"]
    assert "image/png" in forked[1]  # the figure is shown inline
    assert not forked[2]  # a quiet console, as with a started kernel


def test_the_server_is_used_only_where_forking_is_safe(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(kernels, "GPU_DRIVER_FILES", (os.devnull,))  # a driver is here
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(kernels.SWITCH, raising=False)
    assert kernels.wanted()
    monkeypatch.setenv(kernels.SWITCH, "0")
    assert not kernels.wanted()
    monkeypatch.delenv(kernels.SWITCH)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not kernels.wanted()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not kernels.wanted()


def test_without_a_gpu_driver_the_server_is_used_and_torch_not_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    def asked() -> bool:
        raise AssertionError("torch was asked for a device")

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv(kernels.SWITCH, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", asked)
    monkeypatch.setattr(kernels, "GPU_DRIVER_FILES", ("/no/such/driver",))
    assert kernels.wanted()
    monkeypatch.setattr(kernels, "GPU_DRIVER_FILES", ("/no/such/driver", os.devnull))
    with pytest.raises(AssertionError, match="asked"):
        kernels.wanted()


@pytest.mark.skipif(sys.platform != "linux", reason="kernels are forked on Linux only")
def test_a_server_that_cannot_listen_leaves_each_chapter_its_own_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """A socket's path is at most 107 bytes: a long temporary folder (some
    clusters set one) must not stop the run."""
    import tempfile

    deep = tmp_path / ("x" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr(kernels, "wanted", lambda: True)
    with kernels.server(tmp_path, []) as manager:
        assert manager is None
    err = capfd.readouterr().err
    assert "no kernel server: each chapter starts its own kernel" in err
    assert "Traceback" not in err


@pytest.mark.skipif(sys.platform != "linux", reason="kernels are forked on Linux only")
@pytest.mark.parametrize("args", [["--version"], ["--no-such-flag"]])
def test_a_stub_ends_as_its_kernel_ends(tmp_path: Path, args: list[str]) -> None:
    """Its exit status and output are those of ``python -m ipykernel_launcher``."""

    def ended(command: list[str]) -> tuple[int, str]:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout

    started = ended([sys.executable, "-m", "ipykernel_launcher", *args])
    with kernels.server(tmp_path, []) as manager:
        assert manager is not None
        stub = manager(kernel_name="python3").format_kernel_cmd()[:6]
        assert ended([*stub, *args]) == started
    assert started[0] == (0 if args == ["--version"] else 2)


def test_imported_modules_are_read_from_the_cells_in_order() -> None:
    cells = [
        "import os, numpy as np\nfrom wslib.core import seeds",
        "%matplotlib inline\nimport skipped",  # IPython syntax: not parsed
        "from . import local\nimport os\ndef f():\n    import json",
    ]
    assert kernels.imported_modules(cells) == ["os", "numpy", "wslib.core", "json"]


async def kernel_pid(client) -> int:
    """The process id of ``client``'s kernel, as the kernel itself reports it."""
    printed: list[str] = []
    await client.execute_interactive(
        "import os; print(os.getpid())",
        output_hook=lambda msg: printed.append(msg["content"].get("text", "")),
        timeout=30,
    )
    return int("".join(printed))


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has ended or ends within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


async def interrupt_then_kill_the_stub(manager: type, cwd: Path) -> None:
    km = manager(kernel_name="python3")
    await km.start_kernel(cwd=str(cwd))
    client = km.client()
    client.start_channels()
    pid = None
    try:
        await client.wait_for_ready(timeout=60)
        pid = await kernel_pid(client)
        assert pid != km.provisioner.process.pid  # the stub is not the kernel
        msg_id = client.execute("import time; time.sleep(60)")
        await asyncio.sleep(1)
        await km.interrupt_kernel()
        reply = await client.get_shell_msg(timeout=20)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        km.provisioner.process.send_signal(signal.SIGKILL)  # as Jupyter kills a kernel
        assert gone(pid)
    finally:
        client.stop_channels()
        await km.shutdown_kernel(now=True)
        if pid is not None and not gone(pid, within=0):  # the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(sys.platform != "linux", reason="kernels are forked on Linux only")
def test_interrupts_reach_the_kernel_and_a_killed_stub_ends_it(tmp_path: Path) -> None:
    with kernels.server(tmp_path, ["json"]) as manager:
        assert manager is not None
        asyncio.run(interrupt_then_kill_the_stub(manager, tmp_path))
