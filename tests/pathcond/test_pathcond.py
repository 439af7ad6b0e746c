"""PathCond, the explicit path-lifting and ENorm: exactness, invariances, solver, errors."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from tests.kit import (
    SIGNAL,
    cnn1d,
    cnn2d,
    mlp,
    resnet1d,
    seeded_model,
    toy_dataset,
    transformer1d,
)
from tests.pathcond.tiny import TINY, perturbed
from wslib.core.configs import build_model
from wslib.core.data import Dataset, load_dataset
from wslib.core.neurons import (
    NeuronGroup,
    NeuronStructure,
    Slot,
    random_scales,
    rescale_state,
)
from wslib.core.train import Recipe, fit
from wslib.pathcond.enorm import (
    enorm_callback,
    enorm_step,
    enorm_step_authors,
    enorm_step_pathcond_variant,
)
from wslib.pathcond.lifting import explicit_path_lifting
from wslib.pathcond.protocols import rescale_cost
from wslib.pathcond.rescaling import (
    am_over_gm,
    diag_g,
    pathcond_rescale,
    rescalable_structure,
)
from wslib.pathcond.solver import incidence_matrix, objective, optimize_rescaling
from wslib.pathcond.training import TrainSettings, prepare_model, train_run

ALL_ARCHS = {
    "mlp": mlp([64, 16, 64], **SIGNAL),
    "cnn_max": cnn1d([8, 16], **SIGNAL),
    "cnn_avg_fullyconv": cnn1d([8, 16], **SIGNAL, pool="avg", fully_conv=True),
    "cnn_bn": cnn1d([8, 16], **SIGNAL, bn=True),
    "resnet1d": resnet1d([8, 16], **SIGNAL),
    "resnet18": {
        "name": "resnet18",
        "in_shape": [3, 8, 8],
        "n_classes": 10,
        "width": 0.125,
    },
    "vgg11_bn": {
        "name": "vgg11",
        "in_shape": [3, 32, 32],
        "n_classes": 10,
        "width": 0.0625,
        "bn": True,
    },
    "cnn2d_fullyconv": cnn2d([8, 8], n_classes=10, pool="avg", fully_conv=True),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


# --- diag(G) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(TINY))
def test_diag_g_matches_brute_force(arch):
    config = TINY[arch]
    model = perturbed(config)
    brute = explicit_path_lifting(model, config["in_shape"]).diag_g()
    fast = diag_g(model, config["in_shape"])
    assert set(brute) == set(fast)
    for name in brute:
        assert torch.allclose(fast[name], brute[name], rtol=1e-10, atol=1e-14), name


def test_diag_g_is_one_path_mass_sum():
    """sum_i theta_i^2 g_i = depth-weighted ||Phi||^2: each path counts once per parameter on it."""
    config = TINY["mlp"]
    model = perturbed(config)
    lifting = explicit_path_lifting(model, config["in_shape"])
    g = diag_g(model, config["in_shape"])
    lhs = sum(
        float((p.detach() ** 2 * g[n]).sum()) for n, p in model.named_parameters()
    )
    jac_theta = lifting.jacobian * torch.cat(
        [p.detach().reshape(-1) for p in model.parameters()]
    )
    assert lhs == pytest.approx(float((jac_theta**2).sum()), rel=1e-12)


def test_pre_bn_weights_are_scale_free_in_g():
    config = TINY["conv_bn"]
    model = perturbed(config)
    g = diag_g(model, config["in_shape"])
    with torch.no_grad():
        model.features[0].weight[1].mul_(
            7.0
        )  # pre-BN channel 1: BN undoes it in train mode
    g2 = diag_g(model, config["in_shape"])
    for name in g:
        if name != "features.0.weight":
            assert torch.allclose(g[name], g2[name], rtol=1e-12), name
    assert torch.allclose(
        g2["features.0.weight"][1] * 49, g["features.0.weight"][1], rtol=1e-12
    )


# --- invariance / equivariance under rescaling ----------------------------------------------


@pytest.mark.parametrize("arch", ["mlp", "conv_avg", "resnet"])
def test_phi_invariant_g_equivariant(arch):
    config = TINY[arch]
    model = perturbed(config)
    structure = model.neuron_structure()
    scales = random_scales(
        structure, spread=0.7, generator=torch.Generator().manual_seed(1)
    )
    rescaled = copy.deepcopy(model)
    rescaled.load_state_dict(rescale_state(model.state_dict(), structure, scales))
    before = explicit_path_lifting(model, config["in_shape"])
    after = explicit_path_lifting(rescaled, config["in_shape"])
    assert torch.allclose(after.phi, before.phi, rtol=1e-10, atol=1e-14)
    # theta' = D theta  =>  J' = J D^-1,  G' = D^-1 G D^-1,  P' = J D^-2 J^T
    d = torch.cat(
        [
            (p2 / p).detach().reshape(-1)
            for p, p2 in zip(model.parameters(), rescaled.parameters())
        ]
    )
    assert torch.allclose(
        after.gram, before.gram / d[:, None] / d[None, :], rtol=1e-9, atol=1e-12
    )
    if after.phi.numel() > 2000:  # P is paths x paths: only for the MLP
        return
    assert torch.allclose(
        after.kernel,
        before.jacobian @ torch.diag(d**-2) @ before.jacobian.T,
        atol=1e-10,
    )
    # the non-zero spectra of P and G coincide
    ev_p = torch.linalg.eigvalsh(after.kernel)[-len(d) :]
    ev_g = torch.linalg.eigvalsh(after.gram)
    assert torch.allclose(
        ev_p.clamp_min(0), ev_g.clamp_min(0), atol=1e-8 * float(ev_g.max())
    )


@pytest.mark.parametrize("arch", ["mlp", "cnn_bn", "resnet1d", "cnn_avg_fullyconv"])
def test_fast_g_equivariant_with_incidence(arch):
    config = ALL_ARCHS[arch]
    model = perturbed(config)
    structure = model.neuron_structure()
    gen = torch.Generator().manual_seed(2)
    scales = random_scales(structure, spread=0.5, generator=gen)
    g = diag_g(model, config["in_shape"])
    rescaled = copy.deepcopy(model)
    rescaled.load_state_dict(rescale_state(model.state_dict(), structure, scales))
    g2 = diag_g(rescaled, config["in_shape"])
    b, names, neurons = incidence_matrix(model, structure=structure)
    z = np.array([2 * np.log(float(scales[grp][i])) for grp, i in neurons])
    flat = torch.cat([g[n].reshape(-1) for n in names]).numpy()
    flat2 = torch.cat([g2[n].reshape(-1) for n in names]).numpy()
    np.testing.assert_allclose(flat2, flat * np.exp(b @ z), rtol=1e-9)


# --- function preservation -------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(ALL_ARCHS))
def test_pathcond_preserves_function_train_and_eval(arch):
    config = ALL_ARCHS[arch]
    model = seeded_model(config, 0, train=True)
    x = torch.randn(16, *config["in_shape"])
    rescaled = copy.deepcopy(model)
    structure = model.neuron_structure()
    scales = random_scales(
        structure, spread=1.0, generator=torch.Generator().manual_seed(0)
    )
    rescaled.load_state_dict(rescale_state(model.state_dict(), structure, scales))
    result = pathcond_rescale(rescaled, config["in_shape"])
    assert result.objective[-1] < result.objective[0]
    assert (
        max(float(s.max() / s.min()) for s in result.scales.values()) > 1.01
    )  # not a no-op
    for mode in (True, False):
        a, b = copy.deepcopy(model).train(mode), copy.deepcopy(rescaled).train(mode)
        with torch.no_grad():
            assert _rel(b(x), a(x)) <= 1e-5, "train" if mode else "eval"


# --- the objective and its minimisation ------------------------------------------------------


def _g_and_structure(
    config: dict, seed: int = 0
) -> tuple[dict, NeuronStructure, nn.Module]:
    model = seeded_model(config, seed, train=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)
    return diag_g(model, config["in_shape"]), rescalable_structure(model), model


@pytest.mark.parametrize("arch", ["mlp", "resnet1d", "cnn_bn"])
def test_objective_decreases_and_block_beats_gauss_seidel(arch):
    g, structure, model = _g_and_structure(ALL_ARCHS[arch])
    block = optimize_rescaling(g, structure, method="block", max_sweeps=10, rtol=0)
    neuron = optimize_rescaling(g, structure, method="neuron", max_sweeps=10, rtol=0)
    for res in (block, neuron):
        assert 1 <= res.sweeps <= 10
        assert np.all(np.diff(res.objective) <= 1e-9 * abs(res.objective[0]))
    assert block.objective[-1] <= neuron.objective[-1] + 1e-7 * abs(
        neuron.objective[-1]
    )
    # the reported F is F(z) evaluated from scratch with the incidence matrix
    b, names, neurons = incidence_matrix(model, structure=structure)
    z = np.array([block.z[grp][i] for grp, i in neurons])
    flat = torch.cat([g[n].reshape(-1) for n in names]).numpy()
    assert objective(flat, b @ z) == pytest.approx(block.objective[-1], rel=1e-12)
    assert objective(flat, np.zeros(len(flat))) == pytest.approx(
        block.objective[0], rel=1e-12
    )


def test_solver_reaches_stationary_point_and_rescaled_g_is_balanced():
    g, structure, model = _g_and_structure(ALL_ARCHS["mlp"])
    res = optimize_rescaling(g, structure, method="block", max_sweeps=2000, rtol=1e-15)
    ref = optimize_rescaling(g, structure, method="neuron", max_sweeps=2000, rtol=1e-15)
    assert res.objective[-1] == pytest.approx(ref.objective[-1], rel=1e-9)
    b, names, neurons = incidence_matrix(model, structure=structure)
    z = np.array([res.z[grp][i] for grp, i in neurons])
    flat = torch.cat([g[n].reshape(-1) for n in names]).numpy()
    gp = flat * np.exp(b @ z)
    grad = b.T @ (len(flat) * gp / gp.sum() - 1.0)  # dF/dz
    assert np.abs(grad).max() < 1e-4 * len(flat) ** 0.5
    assert am_over_gm(gp) < am_over_gm(flat)


def test_solver_rejects_bad_input():
    g, structure, _ = _g_and_structure(ALL_ARCHS["mlp"])
    with pytest.raises(ValueError, match="method"):
        optimize_rescaling(g, structure, method="newton")
    bad = dict(g)
    bad["linears.0.weight"] = -bad["linears.0.weight"]
    with pytest.raises(ValueError, match="non-negative"):
        optimize_rescaling(bad, structure)


# --- errors and warnings ---------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_gelu_silu_warn_but_rescale(activation):
    config = mlp([32, 32], **SIGNAL, activation=activation)
    model = build_model(config)
    with pytest.warns(UserWarning, match="approximate"):
        result = pathcond_rescale(model, config["in_shape"])
    assert result.objective[-1] < result.objective[0]


def test_transformer_is_rejected_naming_the_module():
    config = transformer1d(**SIGNAL, embed_dim=16, mlp_dim=16)
    with pytest.raises(TypeError, match="LayerNorm"):
        diag_g(build_model(config), config["in_shape"])


def test_model_without_neuron_structure_is_rejected():
    with pytest.raises(TypeError, match="neuron"):
        pathcond_rescale(
            nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), [4]
        )


def test_unsupported_module_is_named():
    class TanhNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act, self.out = nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)

        def forward(self, x):
            return self.out(self.act(self.fc(x)))

        def neuron_structure(self) -> NeuronStructure:
            slots = (
                Slot("fc.weight", 0, "out"),
                Slot("fc.bias", 0, "out"),
                Slot("out.weight", 1, "in"),
            )
            return NeuronStructure((NeuronGroup("fc", 3, slots),))

    with pytest.raises(TypeError, match="'act' \\(Tanh\\)"):
        diag_g(TanhNet(), [4])


def test_diag_g_follows_the_model_device():
    # a "meta" model has no data: a CPU input would raise on the mixed devices
    model = build_model(TINY["mlp"]).double().to("meta")
    g = diag_g(model, TINY["mlp"]["in_shape"])
    assert {v.device.type for v in g.values()} == {"meta"}
    assert set(g) == {n for n, _ in model.named_parameters()}


# --- ENorm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mlp", "resnet1d", "cnn_bn"])
def test_enorm_preserves_function_and_balances(arch):
    config = ALL_ARCHS[arch]
    model = perturbed(config)
    x = torch.randn(8, *config["in_shape"], dtype=torch.float64)
    model.eval()
    before = model(x)
    for _ in range(30):
        enorm_step(model)
    assert _rel(model(x), before) < 1e-10
    if (
        arch == "mlp"
    ):  # converged: incoming and outgoing weight norms of each neuron agree
        for i in range(len(model.linears) - 1):
            a = model.linears[i].weight.pow(2).sum(1)
            b = model.linears[i + 1].weight.pow(2).sum(0)
            assert torch.allclose(a, b, rtol=1e-3)


def _enorm_reference(
    model: nn.Module, p: float, rescale_bias: bool, authors: bool
) -> dict[str, torch.Tensor]:
    """ENorm written out of place with ``rescale_state`` (the pre-in-place code)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    groups = [g for g in model.neuron_structure().groups if g.rescalable]
    groups = groups[:-1] if authors else groups

    def norm(st, group, role):
        total = torch.zeros(group.size, dtype=torch.float64)
        for slot in group.slots:
            if slot.role != role or (
                slot.name.endswith("bias") and st[slot.name].dim() == 1
            ):
                continue
            t = st[slot.name].double().abs().pow(p).movedim(slot.axis, 0)
            total += t.reshape(group.size, slot.block, -1).sum((1, 2))
        return total

    def lam(st, group):
        a, b = norm(st, group, "out"), norm(st, group, "in")
        ok = (a > 0) & (b > 0)
        return torch.where(ok, (b / a.clamp_min(1e-300)) ** (1 / (2 * p)), 1.0)

    def kept(group):
        slots = tuple(
            s
            for s in group.slots
            if rescale_bias or not (s.role == "out" and s.name.endswith("bias"))
        )
        return NeuronStructure((NeuronGroup(group.name, group.size, slots),))

    if authors:  # every scale from the state before the cycle
        scales = {g.name: lam(state, g) for g in groups}
        for g in groups:
            state = rescale_state(state, kept(g), {g.name: scales[g.name]})
        return state
    for g in groups:
        state = rescale_state(state, kept(g), {g.name: lam(state, g)})
    return state


