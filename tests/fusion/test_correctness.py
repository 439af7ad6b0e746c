"""Tests that fail for a wrong fusion: targets, retrofits, head weights, costs and bad inputs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.kit import (
    SIGNAL,
    class_blocks,
    cnn1d,
    mlp,
    pair,
    resnet1d,
    seeded_model,
    transformer1d,
)
from wslib.core.neurons import permute_state, random_permutations
from wslib.core.train import predict
from wslib.fusion.baselines import (
    Ensemble,
    distill,
    fuse_by,
    importance_average,
    permuted_importance_average,
    rebasin_activation_matching,
    rebasin_weight_matching,
    soft_target_loss,
    transport,
)
from wslib.fusion.grouping import hf_groups, hungarian_groups, weighted_centroids
from wslib.fusion.hfkf import attribution_share, depth_map, fuse, model_importance
from wslib.fusion.importance import Scores, neuron_importance
from wslib.fusion.levels import (
    chain_levels,
    layer_io,
    neuron_matrix,
    normalised_scores,
    solve_dtype,
)
from wslib.fusion.residual import fit_block, restat_batchnorm
from wslib.fusion.retrofit import (
    GradientConfig,
    design_matrix,
    retrofit_gradient,
    retrofit_linear,
    ridge_solve,
)
from wslib.fusion.taps import block_output, resnet_taps, tap_matrix, transformer_taps

MLP = mlp([12, 8], **SIGNAL)
CNN = cnn1d([4, 6], **SIGNAL)
RESNET = resnet1d([4, 8], **SIGNAL, blocks_per_stage=1)


def _skewed(model: nn.Module, seed: int) -> Scores:
    """Scores far from uniform, tagged as Conductance."""
    gen = torch.Generator().manual_seed(seed)
    return Scores(
        {
            n: torch.rand(model.get_submodule(n).weight.shape[0], generator=gen) ** 4
            + 1e-3
            for n in chain_levels(model)[:-1]
        },
        "conductance",
    )


# --- the Gradient retrofit ------------------------------------------------------------------


def _affine_problem(
    kind: str,
) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer, correlated inputs, targets that no affine map reproduces, and their flat form."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if kind == "linear":
        layer = nn.Linear(10, 5)
        mix = torch.randn(10, 10, generator=gen)
        x = torch.randn(300, 10, generator=gen) @ mix
        t = torch.tanh(x @ torch.randn(10, 5, generator=gen)) * 3 + 5
        return layer, x, t, t.T.double()
    layer = nn.Conv1d(3, 4, 3, padding=1)
    x = torch.randn(60, 3, 16, generator=gen).cumsum(2)  # correlated positions
    t = torch.relu(
        F.conv1d(x, torch.randn(4, 3, 3, generator=gen), padding=1)
    ) + torch.randn(60, 4, 16, generator=gen)
    return layer, x, t, neuron_matrix(t)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_gradient_retrofit_reaches_the_least_squares_error(kind):
    layer, x, t, flat = _affine_problem(kind)
    start = F.mse_loss(layer(x), t).item()
    ls_layer = copy.deepcopy(layer)
    retrofit_linear(ls_layer, x, flat, ridge=0.0)
    least = F.mse_loss(ls_layer(x), t).item()
    out = retrofit_gradient(layer, x, t, config=GradientConfig())
    reached = F.mse_loss(layer(x), t).item()
    assert start > 2 * least  # the start is far from the optimum
    assert reached <= least + 0.01 * (start - least)
    assert out["best"] == pytest.approx(reached, rel=1e-5)
    assert out["start"] == pytest.approx(start, rel=1e-5)


def test_adam_retrofit_with_scaled_steps_converges_too():
    layer, x, t, flat = _affine_problem("linear")
    start = F.mse_loss(layer(x), t).item()
    ls_layer = copy.deepcopy(layer)
    retrofit_linear(ls_layer, x, flat, ridge=0.0)
    least = F.mse_loss(ls_layer(x), t).item()
    config = GradientConfig(optimizer="adam", lr=0.2, max_epochs=1000)
    retrofit_gradient(layer, x, t, config=config)
    assert F.mse_loss(layer(x), t).item() <= least + 0.01 * (start - least)


def test_adam_steps_scale_with_the_weights():
    """Weights and targets 1000 times larger: the same relative step still converges."""
    layer, x, t, flat = _affine_problem("linear")
    with torch.no_grad():
        layer.weight.mul_(1000)
        layer.bias.mul_(1000)
    t, flat = 1000 * t, 1000 * flat
    start = F.mse_loss(layer(x), t).item()
    ls_layer = copy.deepcopy(layer)
    retrofit_linear(ls_layer, x, flat, ridge=0.0)
    least = F.mse_loss(ls_layer(x), t).item()
    retrofit_gradient(
        layer, x, t, config=GradientConfig(optimizer="adam", lr=0.2, max_epochs=1000)
    )
    assert F.mse_loss(layer(x), t).item() <= least + 0.01 * (start - least)


def test_gradient_retrofit_is_never_worse_than_its_start():
    layer, x, t, _ = _affine_problem("linear")
    start = F.mse_loss(layer(x), t).item()
    before = copy.deepcopy(layer.state_dict())
    wild = GradientConfig(optimizer="adam", lr=1e4, max_epochs=3)
    out = retrofit_gradient(layer, x, t, config=wild)
    assert F.mse_loss(layer(x), t).item() <= start
    assert out["best"] <= out["start"]
    # every step made it worse here, so the start is kept exactly
    assert all(torch.equal(v, layer.state_dict()[k]) for k, v in before.items())


def test_gradient_retrofit_selects_on_the_held_out_part():
    layer, x, t, _ = _affine_problem("linear")
    out = retrofit_gradient(
        layer, x, t, config=GradientConfig(val_fraction=0.25), seed=1
    )
    val = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))[:75]
    assert out["best"] == pytest.approx(F.mse_loss(layer(x[val]), t[val]).item())
    assert out["best"] < out["start"]


@pytest.mark.parametrize("config", [MLP, CNN], ids=["mlp", "cnn"])
def test_fused_gradient_variant_matches_the_linear_one(config):
    models = pair(config)
    x, y = class_blocks(16)
    lin = fuse(models, x, y, "kf", "linear", progress=False)
    grad = fuse(models, x, y, "kf", "gradient", progress=False)
    for c_lin, c_grad in zip(lin.costs, grad.costs):
        excess = c_grad["approximation"] - c_lin["approximation"]
        assert excess <= 0.01 * c_lin["cost"] + 1e-6


def test_gradient_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        GradientConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="val_fraction"):
        GradientConfig(val_fraction=1.0)
    with pytest.raises(ValueError, match="lr > 0"):
        GradientConfig(lr=0.0)


# --- targets: importance, HF for many models, the head ----------------------------------------


def test_importance_moves_the_targets_to_the_weighted_centroids():
    """Level 0 of an MLP is affine in the input, so the fused level equals its targets exactly."""
    models = pair(MLP)
    x, y = class_blocks(12)
    scores = [_skewed(m, 10 + i) for i, m in enumerate(models)]
    level = chain_levels(models[0])[0]
    mats = [neuron_matrix(layer_io(m, [level], x)[level]).numpy() for m in models]
    w = [normalised_scores(s[level]) for s in scores]
    labels = hungarian_groups(mats[0], mats[1], w[0], w[1])
    points, weights = np.concatenate(mats), np.concatenate(w)
    expected = weighted_centroids(points, weights, labels, len(mats[0])).numpy()
    uniform = weighted_centroids(
        points, np.ones_like(weights), labels, len(mats[0])
    ).numpy()
    res = fuse(models, x, y, "hf", importance="conductance", scores=scores)
    got = neuron_matrix(layer_io(res.model, [level], x)[level]).numpy()
    assert np.abs(got - expected).max() < 1e-3 * np.abs(expected).max()
    assert np.abs(got - uniform).max() > 0.05 * np.abs(uniform).max()


def test_hf_matches_every_model_to_the_reference():
    model = seeded_model(MLP, 0)
    structure = model.neuron_structure()
    x, y = class_blocks(12)
    copies, perms = [model], [None]
    for seed in (3, 4):
        perm = random_permutations(
            structure, generator=torch.Generator().manual_seed(seed)
        )
        other = copy.deepcopy(model)
        other.load_state_dict(permute_state(model.state_dict(), structure, perm))
        copies.append(other)
        perms.append(perm)
    level, group = chain_levels(model)[0], structure.groups[0].name
    mats = [neuron_matrix(layer_io(m, [level], x)[level]).numpy() for m in copies]
    labels = hf_groups(mats, [np.ones(len(m)) for m in mats])
    n = len(mats[0])
    assert np.array_equal(labels[:n], np.arange(n))
    for j in (1, 2):
        assert np.array_equal(labels[j * n : (j + 1) * n], perms[j][group].numpy())
    fused = fuse(copies, x, y, "hf", progress=False).model
    assert (predict(fused, x) - predict(model, x)).abs().max() < 1e-4


def test_hf_of_three_models_averages_three_partners():
    models = [seeded_model(MLP, s) for s in (0, 1, 2)]
    x, y = class_blocks(12)
    level = chain_levels(models[0])[0]
    res = fuse(models, x, y, "hf", progress=False)
    mats = [neuron_matrix(layer_io(m, [level], x)[level]).numpy() for m in models]
    labels = hf_groups(mats, [np.ones(len(m)) for m in mats])
    assert np.bincount(labels).tolist() == [3] * len(mats[0])
    expected = weighted_centroids(
        np.concatenate(mats), np.ones(3 * 12), labels, 12
    ).numpy()
    got = neuron_matrix(layer_io(res.model, [level], x)[level]).numpy()
    assert np.abs(got - expected).max() < 1e-3 * np.abs(expected).max()


def _same_features_other_heads() -> list[nn.Module]:
    a = seeded_model(MLP, 0)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.linears[-1].weight.normal_(0, 1, generator=torch.Generator().manual_seed(9))
        b.linears[-1].bias.normal_(0, 1, generator=torch.Generator().manual_seed(8))
    return [a, b]


def test_each_class_logit_follows_its_owner_with_per_class_shares():
    models = _same_features_other_heads()
    x, y = class_blocks(12)
    owner = np.array([[1.0] * 5 + [0.0] * 5, [0.0] * 5 + [1.0] * 5])
    fused = fuse(models, x, y, "hf", class_weights=owner, progress=False).model
    out, a, b = (predict(m, x) for m in (fused, *models))
    assert torch.allclose(out[:, :5], a[:, :5], atol=1e-4)
    assert torch.allclose(out[:, 5:], b[:, 5:], atol=1e-4)
    equal = predict(fuse(models, x, y, "hf", progress=False).model, x)
    assert torch.allclose(equal, (a + b) / 2, atol=1e-4)


def test_theorem1_parts_are_those_of_the_fused_output():
    """Cost, clustering and approximation error recomputed from the fused model's own outputs."""
    models = pair(CNN)
    x, y = class_blocks(12)
    scores = [_skewed(m, i) for i, m in enumerate(models)]
    res = fuse(models, x, y, "hf", "linear", importance="conductance", scores=scores)
    for level, cost in zip(chain_levels(models[0])[:-1], res.costs):
        mats = [neuron_matrix(layer_io(m, [level], x)[level]).numpy() for m in models]
        w = [normalised_scores(s[level]) for s in scores]
        labels = hungarian_groups(mats[0], mats[1], w[0], w[1])
        points, weights = np.concatenate(mats), np.concatenate(w)
        k = len(mats[0])
        targets = weighted_centroids(points, weights, labels, k).numpy()
        out = neuron_matrix(layer_io(res.model, [level], x)[level]).numpy()
        group_w = np.bincount(labels, weights, minlength=k)
        expected = {
            "cost": (weights * ((points - out[labels]) ** 2).sum(1)).sum(),
            "clustering": (weights * ((points - targets[labels]) ** 2).sum(1)).sum(),
            "approximation": (group_w * ((targets - out) ** 2).sum(1)).sum(),
        }
        for key, value in expected.items():
            assert cost[key] == pytest.approx(value, rel=1e-6)


