"""Property tests: the path-lifting, diag G, PathCond and ENorm against slow, obvious references.

Every property draws a tiny ReLU MLP (1 to 3 hidden layers, every layer 1 to 4
wide) and checks a function of :mod:`wslib.pathcond` against a reference
written here in plain float64 numpy: the paths listed one by one with
``itertools.product``, the network evaluated layer by layer, ENorm's cycle
and PathCond's objective written from their definitions.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.optimize
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

from tests.kit import mlp
from wslib.core.configs import build_model
from wslib.core.neurons import neuron_structure
from wslib.pathcond.enorm import enorm_step, enorm_step_authors
from wslib.pathcond.lifting import explicit_path_lifting, mlp_path_labels, path_lifting
from wslib.pathcond.rescaling import diag_g, pathcond_rescale, rescalable_structure
from wslib.pathcond.solver import optimize_rescaling

PROPERTY = settings(max_examples=40, deadline=None, database=None)
"""A few seconds per property; no example database (it would write ``.hypothesis/``)."""

Factor = tuple[str, tuple[int, ...]]
"""One parameter on a path: its ``named_parameters`` name and its index."""


# --- tiny MLPs ------------------------------------------------------------------------------


@dataclass
class Net:
    """A ReLU MLP as plain float64 arrays: layer sizes (input first), weights, biases."""

    sizes: list[int]
    weights: list[np.ndarray]
    biases: list[np.ndarray | None]

    @property
    def n_layers(self) -> int:
        return len(self.weights)

    def params(self) -> dict[str, np.ndarray]:
        """The arrays under the names of :class:`wslib.core.models.MLP`'s parameters."""
        out = {}
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            out[f"linears.{k}.weight"] = w
            if b is not None:
                out[f"linears.{k}.bias"] = b
        return out

    def model(self) -> nn.Module:
        """The :class:`~wslib.core.models.MLP` holding these parameters, in float64."""
        config = mlp(
            self.sizes[1:-1],
            in_shape=[1, self.sizes[0]],
            n_classes=self.sizes[-1],
            output_bias=self.biases[-1] is not None,
        )
        model = build_model(config).double().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(self.params()[name]))
        return model


def net_of(model: nn.Module, sizes: Sequence[int]) -> Net:
    """The arrays of an MLP's parameters (float64 copies)."""
    state = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    n = len(sizes) - 1
    return Net(
        list(sizes),
        [state[f"linears.{k}.weight"] for k in range(n)],
        [state.get(f"linears.{k}.bias") for k in range(n)],
    )


ROUNDED = st.floats(-2.0, 2.0).map(lambda v: round(v, 3))
"""Weights with 3 decimals: exact zeros happen, and no magnitude below 1e-3."""
NONZERO = st.tuples(st.sampled_from([-1.0, 1.0]), st.floats(0.1, 2.0)).map(
    lambda t: t[0] * round(t[1], 3)
)
"""Weights of magnitude 0.1 to 2: every path has a positive mass."""


@st.composite
def nets(
    draw: st.DrawFn,
    elements: st.SearchStrategy[float] = ROUNDED,
    *,
    output_bias: bool | None = True,
    layer_scales: Sequence[float] = (1.0,),
    hidden_bias: st.SearchStrategy[float] | None = None,
) -> Net:
    """A tiny MLP: 1-3 hidden layers, all sizes 1-4; ``output_bias`` None: drawn.

    Each layer's weights and biases are multiplied by one of ``layer_scales``
    (uneven layer scales make the rescalings move far from the identity).
    ``hidden_bias``: the entries of the hidden layers' biases (default: ``elements``).
    """
    depth = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, 4), min_size=depth + 2, max_size=depth + 2))
    head_bias = draw(st.booleans()) if output_bias is None else output_bias
    weights, biases = [], []
    for k, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        scale = draw(st.sampled_from(layer_scales))
        weights.append(
            scale * draw(hnp.arrays(np.float64, (fan_out, fan_in), elements=elements))
        )
        has_bias = k < depth or head_bias
        entries = hidden_bias if hidden_bias is not None and k < depth else elements
        biases.append(
            scale * draw(hnp.arrays(np.float64, (fan_out,), elements=entries))
            if has_bias
            else None
        )
    return Net(sizes, weights, biases)