@pytest.mark.parametrize("arch", ["mlp", "resnet1d", "cnn_bn", "cnn_max"])
@pytest.mark.parametrize(
    ("p", "rescale_bias", "authors"),
    [(2.0, True, False), (1.0, False, False), (3.0, True, False), (2.0, False, True)],
)
def test_enorm_matches_out_of_place_reference(arch, p, rescale_bias, authors):
    model = perturbed(ALL_ARCHS[arch], seed=1)
    with torch.no_grad():  # uneven scales: every lam differs from 1
        for param in model.parameters():
            param.mul_(torch.exp(0.5 * torch.randn_like(param)))
    expected = _enorm_reference(model, p, rescale_bias, authors)
    if authors:
        enorm_step_authors(model, p=p)
    else:
        enorm_step(model, p=p, rescale_bias=rescale_bias)
    for name, value in model.state_dict().items():
        assert torch.allclose(value, expected[name], rtol=1e-12, atol=1e-14), name


@pytest.mark.parametrize("step", [enorm_step, enorm_step_authors])
def test_enorm_works_in_place_without_reload(step, monkeypatch):
    model = perturbed(ALL_ARCHS["mlp"])
    params = {
        n: (q, q.data_ptr(), q.detach().clone()) for n, q in model.named_parameters()
    }

    def no_reload(*args, **kwargs):
        raise AssertionError("ENorm must not reload the state dict")

    monkeypatch.setattr(model, "load_state_dict", no_reload)
    step(model)
    now = dict(model.named_parameters())
    for name, (q, ptr, _) in params.items():
        assert now[name] is q and q.data_ptr() == ptr
    weight, _, before = params["linears.0.weight"]
    assert not torch.allclose(weight, before)  # the model's own tensors changed