def test_cost_reports_the_fused_outputs_not_the_targets():
    """Level 0 of an MLP is exact, level 1 is not: the approximation error tells them apart."""
    models = pair(MLP)
    x, y = class_blocks(12)
    res = fuse(models, x, y, "kf", "linear", progress=False)
    level1 = chain_levels(models[0])[1]
    pts = np.concatenate(
        [neuron_matrix(layer_io(m, [level1], x)[level1]).numpy() for m in models]
    )
    out = neuron_matrix(layer_io(res.model, [level1], x)[level1]).numpy()
    assert res.costs[0]["approximation"] < 1e-6 * res.costs[0]["cost"]
    assert res.costs[1]["approximation"] > 1e-3 * res.costs[1]["cost"]
    # the cost of level 1 is the weighted distance of every neuron to its nearest fused neuron
    nearest = ((pts[:, None] - out[None]) ** 2).sum(2).min(1).sum()
    assert res.costs[1]["cost"] >= nearest - 1e-6


# --- baselines with importance -----------------------------------------------------------------


def test_importance_average_weights_rows_by_their_neurons():
    models = pair(MLP)
    states = [m.state_dict() for m in models]
    level = chain_levels(models[0])[0]
    w0 = np.r_[np.ones(6), np.zeros(6)]
    weights = [{level: w0}, {level: 1 - w0}]
    out = importance_average(states, weights, [level])
    assert torch.equal(out[f"{level}.weight"][:6], states[0][f"{level}.weight"][:6])
    assert torch.equal(out[f"{level}.weight"][6:], states[1][f"{level}.weight"][6:])
    assert torch.equal(out[f"{level}.bias"][6:], states[1][f"{level}.bias"][6:])
    head = chain_levels(models[0])[-1]
    mean = (states[0][f"{head}.weight"] + states[1][f"{head}.weight"]) / 2
    assert torch.allclose(out[f"{head}.weight"], mean)


