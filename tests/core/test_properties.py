"""Property tests: matching, interpolation and the neuron symmetries against references.

Each property draws small random inputs with Hypothesis and checks a library
function against a slow but obvious reference written here (exhaustive search,
explicit loops, index arithmetic), in float64. The docstring of each test names
its reference.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tests.kit import mlp
from wslib.core.configs import build_model
from wslib.core.interpolation import barrier, lerp_state, linear_path
from wslib.core.matching import weight_matching
from wslib.core.neurons import (
    StateDict,
    permute_state,
    random_permutations,
    random_scales,
    rescale_state,
)


def quick(examples: int) -> settings:
    """``examples`` draws, no deadline, no example database written to the checkout."""
    return settings(max_examples=examples, deadline=None, database=None)


# Weights: small integers (ties, zero neurons) as well as generic floats.
WEIGHT = st.one_of(
    st.integers(-2, 2).map(float),
    st.floats(-2.0, 2.0, allow_nan=False, allow_subnormal=False),
)
SEED = st.integers(0, 2**31 - 1)


def mlp_model(
    in_features: int,
    widths: Sequence[int],
    n_classes: int,
    seed: int = 0,
    **options: object,
) -> torch.nn.Module:
    """A float64 MLP on inputs of shape ``[1, in_features]``, built after ``seed``."""
    torch.manual_seed(seed)
    config = mlp(widths, in_shape=[1, in_features], n_classes=n_classes, **options)
    return build_model(config).double().eval()


def drawn_state(draw: st.DrawFn, model: torch.nn.Module) -> StateDict:
    """A float64 state for ``model`` with every entry drawn from :data:`WEIGHT`."""
    return {
        name: torch.from_numpy(
            draw(arrays(np.float64, tuple(t.shape), elements=WEIGHT))
        )
        for name, t in model.state_dict().items()
    }


# --- references for the MLP: permutation and the matching objective ---------------------


def permuted_mlp(state: StateDict, perms: Sequence[Sequence[int]]) -> StateDict:
    """The MLP state with hidden layer ``i`` reordered: new neuron ``j`` is old ``perms[i][j]``.

    Written with numpy index arithmetic: layer ``i`` has its rows permuted by
    ``perms[i]`` and its columns by ``perms[i - 1]``; the head keeps its rows.
    """
    out = dict(state)
    for i in range(len(perms) + 1):
        w = state[f"linears.{i}.weight"].numpy()
        rows = list(perms[i]) if i < len(perms) else list(range(w.shape[0]))
        cols = list(perms[i - 1]) if i > 0 else list(range(w.shape[1]))
        out[f"linears.{i}.weight"] = torch.from_numpy(w[np.ix_(rows, cols)])
        bias = f"linears.{i}.bias"
        if bias in state:
            out[bias] = torch.from_numpy(state[bias].numpy()[rows])
    return out


def objective(a: StateDict, b: StateDict, perms: Sequence[Sequence[int]]) -> float:
    """Weight matching's objective: the inner product of A with B permuted by ``perms``,
    summed over every tensor (the head's bias, which no permutation moves, adds a constant)."""
    pb = permuted_mlp(b, perms)
    return float(sum((a[k] * pb[k]).sum() for k in a))


def slack(a: StateDict, b: StateDict) -> float:
    """Rounding room for objectives: 1e-8 of ``|A| |B|``, the bound on any of them, above
    float64 rounding and weight matching's own stopping threshold (1e-9 relative)."""
    norm_a, norm_b = (
        math.sqrt(sum(float((t * t).sum()) for t in s.values())) for s in (a, b)
    )
    return 1e-8 * (1 + norm_a * norm_b)


def perms_of(found: dict[str, torch.Tensor], depth: int) -> list[list[int]]:
    """The permutations weight matching returns, hidden layer by hidden layer."""
    return [found[f"layer{i}"].tolist() for i in range(depth)]


@st.composite
def matching_pair(draw: st.DrawFn, widths: Sequence[int]) -> tuple:
    """Two drawn states of one MLP with hidden ``widths``, the MLP and a sweep seed."""
    model = mlp_model(draw(st.integers(1, 5)), widths, draw(st.integers(1, 4)))
    return model, drawn_state(draw, model), drawn_state(draw, model), draw(SEED)


@quick(60)
@given(matching_pair([4]))
def test_one_layer_matching_is_the_best_of_all_permutations(case: tuple) -> None:
    """``weight_matching`` on one hidden layer of 4 neurons. Reference: the best
    :func:`objective` over all 4! permutations (exhaustive search); one group
    is one linear assignment problem, so its answer is the global optimum."""
    model, a, b, seed = case
    found = perms_of(weight_matching(a, b, model.neuron_structure(), seed=seed), 1)
    assert sorted(found[0]) == [0, 1, 2, 3]
    best = max(objective(a, b, [p]) for p in itertools.permutations(range(4)))
    got = objective(a, b, found)
    assert got >= best - slack(a, b), (got, best)


@quick(40)
@given(matching_pair([4, 4]))
def test_two_layer_matching_is_optimal_in_each_layer(case: tuple) -> None:
    """``weight_matching`` on two hidden layers of 4 neurons ends at a coordinate-wise
    optimum. Reference: for each layer, the best :func:`objective` over all 4!
    permutations of that layer with the other layer's permutation held fixed."""
    model, a, b, seed = case
    found = perms_of(weight_matching(a, b, model.neuron_structure(), seed=seed), 2)
    got = objective(a, b, found)
    for layer in range(2):
        best = max(
            objective(a, b, [p if i == layer else found[i] for i in range(2)])
            for p in itertools.permutations(range(4))
        )
        assert got >= best - slack(a, b), (layer, got, best)


@st.composite
def permuted_copy(draw: st.DrawFn) -> tuple:
    """A drawn state of a one-hidden-layer MLP (width 2-6), a permutation and a seed."""
    width = draw(st.integers(2, 6))
    model = mlp_model(draw(st.integers(1, 5)), [width], draw(st.integers(1, 4)))
    perm = draw(st.permutations(range(width)))
    return model, drawn_state(draw, model), perm, draw(SEED)


@quick(60)
@given(permuted_copy())
def test_matching_a_permuted_copy_recovers_it(case: tuple) -> None:
    """Matching A against B = A with its hidden neurons reordered finds a permutation
    that turns B back into A. Reference: :func:`permuted_mlp` (numpy index
    arithmetic) both makes B and applies the found permutation.

    One hidden layer: one linear assignment, whose optimum ``|A|^2`` is reached
    only by the permutations that give back A, so A comes back up to weight
    matching's stopping threshold (a gain under 1e-9 of the score is not taken:
    squared distance at most ``2e-9 |A|^2``); exactly unless two neurons differ by
    less. With two or more layers the sweeps can stop at a local optimum that is
    not A (an MLP of widths 2-6 on 1-5 inputs, default init: about 1 in 11), so
    deeper nets get :func:`test_two_layer_matching_is_optimal_in_each_layer`.
    """
    model, a, perm, seed = case
    b = permuted_mlp(a, [perm])
    found = weight_matching(a, b, model.neuron_structure(), seed=seed)
    back = permuted_mlp(b, perms_of(found, 1))
    size = sum(float((t * t).sum()) for t in a.values())
    distance = sum(float(((back[k] - a[k]) ** 2).sum()) for k in a)
    assert distance <= 1e-8 * (1 + size), (distance, size)


# --- interpolation -----------------------------------------------------------------------


@st.composite
def state_pair(draw: st.DrawFn) -> tuple[StateDict, StateDict]:
    """Two state dicts with the same names and shapes: float64, float32 and int64 tensors."""
    a: StateDict = {}
    b: StateDict = {}
    for i in range(draw(st.integers(1, 4))):
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
        kind = draw(st.sampled_from(["float64", "float32", "int64"]))
        if kind == "int64":
            ints = arrays(np.int64, shape, elements=st.integers(-50, 50))
            a[f"t{i}"], b[f"t{i}"] = (torch.from_numpy(draw(ints)) for _ in "ab")
        else:
            dtype, width = (np.float64, 64) if kind == "float64" else (np.float32, 32)
            values = st.floats(-1e3, 1e3, allow_subnormal=False, width=width)
            floats = arrays(dtype, shape, elements=values)
            a[f"t{i}"], b[f"t{i}"] = (torch.from_numpy(draw(floats)) for _ in "ab")
    return a, b


@quick(100)
@given(
    state_pair(),
    st.floats(0.0, 1.0),
    st.one_of(st.none(), st.sets(st.sampled_from(["t0", "t1", "t2", "t3", "other"]))),
)
def test_lerp_state_is_the_weighted_mean_tensor_by_tensor(
    pair: tuple[StateDict, StateDict], t: float, names: set[str] | None
) -> None:
    """``lerp_state(a, b, t, names)``. Reference: a Python loop over the entries,
    ``(1 - t) * x + t * y`` in Python floats for the floating-point tensors named
    (all when ``names`` is None); every other tensor is ``a``'s."""
    a, b = pair
    got = lerp_state(a, b, t, names)
    assert got.keys() == a.keys()
    for k, va in a.items():
        vb = b[k]
        assert got[k].dtype == va.dtype and got[k].shape == va.shape
        moves = va.is_floating_point() and (names is None or k in names)
        eps = 1e-12 if va.dtype == torch.float64 else 1e-6
        flat = got[k].reshape(-1).tolist()
        for g, x, y in zip(flat, va.reshape(-1).tolist(), vb.reshape(-1).tolist()):
            if moves:
                assert abs(g - ((1 - t) * x + t * y)) <= eps * (abs(x) + abs(y)), k
            else:
                assert g == x, k


@quick(200)
@given(
    st.lists(
        st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False),
        min_size=2,
        max_size=20,
    )
)
def test_the_barrier_is_the_peak_above_the_endpoint_mean(losses: list[float]) -> None:
    """``barrier(losses)``, as its docstring defines it: the largest loss on the path
    minus the mean of the two endpoint losses. Reference: a Python loop for the
    maximum and the endpoints read off the list."""
    peak = losses[0]
    for loss in losses:
        if loss > peak:
            peak = loss
    expected = peak - (losses[0] + losses[-1]) / 2
    assert math.isclose(barrier(losses), expected, rel_tol=1e-12, abs_tol=1e-9)
    assert math.isclose(
        barrier(np.array(losses)), expected, rel_tol=1e-12, abs_tol=1e-9
    )


