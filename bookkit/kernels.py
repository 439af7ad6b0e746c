"""Chapter kernels forked from a process that has already imported what they import.

A smoke chapter spends about half of its run starting: the kernel imports
IPython, torch, matplotlib and ``wslib`` before its first cell computes
(4-5 CPU-seconds of 10-15). ``run.py`` therefore starts one *kernel server*
per run: it imports ipykernel and every module the chapters' cells import,
then forks a kernel for each chapter. A forked kernel is the ordinary
``ipykernel`` with the same arguments, environment, working folder and
import path as ``python -m ipykernel_launcher``, so its cells compute as
before: only their imports find the modules loaded (``tests/book/test_kernels.py``
compares what a chapter sees of its process with and without the server).

Jupyter starts a small *stub* process in the kernel's place (``python -I -S
kernels.py connect SOCKET ARGS``): it hands the server its arguments,
environment, working folder and standard streams, forwards the signals Jupyter
sends (interrupt, terminate) to the forked kernel, and exits when the kernel
ends; a kernel whose stub is killed exits too. So Jupyter watches, interrupts
and stops the stub as it would the kernel.

Forking is used only on Linux without a CUDA device: macOS's system
libraries are not safe to fork, and a process that has touched CUDA cannot
be forked; there every chapter starts its own kernel as before.
``WSLIB_FORK_KERNELS=0`` turns the server off anywhere.

Before each fork the server freezes its objects (``gc.freeze``): a kernel's
garbage collections then skip the millions of objects of the imported modules
instead of walking them again in every chapter (the 12 smoke chapters, one at
a time: 95 → 83 CPU-s, metrics identical).

This module imports only the standard library at the top: the stub must start
in milliseconds.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import gc
import importlib
import itertools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SWITCH = "WSLIB_FORK_KERNELS"
"""Set to 0 to start every chapter's kernel as a fresh process."""
INLINE = "module://matplotlib_inline.backend_inline"
"""The matplotlib backend ipykernel sets before a chapter's first cell."""
STOPPED = "no kernel server: each chapter starts its own kernel"
"""What run.py says when the server did not start."""
HEADER = struct.Struct("!Q")  # the length of a request, sent with the stub's streams
FIRST_USE = {
    "ipykernel.kernelapp": ["ipykernel.debugger"],
    "myst_nb": ["myst_nb.ext.glue"],
    "torch": ["torch._dynamo"],
}
"""Modules that a loaded module imports only when first used (an optimizer's
first step imports ``torch._dynamo``: about 1 CPU-s in each kernel). The
server imports them when a second kernel is asked for: a run of one chapter
(a sweep's job) would gain nothing, and later kernels find them loaded."""


def imported_modules(sources: list[str]) -> list[str]:
    """The modules that ``import`` and ``from ... import`` statements of ``sources``
    (code cells) name, in the order they first appear."""
    names: dict[str, None] = {}
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell with IPython syntax imports nothing we need
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(dict.fromkeys(alias.name for alias in node.names))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names[node.module] = None
    return list(names)


def serve(path: str, modules: list[str]) -> None:
    """Import ``modules``, then fork a kernel for each stub that connects to ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # run.py stops the kernels on Ctrl-C
    # no zombies: the stubs, not the server, watch the kernels
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as error:  # e.g. a temporary folder too long for a socket
        sys.exit(f"note: {STOPPED}: it cannot listen at {path}: {error}")
    listener.listen(16)  # stubs that connect now wait for the imports
    os.environ.setdefault("MPLBACKEND", INLINE)
    del sys.path[0]  # this script's folder: ipykernel_launcher's path starts after it
    _import(["ipykernel.kernelapp", *modules])
    for served in itertools.count():
        conn, _ = listener.accept()
        if served == 1:
            _import([m for k, v in FIRST_USE.items() if k in sys.modules for m in v])
        gc.freeze()  # the kernels' collections skip the imported modules' objects
        fds: list[int] = []
        try:  # a stub that died mid-request costs its own chapter only
            header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            request = json.loads(_receive(conn, HEADER.unpack(header)[0]))
            if os.fork() == 0:
                listener.close()
                _run_kernel(conn, fds, request)
        except (OSError, ValueError, struct.error):
            pass
        conn.close()
        for fd in fds:
            os.close(fd)


def _import(modules: list[str]) -> None:
    """Import ``modules``; one that fails is left to the chapter's cell to report."""
    for name in modules:
        with contextlib.suppress(BaseException):
            importlib.import_module(name)