@pytest.mark.parametrize("method", ["otfusion", "rebasin_wm", "rebasin_am"])
def test_aligners_use_importance(method):
    models = pair(MLP)
    x, y = class_blocks(12)
    scores = [_skewed(m, i) for i, m in enumerate(models)]
    plain = fuse_by(method, models, x, y)
    weighted = fuse_by(method, models, x, y, importance="conductance", scores=scores)
    assert (predict(plain, x) - predict(weighted, x)).abs().max() > 1e-3
    itself = [models[0], copy.deepcopy(models[0])]
    same = fuse_by(
        method, itself, x, y, importance="conductance", scores=scores[:1] * 2
    )
    assert (predict(same, x) - predict(models[0], x)).abs().max() < 1e-4


def test_transport_marginals_are_the_importance():
    rng = np.random.default_rng(0)
    cost = rng.uniform(size=(5, 4))
    ma, mb = rng.uniform(0.1, 2.0, 5), rng.uniform(0.1, 2.0, 4)
    p = transport(cost, ma, mb).numpy()
    assert np.allclose(p.sum(0), 1.0)
    # undo the column scaling: the plan's row sums are the source marginals
    plan = p * (mb / mb.sum())[None]
    assert np.allclose(plan.sum(1), ma / ma.sum())
    uniform = transport(cost, np.ones(5), np.ones(4)).numpy() * 0.25
    assert not np.allclose(plan, uniform)


