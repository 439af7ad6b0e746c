"""Every fusion method refuses a fusion set its models cannot read (``fuse_by``'s check)."""

from __future__ import annotations

import pytest
import torch

from wslib.core.configs import build_model
from wslib.fusion.baselines import fuse_by


@pytest.mark.parametrize("method", ["averaging", "hf_linear", "kf_linear", "otfusion"])
def test_a_fusion_set_the_models_cannot_read_is_named(method) -> None:
    """Inputs of another width, or one label per input missing: a clear error."""
    config = {"name": "mlp", "in_shape": [1, 12], "n_classes": 4, "widths": [6]}
    models = [build_model(config) for _ in range(2)]
    x, y = torch.randn(32, 1, 10), torch.arange(32) % 4
    with pytest.raises(
        ValueError, match=r"cannot read the fusion set's inputs of shape \(1, 10\)"
    ):
        fuse_by(method, models, x, y)
    with pytest.raises(ValueError, match="32 inputs but 31 labels"):
        fuse_by(method, models, torch.randn(32, 1, 12), y[:31])
    assert all(m.training for m in models)  # the probe left their mode alone
