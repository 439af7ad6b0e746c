"""PathCond's rescaling applied the right way round, its solver's order, and its errors."""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.kit import SIGNAL, cnn1d, cnn2d, mlp, resnet1d, seeded_model
from tests.pathcond.tiny import perturbed
from wslib.core.configs import build_model
from wslib.pathcond.enorm import enorm_step_authors
from wslib.pathcond.rescaling import (
    check_range,
    diag_g,
    pathcond_rescale,
    rescalable_structure,
)
from wslib.pathcond.solver import (
    PAPER_SWEEPS,
    incidence_matrix,
    objective,
    optimize_rescaling,
)
from wslib.pathcond.training import prepare_model

MLP = mlp([5, 12, 4], in_shape=[1, 6], output_bias=False)
CNN_BN = cnn1d([3, 4], kernel_size=3, bn=True)
RESNET = resnet1d([3], in_shape=[1, 6])
CNN2D_AVG = cnn2d([4, 4], n_classes=4, pool="avg", fully_conv=True)


def _model(config: dict, scale: float = 0.3) -> nn.Module:
    return perturbed(config, noise=0.05, scale=scale)


def _flat(g: dict, names: list[str]) -> np.ndarray:
    return torch.cat([g[n].reshape(-1) for n in names]).numpy()


def _gradient(g: dict, model: nn.Module, z: dict) -> tuple[np.ndarray, list]:
    """dF/dz at log-scales ``z`` and the (group, index) of each entry."""
    b, names, neurons = incidence_matrix(model, structure=rescalable_structure(model))
    zz = np.array([z[grp][i] for grp, i in neurons])
    gp = _flat(g, names) * np.exp(b @ zz)
    return b.T @ (gp.size * gp / gp.sum() - 1.0), neurons


# --- the rescaling is applied as the solver computed it --------------------------------------


@pytest.mark.parametrize("config", [MLP, CNN_BN, RESNET], ids=["mlp", "bn", "resnet"])
def test_g_after_rescaling_is_g_times_exp_bz(config):
    model = _model(config)
    g = diag_g(model, config["in_shape"])
    rescaled = copy.deepcopy(model)
    res = pathcond_rescale(rescaled, config["in_shape"])
    b, names, neurons = incidence_matrix(model, structure=rescalable_structure(model))
    z = np.array([res.z[grp][i] for grp, i in neurons])
    assert np.abs(z).max() > 0.1  # a real rescaling, not the identity
    g_after = _flat(diag_g(rescaled, config["in_shape"]), names)
    np.testing.assert_allclose(g_after, _flat(g, names) * np.exp(b @ z), rtol=1e-9)
    # the applied rescaling is the solver's: F(z) from g after is its last F
    bz = b @ z
    assert objective(g_after, np.zeros(bz.size)) - bz.sum() == pytest.approx(
        res.objective[-1], rel=1e-10
    )


def test_mlp_rescaling_direction():
    model = _model(MLP)
    rescaled = copy.deepcopy(model)
    res = pathcond_rescale(rescaled, MLP["in_shape"])
    lam, lam1 = (np.exp(res.z[f"layer{i}"] / 2) for i in (0, 1))
    w0, w1 = (lin.weight.detach().numpy() for lin in model.linears[:2])
    v0, v1 = (lin.weight.detach().numpy() for lin in rescaled.linears[:2])
    np.testing.assert_allclose(v0, w0 * lam[:, None], rtol=1e-12)  # producer x lam
    np.testing.assert_allclose(
        rescaled.linears[0].bias.detach().numpy(),
        model.linears[0].bias.detach().numpy() * lam,
        rtol=1e-12,
    )
    expected = w1 * lam1[:, None] / lam[None, :]  # consumer of layer 0, producer of 1
    np.testing.assert_allclose(v1, expected, rtol=1e-12)


def test_bn_scale_goes_to_gamma_and_beta():
    model = _model(CNN_BN)
    rescaled = copy.deepcopy(model)
    res = pathcond_rescale(rescaled, CNN_BN["in_shape"])
    group = next(g for g in rescalable_structure(model).groups if g.name in res.z)
    lam = torch.from_numpy(np.exp(res.z[group.name] / 2))
    before, after = model.state_dict(), rescaled.state_dict()
    bn = [n for n in before if n.endswith(".weight") and before[n].dim() == 1][0]
    prefix = bn[: -len("weight")]
    conv = [n for n in before if before[n].dim() == 3][0]
    assert torch.equal(after[conv], before[conv])  # pre-BN weights are scale-free
    torch.testing.assert_close(
        after[prefix + "weight"], before[prefix + "weight"] * lam
    )
    torch.testing.assert_close(after[prefix + "bias"], before[prefix + "bias"] * lam)