def test_permuted_importance_average_permutes_the_scores_with_the_neurons():
    models = pair(MLP)
    structure = models[0].neuron_structure()
    levels = chain_levels(models[0])
    perm = random_permutations(structure, generator=torch.Generator().manual_seed(2))
    states = [models[0].state_dict()]
    states.append(permute_state(models[1].state_dict(), structure, perm))
    scores = [
        {lv: torch.ones(m.get_submodule(lv).weight.shape[0]) for lv in levels[:-1]}
        for m in models
    ]
    level, group = levels[0], structure.groups[0].name
    scores[1][level] = torch.arange(1.0, 13.0) ** 3  # model 1's own neuron order
    out = permuted_importance_average(models, states, [None, perm], scores)
    w1 = normalised_scores(scores[1][level])[perm[group].numpy()]
    share = torch.as_tensor(w1 / (1.0 + w1))[:, None]
    expected = (1 - share) * states[0][f"{level}.weight"].double() + share * states[1][
        f"{level}.weight"
    ].double()
    assert torch.allclose(out[f"{level}.weight"].double(), expected, atol=1e-6)


def test_rebasin_without_scores_is_plain_averaging_of_aligned_models():
    models = pair(MLP)
    x, _ = class_blocks(12)
    uniform = [
        {
            n: torch.ones(m.get_submodule(n).weight.shape[0])
            for n in chain_levels(m)[:-1]
        }
        for m in models
    ]
    for fn in (
        lambda s: rebasin_weight_matching(models, scores=s),
        lambda s: rebasin_activation_matching(models, x, scores=s),
    ):
        assert (predict(fn(None), x) - predict(fn(uniform), x)).abs().max() < 1e-5


