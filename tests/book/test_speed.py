"""bookkit/speed.py: the CPU's one-thread speed in GFLOPS."""

from __future__ import annotations

import pytest

from bookkit import speed


def test_cpu_speed_counts_the_products_flops_on_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2 m n k FLOPs per product over the timed seconds; the thread count comes back."""
    clock = iter([10.0, 12.0])  # two seconds for the timed products
    monkeypatch.setattr(speed.time, "perf_counter", lambda: next(clock))
    threads = []
    real_set = speed.torch.set_num_threads
    monkeypatch.setattr(
        speed.torch, "set_num_threads", lambda n: (threads.append(n), real_set(n))
    )
    before = speed.torch.get_num_threads()
    gflops = speed.thread_gflops(repeats=100)
    assert gflops == pytest.approx(2 * 128 * 256 * 256 * 100 / 2 / 1e9)
    assert threads == [1, before] and speed.torch.get_num_threads() == before
