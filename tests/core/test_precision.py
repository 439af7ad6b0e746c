"""Invariance and self-fusion checks run with TF32 off; training keeps the default."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from wslib.core.connectivity import max_output_diff
from wslib.core.train import full_precision
from wslib.fusion import ch10_regimes


class FlagSpy(nn.Module):
    """A linear model that records the two TF32 flags at each forward pass (of any copy)."""

    calls: list[tuple[bool, bool]] = []

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        FlagSpy.calls.append(flags)
        return self.lin(x)


@pytest.fixture()
def tf32_on():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_full_precision_turns_tf32_off_and_restores_it(tf32_on) -> None:
    with full_precision():
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def test_output_difference_is_measured_without_tf32(tf32_on) -> None:
    """Every forward pass of max_output_diff (the symmetry checks') sees TF32 off."""
    spy = FlagSpy()
    assert max_output_diff(spy, spy.state_dict(), torch.randn(4, 3), False) == 0
    assert FlagSpy.calls and all(flags == (False, False) for flags in FlagSpy.calls)


def test_self_fusion_runs_without_tf32(tf32_on, monkeypatch) -> None:
    seen = []

    def fake_fuse(method, pair, x, y, ridge):  # noqa: ANN001
        seen.append(
            (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        )
        return pair[1]

    monkeypatch.setattr(ch10_regimes, "fuse_by", fake_fuse)
    model = nn.Sequential(nn.Linear(3, 2))
    out = ch10_regimes.self_fusion(
        model, torch.randn(4, 3), None, torch.randn(5, 3), methods=["x"]
    )
    assert out == {"x": 0.0} and seen == [(False, False)]