# --- DeepLIFT on the ResNet ---------------------------------------------------------------------


def test_deeplift_on_the_resnet_is_not_gradient_times_delta():
    """With BatchNorm offsets (a train-mode pass), the rescale rule differs from the gradient.

    Without offsets every layer is positively homogeneous and, from a zero
    baseline, DeepLIFT equals gradient x delta exactly.
    """
    model = seeded_model(RESNET, 0)
    x, y = class_blocks(3)
    model.train()
    with torch.no_grad():
        model(x * 2 + 1)
    model.eval()
    layer_name = "stages.0.0.conv1"
    ours = neuron_importance(model, [layer_name], x, y, "deeplift", progress=False)
    layer = model.get_submodule(layer_name)
    store = {}

    def hook(m, i, o):
        o.retain_grad()
        store["out"] = o

    handle = layer.register_forward_hook(hook)
    out = model(x)
    out.gather(1, y[:, None]).sum().backward()
    handle.remove()
    act, grad = store["out"].detach(), store["out"].grad
    base = layer_io(model, [layer_name], torch.zeros_like(x[:1]))[layer_name]
    gxd = (grad * (act - base)).abs().mean((0, 2)).double()
    rel = (ours[layer_name] - gxd).abs().max() / gxd.abs().max()
    assert rel > 1e-3  # the rescale rule changes the scores
    assert ours.method == "deeplift"


# --- bad inputs and the caller's models ---------------------------------------------------------


def test_class_weights_with_an_empty_class_are_rejected():
    models = pair(MLP)
    x, y = class_blocks(12)
    weights = np.ones((2, 10))
    weights[:, 4] = 0.0
    with pytest.raises(ValueError, match=r"classes \[4\] zero total weight"):
        fuse(models, x, y, "kf", class_weights=weights, progress=False)
    with pytest.raises(ValueError, match="non-negative"):
        fuse(models, x, y, "kf", class_weights=-weights, progress=False)
    with pytest.raises(ValueError, match="must have shape"):
        fuse(models, x, y, "kf", class_weights=np.ones((3, 10)), progress=False)


@pytest.mark.parametrize("widths", [[8, 8], [16, 8]], ids=["narrower", "wider"])
def test_hf_into_another_width_is_rejected(widths):
    models = pair(MLP)
    x, y = class_blocks(12)
    target = seeded_model({**MLP, "widths": widths}, 2)
    with pytest.raises(ValueError, match="needs equal widths"):
        fuse(models, x, y, "hf", fused=target, progress=False)


def test_kf_across_numbers_of_classes_is_rejected():
    x, y = class_blocks(12)
    models = [seeded_model(MLP, 0), seeded_model({**MLP, "n_classes": 12}, 1)]
    with pytest.raises(ValueError, match="same output classes"):
        fuse(models, x, y, "kf", progress=False)


def test_labels_out_of_range_are_rejected():
    models = pair(MLP)
    x, y = class_blocks(12)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\)"):
        fuse(models, x, torch.where(y == 9, 10, y), "kf", progress=False)
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\)"):
        fuse(models, x, y - 1, "kf", progress=False)
    with pytest.raises(ValueError, match="inputs but"):
        fuse(models, x[:-1], y, "kf", progress=False)