# --- the references -------------------------------------------------------------------------


def node_name(layer: int, i: int, n_layers: int) -> str:
    """``x{i}`` (layer 0), ``h{layer}.{i}`` (hidden) or ``y{i}`` (the output layer)."""
    if layer == 0:
        return f"x{i}"
    return f"y{i}" if layer == n_layers else f"h{layer}.{i}"


def enumerate_paths(net: Net) -> list[tuple[str, list[Factor]]]:
    """Every input-output path, listed one by one: its label and its parameters.

    A path starts at an input coordinate, or at the bias of a neuron of some
    layer, and takes one neuron in each following layer. Labels follow
    :func:`~wslib.pathcond.lifting.mlp_path_labels`: ``x{i}`` an input,
    ``b{l}.{i}`` the bias of neuron ``i`` of layer ``l`` (1-based over the
    Linear layers), ``h{l}.{i}`` a hidden neuron, ``y{o}`` an output.
    """
    n = net.n_layers
    paths = []
    for start in range(n + 1):  # 0: an input; l >= 1: the bias of layer l
        if start > 0 and net.biases[start - 1] is None:
            continue
        for nodes in itertools.product(
            *(range(net.sizes[k]) for k in range(start, n + 1))
        ):
            factors: list[Factor] = []
            if start > 0:
                factors.append((f"linears.{start - 1}.bias", (nodes[0],)))
            for k in range(start, n):  # the edge from layer k into layer k + 1
                i, j = nodes[k - start + 1], nodes[k - start]
                factors.append((f"linears.{k}.weight", (i, j)))
            names = [node_name(start + m, v, n) for m, v in enumerate(nodes)]
            if start > 0:  # the bias node stands for the neuron it feeds
                names[0] = f"b{start}.{nodes[0]}" + (f" > {names[0]}" * (start == n))
            paths.append((" > ".join(names), factors))
    return paths


def reference_phi(net: Net) -> dict[str, float]:
    """Path-lifting by enumeration: each path's label and the product of its parameters."""
    params = net.params()
    return {
        label: math.prod(float(params[name][idx]) for name, idx in factors)
        for label, factors in enumerate_paths(net)
    }


def reference_diag_g(net: Net) -> dict[str, np.ndarray]:
    """``diag(J^T J)`` by enumeration, ``J = dPhi / dtheta``: for every parameter, the
    sum over the paths through it of the squared product of the path's other factors."""
    params = net.params()
    g = {name: np.zeros_like(v) for name, v in params.items()}
    for _, factors in enumerate_paths(net):
        for m, (name, idx) in enumerate(factors):
            others = math.prod(
                float(params[o][oi]) for q, (o, oi) in enumerate(factors) if q != m
            )
            g[name][idx] += others**2
    return g


def reference_forward(net: Net, x: np.ndarray, *, absolute: bool = False) -> np.ndarray:
    """The ReLU network on rows ``x``, layer by layer; ``absolute``: with ``|theta|``
    and ``|x|`` and no ReLU, an upper bound of every term's size (the rounding scale)."""
    h = np.abs(x) if absolute else x
    for k, (w, b) in enumerate(zip(net.weights, net.biases)):
        w = np.abs(w) if absolute else w
        h = h @ w.T + (0.0 if b is None else (np.abs(b) if absolute else b))
        if k < net.n_layers - 1 and not absolute:
            h = np.maximum(h, 0.0)
    return h


def model_forward(model: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)[:, None, :]).numpy()


