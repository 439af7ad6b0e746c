"""PathCond's corners that the main tests leave open (found by mutation testing).

The refusals' and warnings' messages (and the line a warning names), ReLU
written as a tensor method or a function, means with keywords, parameters no
path uses, 2-D average pooling with an ``int`` kernel, the incidence matrix
against a loop, the solver's dead neurons, exact block steps, scale
invariance and stop rule, float32 inputs, and :func:`check_range`'s limits.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from tests.kit import cnn1d, cnn2d, mlp, seeded_model, warning_sites
from tests.pathcond.tiny import perturbed
from wslib.core.configs import build_model
from wslib.core.neurons import NeuronGroup, NeuronStructure, Slot, rescale_state
from wslib.pathcond.lifting import explicit_path_lifting
from wslib.pathcond.rescaling import (
    am_over_gm,
    check_architecture,
    check_range,
    diag_g,
    pathcond_rescale,
    rescalable_structure,
)
from wslib.pathcond.solver import incidence_matrix, objective, optimize_rescaling

SUPPORTED = (
    "PathCond supports Linear/Conv layers, BatchNorm, ReLU (GELU/SiLU approximately), "
    "average/max pooling and residual additions"
)
GELU_WARNING = (
    "GELU/SiLU are not positively homogeneous: the rescaling changes the function "
    "slightly and diag(G) is that of the ReLU network (the invariance is approximate)"
)
FIX = (
    "; compute in float64 (model.double()) or use a larger initial scale, "
    "which makes the rescaling milder"
)


class Hidden(nn.Module):
    """``fc (3 -> 4) -> activation -> out (4 -> 2)``, the activation written as
    ``kind``: a module (``"module"``: ReLU, ``"tanh module"``), a tensor method
    (``"method"``, ``"tanh method"``), a function (``"F.relu"``,
    ``"torch.relu"``, ``"torch.tanh"``), or a branch on the data (``"branch"``,
    which torch.fx cannot trace)."""

    def __init__(self, kind: str = "module") -> None:
        super().__init__()
        self.kind = kind
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)
        self.act = nn.Tanh() if kind == "tanh module" else nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.flatten(1))
        if self.kind in ("module", "tanh module"):
            h = self.act(h)
        elif self.kind == "method":
            h = h.relu()
        elif self.kind == "F.relu":
            h = F.relu(h)
        elif self.kind == "torch.relu":
            h = torch.relu(h)
        elif self.kind == "tanh method":
            h = h.tanh()
        elif self.kind == "torch.tanh":
            h = torch.tanh(h)
        elif h.sum() > 0:  # "branch"
            h = 2 * h
        return self.out(h)

    def neuron_structure(self) -> NeuronStructure:
        slots = (
            Slot("fc.weight", 0, "out"),
            Slot("fc.bias", 0, "out"),
            Slot("out.weight", 1, "in"),
        )
        return NeuronStructure((NeuronGroup("fc", 4, slots),))


class Spare(Hidden):
    """:class:`Hidden` with a layer whose output the forward pass drops."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        self.spare(y)  # computed, never used: no path goes through it
        return y


class Scaled(Hidden):
    """:class:`Hidden` with a parameter of its own, outside any layer."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))


class Averaged(nn.Module):
    """``conv -> ReLU -> mean over positions -> Linear``, the mean given its
    dimension as a keyword (``keyword``) or by position."""

    def __init__(self, keyword: bool) -> None:
        super().__init__()
        self.keyword = keyword
        self.conv, self.out = nn.Conv1d(1, 2, 3, padding=1), nn.Linear(2, 2)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.conv(x))
        return self.out(h.mean(dim=2) if self.keyword else h.mean(2))

    def neuron_structure(self) -> NeuronStructure:
        slots = (
            Slot("conv.weight", 0, "out"),
            Slot("conv.bias", 0, "out"),
            Slot("out.weight", 1, "in"),
        )
        return NeuronStructure((NeuronGroup("conv", 2, slots),))


def _hidden(kind: str = "module", seed: int = 0) -> Hidden:
    torch.manual_seed(seed)
    return Hidden(kind).double()


def _in_mlp(name: str) -> str:
    """The name of :class:`Hidden`'s parameter ``name`` in the MLP of its shape."""
    layer, rest = name.split(".", 1)
    return f"linears.{0 if layer == 'fc' else 1}.{rest}"


# --- check_architecture ----------------------------------------------------------------------