def test_nan_weights_or_inputs_are_named():
    models = pair(MLP)
    x, y = class_blocks(12)
    with torch.no_grad():
        models[1].linears[1].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"model 1 has NaN .* 'linears.1.weight'"):
        fuse(models, x, y, "kf", progress=False)
    models[1] = seeded_model(MLP, 1)
    target = seeded_model(MLP, 2)
    with torch.no_grad():
        target.linears[0].bias[0] = float("inf")
    with pytest.raises(ValueError, match=r"the fused model has NaN or infinite"):
        fuse(models, x, y, "kf", fused=target, progress=False)
    with pytest.raises(ValueError, match="fusion set's inputs hold NaN"):
        fuse(models, x.clone().fill_(float("inf")), y, "hf", progress=False)


def test_a_fusion_set_smaller_than_the_fan_in_warns():
    models = pair(MLP)
    x, y = class_blocks(2)  # 20 examples, 41 unknowns per neuron at level 0
    with pytest.warns(UserWarning, match="underdetermined"):
        fuse(models, x, y, "kf", progress=False)


def test_scores_of_another_importance_are_rejected():
    models = pair(MLP)
    x, y = class_blocks(12)
    deep = [model_importance(m, x, y, "deeplift", progress=False) for m in models]
    with pytest.raises(ValueError, match="computed with 'deeplift'"):
        fuse(models, x, y, "kf", importance="conductance", scores=deep)
    plain = [dict(s) for s in deep]
    with pytest.raises(ValueError, match="not uniform"):
        fuse(models, x, y, "kf", importance="uniform", scores=plain)
    with pytest.raises(ValueError, match="computed with 'deeplift'"):
        fuse_by("otfusion", models, x, y, importance="conductance", scores=deep)
    with pytest.raises(ValueError, match="for 2 models"):
        fuse(models, x, y, "kf", importance="deeplift", scores=deep[:1])


@pytest.mark.parametrize(
    "method",
    [
        "hf_linear",
        "kf_gradient",
        "averaging",
        "otfusion",
        "rebasin_wm",
        "last_layer_kd",
    ],
)
def test_the_callers_models_keep_their_mode_and_device(method):
    models = [seeded_model(MLP, s).train() for s in (0, 1)]
    x, y = class_blocks(12)
    fused = fuse_by(method, models, x, y, gradient=GradientConfig(max_epochs=2))
    assert all(m.training for m in models)
    assert not fused.training
    assert next(fused.parameters()).device == next(models[0].parameters()).device


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_the_distillation_loss_is_t_squared_kl_at_temperature_t(temperature):
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    soft = torch.softmax(teacher / temperature, 1)
    q = torch.softmax(student / temperature, 1)
    kl = (soft * (soft.log() - q.log())).sum(1).mean()
    loss = soft_target_loss(student, soft, temperature)
    assert float(loss) == pytest.approx(temperature**2 * float(kl), rel=1e-5)
    assert float(soft_target_loss(teacher, soft, temperature)) == pytest.approx(
        0.0, abs=1e-6
    )  # the teacher itself is the optimum at every temperature


def test_distillation_keeps_the_teachers_mode():
    teacher = seeded_model(MLP, 0).train()
    student = seeded_model(MLP, 1)
    x, _ = class_blocks(2)
    out = distill(student, teacher, x, epochs=1)
    assert teacher.training and not out.training
    assert out is student


# --- KF across depths ------------------------------------------------------------------------


def test_depth_map_spreads_the_fused_levels_over_the_base_levels():
    base = ["l0", "l1", "l2", "l3", "head"]
    assert depth_map(base, ["a", "b", "out"]) == {"a": "l1", "b": "l3", "out": "head"}
    assert depth_map(base[2:], ["a", "b", "out"]) == {
        "a": "l2",
        "b": "l3",
        "out": "head",
    }
    assert depth_map(["l0", "l1", "l2", "head"], ["a", "out"]) == {
        "a": "l2",
        "out": "head",
    }
    with pytest.raises(ValueError, match="deeper model into a shallower"):
        depth_map(["l0", "head"], ["a", "b", "out"])


