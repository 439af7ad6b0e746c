"""bookkit/speed.py: the CPU's one-thread speed in GFLOPS."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info

from bookkit import speed


def blas_threads() -> list[int]:
    """The thread count of each BLAS library NumPy loaded."""
    return [
        lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"
    ]


def test_cpu_speed_counts_the_products_flops(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 m n k FLOPs per product over the timed seconds; the thread counts come back."""
    clock = iter([10.0, 12.0])  # two seconds for the timed products
    monkeypatch.setattr(speed.time, "perf_counter", lambda: next(clock))
    before = blas_threads()
    gflops = speed.thread_gflops(repeats=100)
    assert gflops == pytest.approx(2 * 128 * 256 * 256 * 100 / 2 / 1e9)
    assert blas_threads() == before


def test_the_products_are_timed_on_one_blas_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = []
    clock = speed.time.perf_counter
    monkeypatch.setattr(
        speed.time, "perf_counter", lambda: (seen.append(blas_threads()), clock())[1]
    )
    speed.thread_gflops(repeats=10)
    assert len(seen) == 2 and all(threads and set(threads) == {1} for threads in seen)