def test_check_architecture_answers_false_for_relu_and_true_for_gelu(monkeypatch):
    """False (not merely falsy) without a warning for a ReLU net; True for a GELU
    net, whose warning (through ``diag_g``) names the line that called diag_g."""
    sites = warning_sites(monkeypatch)
    assert check_architecture(build_model(mlp([3], in_shape=[1, 4]))) is False
    assert sites == []
    gelu = build_model(mlp([3], in_shape=[1, 4], activation="gelu"))
    assert check_architecture(gelu) is True
    sites.clear()
    diag_g(gelu, [1, 4])
    assert sites == [(UserWarning, GELU_WARNING, __file__)]
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=f"^{re.escape(GELU_WARNING)}$"):
        check_architecture(gelu)


def test_a_module_without_a_path_lifting_is_named():
    message = rf"^module 'act' \(Tanh\) has no path-lifting; {re.escape(SUPPORTED)}$"
    with pytest.raises(TypeError, match=message):
        diag_g(_hidden("tanh module"), [3])


def test_batchnorm_without_affine_parameters_is_named():
    config = cnn1d([2], bn=True)
    model = build_model(config)
    assert isinstance(model.features[1], nn.BatchNorm1d)
    model.features[1] = nn.BatchNorm1d(2, affine=False)
    message = r"^BatchNorm 'features\.1' has no affine parameters to carry a scale$"
    with pytest.raises(TypeError, match=message):
        diag_g(model, config["in_shape"])


def test_batchnorm_without_a_bias_is_refused_with_the_whole_message():
    config = cnn1d([2], bn=True)
    model = build_model(config)
    model.features[1].register_parameter("bias", None)
    message = (
        r"^BatchNorm1d without a bias \(beta\) has no path-lifting; PathCond needs "
        r"BatchNorm layers with both affine parameters$"
    )
    with pytest.raises(TypeError, match=message):
        diag_g(model, config["in_shape"])


def test_a_parameter_outside_any_layer_is_named():
    message = (
        r"^Scaled holds top-level parameters \['scale'\] outside any layer; "
        r"PathCond cannot place them on paths$"
    )
    with pytest.raises(TypeError, match=message):
        check_architecture(Scaled())


def test_average_pooling_with_every_other_divisor_is_named_with_all_options():
    config = cnn2d([2], n_classes=2, pool="avg", fully_conv=True)
    model = build_model(config)
    pool = model.features[2]
    assert isinstance(pool, nn.AvgPool2d)
    pool.padding, pool.count_include_pad = 1, False
    pool.ceil_mode, pool.divisor_override = True, 3
    message = (
        r"^average pooling 'features\.2' uses count_include_pad=False, ceil_mode=True, "
        r"divisor_override: its divisor then differs between windows and the "
        r"one-pass diag\(G\) would be wrong; use the default pooling "
        r"\(count_include_pad=True, ceil_mode=False, no divisor_override\)$"
    )
    with pytest.raises(TypeError, match=message):
        diag_g(model, config["in_shape"])


def test_1d_pooling_without_padding_may_exclude_the_padding():
    """``AvgPool1d`` keeps its padding as a 1-tuple: (0,) is no padding, so
    ``count_include_pad=False`` changes nothing and is accepted; (1,) is refused."""
    config = cnn1d([2], pool="avg")
    model = build_model(config)
    pool = model.features[2]
    assert isinstance(pool, nn.AvgPool1d) and pool.padding == (0,)
    pool.count_include_pad = False
    g = diag_g(model, config["in_shape"])
    assert set(g) == {n for n, _ in model.named_parameters()}
    pool.padding = (1,)
    with pytest.raises(TypeError, match="uses count_include_pad=False:"):
        diag_g(model, config["in_shape"])


# --- diag_g ----------------------------------------------------------------------------------