def test_kf_compresses_a_deeper_mlp_into_a_shallower_one():
    deep = seeded_model({**MLP, "widths": [12, 10, 8]}, 0)
    shallow = seeded_model({**MLP, "widths": [10, 8]}, 1)
    x, y = class_blocks(12)
    res = fuse([deep], x, y, "kf", fused=shallow, progress=False)
    assert [m.out_features for m in res.model.linears] == [10, 8, 10]
    levels = chain_levels(deep)
    # one model, k = width: every neuron is its own group, so the clustering
    # error is zero and the cost is the distance to the mapped deep level
    for cost, level in zip(res.costs, (levels[1], levels[2])):
        fused_level = cost["level"]
        a = neuron_matrix(layer_io(deep, [level], x)[level]).numpy()
        f = neuron_matrix(layer_io(res.model, [fused_level], x)[fused_level]).numpy()
        assert cost["clustering"] == pytest.approx(0.0, abs=1e-9)
        assert cost["cost"] == pytest.approx(((a - f) ** 2).sum(), rel=1e-6)
    other = seeded_model(CNN, 2)
    with pytest.raises(ValueError, match="fuse into a model of the base"):
        fuse([deep], x, y, "kf", fused=other, progress=False)


def test_attribution_share_gives_a_class_to_the_model_that_attributes_it():
    models = pair(MLP)
    with torch.no_grad():
        models[1].linears[-1].weight[3] = 0.0  # model 1 cannot attribute class 3
    x, y = class_blocks(4)
    share = attribution_share(models, x, y, "deeplift")
    assert share.shape == (2, 10)
    assert np.allclose(share.sum(0), 1.0)
    assert share[0, 3] == pytest.approx(1.0)
    assert 0.0 < share[0, 0] < 1.0


# --- the Gradient variant on whole blocks (ResNets, transformers) ----------------------------

TRANSFORMER = transformer1d(**SIGNAL, embed_dim=8, depth=1, heads=2, mlp_dim=12)