@pytest.mark.parametrize("step", [enorm_step, enorm_step_authors])
def test_enorm_stays_on_the_model_device(step):
    # a "meta" model has no data: any copy to the CPU (``.cpu()``, a CPU
    # accumulator, a state-dict reload of CPU tensors) would raise here
    model = build_model(ALL_ARCHS["resnet1d"]).to("meta")
    step(model)
    assert {q.device.type for q in model.state_dict().values()} == {"meta"}


def test_enorm_leaves_a_dead_neuron_alone():
    model = perturbed(ALL_ARCHS["mlp"])
    with torch.no_grad():
        model.linears[0].weight[3].zero_()  # neuron 3 of the first layer: no input
    out_col, bias = model.linears[1].weight[:, 3].clone(), model.linears[0].bias[3]
    bias = float(bias)
    enorm_step(model)
    # scale 1 for neuron 3: its bias is kept, its column only takes the next
    # layer's (moderate) row scales; a zero norm must not give a scale ~1e75
    assert float(model.linears[0].bias[3]) == bias
    ratio = (model.linears[1].weight[:, 3] / out_col).abs()
    assert ((ratio > 1e-3) & (ratio < 1e3)).all()


def test_enorm_callbacks_apply_their_step():
    model = perturbed(ALL_ARCHS["mlp"])
    step_copy, cb_copy = copy.deepcopy(model), copy.deepcopy(model)
    enorm_step(step_copy, p=1.0)
    enorm_callback(p=1.0)(cb_copy)
    variant_copy, authors_copy = copy.deepcopy(model), copy.deepcopy(model)
    enorm_step_authors(authors_copy, p=2.0)
    enorm_step_pathcond_variant(3, variant_copy)
    for name in model.state_dict():
        assert torch.equal(cb_copy.state_dict()[name], step_copy.state_dict()[name])
        assert torch.equal(
            variant_copy.state_dict()[name], authors_copy.state_dict()[name]
        )
    assert not torch.allclose(step_copy.linears[0].weight, model.linears[0].weight)


