"""PathCond's criterion along a path: the gauge keeps the loss and lowers AM/GM."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.kit import mlp
from wslib.core.configs import build_model
from wslib.core.interpolation import lerp_state
from wslib.pathcond.rescaling import diag_g
from wslib.synthesis.conditioning import KEYS, log_spread, path_conditioning

IN = [1, 20]
MLP = mlp([12, 10], IN, 4)


def path_of_two_models(seed: int) -> tuple[torch.nn.Module, list[dict]]:
    torch.manual_seed(seed)
    a, b = build_model(MLP), build_model(MLP)
    sa, sb = a.state_dict(), b.state_dict()
    return a, [lerp_state(sa, sb, t) for t in (0.0, 0.5, 1.0)]


def test_gauge_keeps_each_point_and_improves_its_conditioning() -> None:
    a, states = path_of_two_models(0)
    x, y = torch.randn(50, *IN), torch.randint(0, 4, (50,))
    result = path_conditioning(a, states, IN, x, y)
    assert set(result) == set(KEYS)
    assert all(len(v) == 3 for v in result.values())
    assert result["loss_gauge"] == pytest.approx(result["loss"], rel=1e-5)
    pairs = list(zip(result["amgm"], result["amgm_gauge"]))
    assert all(1.0 <= gauged < given for given, gauged in pairs)
    assert all(f_min < f for f, f_min in zip(result["F"], result["F_gauge"]))
    assert len(set(result["loss"])) == 3  # each point evaluated, not the first one


def test_f_is_p_log_amgm_plus_the_point_constant() -> None:
    a, states = path_of_two_models(1)
    x, y = torch.randn(20, *IN), torch.randint(0, 4, (20,))
    result = path_conditioning(a, states, IN, x, y)
    for state, f, amgm, spread in zip(
        states, result["F"], result["amgm"], result["log_g_std"]
    ):
        point = build_model(MLP)
        point.load_state_dict(state)
        g = torch.cat([v.reshape(-1) for v in diag_g(point.double(), IN).values()])
        g = g[g > 0].numpy()
        p = g.size
        want = p * math.log(amgm) + p * math.log(p) + np.log(g).sum()
        assert f == pytest.approx(want, rel=1e-9)
        assert spread == pytest.approx(np.log(g).std(ddof=1), rel=1e-9)


def test_log_spread_and_empty_path() -> None:
    g = {"a": torch.tensor([1.0, math.e**2]), "b": torch.tensor([0.0])}
    assert log_spread(g) == pytest.approx(2**0.5)
    a, _ = path_of_two_models(2)
    with pytest.raises(ValueError, match="at least one state"):
        path_conditioning(a, [], IN, torch.randn(2, *IN), torch.zeros(2).long())