def _with_bn_statistics(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model.train()
    with torch.no_grad():
        model(x)
    return model.eval()


def _residual_pair(config: dict) -> tuple[list[nn.Module], torch.Tensor, torch.Tensor]:
    x, y = class_blocks(12)
    return [_with_bn_statistics(seeded_model(config, s), x) for s in (0, 1)], x, y


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
def test_block_fit_lowers_the_block_output_error_of_the_affine_fit(config):
    models, x, y = _residual_pair(config)
    linear = fuse(models, x, y, "kf", "linear", progress=False)
    blocks = fuse(models, x, y, "kf", "gradient", progress=False)
    names = [
        n for n, m in models[0].named_modules() if type(m).__name__.endswith("Block")
    ]
    assert linear.block_fits == []
    assert [f["block"] for f in blocks.block_fits] == names
    for fit in blocks.block_fits:
        assert fit["best"] <= fit["start"]
    first = blocks.block_fits[0]  # same input as the Linear fit: its start is that fit
    assert first["best"] < 0.8 * first["start"]
    # the Linear fusion's first block misses its targets by the block fit's start error
    taps_of = resnet_taps if config is RESNET else transformer_taps
    out_lin = taps_of(linear.model, x)
    out_blk = taps_of(blocks.model, x)
    tap = "stages.0.0.sum" if config is RESNET else "blocks.0.mlp_sum"
    assert not torch.allclose(out_lin[tap], out_blk[tap], atol=1e-4)
    assert (
        fuse(models, x, y, "kf", "gradient", gradient=GradientConfig(blocks=False))
    ).block_fits == []
    # the stem (same input) stays the least-squares fit; the blocks' BatchNorms describe
    # their convs' outputs on the fusion set after the fit
    for name, p in linear.model.named_parameters():
        if name.startswith(("stem.", "embed.")):
            assert torch.allclose(p, blocks.model.get_parameter(name), atol=1e-7), name
    if config is RESNET:
        block = blocks.model.stages[0][0]
        conv_out = block.conv1(out_blk["stages.0.0.in"]).transpose(0, 1).flatten(1)
        assert torch.allclose(block.bn1.running_mean, conv_out.mean(1), atol=1e-4)


def test_fit_block_keeps_the_better_of_start_and_end_and_reports_it():
    x, _ = class_blocks(12)
    model = _with_bn_statistics(seeded_model(RESNET, 0), x)
    other = _with_bn_statistics(seeded_model(RESNET, 1), x)
    block, ref = model.stages[0][0], other.stages[0][0]
    inp = resnet_taps(model, x)["stages.0.0.in"]
    with torch.no_grad():
        target = tap_matrix(block_output(ref, inp), False)

    def mse() -> float:
        with torch.no_grad():
            return float(
                ((tap_matrix(block_output(block, inp), False) - target) ** 2).mean()
            )

    before = mse()
    out = fit_block(block, inp, target, False, GradientConfig(max_epochs=50), 0)
    assert out["start"] == pytest.approx(before, rel=1e-4)
    assert out["best"] == pytest.approx(mse(), rel=1e-3)
    assert out["best"] < 0.5 * before
    # from an exact start, nothing moves: the result is never worse than the start
    again = fit_block(ref, inp, target, False, GradientConfig(max_epochs=20), 0)
    assert again["best"] <= again["start"] < 1e-10


def test_block_fit_keeps_batchnorm_statistics_true_and_the_eval_function():
    x, _ = class_blocks(12)
    block = _with_bn_statistics(seeded_model(RESNET, 0), x).stages[1][
        0
    ]  # with a projection
    inp = torch.relu(
        torch.randn(len(x), 4, 40, generator=torch.Generator().manual_seed(3))
    )
    with torch.no_grad():
        block.conv1.weight.mul_(2.0)
        before = block_output(block, inp)
        restat_batchnorm(block, inp)
        after = block_output(block, inp)
        conv_out = block.conv1(inp).transpose(0, 1).flatten(1)
    assert torch.allclose(before, after, atol=1e-4)
    assert torch.allclose(block.bn1.running_mean, conv_out.mean(1), atol=1e-5)
    assert torch.allclose(
        block.bn1.running_var, conv_out.var(1, unbiased=False), rtol=1e-4
    )


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
def test_block_gradient_fusion_of_a_model_with_itself_returns_it(config):
    x, y = class_blocks(12)
    model = _with_bn_statistics(seeded_model(config, 0), x)
    fused = fuse([model, copy.deepcopy(model)], x, y, "hf", "gradient", progress=False)
    x_test, _ = class_blocks(5, seed=1)
    assert (predict(model, x_test) - predict(fused.model, x_test)).abs().max() < 1e-3


def test_gradient_config_blocks_must_be_a_bool():
    with pytest.raises(TypeError, match="blocks must be True or False"):
        GradientConfig(blocks="yes")


# --- devices and dtypes (no GPU here: what holds by construction) ----------------------------


def test_ensemble_class_weights_are_a_buffer_that_follows_the_members():
    models = pair(MLP)
    ens = Ensemble(models, class_weights=np.ones((2, 10)))
    assert "class_weights" in dict(ens.named_buffers())
    assert ens.class_weights.device == next(models[0].parameters()).device
    ens.to(torch.float64)  # .to() reaches the buffer, so a device move does too
    assert ens.class_weights.dtype == torch.float64


def test_least_squares_run_in_float64_where_the_device_supports_it():
    assert solve_dtype(torch.device("cpu")) == torch.float64
    assert solve_dtype(torch.device("cuda")) == torch.float64
    assert solve_dtype(torch.device("mps")) == torch.float32
    conv = nn.Conv1d(2, 3, 3)
    assert design_matrix(conv, torch.randn(4, 2, 8)).dtype == torch.float64
    assert (
        design_matrix(conv, torch.randn(4, 2, 8), dtype=torch.float32).dtype
        == torch.float32
    )
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    t = torch.randn(3, 50, generator=gen)
    sol = ridge_solve(lambda sl: a[sl], t, 50, 1e-8, chunk=7)
    assert sol.dtype == torch.float64
    assert torch.allclose(sol, torch.linalg.lstsq(a, t.T.double()).solution, atol=1e-6)


def test_distillation_moves_the_data_to_the_student():
    teacher, student = seeded_model(MLP, 0), seeded_model(MLP, 1)
    x, _ = class_blocks(2)
    out = distill(student, teacher, x.double().float(), epochs=1)
    assert next(out.parameters()).device == x.device
