"""Alignment steps keep each model's function and bring B closer to A."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.kit import cnn1d, drawn_models, mlp, resnet1d, toy_dataset
from wslib.core.configs import build_model
from wslib.core.connectivity import max_output_diff
from wslib.core.data import Dataset
from wslib.core.matching import match_scales, scale_distance
from wslib.core.neurons import (
    permute_state,
    random_permutations,
    random_scales,
    rescale_state,
)
from wslib.pathcond.lifting import explicit_path_lifting
from wslib.pathcond.rescaling import am_over_gm, diag_g
from wslib.synthesis.alignment import (
    STEPS,
    alignment_steps,
    alignment_study,
    distance,
    enorm_gauge,
    gauges_of,
    lifting_distance,
    lifting_inner,
    pathcond_gauge,
    scale_matched,
    summarise,
    with_state,
)

IN = [1, 20]
CONFIGS = {
    "mlp": mlp([12, 10], IN, 4),
    "cnn": cnn1d([5, 6], IN, 4),
    "resnet": resnet1d([4, 6], IN, 4, blocks_per_stage=1),
}
TINY = mlp([4, 3], [1, 3], 2)


def rescaled_copy(model: torch.nn.Module, seed: int, spread: float = 1.0) -> dict:
    structure = model.neuron_structure()
    gen = torch.Generator().manual_seed(seed)
    wide = {k: v.double() for k, v in model.state_dict().items()}
    state = rescale_state(
        wide, structure, random_scales(structure, spread=spread, generator=gen)
    )
    return {k: v.float() for k, v in state.items()}


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_every_step_keeps_both_functions(arch: str) -> None:
    torch.manual_seed(0)
    a, b = build_model(CONFIGS[arch]), build_model(CONFIGS[arch])
    x = torch.randn(64, *IN)
    steps = alignment_steps(a, b, IN, seed=0)
    assert list(steps) == list(STEPS)
    for sa, sb in steps.values():
        assert max_output_diff(a, sa, x, False) < 1e-4
        assert max_output_diff(b, sb, x, False) < 1e-4


def test_precomputed_gauges_give_the_same_steps() -> None:
    torch.manual_seed(2)
    a, b = build_model(CONFIGS["mlp"]), build_model(CONFIGS["mlp"])
    fresh = alignment_steps(a, b, IN, seed=0)
    given = alignment_steps(a, b, IN, 0, gauges=(gauges_of(a, IN), gauges_of(b, IN)))
    for step in STEPS:
        for s, t in zip(fresh[step], given[step]):
            assert all(torch.equal(s[k], t[k]) for k in s)


def test_gauge_steps_are_gauged_then_matched() -> None:
    torch.manual_seed(3)
    a, b = build_model(CONFIGS["mlp"]), build_model(CONFIGS["mlp"])
    steps = alignment_steps(a, b, IN, seed=0)
    gb = gauges_of(b, IN)["PathCond gauge + WM"]
    sa, sb = steps["PathCond gauge + WM"]
    assert distance(sa, pathcond_gauge(a, IN)) < 1e-6
    assert distance(sa, sb) < distance(sa, gb)  # weight matching ran after the gauge


def test_scale_matching_moves_b_closer_than_weight_matching_alone() -> None:
    torch.manual_seed(1)
    a, b = build_model(CONFIGS["mlp"]), build_model(CONFIGS["mlp"])
    steps = alignment_steps(a, b, IN, seed=0)
    wm = distance(*steps["weight matching"])
    assert distance(*steps["WM + scale matching"]) < wm < distance(*steps["none"])
    assert steps["WM + scale matching"][0] is steps["weight matching"][0]


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_model_matched_to_a_rescaled_copy_of_itself_comes_back(arch: str) -> None:
    torch.manual_seed(4)
    model = build_model(CONFIGS[arch])
    moved = rescaled_copy(model, seed=5)
    assert distance(model.state_dict(), moved) > 1.0  # the rescaling moved it far
    back = scale_matched(model.state_dict(), moved, model)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(back[k], v, rtol=1e-4, atol=1e-5)


def test_scale_matching_keeps_function_lowers_objective_and_is_stationary() -> None:
    torch.manual_seed(6)
    a, b = build_model(CONFIGS["mlp"]), build_model(CONFIGS["mlp"])
    structure = a.neuron_structure()
    sa, sb = a.state_dict(), b.state_dict()
    matched = scale_matched(sa, sb, a)
    x = torch.randn(32, *IN)
    assert max_output_diff(b, matched, x, False) < 1e-4
    wide = {k: v.double() for k, v in matched.items()}
    best = scale_distance(sa, wide, structure)
    assert best < scale_distance(sa, sb, structure)
    for group in (g for g in structure.groups if g.rescalable):
        for h in range(group.size):
            for factor in (0.99, 1.01):
                nudged = {group.name: torch.ones(group.size, dtype=torch.float64)}
                nudged[group.name][h] = factor
                moved = rescale_state(wide, structure, nudged)
                assert scale_distance(sa, moved, structure) > best - 1e-9 * best
    _, history = match_scales(sa, sb, structure)
    assert all(y <= x + 1e-12 for x, y in zip(history, history[1:]))


@pytest.mark.parametrize("bias", [True, False])
def test_lifting_inner_matches_the_explicit_path_lifting(bias: bool) -> None:
    torch.manual_seed(7)
    a, b = build_model(TINY), build_model(TINY)
    if not bias:  # no output bias: the same paths as a zero output bias
        for m in (a, b):
            m.linears[-1].bias.data.zero_()
    phi_a = explicit_path_lifting(a, [1, 3]).phi
    phi_b = explicit_path_lifting(b, [1, 3]).phi
    sa, sb = a.state_dict(), b.state_dict()
    if not bias:
        a = build_model({**TINY, "output_bias": False})
        sa, sb = (
            {k: v for k, v in s.items() if k != "linears.2.bias"} for s in (sa, sb)
        )
    assert lifting_inner(a, sa, sb) == pytest.approx(float(phi_a @ phi_b), rel=1e-9)
    assert lifting_inner(a, sa, sa) == pytest.approx(float(phi_a @ phi_a), rel=1e-9)
    want = (phi_a / phi_a.norm() - phi_b / phi_b.norm()).norm()
    assert lifting_distance(a, sa, sb) == pytest.approx(float(want), rel=1e-6)


def test_lifting_distance_ignores_rescalings_and_sees_permutations_as_labels() -> None:
    torch.manual_seed(8)
    a, b = build_model(CONFIGS["mlp"]), build_model(CONFIGS["mlp"])
    sa, sb = a.state_dict(), b.state_dict()
    assert lifting_distance(a, sa, rescaled_copy(a, 9)) < 1e-5
    assert lifting_distance(a, sb, rescaled_copy(b, 9)) < 1e-5
    assert lifting_distance(a, sa, sb) > 0.05
    structure = a.neuron_structure()
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(1))
    assert lifting_distance(a, sa, permute_state(sa, structure, perms)) > 0.05


def test_lifting_needs_an_mlp() -> None:
    cnn = build_model(CONFIGS["cnn"])
    with pytest.raises(TypeError, match="needs an MLP"):
        lifting_inner(cnn, cnn.state_dict(), cnn.state_dict())


def test_gauges_keep_the_function_and_are_fixed_points() -> None:
    torch.manual_seed(10)
    model = build_model(CONFIGS["mlp"])
    model.load_state_dict(rescaled_copy(model, 11, spread=1.5))
    x = torch.randn(32, *IN)
    for gauge in (lambda m: pathcond_gauge(m, IN), enorm_gauge):
        once = gauge(model)
        assert max_output_diff(model, once, x, False) < 1e-4
        twice = gauge(with_state(model, once))
        assert distance(once, twice) < 1e-3 * distance(
            once, {k: 0 * v for k, v in once.items()}
        )
    gauged = with_state(model, pathcond_gauge(model, IN))
    assert am_over_gm(diag_g(gauged, IN)) < am_over_gm(diag_g(model, IN))


def test_enorm_gauge_balances_in_and_out_norms() -> None:
    torch.manual_seed(12)
    model = build_model({**CONFIGS["mlp"], "widths": [6]})
    model.load_state_dict(rescaled_copy(model, 13, spread=2.0))
    state = enorm_gauge(model, cycles=500, rtol=1e-10)
    w_in = (state["linears.0.weight"] ** 2).sum(1)  # ENorm: biases not in the norms
    w_out = (state["linears.1.weight"] ** 2).sum(0)
    torch.testing.assert_close(w_in, w_out, rtol=1e-3, atol=1e-6)


def tiny_data() -> Dataset:
    """40 training rows in 4 classes; the test set is the first 20 of them."""
    return toy_dataset(40, 20, IN, 4, name="tiny", test_from_train=True)


def test_alignment_study_reports_every_step_with_its_spread() -> None:
    models = drawn_models(CONFIGS["mlp"], 3, seed=14, train=True)
    pairs = {"mlp": [(models[0], models[1]), (models[0], models[2])]}
    result = alignment_study(pairs, tiny_data(), [0.0, 0.5, 1.0], seed=0)
    steps = result["mlp"]
    assert list(steps) == list(STEPS)
    for r in steps.values():
        assert len(r["barriers"]) == 2
        assert r["barrier_std"] == pytest.approx(np.std(r["barriers"], ddof=1))
        assert r["function_change_max"] < 1e-4
    lifting = {s: steps[s]["lifting_distance_mean"] for s in STEPS}
    assert lifting["WM + scale matching"] == pytest.approx(lifting["weight matching"])
    assert lifting["weight matching"] != pytest.approx(lifting["none"])
    assert steps["none"]["distance_mean"] > steps["weight matching"]["distance_mean"]
    sa = models[0].state_dict()
    relative = distance(sa, models[1].state_dict()) / distance(
        sa, {k: torch.zeros_like(v) for k, v in sa.items()}
    )
    first = alignment_study({"mlp": pairs["mlp"][:1]}, tiny_data(), [0.0, 1.0], seed=0)
    assert first["mlp"]["none"]["distance_mean"] == pytest.approx(relative)


def test_summarise_and_distance_values() -> None:
    row = {
        "barrier": [1.0, 3.0],
        "distance": [2.0, 4.0],
        "function_change": [0.0, 1e-6],
    }
    s = summarise(row)
    assert s["barrier_mean"] == 2.0
    assert s["barrier_std"] == pytest.approx(2**0.5)
    assert s["distance_mean"] == 3.0
    assert s["lifting_distance_mean"] is None
    a = {"w": torch.tensor([3.0, 0.0]), "n": torch.tensor([1])}
    b = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor([7])}
    assert distance(a, b) == pytest.approx(5.0)