# --- the solver ------------------------------------------------------------------------------


def test_block_sweep_visits_groups_in_data_flow_order():
    model = _model(MLP, scale=0.1)
    g = diag_g(model, MLP["in_shape"])
    one = optimize_rescaling(
        g, rescalable_structure(model), method="block", max_sweeps=1, rtol=0.0
    )
    grad, neurons = _gradient(g, model, one.z)
    last = np.array([grp == "layer2" for grp, _ in neurons])
    first = np.array([grp == "layer0" for grp, _ in neurons])
    scale = np.abs(grad).max()
    assert np.abs(grad[last]).max() < 1e-8 * max(scale, 1.0)  # visited last: optimal
    assert np.abs(grad[first]).max() > 1e-3  # visited first, then moved by the others


def test_neuron_sweep_ends_on_the_last_neuron():
    model = _model(MLP, scale=0.1)
    g = diag_g(model, MLP["in_shape"])
    one = optimize_rescaling(
        g, rescalable_structure(model), method="neuron", max_sweeps=1, rtol=0.0
    )
    grad, _ = _gradient(g, model, one.z)
    assert abs(grad[-1]) < 1e-8 * max(np.abs(grad).max(), 1.0)
    assert np.abs(grad[:-1]).max() > 1e-3


def test_converged_flag_and_warning_at_max_sweeps():
    model = _model(MLP, scale=0.1)
    g, structure = diag_g(model, MLP["in_shape"]), rescalable_structure(model)
    with pytest.warns(UserWarning, match="max_sweeps=2"):
        short = optimize_rescaling(g, structure, max_sweeps=2)
    assert not short.converged and short.sweeps == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        full = optimize_rescaling(g, structure)
        paper = optimize_rescaling(g, structure, max_sweeps=PAPER_SWEEPS, rtol=0.0)
    assert full.converged and full.sweeps < 100
    assert paper.sweeps == PAPER_SWEEPS and not paper.converged
    assert full.objective[-1] <= paper.objective[-1] < paper.objective[0]


def test_paper_setting_method_stops_after_ten_sweeps():
    config = {**MLP, "widths": [8, 24, 6]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paper, *_ = prepare_model(config, "pathcond_10", init_scale=0.1, seed=1)
    full, *_ = prepare_model(config, "pathcond", init_scale=0.1, seed=1)
    base, *_ = prepare_model(config, "baseline", init_scale=0.1, seed=1)
    x = torch.randn(4, *config["in_shape"])
    with torch.no_grad():
        torch.testing.assert_close(paper(x), base(x), rtol=1e-4, atol=1e-6)
    w = [m.linears[0].weight.detach() for m in (paper, full, base)]
    assert not torch.allclose(w[0], w[1], rtol=1e-3)  # 10 sweeps: not the optimum
    assert not torch.allclose(w[0], w[2], rtol=1e-3)  # but a rescaling


# --- errors ----------------------------------------------------------------------------------


def test_float32_overflow_is_refused_naming_the_layer():
    config = mlp([256] * 5, **SIGNAL)
    model = seeded_model(config, 0, train=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e-3)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"layer0.*float32.*float64"):
        pathcond_rescale(model, config["in_shape"])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    wide = model.double()  # float64 holds it: the function is kept
    x = torch.randn(3, 1, 40, dtype=torch.float64)
    with torch.no_grad():
        before = wide(x)
        pathcond_rescale(wide, config["in_shape"])
        assert torch.allclose(wide(x), before, rtol=1e-8, atol=1e-30)