def test_2d_pooling_by_an_int_kernel_divides_by_its_area():
    """``AvgPool2d(3)`` keeps the kernel as the int 3: its coefficient is 1/9, as
    for the kernel written ``(3, 3)``."""
    config = cnn2d([2], in_shape=[1, 9, 9], n_classes=2, pool="avg", fully_conv=True)
    model = perturbed(config)
    g = {}
    for kernel in (3, (3, 3)):
        model.features[2] = nn.AvgPool2d(kernel)
        g[kernel] = diag_g(model, config["in_shape"])
    for name, value in g[3].items():
        torch.testing.assert_close(value, g[(3, 3)][name], rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("kind", ["method", "F.relu", "torch.relu"])
def test_relu_written_as_a_method_or_function_keeps_a_dead_neuron_s_paths(kind: str):
    """A neuron with zero weights and bias has squared pre-activation 0, where
    torch's ReLU has derivative 0: PathCond's ReLU is the identity, so the paths
    through it count, as in the explicit lifting of the same MLP."""
    model = _hidden(kind)
    with torch.no_grad():
        model.fc.weight[1].zero_()
        model.fc.bias[1].zero_()
    twin = build_model(mlp([4], in_shape=[1, 3], n_classes=2)).double()
    twin.load_state_dict({_in_mlp(k): v for k, v in model.state_dict().items()})
    brute = explicit_path_lifting(twin, [1, 3]).diag_g()
    g = diag_g(model, [1, 3])
    assert float(g["fc.weight"][1].min()) > 0  # the dead neuron's weights
    for name, value in g.items():
        torch.testing.assert_close(value, brute[_in_mlp(name)], rtol=1e-12, atol=0.0)


def test_a_mean_given_its_dimension_by_keyword_is_a_mean():
    g = {}
    for keyword in (True, False):
        torch.manual_seed(0)
        g[keyword] = diag_g(Averaged(keyword).double(), [1, 5])
    for name, value in g[False].items():
        assert torch.equal(g[True][name], value), name


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("tanh method", r"^Hidden: tensor method 'tanh' has no path-lifting$"),
        ("torch.tanh", r"^Hidden: function .*tanh.* has no path-lifting$"),
        ("branch", r"^Hidden cannot be traced for PathCond: \S"),
    ],
)
def test_code_without_a_path_lifting_is_named(kind: str, message: str):
    with pytest.raises(TypeError, match=message):
        diag_g(_hidden(kind), [3])


def test_a_parameter_no_path_uses_has_g_zero():
    torch.manual_seed(0)
    spare = Spare().double()
    g = diag_g(spare, [3])
    assert torch.equal(g["spare.weight"], torch.zeros(2, 2, dtype=torch.float64))
    assert torch.equal(g["spare.bias"], torch.zeros(2, dtype=torch.float64))
    plain = _hidden()
    plain.load_state_dict(
        {k: v for k, v in spare.state_dict().items() if "spare" not in k}
    )
    for name, value in diag_g(plain, [3]).items():
        assert torch.equal(g[name], value), name


def test_an_input_shape_that_does_not_fit_quotes_torch_s_error():
    config = mlp([5, 4], in_shape=[1, 6])
    model = build_model(config)
    with pytest.raises(RuntimeError) as raised:
        model.double()(torch.ones(1, 2, 6, dtype=torch.float64))
    first = str(raised.value).splitlines()[0]
    message = (
        rf"^in_shape \[2, 6\] does not fit the model \({re.escape(first)}\); give the "
        r"shape of one input example without the batch dimension, as in the model's "
        r"config$"
    )
    with pytest.raises(ValueError, match=message):
        diag_g(model, [2, 6])


# --- incidence matrix and objective ----------------------------------------------------------


