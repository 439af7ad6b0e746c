"""Alignment steps, found by mutation testing (``make mutation MODULE=synthesis/alignment``).

When ENorm's gauge stops, the precision of the rescaled states, the seed
that every matching gets, and what the study computes once, in eval mode and
without progress bars.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from tests.kit import cnn1d, drawn_models, mlp, toy_dataset
from wslib.core.configs import build_model
from wslib.core.matching import match_scales
from wslib.core.neurons import neuron_structure, rescale_state
from wslib.synthesis import alignment
from wslib.synthesis.alignment import (
    STEPS,
    alignment_steps,
    alignment_study,
    enorm_gauge,
    lifting_inner,
    scale_matched,
    summarise,
)

IN = [1, 20]
MLP = mlp([6, 5, 4], IN, 4)
"""Three groups: for the models drawn after seed 0 every matching step
depends on the order of the groups (the matching's seed)."""


def small_weights(seed: int = 0) -> nn.Module:
    """An MLP whose every tensor's largest entry is below 1/3."""
    torch.manual_seed(seed)
    model = build_model(mlp([6], IN, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.1)
    return model


def _enorm_cycles(monkeypatch: pytest.MonkeyPatch, step) -> list[int]:  # noqa: ANN001
    """Replace ENorm's cycle by ``step(model, cycle)``; the cycles run are listed."""
    cycles: list[int] = []

    def counted(model: nn.Module) -> None:
        cycles.append(len(cycles) + 1)
        with torch.no_grad():
            step(model, cycles[-1])

    monkeypatch.setattr(alignment, "enorm_step", counted)
    return cycles


def test_enorm_stops_at_the_first_cycle_that_moves_no_tensor_by_rtol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cycle k moves every weight by 3 * 10**-k of itself (relative to the
    tensor's largest entry, whatever its size): cycle 7 is the first below 1e-6."""

    def shrinking(model: nn.Module, k: int) -> None:
        for p in model.parameters():
            p.mul_(1 + 3 * 10.0**-k)

    cycles = _enorm_cycles(monkeypatch, shrinking)
    enorm_gauge(small_weights())
    assert cycles == list(range(1, 8))


def test_enorm_runs_100_cycles_by_default_and_every_cycle_when_rtol_is_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def doubling(model: nn.Module, k: int) -> None:
        for p in model.parameters():
            p.mul_(2.0)

    cycles = _enorm_cycles(monkeypatch, doubling)
    enorm_gauge(small_weights())
    assert len(cycles) == 100
    cycles = _enorm_cycles(monkeypatch, lambda model, k: None)  # moves nothing
    enorm_gauge(small_weights(), cycles=5, rtol=0.0)
    assert len(cycles) == 5


def test_the_gauges_come_back_in_the_models_dtype() -> None:
    model = small_weights()
    for state in (enorm_gauge(model), alignment.pathcond_gauge(model, IN)):
        assert all(
            state[k].dtype == v.dtype == torch.float32
            for k, v in model.state_dict().items()
        )


def test_scale_matching_rescales_in_float64_and_rounds_once() -> None:
    a, b = drawn_models(MLP, 2)
    sa, sb = a.state_dict(), b.state_dict()
    structure = neuron_structure(a)
    scales, _ = match_scales(sa, sb, structure)
    exact = rescale_state({k: v.double() for k, v in sb.items()}, structure, scales)
    got = scale_matched(sa, sb, a)
    for k, v in exact.items():
        assert got[k].dtype == torch.float32
        assert torch.equal(got[k], v.float()), k


def test_every_matching_of_the_steps_gets_the_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seeds: list[object] = []
    align = alignment.align

    def spy(a, b, structure, **kwargs):  # noqa: ANN001, ANN202
        seeds.append(kwargs.get("seed"))
        return align(a, b, structure, **kwargs)

    monkeypatch.setattr(alignment, "align", spy)
    a, b = drawn_models(MLP, 2)
    steps = alignment_steps(a, b, IN, seed=1)
    assert seeds == [1, 1, 1]  # weight matching and the two gauge steps
    others = alignment_steps(a, b, IN, seed=0)
    for step in STEPS[1:]:  # the seed changes every matched step
        assert any(
            not torch.equal(steps[step][1][k], others[step][1][k])
            for k in steps[step][1]
        )


def test_the_lifting_needs_an_mlp_and_says_what_to_use_instead() -> None:
    cnn = build_model(cnn1d([3], IN, 4))
    message = (
        "lifting_inner needs an MLP, got ConvNet; "
        "use wslib.pathcond.lifting.explicit_path_lifting for tiny nets"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        lifting_inner(cnn, cnn.state_dict(), cnn.state_dict())


def test_the_study_gauges_each_model_once_checks_in_eval_mode_and_prints_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gauged: list[tuple[int, list[int]]] = []
    modes: list[bool] = []
    gauges_of, max_output_diff = alignment.gauges_of, alignment.max_output_diff

    def gauges_spy(model: nn.Module, in_shape: list[int]) -> dict:
        gauged.append((id(model), list(in_shape)))
        return gauges_of(model, in_shape)

    def diff_spy(model, state, x, train_mode: bool) -> float:  # noqa: ANN001
        modes.append(train_mode)
        return max_output_diff(model, state, x, train_mode)

    monkeypatch.setattr(alignment, "gauges_of", gauges_spy)
    monkeypatch.setattr(alignment, "max_output_diff", diff_spy)
    models = drawn_models(mlp([6, 5], IN, 4), 3, seed=1, train=True)
    ds = toy_dataset(24, 12, IN, 4, test_from_train=True)
    capsys.readouterr()
    alignment_study({"mlp": [models[:2], models[::2]]}, ds, [0.0, 1.0], seed=0)
    assert capsys.readouterr().err == ""
    assert sorted(gauged) == sorted((id(m), IN) for m in models)
    assert modes == [False] * (2 * len(STEPS) * 2)


def test_one_pair_has_no_spread() -> None:
    row = {"barrier": [0.7], "distance": [2.0], "function_change": [0.0]}
    assert summarise(row)["barrier_std"] == 0.0