def test_enorm_authors_variant_leaves_biases_and_changes_function():
    config = ALL_ARCHS["mlp"]
    model = perturbed(config)
    x = torch.randn(8, *config["in_shape"], dtype=torch.float64)
    before, bias = model(x), model.linears[0].bias.detach().clone()
    enorm_step_pathcond_variant(0, model)
    assert torch.equal(model.linears[0].bias, bias)
    assert _rel(model(x), before) > 1e-6


def test_enorm_rejects_non_rescalable_model():
    config = mlp([4], in_shape=[1, 10], n_classes=2, activation="gelu")
    with pytest.raises(ValueError, match="rescalable"):
        enorm_step(build_model(config))


def test_fit_on_step_and_loss_fn():
    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 6), torch.randint(0, 2, (40,))
    model = build_model(mlp([8], in_shape=[1, 6], n_classes=2))
    calls = []
    recipe = Recipe(
        epochs=2, batch_size=16, lr=0.1, momentum=0, weight_decay=0, schedule="constant"
    )
    cb = enorm_callback()
    fit(model, x, y, recipe, progress=False, on_step=lambda m: (calls.append(1), cb(m)))
    assert len(calls) == 2 * 3
    ae = build_model(mlp([3], in_shape=[1, 6], n_classes=6))
    hist = fit(
        ae, x, x.flatten(1), recipe, progress=False, loss_fn=nn.functional.mse_loss
    )
    assert np.isnan(hist["acc"]).all() and hist["loss"][1] < hist["loss"][0]


