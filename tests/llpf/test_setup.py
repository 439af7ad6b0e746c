"""The LLPF chapters' shared setup (wslib.llpf.setup)."""

from __future__ import annotations

from pathlib import Path

from wslib.llpf.setup import profile_folder


def test_profile_folder() -> None:
    assert profile_folder(None, "cpu") is None
    assert profile_folder("data/llpf", "cpu") == Path("data/llpf/cpu")