def _incidence_by_loop(
    model: nn.Module, structure: NeuronStructure
) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """``B`` entry by entry: +1 where a parameter entry consumes a neuron, -1
    where it produces it (rows: ``named_parameters`` flattened in order)."""
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    offsets, total = {}, 0
    for name, shape in shapes.items():
        offsets[name], total = total, total + math.prod(shape)
    groups = [g for g in structure.groups if g.rescalable]
    neurons = [(g.name, i) for g in groups for i in range(g.size)]
    column = {neuron: j for j, neuron in enumerate(neurons)}
    b = np.zeros((total, len(neurons)))
    for group in groups:
        for slot in group.slots:
            if slot.role == "free" or slot.name not in shapes:
                continue
            for flat, index in enumerate(np.ndindex(*shapes[slot.name])):
                j = column[(group.name, index[slot.axis] // slot.block)]
                b[offsets[slot.name] + flat, j] = 1.0 if slot.role == "in" else -1.0
    return b, neurons


def test_the_incidence_matrix_is_the_loop_over_every_entry():
    """A conv net with a flattened head (4 positions per neuron) and three
    groups: ``B`` of its own structure (the default) and of a structure whose
    middle group is not rescalable (no column, the later groups kept)."""
    model = build_model(cnn1d([2, 3, 2], in_shape=[1, 4], pool=None))
    structure = model.neuron_structure()
    assert [g.name for g in structure.groups] == ["conv0", "conv1", "conv2"]
    frozen = NeuronStructure(
        tuple(
            NeuronGroup(g.name, g.size, g.slots, g.name != "conv1")
            for g in structure.groups
        )
    )
    for given in (None, frozen):
        b, names, neurons = incidence_matrix(model, structure=given)
        expected, expected_neurons = _incidence_by_loop(model, given or structure)
        assert names == [n for n, _ in model.named_parameters()]
        assert neurons == expected_neurons
        np.testing.assert_array_equal(b.toarray(), expected)
    assert [grp for grp, _ in neurons] == ["conv0"] * 2 + ["conv2"] * 2


def test_the_objective_is_computed_in_float64():
    rng = np.random.default_rng(0)
    g, bz = rng.uniform(0.1, 2.0, 50), rng.normal(0.0, 3.0, 50).astype(np.float32)
    value = objective(g, bz)
    assert value == objective(g, bz.astype(np.float64))
    wide = g.size * np.log(np.sum(g * np.exp(bz.astype(np.float64))))
    assert value == pytest.approx(wide - bz.astype(np.float64).sum(), rel=1e-14)


# --- the solver ------------------------------------------------------------------------------


def _mlp_g(
    widths: list[int], in_shape: list[int], n_classes: int = 3, seed: int = 0
) -> tuple[dict[str, torch.Tensor], NeuronStructure, nn.Module]:
    model = perturbed(mlp(widths, in_shape=in_shape, n_classes=n_classes), seed=seed)
    return diag_g(model, in_shape), rescalable_structure(model), model


def test_the_solver_skips_a_group_that_is_not_rescalable():
    g, structure, _ = _mlp_g([3, 4, 3], [1, 3])
    middle = NeuronStructure(
        tuple(
            NeuronGroup(grp.name, grp.size, grp.slots, grp.name != "layer1")
            for grp in structure.groups
        )
    )
    for method in ("block", "neuron"):
        result = optimize_rescaling(g, middle, method=method, max_sweeps=3, rtol=0.0)
        assert list(result.z) == ["layer0", "layer2"]
        assert result.objective[-1] < result.objective[0]


@pytest.mark.parametrize("method", ["block", "neuron"])
def test_a_neuron_no_path_reaches_keeps_scale_one(method: str):
    """Zero weights and bias into neuron 1: its outgoing weights have g = 0
    (no path mass reaches them), so F does not depend on its scale: z stays 0,
    every other z is finite and moves."""
    model = perturbed(mlp([4, 3], in_shape=[1, 3]))
    with torch.no_grad():
        model.linears[0].weight[1].zero_()
        model.linears[0].bias[1].zero_()
    g = diag_g(model, [1, 3])
    assert float(g["linears.1.weight"][:, 1].abs().max()) == 0.0
    assert float(g["linears.0.weight"][1].min()) > 0.0
    result = optimize_rescaling(
        g, rescalable_structure(model), method=method, max_sweeps=5, rtol=0.0
    )
    z = result.z["layer0"]
    assert z[1] == 0.0
    assert np.isfinite(result.z["layer1"]).all() and np.isfinite(z).all()
    assert np.abs(np.delete(z, 1)).min() > 0.0


def test_one_block_sweep_minimises_a_single_group_exactly():
    """One group (1 input, 4 hidden neurons, 200 outputs; g of the producing
    side 1e-8 of the consuming side): one block step is the exact minimum over
    the group, so a second sweep moves no scale beyond rounding."""
    g, structure, _ = _mlp_g([4], [1, 1], n_classes=200)
    g = {k: v * 1e-8 if k.startswith("linears.0") else v for k, v in g.items()}
    one = optimize_rescaling(g, structure, max_sweeps=1, rtol=0.0)
    two = optimize_rescaling(g, structure, max_sweeps=2, rtol=0.0)
    assert np.abs(one.z["layer0"]).max() > 0.5
    np.testing.assert_allclose(two.z["layer0"], one.z["layer0"], rtol=0, atol=1e-12)


class _HostReads(TorchFunctionMode):
    """Count the numbers read back from tensors (``float(t)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.count += func is torch.Tensor.__float__
        return func(*args, **(kwargs or {}))


def test_a_block_step_stops_newton_once_the_total_is_converged():
    """Newton's iteration for a group's new total stops when a step is below
    1e-15 of it (a handful of iterations), not at its cap of 100: each
    iteration reads one number back from g's device."""
    g, structure, _ = _mlp_g([4, 3], [1, 3])
    with _HostReads() as reads:
        optimize_rescaling(g, structure, max_sweeps=1, rtol=0.0)
    assert 2 * 2 < reads.count <= 2 * 10 + 10  # two groups; F and totals: < 10


def test_the_scales_do_not_depend_on_the_scale_of_g():
    """g times 2^-60 (a total far below 1): the same scales, bit for bit."""
    g, structure, _ = _mlp_g([4], [1, 1], n_classes=60)
    small = {k: v * 2.0**-60 for k, v in g.items()}
    for method in ("block", "neuron"):
        ref = optimize_rescaling(g, structure, method=method, max_sweeps=1, rtol=0.0)
        got = optimize_rescaling(
            small, structure, method=method, max_sweeps=1, rtol=0.0
        )
        np.testing.assert_array_equal(got.z["layer0"], ref.z["layer0"])


def test_the_solver_stops_at_the_first_sweep_within_rtol_of_the_current_f():
    """The stop rule: F_{k-1} - F_k <= rtol |F_k|, with F_k the value after the
    sweep. g is scaled so that F after the second sweep is 1.5 times that
    sweep's decrease: with rtol 0.5 the second sweep is not yet within rtol of
    F_2 (it is of F_1), so the solver goes on."""
    g, structure, _ = _mlp_g([4, 3], [1, 3])
    g = {k: v * 0.25 for k, v in g.items()}
    history = optimize_rescaling(g, structure, max_sweeps=3, rtol=0.0).objective
    p = sum(v.numel() for v in g.values())
    drop = history[1] - history[2]
    c = math.exp((1.5 * drop - history[2]) / p)  # F shifts by p log c
    rtol = 0.5
    result = optimize_rescaling({k: v * c for k, v in g.items()}, structure, rtol=rtol)
    f = result.objective
    assert f[2] == pytest.approx(1.5 * drop, rel=1e-6)
    assert result.converged is True and result.sweeps >= 3
    for k in range(1, len(f) - 1):
        assert f[k - 1] - f[k] > rtol * abs(f[k])
    assert f[-2] - f[-1] <= rtol * abs(f[-1])


def test_the_solver_checks_its_limits_and_allows_no_sweep():
    g, structure, _ = _mlp_g([3], [1, 3])
    message = r"^max_sweeps and rtol must be non-negative$"
    for bad in ({"max_sweeps": -1}, {"rtol": -1e-3}):
        with pytest.raises(ValueError, match=message):
            optimize_rescaling(g, structure, **bad)
    none = optimize_rescaling(g, structure, max_sweeps=0, rtol=0.0)
    assert none.sweeps == 0 and none.converged is False
    assert not none.z["layer0"].any()
    bad_g = {**g, "linears.0.bias": -g["linears.0.bias"]}
    with pytest.raises(
        ValueError,
        match=r"^g must be finite and non-negative \(compute it with diag_g\)$",
    ):
        optimize_rescaling(bad_g, structure)


def test_float32_g_is_solved_in_float64():
    g, structure, _ = _mlp_g([4, 3], [1, 3])
    narrow = {k: v.float() for k, v in g.items()}
    wide = {k: v.double() for k, v in narrow.items()}
    for method in ("block", "neuron"):
        got = optimize_rescaling(narrow, structure, method=method, max_sweeps=4, rtol=0)
        ref = optimize_rescaling(wide, structure, method=method, max_sweeps=4, rtol=0)
        assert got.objective == ref.objective
        for name, z in ref.z.items():
            np.testing.assert_array_equal(got.z[name], z)


def test_the_result_records_its_method_time_and_unfinished_state(monkeypatch):
    """The method asked for, the seconds it took (within the caller's clock),
    converged False (not merely falsy) at max_sweeps, and the warning naming
    the caller's line."""
    g, structure, _ = _mlp_g([3, 3], [1, 3])
    sites = warning_sites(monkeypatch)
    start = time.perf_counter()
    result = optimize_rescaling(g, structure, method="neuron", max_sweeps=1)
    elapsed = time.perf_counter() - start
    assert result.method == "neuron"
    assert 0.0 <= result.seconds <= elapsed
    assert result.converged is False
    assert len(sites) == 1 and sites[0][0] is UserWarning
    assert sites[0][1].startswith("PathCond's solver stopped at max_sweeps=1 ")
    assert sites[0][2] == __file__


# --- am_over_gm ------------------------------------------------------------------------------


def test_am_over_gm_ignores_zeros_and_works_in_float64():
    assert am_over_gm(np.array([0.0, 1.0, 4.0, 0.0])) == pytest.approx(1.25, rel=1e-15)
    g, _, _ = _mlp_g([6, 5], [1, 4])
    narrow = {k: v.float() for k, v in g.items()}
    wide = {k: v.double() for k, v in narrow.items()}
    assert am_over_gm(narrow) == am_over_gm(wide)
    array = narrow["linears.1.weight"].numpy()
    assert am_over_gm(array) == am_over_gm(array.astype(np.float64))


# --- pathcond_rescale ------------------------------------------------------------------------


def test_pathcond_rescale_passes_the_method_and_rtol_on():
    config = mlp([4, 3], in_shape=[1, 3])
    model = perturbed(config, scale=0.3)
    result = pathcond_rescale(copy.deepcopy(model), [1, 3], method="neuron", rtol=0.5)
    assert result.method == "neuron"
    assert result.sweeps == 1  # the first sweep is within rtol 0.5 of F
    assert result.objective[0] - result.objective[1] <= 0.5 * abs(result.objective[1])


def test_a_float32_model_is_rescaled_in_float64_and_rounded_once():
    config = mlp([6, 5], in_shape=[1, 4])
    model = seeded_model(config, 1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = pathcond_rescale(model, [1, 4])
    wide = {k: v.double() for k, v in state.items()}
    expected = rescale_state(wide, rescalable_structure(model), result.scales)
    for name, value in model.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, expected[name].float()), name


def test_a_rescaled_tensor_that_underflows_float32_is_refused_by_name():
    """The scales fit float32, but a tiny weight times its neuron's scale (below
    1) falls below float32's smallest normal number: refused, naming the tensor,
    and the model is left as it was."""
    config = mlp([4], in_shape=[1, 3], n_classes=2)
    model = seeded_model(config, 0)
    with torch.no_grad():
        model.linears[0].weight.mul_(30.0)
        model.linears[0].weight[:, 0] = 2e-38
    state = {k: v.clone() for k, v in model.state_dict().items()}
    message = (
        r"^PathCond's rescaling makes 'linears\.0\.weight' overflow or underflow "
        rf"torch\.float32 \(\|entries\| up to \S+\){re.escape(FIX)}$"
    )
    with pytest.raises(ValueError, match=message):
        pathcond_rescale(model, [1, 3])
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name])