def _receive(conn: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``conn``."""
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the stub closed its connection mid-request")
        data += chunk
    return data


def _run_kernel(conn: socket.socket, fds: list[int], request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m ipykernel_launcher ARGS`` as the stub
    was started (streams, folder, environment, a session of its own); never returns."""
    os.setsid()  # like Jupyter's kernels: the terminal's Ctrl-C is run.py's to handle
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # parent_handle 1: no parent to poll (its parent is the server; the stub
    # watches it) and, unlike 0, no "Ctrl-C will not work" note on run's console
    sys.argv = ["ipykernel_launcher", *request["argv"], "--IPKernelApp.parent_handle=1"]
    conn.sendall(b"%d\n" % os.getpid())
    threading.Thread(target=_exit_with_stub, args=(conn,), daemon=True).start()
    code = 1
    try:
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            conn.sendall(b"%d\n" % code)  # the stub exits with it
        os._exit(code)


def _exit_with_stub(conn: socket.socket) -> None:
    """End the kernel when its stub ends (Jupyter killed it): nothing else watches."""
    while conn.recv(1):
        pass
    os._exit(1)


def connect(path: str, argv: list[str]) -> int:
    """The stub: have the server at ``path`` fork a kernel with ``argv``, relay
    signals to it and return when it ends."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    body = json.dumps(request).encode()
    socket.send_fds(conn, [HEADER.pack(len(body))], [0, 1, 2])
    conn.sendall(body)
    reader = conn.makefile("rb")
    pid = int(reader.readline())

    def relay(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, relay)
    status = reader.read()  # until the kernel's end of the connection closes
    return int(status) if status.strip() else 1  # nothing: killed by a signal


GPU_DRIVER_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")
"""Files of the NVIDIA and AMD (ROCm) drivers: torch sees a GPU only where one exists."""


def wanted() -> bool:
    """Whether this machine forks its kernels (see the module's docstring).

    Without a GPU driver torch cannot see a device, so ``run.py`` starts
    without importing torch (2.6 CPU-s); where a driver is, torch is asked.
    """
    if os.environ.get(SWITCH, "1") == "0" or sys.platform != "linux":
        return False
    if not any(os.path.exists(f) for f in GPU_DRIVER_FILES):
        return True
    import torch

    return not torch.cuda.is_available()


@contextlib.contextmanager
def server(cwd: Path, modules: list[str]) -> Iterator[type | None]:
    """A kernel server importing ``modules``, run in ``cwd`` while the block runs;
    yields the kernel manager class that starts kernels from it, or None where
    kernels are not forked (:func:`wanted`) or the server did not start (a
    temporary folder too long for a socket's path, say: a note says why)."""
    if not wanted():
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="wslib-kernels-") as folder:
        path = Path(folder) / "server"
        process = subprocess.Popen(
            [sys.executable, __file__, "serve", str(path), *modules],
            cwd=cwd,
        )
        try:
            listening = _listening(path, process)
            if not listening and process.poll() is None:  # else it said why
                print(f"note: {STOPPED} (no answer within a minute)", file=sys.stderr)
            yield manager_class(str(path)) if listening else None
        finally:
            process.terminate()
            process.wait()


def _listening(path: Path, process: subprocess.Popen, wait: float = 60) -> bool:
    """Whether the server listens at ``path`` within ``wait`` s (it binds before it imports)."""
    deadline = time.monotonic() + wait
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def manager_class(path: str) -> type:
    """A Jupyter kernel manager whose python kernels are forked by the server at ``path``."""
    from jupyter_client.manager import AsyncKernelManager  # nbclient's default

    class ForkedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(
            self, extra_arguments: list[str] | None = None
        ) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            if cmd[:3] != [sys.executable, "-m", "ipykernel_launcher"]:
                return cmd  # another kernel: started as its spec says
            return [sys.executable, "-I", "-S", __file__, "connect", path, *cmd[3:]]

    return ForkedKernelManager


if __name__ == "__main__":
    command, socket_path, *rest = sys.argv[1:]
    if command == "serve":
        serve(socket_path, rest)
    else:
        sys.exit(connect(socket_path, rest))