def mlp_forward(state: dict[str, np.ndarray], x: np.ndarray, depth: int) -> np.ndarray:
    """The ReLU MLP's logits by hand: ``x W^T + b`` per layer, ReLU between layers."""
    h = x.reshape(len(x), -1)
    for i in range(depth + 1):
        h = h @ state[f"linears.{i}.weight"].T
        if f"linears.{i}.bias" in state:
            h = h + state[f"linears.{i}.bias"]
        if i < depth:
            h = np.maximum(h, 0.0)
    return h


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean of ``logsumexp(row) - row[label]`` over the rows, a Python loop per row."""
    total = 0.0
    for row, label in zip(logits.tolist(), labels.tolist()):
        top = max(row)
        total += top + math.log(sum(math.exp(v - top) for v in row)) - row[label]
    return total / len(logits)


@st.composite
def path_case(draw: st.DrawFn) -> tuple:
    """A float64 MLP, two endpoint states, ``ts``, training and test data."""
    widths = draw(st.lists(st.integers(2, 6), min_size=1, max_size=2))
    f, c = draw(st.integers(1, 4)), draw(st.integers(2, 4))
    bias = draw(st.booleans())
    model, ma, mb = (
        mlp_model(f, widths, c, draw(SEED), output_bias=bias) for _ in "mab"
    )
    a, b = ({k: v.clone() for k, v in m.state_dict().items()} for m in (ma, mb))
    inner = draw(
        st.lists(
            st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
            max_size=4,
            unique=True,
        )
    )
    ts = [0.0, *sorted(inner), 1.0]  # a path: from a (0) to b (1), increasing
    gen = torch.Generator().manual_seed(draw(SEED))
    n = draw(st.integers(1, 8))
    x = torch.randn(2, n, 1, f, generator=gen, dtype=torch.float64)
    y = torch.randint(0, c, (2, n), generator=gen)
    return model, a, b, ts, (x[0], y[0], x[1], y[1]), len(widths)


@quick(25)
@given(path_case())
def test_linear_path_evaluates_the_hand_built_path(case: tuple) -> None:
    """``linear_path`` on a float64 MLP. Reference: for each ``t``, the weights
    ``(1 - t) a + t b`` in numpy, the logits by hand (:func:`mlp_forward`), the
    cross-entropy and accuracy by a loop, and the barrier as the largest training
    loss minus the mean of the first and last."""
    model, a, b, ts, (x, y, xt, yt), depth = case
    res = linear_path(model, a, b, ts, x, y, xt, yt, progress=False)
    train: list[float] = []
    for i, t in enumerate(ts):
        mid = {k: (1 - t) * a[k].numpy() + t * b[k].numpy() for k in a}
        for data, labels, split in ((x, y, "train"), (xt, yt, "test")):
            logits = mlp_forward(mid, data.numpy(), depth)
            loss = cross_entropy(logits, labels.numpy())
            assert math.isclose(
                res[f"{split}_loss"][i], loss, rel_tol=1e-10, abs_tol=1e-10
            )
            top2 = np.sort(logits, axis=1)[:, -2:]
            if (top2[:, 1] - top2[:, 0]).min() > 1e-9:  # no near-tie to round
                hits = sum(
                    int(r.argmax() == c) for r, c in zip(logits, labels.tolist())
                )
                acc = res[f"{split}_acc"][i]  # a float32 mean
                assert math.isclose(acc, hits / len(labels), rel_tol=1e-6), acc
            if split == "train":
                train.append(loss)
    expected = max(train) - (train[0] + train[-1]) / 2
    assert np.array_equal(res["ts"], np.asarray(ts))
    assert math.isclose(float(res["barrier"]), expected, rel_tol=1e-9, abs_tol=1e-10)


# --- the neuron symmetries ----------------------------------------------------------------


@st.composite
def symmetry_case(draw: st.DrawFn) -> tuple:
    """A float64 MLP of random depth and widths, inputs and a list of symmetry moves.

    A move is ``("permute", perms)`` (drawn permutations of some groups),
    ``("rescale", scales)`` (drawn positive scales of some groups, ReLU only) or
    ``("library", seed)`` (:func:`random_permutations` and :func:`random_scales`).
    """
    widths = draw(st.lists(st.integers(2, 6), min_size=1, max_size=3))
    f, c = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    activation = draw(st.sampled_from(["relu", "gelu", "silu"]))
    model = mlp_model(
        f,
        widths,
        c,
        draw(SEED),
        activation=activation,
        output_bias=draw(st.booleans()),
    )
    kinds = ["permute", "library"] + (["rescale"] if activation == "relu" else [])
    moves = []
    for kind in draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3)):
        if kind == "library":
            moves.append((kind, draw(SEED)))
            continue
        chosen = draw(st.sets(st.integers(0, len(widths) - 1), min_size=1))
        move = {}
        for i in sorted(chosen):
            if kind == "permute":
                move[f"layer{i}"] = torch.tensor(
                    draw(st.permutations(range(widths[i])))
                )
            else:
                scale = st.floats(0.05, 20.0)
                lam = draw(st.lists(scale, min_size=widths[i], max_size=widths[i]))
                move[f"layer{i}"] = torch.tensor(lam, dtype=torch.float64)
        moves.append((kind, move))
    n = draw(st.integers(1, 6))
    x = torch.randn(n, 1, f, generator=torch.Generator().manual_seed(draw(SEED)))
    return model, moves, x.double()


@quick(100)
@given(symmetry_case())
def test_permutations_and_rescalings_keep_the_function(case: tuple) -> None:
    """``permute_state``, ``rescale_state``, ``random_permutations`` and ``random_scales``
    on MLPs of depth 1-3 and widths 2-6. Reference: the original model's outputs,
    which every sequence of moves must keep to 1e-10 in float64; the library's
    draws must be permutations of ``range(size)`` and finite positive scales."""
    model, moves, x = case
    structure = model.neuron_structure()
    with torch.no_grad():
        before = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for kind, move in moves:
        if kind == "permute":
            state = permute_state(state, structure, move)
        elif kind == "rescale":
            state = rescale_state(state, structure, move)
        else:
            gen = torch.Generator().manual_seed(move)
            perms = random_permutations(structure, generator=gen)
            for g in structure.groups:
                assert torch.equal(
                    torch.sort(perms[g.name]).values, torch.arange(g.size)
                )
            state = permute_state(state, structure, perms)
            scales = random_scales(structure, spread=0.5, generator=gen)
            assert {g.name for g in structure.groups if g.rescalable} == set(scales)
            for lam in scales.values():
                assert bool(((lam > 0) & torch.isfinite(lam)).all())
            state = rescale_state(state, structure, scales)
    moved = copy.deepcopy(model)
    moved.load_state_dict(state)
    with torch.no_grad():
        after = moved(x)
    torch.testing.assert_close(after, before, rtol=1e-10, atol=1e-10)