# --- experiment helpers, incl. the gpu-profile code paths on tiny CIFAR-format data ----------


def test_prepare_model_methods():
    config = ALL_ARCHS["mlp"]
    base, *_ = prepare_model(config, "baseline", init_scale=1.0, seed=3)
    low, *_ = prepare_model(config, "baseline", init_scale=0.1, seed=3)
    assert torch.allclose(low.linears[0].weight, 0.1 * base.linears[0].weight)
    pc, *_ = prepare_model(config, "pathcond", init_scale=0.1, seed=3)
    x = torch.randn(5, 1, 40)
    with torch.no_grad():
        assert _rel(pc(x), low(x)) < 1e-5
    kn, *_ = prepare_model(config, "kaiming", init_scale=1.0, seed=3)
    assert float(kn.linears[0].bias.detach().abs().max()) == 0.0
    with pytest.raises(ValueError, match="method"):
        prepare_model(config, "magic", init_scale=1.0)


def _write_tiny_cifar10(root) -> None:
    rng = np.random.default_rng(0)
    folder = root / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def batch(n: int) -> dict:
        return {
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, n).tolist(),
        }

    for i in range(1, 6):
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch(4), f, protocol=2)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(6), f, protocol=2)


@pytest.mark.parametrize(
    "config",
    [
        mlp([20, 20, 20], in_shape=[3, 32, 32], n_classes=10),
        cnn2d([4, 8], in_shape=[3, 32, 32], n_classes=10, fully_conv=True),
        {"name": "resnet18", "in_shape": [3, 32, 32], "n_classes": 10, "width": 0.0625},
        {"name": "cifar_nv", "in_shape": [3, 32, 32], "n_classes": 10, "width": 0.05},
    ],
)
@pytest.mark.parametrize("method", ["pathcond", "enorm"])
def test_gpu_profile_code_paths_on_tiny_cifar(tmp_path, config, method):
    _write_tiny_cifar10(tmp_path)
    ds = load_dataset("cifar10", root=tmp_path)
    recipe = Recipe(
        epochs=1, batch_size=8, lr=1e-3, momentum=0, weight_decay=0, schedule="constant"
    )
    run = train_run(
        TrainSettings(model=config, method=method, recipe=recipe, seed=0),
        ds,
        device="cpu",
    )
    assert len(run["loss"]) == 1 and np.isfinite(run["loss"]).all()
    assert 0.0 <= run["test_acc"] <= 1.0


