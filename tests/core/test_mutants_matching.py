"""Weight and scale matching, found by mutation testing (``make mutation MODULE=core/matching``).

The tolerances that decide when a permutation is taken and when the sweeps
stop, the defaults of the sweeps, and the choice among the roots of the
quartic of :func:`wslib.core.matching._best_multiplier`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.core.test_matching import _brute_multiplier, _multiplier_cost, scaled_pair
from tests.kit import drawn_models, mlp
from wslib.core import matching
from wslib.core.configs import build_model
from wslib.core.matching import align, match_scales, weight_matching
from wslib.core.neurons import NeuronStructure, StateDict

TWO = mlp([2], [1, 2], 2)
"""Two inputs, two hidden neurons (one group), two outputs."""
DEEP = mlp([8, 6, 4])
"""Three groups: with models drawn after seed 2, the order of the groups
(weight matching's ``seed``) changes the permutations found."""


def two_neuron_states(
    scale: float, gain: float
) -> tuple[StateDict, StateDict, NeuronStructure]:
    """A and B (float64) whose similarity is ``scale * [[1, 1 + gain], [1 + gain, 1]]``:
    swapping B's neurons raises the score by the fraction ``gain``."""
    model = build_model(TWO)
    a = {
        k: torch.zeros_like(v, dtype=torch.float64)
        for k, v in model.state_dict().items()
    }
    b = {k: v.clone() for k, v in a.items()}
    a["linears.0.weight"] = scale * torch.eye(2, dtype=torch.float64)
    b["linears.0.weight"] = torch.tensor(
        [[1.0, 1.0 + gain], [1.0 + gain, 1.0]], dtype=torch.float64
    )
    return a, b, model.neuron_structure()


@pytest.mark.parametrize(
    ("scale", "gain", "swapped"),
    [
        (1.0, 1e-8, True),  # below float32's resolution, above the tolerance
        (1e3, 1e-10, False),  # below the tolerance of 1e-9 of the score
        (1e-3, 1e-10, False),
    ],
)
def test_weight_matching_takes_gains_above_a_billionth_of_the_score(
    scale: float, gain: float, swapped: bool
) -> None:
    """The similarities are float64, and a permutation is taken only when it
    raises the score by more than 1e-9 of it (relative, whatever the scale)."""
    a, b, structure = two_neuron_states(scale, gain)
    (perm,) = weight_matching(a, b, structure).values()
    assert perm.tolist() == ([1, 0] if swapped else [0, 1])
    assert perm.dtype == torch.long


def _count_assignments(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    solve = matching.linear_sum_assignment

    def counted(sim: np.ndarray, maximize: bool = False):  # noqa: ANN202
        calls.append(1)
        return solve(sim, maximize=maximize)

    monkeypatch.setattr(matching, "linear_sum_assignment", counted)
    return calls


@pytest.mark.parametrize("kind", ["equal", "zero"])
def test_weight_matching_stops_after_the_first_sweep_that_changes_nothing(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Equal models (ties everywhere) and all-zero models (every score 0): one
    sweep of the three groups, not ``max_sweeps``."""
    model = build_model(DEEP)
    state = model.state_dict()
    if kind == "zero":
        state = {k: torch.zeros_like(v) for k, v in state.items()}
    structure = model.neuron_structure()
    calls = _count_assignments(monkeypatch)
    perms = weight_matching(state, state, structure)
    assert len(calls) == len(structure.groups) == 3
    assert all(torch.equal(p, torch.arange(len(p))) for p in perms.values())


def test_weight_matching_gives_up_after_100_sweeps_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Similarities that always favour the next cyclic shift never settle."""
    seen: list[str] = []

    def next_shift(a, b, structure, perms, group) -> np.ndarray:  # noqa: ANN001
        seen.append(group.name)
        sim = np.zeros((group.size, group.size))
        sim[np.arange(group.size), (perms[group.name].numpy() + 1) % group.size] = 1
        return sim

    monkeypatch.setattr(matching, "_similarity", next_shift)
    model = build_model(TWO)
    weight_matching(model.state_dict(), model.state_dict(), model.neuron_structure())
    assert len(seen) == 100


def test_weight_matching_orders_the_groups_with_seed_0_by_default() -> None:
    a, b = drawn_models(DEEP, 2, seed=2)
    structure = a.neuron_structure()
    sa, sb = a.state_dict(), b.state_dict()
    default = weight_matching(sa, sb, structure)
    runs = {s: weight_matching(sa, sb, structure, seed=s) for s in (0, 1)}
    assert all(torch.equal(default[g], runs[0][g]) for g in default)
    assert any(not torch.equal(default[g], runs[1][g]) for g in default)


def test_align_passes_its_options_to_weight_matching() -> None:
    a, b = drawn_models(DEEP, 2, seed=2)
    structure = a.neuron_structure()
    sa, sb = a.state_dict(), b.state_dict()
    untouched = align(sa, sb, structure, max_sweeps=0)
    assert all(torch.equal(untouched[k], sb[k]) for k in sb)
    seeded = align(sa, sb, structure, seed=1)
    default = align(sa, sb, structure)
    assert any(not torch.equal(seeded[k], default[k]) for k in sb)


# --- the best multiplier and match_scales ----------------------------------------------


@pytest.mark.parametrize(
    ("p2", "pa", "q2", "qa"),
    [(0.25, 5.0, 1.0, 8.0), (0.5, 8.0, 1.0, 10.0)],  # two minima, p2 != 1
)
def test_the_best_multiplier_weighs_the_producing_norm(p2, pa, q2, qa) -> None:
    mine = matching._best_multiplier(p2, pa, q2, qa)
    assert mine == pytest.approx(_brute_multiplier(p2, pa, q2, qa), rel=1e-5)
    assert mine > 10  # the large minimum, not the one near 0.1


def _roots_found(monkeypatch: pytest.MonkeyPatch, roots: list[complex]) -> None:
    """``np.roots`` answering ``roots`` (what round-off may leave of a quartic's)."""
    monkeypatch.setattr(np, "roots", lambda coefficients: np.array(roots))


def test_a_root_counts_when_positive_and_real_up_to_round_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Imaginary parts below 1e-9 of the root's size are round-off; a complex
    pair, a zero or a negative root is no candidate."""
    _roots_found(monkeypatch, [1e4 + 1e-6j, 2 + 1j, 2 - 1j, 0j, -3 + 0j])
    # cost m^2 + 1/m^2: the complex pair's real part 2 would cost less than 1e4
    assert matching._best_multiplier(1.0, 0.0, 1.0, 0.0) == 1e4
    assert _multiplier_cost(2.0, 1.0, 0.0, 1.0, 0.0) < _multiplier_cost(
        1e4, 1.0, 0.0, 1.0, 0.0
    )


def test_a_neuron_whose_positive_roots_are_all_lost_keeps_its_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _roots_found(monkeypatch, [-2 + 0j, 1 + 1j, 1 - 1j, -0.5 + 0j])
    assert matching._best_multiplier(1.0, 1.0, 1.0, 1.0) == 1.0


def test_with_no_tolerance_the_sweeps_stop_when_the_distance_stops_falling() -> None:
    """``tol=0``: a GELU network has no rescalable neuron, so the first sweep
    leaves the distance as it was, and the sweeps stop there."""
    a, b = drawn_models(mlp([6, 5], activation="gelu"), 2)
    scales, history = match_scales(
        a.state_dict(), b.state_dict(), a.neuron_structure(), tol=0.0
    )
    assert scales == {} and len(history) == 2
    assert history[0] == history[1] > 0


def test_the_stopping_tolerance_is_relative_for_tiny_weights() -> None:
    """A model with weights a thousand times smaller comes back as exactly."""
    a, b, structure, scales = scaled_pair("cnn")
    a, b = ({k: 1e-3 * v for k, v in s.items()} for s in (a, b))
    found, history = match_scales(a, b, structure)
    assert history[-1] < 1e-12 * history[0]
    for name, lam in scales.items():
        torch.testing.assert_close(
            found[name] * lam, torch.ones_like(lam), rtol=1e-6, atol=0
        )