def assert_same_function(before: Net, after: Net, seed: int) -> None:
    """Outputs on random inputs agree to 1e-10 of the size of the terms they sum."""
    x = np.random.default_rng(seed).normal(size=(16, before.sizes[0]))
    scale = reference_forward(before, x, absolute=True).max()
    gap = np.abs(reference_forward(after, x) - reference_forward(before, x)).max()
    assert gap <= 1e-10 * max(scale, 1e-300)


def assert_same_phi(before: Net, after: Net) -> None:
    """Every path product agrees to 1e-11 relative (a product has no cancellation)."""
    phi0, phi1 = reference_phi(before), reference_phi(after)
    assert phi0.keys() == phi1.keys()
    for label, value in phi0.items():
        assert phi1[label] == pytest.approx(value, rel=1e-11, abs=1e-300), label


def reference_incidence(net: Net) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``B`` (parameters in ``named_parameters`` order x hidden neurons): +1 where a
    parameter consumes the neuron (the next layer's column), -1 where it produces it."""
    neurons = [(k, h) for k in range(net.n_layers - 1) for h in range(net.sizes[k + 1])]
    column = {nh: c for c, nh in enumerate(neurons)}
    rows = []
    for k, (w, b) in enumerate(zip(net.weights, net.biases)):
        for i, j in itertools.product(range(w.shape[0]), range(w.shape[1])):
            row = np.zeros(len(neurons))
            if k < net.n_layers - 1:
                row[column[(k, i)]] -= 1  # produces neuron i of layer k
            if k > 0:
                row[column[(k - 1, j)]] += 1  # consumes neuron j of layer k - 1
            rows.append(row)
        for i in range(0 if b is None else len(b)):
            row = np.zeros(len(neurons))
            if k < net.n_layers - 1:
                row[column[(k, i)]] -= 1
            rows.append(row)
    return np.array(rows).reshape(-1, len(neurons)), neurons


def reference_objective(g: np.ndarray, b: np.ndarray, z: np.ndarray) -> float:
    """PathCond's ``F(z) = P log(sum_i g_i exp((Bz)_i)) - sum_i (Bz)_i``, ``P`` parameters."""
    bz = b @ z
    return float(len(g) * np.log(np.sum(g * np.exp(bz))) - bz.sum())


def reference_gradient(g: np.ndarray, b: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``dF/dz = P B^T (g e^{Bz}) / sum(g e^{Bz}) - B^T 1``."""
    mass = g * np.exp(b @ z)
    return len(g) * b.T @ mass / mass.sum() - b.sum(0)


def flat_g(net: Net, g: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([g[name].ravel() for name in net.params()])


# --- 1. the path-lifting and diag G ---------------------------------------------------------


@PROPERTY
@given(net=nets())
def test_path_lifting_is_the_product_of_weights_along_each_enumerated_path(net: Net):
    """``path_lifting`` and ``explicit_path_lifting(...).phi``, labelled by
    ``mlp_path_labels``, equal the products of the parameters along every path
    listed by ``itertools.product`` (reference: :func:`reference_phi`)."""
    model = net.model()
    expected = reference_phi(net)
    labels = mlp_path_labels(net.sizes)
    assert sorted(labels) == sorted(expected)  # every path once, no other
    params = {n: p.detach() for n, p in model.named_parameters()}
    phi = path_lifting(model, [1, net.sizes[0]])(params).numpy()
    lifted = explicit_path_lifting(model, [1, net.sizes[0]])
    for values in (phi, lifted.phi.numpy()):
        assert len(values) == len(labels)
        got = dict(zip(labels, values.tolist()))
        for label, value in expected.items():
            assert got[label] == pytest.approx(value, rel=1e-12, abs=0.0), label


@PROPERTY
@given(net=nets(output_bias=None, hidden_bias=NONZERO))
def test_diag_g_is_the_enumerated_sum_over_paths_of_the_other_factors_squared(net: Net):
    """``rescaling.diag_g`` (one backward pass) and ``PathLifting.diag_g`` (the
    Jacobian of the explicit lifting; MLPs with an output bias) equal, per
    parameter, the sum over the paths through it of the squared product of the
    path's other parameters (reference: :func:`reference_diag_g`).

    Weights may be zero, hidden biases are not: a hidden neuron that no path
    mass reaches is the known failure below."""
    model = net.model()
    expected = reference_diag_g(net)
    fast = diag_g(model, [1, net.sizes[0]])
    found = [fast]
    if net.biases[-1] is not None:  # the explicit lifting reads every layer's bias
        found.append(explicit_path_lifting(model, [1, net.sizes[0]]).diag_g())
    for g in found:
        assert set(g) == set(expected)
        for name, ref in expected.items():
            np.testing.assert_allclose(
                g[name].numpy(), ref, rtol=1e-10, atol=1e-14 * ref.max(), err_msg=name
            )


def test_diag_g_of_the_weights_into_a_neuron_that_no_path_mass_reaches():
    """Found by the property above: 1 -> 1 -> 1 with ``W0 = 0, b0 = 0, W1 = 1``.
    ``dPhi/dW0 = W1 = 1`` on the path ``x0 > h1.0 > y0``, so ``g(W0) = 1`` (the
    reference and the explicit lifting agree); the one-pass ``diag_g`` gave 0
    when it differentiated torch's ReLU at 0 in the squared network."""
    net = Net([1, 1, 1], [np.zeros((1, 1)), np.ones((1, 1))], [np.zeros(1), None])
    assert reference_diag_g(net)["linears.0.weight"][0, 0] == 1.0
    with_bias = Net(net.sizes, net.weights, [np.zeros(1), np.zeros(1)])
    lifted = explicit_path_lifting(with_bias.model(), [1, 1]).diag_g()
    assert float(lifted["linears.0.weight"]) == 1.0
    assert float(diag_g(net.model(), [1, 1])["linears.0.weight"]) == 1.0


# --- 2. rescalings leave the function and Phi unchanged ---------------------------------------


@PROPERTY
@given(
    net=nets(output_bias=None, layer_scales=(0.1, 1.0, 10.0), hidden_bias=NONZERO),
    method=st.sampled_from(["block", "neuron"]),
    seed=st.integers(0, 2**16),
)
def test_pathcond_rescaling_keeps_the_function_and_the_path_lifting(
    net: Net, method: str, seed: int
):
    """``pathcond_rescale`` changes neither the outputs (reference: the network
    evaluated layer by layer, :func:`reference_forward`) nor any path product
    (reference: :func:`reference_phi`).

    Hidden biases are non-zero (the known ``diag_g`` failure above): with
    ``W0 = b0 = 0, W1 = 0.1`` on 1-1-1 that failure makes every ``g`` zero and
    PathCond stops on ``log(sum g)`` with a bare "math domain error"."""
    model = net.model()
    pathcond_rescale(model, [1, net.sizes[0]], method=method, max_sweeps=10, rtol=0.0)
    after = net_of(model, net.sizes)
    assert_same_function(net, after, seed)
    assert_same_phi(net, after)
    x = np.random.default_rng(seed).normal(size=(4, net.sizes[0]))
    np.testing.assert_allclose(  # the model itself computes the reference's function
        model_forward(model, x),
        reference_forward(after, x),
        rtol=1e-9,
        atol=1e-12 * reference_forward(after, x, absolute=True).max(),
    )


def reference_enorm_cycle(net: Net, p: float) -> Net:
    """One ENorm cycle from its definition: hidden layers in order, each neuron
    scaled by ``lam = (b / a)^(1 / (2p))`` (``a``: the p-th power norm of its
    incoming weights, ``b``: of its outgoing ones, both after the previous
    layers' scalings; 1 where either is zero), bias with its neuron."""
    weights = [w.copy() for w in net.weights]
    biases = [None if b is None else b.copy() for b in net.biases]
    for k in range(net.n_layers - 1):
        for h in range(net.sizes[k + 1]):
            a = float(np.sum(np.abs(weights[k][h]) ** p))
            b = float(np.sum(np.abs(weights[k + 1][:, h]) ** p))
            lam = (b / a) ** (1 / (2 * p)) if a > 0 and b > 0 else 1.0
            weights[k][h] *= lam
            bias = biases[k]
            if bias is not None:
                bias[h] *= lam
            weights[k + 1][:, h] /= lam
    return Net(list(net.sizes), weights, biases)


@PROPERTY
@given(
    net=nets(output_bias=None, layer_scales=(0.1, 1.0, 10.0)),
    p=st.sampled_from([1.0, 2.0, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_enorm_cycle_is_the_reference_cycle_and_keeps_the_function(
    net: Net, p: float, seed: int
):
    """``enorm_step`` gives the state of :func:`reference_enorm_cycle`, and keeps
    the outputs (reference: :func:`reference_forward`) and every path product."""
    model = net.model()
    enorm_step(model, p=p)
    after = net_of(model, net.sizes)
    expected = reference_enorm_cycle(net, p)
    for got, ref in zip(after.params().values(), expected.params().values()):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0.0)
    assert_same_function(net, after, seed)
    assert_same_phi(net, after)


@PROPERTY
@given(
    net=nets(output_bias=None, layer_scales=(0.1, 1.0, 10.0)), seed=st.integers(0, 99)
)
def test_authors_enorm_keeps_the_function_when_hidden_biases_are_zero(
    net: Net, seed: int
):
    """``enorm_step_authors`` leaves biases unscaled, so it keeps the function of a
    network whose hidden biases are zero (reference: :func:`reference_forward`)."""
    zeroed = copy.deepcopy(net)
    for b in zeroed.biases[:-1]:
        b[:] = 0.0
    model = zeroed.model()
    enorm_step_authors(model)
    assert_same_function(zeroed, net_of(model, net.sizes), seed)


# --- PathCond's solver reaches the minimum of its objective ----------------------------------


@settings(max_examples=40, deadline=None, database=None)
@given(
    net=nets(NONZERO, output_bias=None, layer_scales=(0.3, 1.0, 3.0)),
    method=st.sampled_from(["block", "neuron"]),
)
def test_optimize_rescaling_minimises_the_reference_objective(net: Net, method: str):
    """``optimize_rescaling`` reports ``F`` at its ``z`` as the reference formula
    gives it (:func:`reference_objective`, on the enumerated ``g`` and ``B``), is
    stationary there (:func:`reference_gradient`) and is no higher than SciPy's
    BFGS on the same formula."""
    model = net.model()
    g_ref = reference_diag_g(net)
    b, neurons = reference_incidence(net)
    g = flat_g(net, g_ref)
    structure = rescalable_structure(model)
    result = optimize_rescaling(
        {n: torch.from_numpy(v) for n, v in g_ref.items()}, structure, method=method
    )
    names = [grp.name for grp in neuron_structure(model).groups]
    z = np.array([result.z[names[k]][h] for k, h in neurons])
    value = reference_objective(g, b, z)
    assert result.objective[0] == pytest.approx(
        reference_objective(g, b, 0 * z), rel=1e-10
    )
    assert result.objective[-1] == pytest.approx(value, rel=1e-10, abs=1e-10)
    best = scipy.optimize.minimize(
        lambda v: reference_objective(g, b, v),
        np.zeros(len(neurons)),
        jac=lambda v: reference_gradient(g, b, v),
        method="BFGS",
        options={"gtol": 1e-10, "maxiter": 10_000},
    )
    assert value <= best.fun + 1e-9 * max(1.0, abs(best.fun))
    assert np.abs(reference_gradient(g, b, z)).max() <= 1e-4 * len(g)
