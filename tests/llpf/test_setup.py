"""The LLPF chapters' shared setup (wslib.llpf.setup)."""

from __future__ import annotations

from pathlib import Path

from wslib.core.workspace import workspace
from wslib.llpf.setup import profile_folder


def test_profile_folder() -> None:
    """Under the workspace's root, whatever the working directory."""
    assert profile_folder(None, "cpu") is None
    assert profile_folder("data/llpf", "cpu") == workspace().checkpoints / "cpu"
    assert profile_folder("/elsewhere", "cpu") == Path("/elsewhere/cpu")
