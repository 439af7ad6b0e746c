"""Weight matching recovers hidden permutations and keeps the function."""

import pytest
import torch

from tests.kit import SIGNAL, cnn1d, drawn_models, mlp, resnet1d
from wslib.core.configs import build_model
from wslib.core.matching import align, match_scales, scale_distance, weight_matching
from wslib.core.neurons import (
    permute_state,
    random_permutations,
    random_scales,
    rescale_state,
)

MLP = mlp([24, 16], **SIGNAL)
RESNET = resnet1d([8, 16], **SIGNAL, blocks_per_stage=1)
CONFIGS = {
    "mlp": MLP,
    "cnn": cnn1d([6, 8], **SIGNAL),
    "cnn_bn": cnn1d([6, 8], **SIGNAL, bn=True),  # pre-BN weights: "free" slots
    "resnet": RESNET,
}


def test_recovers_a_hidden_permutation() -> None:
    torch.manual_seed(0)
    for config in (MLP, RESNET):
        model = build_model(config)
        structure = model.neuron_structure()
        a = model.state_dict()
        b = permute_state(
            a,
            structure,
            random_permutations(structure, generator=torch.Generator().manual_seed(1)),
        )
        aligned = align(a, b, structure)
        for k in a:
            assert torch.allclose(aligned[k].float(), a[k].float()), k


def test_alignment_keeps_the_function_and_moves_towards_a() -> None:
    ma, mb = drawn_models(MLP, 2, train=True)
    structure = ma.neuron_structure()
    a = {k: v.clone() for k, v in ma.state_dict().items()}
    b = {k: v.clone() for k, v in mb.state_dict().items()}
    aligned = align(a, b, structure)
    x = torch.randn(32, 1, 40)
    mb.eval()
    before = mb(x)
    mb.load_state_dict(aligned)
    assert torch.allclose(mb(x), before, atol=1e-5)

    def dist(s):
        return sum(((s[k] - a[k]) ** 2).sum() for k in a if a[k].is_floating_point())

    assert dist(aligned) < dist(b)


def test_identity_when_models_are_equal() -> None:
    model = build_model(MLP)
    structure = model.neuron_structure()
    perms = weight_matching(model.state_dict(), model.state_dict(), structure)
    for g in structure.groups:
        assert torch.equal(perms[g.name], torch.arange(g.size))


def scaled_pair(key: str, seed: int = 0) -> tuple:
    model = build_model(CONFIGS[key])
    structure = model.neuron_structure()
    g = torch.Generator().manual_seed(seed)
    scales = random_scales(structure, spread=1.0, generator=g)
    state = {k: v.double() for k, v in model.state_dict().items()}
    return state, rescale_state(state, structure, scales), structure, scales


@pytest.mark.parametrize("key", ["mlp", "cnn", "cnn_bn", "resnet"])
def test_match_scales_undoes_a_hidden_rescaling(key: str) -> None:
    """A model matched to a rescaled copy of itself comes back exactly."""
    a, b, structure, scales = scaled_pair(key)
    found, history = match_scales(a, b, structure)
    back = rescale_state(b, structure, found)
    for name, tensor in a.items():
        torch.testing.assert_close(back[name], tensor, rtol=1e-6, atol=1e-9)
    for name, lam in scales.items():
        torch.testing.assert_close(
            found[name] * lam, torch.ones_like(lam), rtol=1e-6, atol=0
        )
    assert history[-1] < 1e-12 * history[0]
    assert len(history) < 150  # it stops once the distance stops falling (cap: 200)
    assert all(lam.dtype == torch.float64 for lam in found.values())


def _multiplier_cost(mu: float, p2: float, pa: float, q2: float, qa: float) -> float:
    return mu * mu * p2 - 2 * mu * pa + q2 / (mu * mu) - 2 * qa / mu


def _brute_multiplier(p2: float, pa: float, q2: float, qa: float) -> float:
    """The best of a dense log grid, refined by a bounded scalar search around it."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    grid = np.logspace(-4, 4, 200_001)
    best = grid[
        np.argmin([_multiplier_cost(m, p2, pa, q2, qa) for m in grid[::100]]) * 100
    ]
    found = minimize_scalar(
        lambda t: _multiplier_cost(float(np.exp(t)), p2, pa, q2, qa),
        bounds=(np.log(best) - 0.05, np.log(best) + 0.05),
        method="bounded",
        options={"xatol": 1e-12},
    )
    return float(np.exp(found.x))


@pytest.mark.parametrize(
    ("p2", "pa", "q2", "qa"),
    [
        (1.0, 10.0, 1.0, 8.0),  # two local minima, the large one best
        (1.0, 8.0, 1.0, 10.0),  # two local minima, the small one best
        (2.0, -1.0, 0.5, 3.0),
        (0.3, 0.2, 4.0, -1.0),
    ],
)
def test_the_best_multiplier_is_the_global_minimum(p2, pa, q2, qa) -> None:
    """Against a brute-force search: with two local minima the better one is kept."""
    from wslib.core.matching import _best_multiplier

    mine = _best_multiplier(p2, pa, q2, qa)
    brute = _brute_multiplier(p2, pa, q2, qa)
    assert mine == pytest.approx(brute, rel=1e-5)
    assert (
        _multiplier_cost(mine, p2, pa, q2, qa)
        <= _multiplier_cost(brute, p2, pa, q2, qa) + 1e-12
    )


@pytest.mark.parametrize(
    # without the guard each of these has a positive stationary point != 1
    "sums",
    [(0.0, -1.0, 1.0, 1.0), (1.0, 3.0, 0.0, 1.0), (0.0, 0.0, 0.0, 0.0)],
)
def test_a_neuron_without_producing_or_consuming_weights_keeps_its_scale(sums) -> None:
    from wslib.core.matching import _best_multiplier

    assert _best_multiplier(*sums) == 1.0


@pytest.mark.parametrize("key", ["mlp", "cnn_bn"])
def test_match_scales_never_increases_the_distance_and_stops_at_a_stationary_point(
    key: str,
) -> None:
    """Two independent models: every neuron's scale is at a minimum of the distance
    (with BatchNorm, the pre-BN weights, which no rescaling moves, play no part)."""
    a_model, b_model = build_model(CONFIGS[key]), build_model(CONFIGS[key])
    structure = a_model.neuron_structure()
    a, b = a_model.state_dict(), b_model.state_dict()
    found, history = match_scales(a, b, structure)
    assert all(
        later <= earlier * (1 + 1e-12) for earlier, later in zip(history, history[1:])
    )
    assert history[-1] < history[0]
    best = scale_distance(a, rescale_state(b, structure, found), structure)
    for group in structure.groups:  # nudging any neuron's scale moves away from A
        for factor in (0.99, 1.01):
            nudged = dict(found)
            nudged[group.name] = found[group.name].clone()
            nudged[group.name][0] *= factor
            assert (
                scale_distance(a, rescale_state(b, structure, nudged), structure) > best
            )
