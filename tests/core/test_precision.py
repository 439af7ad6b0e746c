"""Invariance and self-fusion checks compare outputs in float64, on any device.

A device's kernels (TF32, FFT or Winograd convolutions) change float32
outputs by far more than the weights' rounding; in float64 a check sees the
weights alone. Training keeps its own precision.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from wslib.core.connectivity import max_output_diff
from wslib.core.train import float64_outputs
from wslib.fusion import ch10_regimes


class DtypeSpy(nn.Module):
    """A linear model (with BatchNorm) that records the dtypes of each forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
        self.seen: list[tuple[torch.dtype, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.dtype, self.lin.weight.dtype))
        return self.bn(self.lin(x))


def test_float64_outputs_run_a_float64_copy_and_leave_the_model_alone() -> None:
    torch.manual_seed(0)
    model = DtypeSpy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2500, 3)
    out = float64_outputs(model, x, train_mode=True, batch_size=1000)
    assert out.dtype == torch.float64 and out.shape == (2500, 2)
    assert model.training and model.lin.weight.dtype == torch.float32
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])  # BatchNorm's running statistics too
    # train mode: one batch (BatchNorm's statistics are all of x's)
    whole = DtypeSpy()
    whole.load_state_dict(before)
    with torch.no_grad():
        expected = whole.double().train()(x.double())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    evaluated = float64_outputs(model, x, batch_size=1000)  # eval mode: in batches
    wide = model.double().eval()
    with torch.no_grad():
        torch.testing.assert_close(evaluated, wide(x.double()), rtol=0, atol=0)


def test_the_output_difference_is_measured_in_float64() -> None:
    spy = DtypeSpy()
    assert max_output_diff(spy, spy.state_dict(), torch.randn(4, 3), False) == 0
    assert spy.seen == []  # copies ran, not the model itself
    torch.manual_seed(0)
    model = nn.Linear(50, 50)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["weight"][0, 0] = torch.nextafter(state["weight"][0, 0], torch.tensor(2.0))
    x = torch.ones(1, 50)
    step = float(state["weight"][0, 0].double() - model.weight.detach()[0, 0].double())
    # one float32 ulp of one weight, seen exactly: float64 adds no rounding of its own
    assert max_output_diff(model, state, x, False) == abs(step)


def test_self_fusion_compares_float64_outputs(monkeypatch) -> None:
    seen: list[torch.dtype] = []
    spy = DtypeSpy().eval()

    def fake_fuse(method, pair, x, y, ridge):  # noqa: ANN001
        return pair[1]

    real = ch10_regimes.float64_outputs

    def recording(model, x, **kwargs):  # noqa: ANN001
        out = real(model, x, **kwargs)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(ch10_regimes, "fuse_by", fake_fuse)
    monkeypatch.setattr(ch10_regimes, "float64_outputs", recording)
    out = ch10_regimes.self_fusion(
        spy, torch.randn(4, 3), None, torch.randn(5, 3), methods=["x"]
    )
    assert out == {"x": 0.0} and seen == [torch.float64, torch.float64]

    def shifted_fuse(method, pair, x, y, ridge):  # noqa: ANN001
        other = copy.deepcopy(pair[1])
        with torch.no_grad():
            other.lin.bias += 0.25
        return other

    monkeypatch.setattr(ch10_regimes, "fuse_by", shifted_fuse)
    x_test = torch.randn(5, 3)
    out = ch10_regimes.self_fusion(spy, torch.randn(4, 3), None, x_test, methods=["x"])
    shifted = copy.deepcopy(spy)
    with torch.no_grad():
        shifted.lin.bias += 0.25
    expected = (
        (float64_outputs(shifted, x_test) - float64_outputs(spy, x_test)).abs().max()
    )
    assert out["x"] == pytest.approx(float(expected), rel=1e-12) and out["x"] > 0