def test_autoencoder_run_mse():
    rng = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 12, generator=rng)
    ds = Dataset(
        "toy",
        x,
        torch.zeros(64, dtype=torch.long),
        x[:16],
        torch.zeros(16, dtype=torch.long),
        10,
    )
    config = mlp([16, 4, 16], in_shape=[1, 12], n_classes=12)
    recipe = Recipe(
        epochs=3,
        batch_size=16,
        lr=0.05,
        momentum=0,
        weight_decay=0,
        schedule="constant",
    )
    run = train_run(
        TrainSettings(
            model=config, method="pathcond", recipe=recipe, seed=0, task="autoencoder"
        ),
        ds,
    )
    assert run["loss"][-1] < run["loss"][0]
    assert "test_loss" in run and np.isnan(run["test_acc"])


def test_rescale_cost_reports_medians_and_rejects_zero_repeats():
    ds = toy_dataset(256, 8, [1, 40], 10, labels="cyclic", test_from_train=True)
    config = mlp([16, 16], **SIGNAL)
    cost = rescale_cost(config, ds, batch_size=32, repeats=3)
    assert cost["n_params"] == 40 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    assert cost["rescale_over_epoch"] == pytest.approx(
        cost["rescale_seconds"] / cost["epoch_seconds"]
    )
    with pytest.raises(ValueError, match="repeats"):
        rescale_cost(config, ds, repeats=0)


def test_a_run_whose_model_does_not_fit_the_data_is_refused(tmp_path) -> None:
    ds = toy_dataset()
    n_in = list(ds.x_train.shape[1:])
    wrong = mlp([8], in_shape=n_in, n_classes=ds.n_classes + 2)
    with pytest.raises(ValueError, match=f"has {ds.n_classes} classes"):
        train_run(
            TrainSettings(model=wrong, method="baseline", recipe=Recipe(epochs=1)),
            ds,
            cache_dir=tmp_path,
        )
    shape = mlp([8], in_shape=[n_in[0], n_in[-1] + 1], n_classes=ds.n_classes)
    with pytest.raises(ValueError, match="has inputs of shape"):
        train_run(
            TrainSettings(model=shape, method="baseline", recipe=Recipe(epochs=1)),
            ds,
            cache_dir=tmp_path,
        )
    assert not list(tmp_path.rglob("*.pt"))