# --- check_range -----------------------------------------------------------------------------


def test_check_range_without_a_float_tensor_judges_scales_in_float64():
    state = {"count": torch.tensor(3)}
    check_range(state, {}, {"layer0": torch.tensor([1e39], dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"leave the float64 range"):
        check_range(state, {}, {"layer0": torch.tensor([1e-320], dtype=torch.float64)})


def test_check_range_skips_integer_tensors_and_checks_the_rest():
    state = {"count": torch.tensor(3), "w": torch.ones(2)}
    wide = torch.tensor([1.0, 1e39], dtype=torch.float64)
    rescaled = {"count": torch.tensor(5), "w": wide}
    message = (
        r"^PathCond's rescaling makes 'w' overflow or underflow torch\.float32 "
        rf"\(\|entries\| up to 1e\+39\){re.escape(FIX)}$"
    )
    with pytest.raises(ValueError, match=message):
        check_range(state, rescaled, {})


def test_check_range_judges_plain_float_scales_in_float64():
    state = {"w": torch.ones(2)}
    with pytest.raises(ValueError, match=r"from 1e-300 to 1e-300"):
        check_range(state, {}, {"layer0": 1e-300})
    message = (
        r"^PathCond's scales of layer 'layer0' \(from 1 to 1e\+39\) leave the "
        rf"float32 range{re.escape(FIX)}$"
    )
    with pytest.raises(ValueError, match=message):
        check_range(state, {}, {"layer0": [1.0, 1e39]})


def test_check_range_accepts_the_limits_of_the_dtype():
    info = torch.finfo(torch.float32)
    edges = torch.tensor([info.max, info.tiny, -info.max, 0.0], dtype=torch.float64)
    check_range({"w": torch.ones(4)}, {"w": edges}, {"layer0": edges[:2]})