def test_check_range_catches_underflow_and_overflow_of_tensors():
    state = {"a.weight": torch.ones(2, dtype=torch.float32)}
    ok = {"layer0": torch.ones(2, dtype=torch.float64)}
    check_range(
        state, {"a.weight": torch.tensor([1e30, 1e-30], dtype=torch.float64)}, ok
    )
    for bad in (1e39, 1e-39, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"'a\.weight'.*float64"):
            check_range(state, {"a.weight": torch.tensor([1.0, bad]).double()}, ok)
    with pytest.raises(ValueError, match=r"layer 'layer0'"):
        check_range(state, {}, {"layer0": torch.tensor([1.0, 1e-40]).double()})
    check_range({"a": torch.ones(1).double()}, {"a": torch.tensor([1e-300])}, ok)


@pytest.mark.parametrize(
    "option",
    ["ceil_mode", "count_include_pad", "divisor_override"],
)
def test_avg_pool_with_other_divisors_is_refused(option):
    model = build_model(CNN2D_AVG)
    pools = [m for m in model.modules() if isinstance(m, nn.AvgPool2d)]
    assert pools
    diag_g(model, CNN2D_AVG["in_shape"])  # the default pooling is fine
    if option == "ceil_mode":
        pools[0].ceil_mode = True
    elif option == "count_include_pad":
        pools[0].padding, pools[0].count_include_pad = 1, False
    else:
        pools[0].divisor_override = 3
    with pytest.raises(TypeError, match=option):
        diag_g(model, CNN2D_AVG["in_shape"])


def test_count_include_pad_without_padding_is_accepted():
    model = build_model(CNN2D_AVG)
    pool = next(m for m in model.modules() if isinstance(m, nn.AvgPool2d))
    pool.count_include_pad = False
    diag_g(model, CNN2D_AVG["in_shape"])


def test_frozen_parameter_has_its_g_and_the_model_rescales():
    model = _model(MLP)
    g = diag_g(model, MLP["in_shape"])
    frozen = copy.deepcopy(model)
    frozen.linears[0].weight.requires_grad_(False)
    g2 = diag_g(frozen, MLP["in_shape"])
    for name in g:
        torch.testing.assert_close(g2[name], g[name])
    assert float(g2["linears.0.weight"].min()) > 0
    res = pathcond_rescale(frozen, MLP["in_shape"])
    assert not frozen.linears[0].weight.requires_grad and res.converged


# --- the PathCond authors' ENorm -------------------------------------------------------------


def _authors_enorm(weights: list[torch.Tensor], p: float = 2.0) -> None:
    """Their ``ENorm._step_fc`` (Stock et al.'s loop, no biases, c = 1, alpha = 1/2)."""
    left = weights[0].norm(p=p, dim=1)
    right = weights[1].norm(p=p, dim=0)
    for i in range(1, len(weights) - 1):
        balancer = (right / left).pow(0.5)
        left = weights[i].norm(p=p, dim=1)
        right = weights[i + 1].norm(p=p, dim=0)
        weights[i - 1].t_().mul_(balancer).t_()
        weights[i].mul_(1 / balancer)


def test_enorm_authors_variant_matches_their_loop():
    config = mlp([5, 9, 4, 7], in_shape=[1, 6])
    model = _model(config, scale=1.0)
    weights = [lin.weight.detach().clone() for lin in model.linears]
    biases = [lin.bias.detach().clone() for lin in model.linears]
    with torch.no_grad():
        _authors_enorm(weights)
    enorm_step_authors(model)
    for lin, w, b in zip(model.linears, weights, biases, strict=True):
        torch.testing.assert_close(lin.weight.detach(), w, rtol=1e-12, atol=1e-14)
        assert torch.equal(lin.bias.detach(), b)  # biases are not rescaled
    # the last hidden layer is left alone: its outgoing weights are untouched
    assert torch.equal(model.linears[-1].weight.detach(), weights[-1])


@pytest.mark.parametrize("shape", [[2, 6], [1, 7, 3]])
def test_diag_g_names_an_input_shape_that_does_not_fit(shape: list[int]) -> None:
    model = build_model(MLP)
    message = re.escape(f"in_shape {shape} does not fit the model")
    with pytest.raises(ValueError, match=message):
        diag_g(model, shape)


def test_batchnorm_without_a_bias_is_refused_by_name() -> None:
    model = build_model(CNN_BN)
    bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm1d))
    bn.register_parameter("bias", None)  # as BatchNorm1d(..., bias=False) builds it
    with pytest.raises(TypeError, match="BatchNorm1d without a bias"):
        diag_g(model, CNN_BN["in_shape"])
