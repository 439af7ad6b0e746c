"""This CPU's speed, printed beside every wall time a run or a sweep reports.

It is measured with NumPy's BLAS, not torch's: the commands that print it
(``bookkit run`` and ``sweep``) then start without importing torch, which
costs 2.6 CPU-s a process and which their chapters' kernels import anyway.
The two BLAS libraries gave the same speed here (numpy 97, 100, 100, 100
GFLOPS against torch 90, 99, 99, 100, called in turn; decision 0050).
"""

from __future__ import annotations

import time

import numpy as np
from threadpoolctl import threadpool_limits


def thread_gflops(repeats: int = 1000) -> float:
    """This CPU's float32 speed on one thread, in GFLOPS.

    A 128x256 by 256x256 matrix product (a layer of the book's MLPs at batch
    128) timed ``repeats`` times, with the BLAS limited to one thread. The
    run prints it beside its wall time: a timing means little without the
    machine's speed (the book's 2-core build machine was seen at about 90 and
    at 180 GFLOPS on different days), and this number lets builds on
    different machines or days be compared. 1,000 products (0.2 s at 90
    GFLOPS; ``make test`` runs about 80) spread as 5,000 did: 81-100 against
    88-99 GFLOPS, 20 calls each, here.
    """
    a = np.ones((128, 256), np.float32)
    b = np.ones((256, 256), np.float32)
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(repeats // 10):  # warm-up
            a @ b
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        seconds = time.perf_counter() - start
    return 2 * 128 * 256 * 256 * repeats / seconds / 1e9


def cpu_speed_text() -> str:
    """:func:`thread_gflops` in words, for the line that reports a wall time."""
    return f"this CPU: {thread_gflops():.0f} GFLOPS on one thread, float32"
