"""Fusion (HF / KF) and its baselines: invariants, exact identities and clear errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.fixtures import write_cifar10
from tests.kit import (
    SIGNAL,
    class_blocks,
    cnn1d,
    drawn_models,
    mlp,
    pair,
    resnet1d,
    seeded_model,
    transformer1d,
)
from wslib.core.data import load_dataset
from wslib.core.neurons import permute_state, random_permutations
from wslib.core.train import predict
from wslib.fusion.baselines import (
    Ensemble,
    averaging,
    last_layer_kd,
    otfusion,
    rebasin_activation_matching,
    rebasin_weight_matching,
)
from wslib.fusion.grouping import (
    cost_decomposition,
    hungarian_groups,
    kmeans_groups,
    weighted_centroids,
)
from wslib.fusion.hfkf import class_share, fuse
from wslib.fusion.importance import neuron_importance
from wslib.fusion.levels import chain_levels, layer_io, neuron_matrix
from wslib.fusion.retrofit import GradientConfig
from wslib.fusion.taps import resnet_taps, transformer_taps

QUICK = GradientConfig(max_epochs=10, patience=3)
MLP = mlp([24, 16], **SIGNAL)
CNN = cnn1d([6, 8], **SIGNAL)
RESNET = resnet1d([4, 8], **SIGNAL, blocks_per_stage=2)
TRANSFORMER = transformer1d(**SIGNAL, embed_dim=8, depth=2, heads=2, mlp_dim=12)


def _max_diff(a: torch.nn.Module, b: torch.nn.Module, x: torch.Tensor) -> float:
    return (predict(a, x) - predict(b, x)).abs().max().item()


SELF_FUSIONS = {
    "averaging": lambda ms, x, y: averaging(ms),
    "otfusion_activation": lambda ms, x, y: otfusion(ms, x, cost="activation"),
    "otfusion_weight": lambda ms, x, y: otfusion(ms, None, cost="weight"),
    "rebasin_wm": lambda ms, x, y: rebasin_weight_matching(ms),
    "hf_linear": lambda ms, x, y: fuse(ms, x, y, "hf", "linear", progress=False).model,
    "kf_linear": lambda ms, x, y: fuse(ms, x, y, "kf", "linear", progress=False).model,
    "kf_linear_conductance": lambda ms, x, y: (
        fuse(ms, x, y, "kf", "linear", importance="conductance", progress=False).model
    ),
}


@pytest.mark.parametrize("config", [MLP, CNN], ids=["mlp", "cnn"])
@pytest.mark.parametrize("method", list(SELF_FUSIONS))
def test_fusing_a_model_with_itself_returns_it(config, method):
    model = seeded_model(config, 0)
    x, y = class_blocks(12)
    fused = SELF_FUSIONS[method]([model, copy.deepcopy(model)], x, y)
    x_test, _ = class_blocks(5, seed=1)
    assert _max_diff(model, fused, x_test) < 1e-4


def _with_bn_statistics(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    """Running statistics from one train-mode pass, so that BatchNorm is not the identity."""
    model.train()
    with torch.no_grad():
        model(x)
    return model.eval()


RESIDUAL_FUSIONS = ["hf_linear", "kf_linear", "kf_linear_conductance"]


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
@pytest.mark.parametrize("method", RESIDUAL_FUSIONS)
def test_residual_models_fused_with_themselves_are_returned(config, method):
    x, y = class_blocks(12)
    model = _with_bn_statistics(seeded_model(config, 0), x)
    fused = SELF_FUSIONS[method]([model, copy.deepcopy(model)], x, y)
    x_test, _ = class_blocks(5, seed=1)
    assert _max_diff(model, fused, x_test) < 1e-4


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
def test_taps_reproduce_the_forward_pass(config):
    x, _ = class_blocks(3)
    model = _with_bn_statistics(seeded_model(config, 0), x)
    taps = (resnet_taps if config is RESNET else transformer_taps)(model, x)
    assert torch.allclose(taps["head"], model(x), atol=1e-6)


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
def test_permuted_residual_copy_fuses_back_to_the_model(config):
    """Streams, block neurons and MLP neurons permuted: HF pairs every neuron with its copy."""
    x, y = class_blocks(12)
    model = _with_bn_statistics(seeded_model(config, 0), x)
    structure = model.neuron_structure()
    other = copy.deepcopy(model)
    other.load_state_dict(
        permute_state(
            model.state_dict(),
            structure,
            random_permutations(structure, generator=torch.Generator().manual_seed(5)),
        )
    )
    fused = fuse([model, other], x, y, "hf", progress=False).model
    assert _max_diff(model, fused, x) < 1e-4


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
@pytest.mark.parametrize("grouping,retrofit", [("hf", "linear"), ("kf", "gradient")])
def test_residual_fusion_of_different_models(config, grouping, retrofit):
    x, y = class_blocks(12)
    models = [_with_bn_statistics(seeded_model(config, s), x) for s in (0, 1)]
    result = fuse(
        models,
        x,
        y,
        grouping,
        retrofit,
        importance="deeplift",
        gradient=QUICK,
        progress=False,
    )
    assert type(result.model) is type(models[0])
    assert torch.isfinite(predict(result.model, x)).all()
    groups = [g.name for g in models[0].neuron_structure().groups]
    assert [c["level"] for c in result.costs] == groups
    for c in result.costs:
        assert c["clustering"] + c["approximation"] == pytest.approx(
            c["cost"], rel=1e-9
        )


def test_hungarian_recovers_the_permutation_of_a_permuted_copy():
    model = seeded_model(MLP, 0)
    structure = model.neuron_structure()
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(3))
    other = copy.deepcopy(model)
    other.load_state_dict(permute_state(model.state_dict(), structure, perms))
    x, _ = class_blocks(12)
    levels = chain_levels(model)
    acts_a, acts_b = layer_io(model, levels, x), layer_io(other, levels, x)
    for group, name in zip(structure.groups, levels):
        a, b = neuron_matrix(acts_a[name]).numpy(), neuron_matrix(acts_b[name]).numpy()
        labels = hungarian_groups(a, b, np.ones(len(a)), np.ones(len(b)))
        # neuron j of the copy is old neuron perms[j]: it must join group perms[j]
        assert np.array_equal(labels[len(a) :], perms[group.name].numpy())


def test_permuted_copy_fuses_back_to_the_model():
    model = seeded_model(MLP, 0)
    structure = model.neuron_structure()
    other = copy.deepcopy(model)
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(4))
    other.load_state_dict(permute_state(model.state_dict(), structure, perms))
    x, y = class_blocks(12)
    for grouping in ("hf", "kf"):
        fused = fuse([model, other], x, y, grouping, progress=False).model
        assert _max_diff(model, fused, x) < 1e-4


@pytest.mark.parametrize(
    "grouping,retrofit", [("hf", "linear"), ("kf", "linear"), ("kf", "gradient")]
)
def test_theorem1_decomposition_is_exact(grouping, retrofit):
    models = pair(CNN)
    x, y = class_blocks(12)
    result = fuse(
        models,
        x,
        y,
        grouping,
        retrofit,
        importance="deeplift",
        gradient=QUICK,
        progress=False,
    )
    assert len(result.costs) == 2
    for c in result.costs:
        assert c["cost"] > 0
        assert c["clustering"] + c["approximation"] == pytest.approx(
            c["cost"], rel=1e-9
        )


def test_decomposition_on_random_points_and_centroids():
    rng = np.random.default_rng(0)
    points, weights = rng.normal(size=(30, 7)), rng.uniform(0.1, 2.0, 30)
    labels = kmeans_groups(points, weights, 5, seed=0)
    fused = rng.normal(size=(5, 7))
    parts = cost_decomposition(points, weights, labels, fused)
    assert parts["clustering"] + parts["approximation"] == pytest.approx(
        parts["cost"], rel=1e-12
    )
    # the weighted centroids minimise the cost: fusing exactly to them leaves the clustering error
    at_targets = cost_decomposition(
        points, weights, labels, weighted_centroids(points, weights, labels, 5)
    )
    assert at_targets["approximation"] == pytest.approx(0.0, abs=1e-12)
    assert at_targets["cost"] <= parts["cost"]


def test_kmeans_fuses_models_of_different_widths_into_a_given_width():
    wide = seeded_model({**MLP, "widths": [32, 24]}, 0)
    narrow = seeded_model(MLP, 1)
    x, y = class_blocks(12)
    target = seeded_model({**MLP, "widths": [12, 10]}, 2)
    result = fuse([wide, narrow], x, y, "kf", fused=target, progress=False)
    assert [m.out_features for m in result.model.linears] == [12, 10, 10]
    assert torch.isfinite(predict(result.model, x)).all()


def test_importance_scores_are_nonnegative_and_uniform_is_ones():
    model = seeded_model(CNN, 0)
    x, y = class_blocks(12)
    levels = chain_levels(model)[:-1]
    uniform = neuron_importance(model, levels, x, y, "uniform", progress=False)
    assert all(torch.equal(s, torch.ones_like(s)) for s in uniform.values())
    for method in ("conductance", "deeplift"):
        scores = neuron_importance(model, levels, x, y, method, progress=False)
        assert [len(s) for s in scores.values()] == [6, 8]
        assert all((s >= 0).all() and s.sum() > 0 for s in scores.values())


def test_class_weighted_ensemble_follows_the_owner_of_each_class():
    models = pair(MLP)
    share = class_share(np.array([[5] * 5 + [0] * 5, [0] * 5 + [5] * 5]))
    x, _ = class_blocks(2)
    ens = predict(Ensemble(models, class_weights=share), x).exp()
    p0, p1 = (torch.softmax(predict(m, x), 1) for m in models)
    mixed = torch.cat([p0[:, :5], p1[:, 5:]], 1)
    assert torch.allclose(ens, mixed / mixed.sum(1, keepdim=True), atol=1e-5)


def test_baselines_return_models_of_the_same_architecture():
    models = [seeded_model(MLP, s) for s in (0, 1, 2)]
    x, _ = class_blocks(12)
    for fused in (
        last_layer_kd(models, x, epochs=2),
        rebasin_activation_matching(models, x),
        otfusion(models, x),
    ):
        assert type(fused) is type(models[0])
        assert predict(fused, x).shape == (len(x), 10)


def test_hf_rejects_different_widths_and_fewer_than_two_models():
    x, y = class_blocks(12)
    with pytest.raises(ValueError, match="equal widths"):
        fuse(
            [seeded_model(MLP, 0), seeded_model({**MLP, "widths": [32, 16]}, 1)],
            x,
            y,
            "hf",
            progress=False,
        )
    with pytest.raises(ValueError, match="two or more models"):
        fuse([seeded_model(MLP, 0)], x, y, "hf", progress=False)


def test_different_architectures_are_rejected():
    x, y = class_blocks(12)
    with pytest.raises(ValueError, match="another architecture"):
        fuse([seeded_model(MLP, 0), seeded_model(CNN, 1)], x, y, "kf", progress=False)
    with pytest.raises(ValueError, match="another architecture"):
        averaging([seeded_model(MLP, 0), seeded_model(CNN, 1)])


def test_fusion_set_missing_classes_is_named():
    x, y = class_blocks(12)
    keep = (y != 3) & (y != 7)
    with pytest.raises(ValueError, match=r"classes \[3, 7\]"):
        fuse(
            [seeded_model(MLP, 0), seeded_model(MLP, 1)],
            x[keep],
            y[keep],
            "kf",
            progress=False,
        )


def test_non_chain_architectures_get_a_clear_error():
    resnet = seeded_model(resnet1d([4, 8], **SIGNAL), 0)
    with pytest.raises(ValueError, match="BatchNorm"):
        chain_levels(resnet)
    vit = seeded_model(
        transformer1d(**SIGNAL, embed_dim=8, heads=2, mlp_dim=8, depth=1),
        0,
    )
    with pytest.raises(ValueError, match="chain architectures"):
        chain_levels(vit)


def test_gpu_profile_code_paths_on_tiny_cifar(tmp_path):
    """VGG-11 (no BN) through HF/KF and the baselines; ResNet-18 and a ViT through Re-Basin and KF."""
    write_cifar10(tmp_path / "cifar10", np.random.default_rng(0), n_train=10, n_test=10)
    ds = load_dataset("cifar10", root=tmp_path)
    x, y = ds.x_train[:20], ds.y_train[:20]
    vgg = {"name": "vgg11", "in_shape": [3, 32, 32], "n_classes": 10, "width": 0.0625}
    models = pair(vgg)
    for grouping, retrofit in (("hf", "linear"), ("kf", "gradient")):
        fused = fuse(
            models,
            x,
            y,
            grouping,
            retrofit,
            importance="deeplift",
            gradient=QUICK,
            progress=False,
        ).model
        assert torch.isfinite(predict(fused, ds.x_test)).all()
    assert (
        _max_diff(
            models[0], otfusion([models[0], copy.deepcopy(models[0])], x), ds.x_test
        )
        < 1e-4
    )
    for config in (
        {"name": "resnet18", "in_shape": [3, 32, 32], "n_classes": 10, "width": 0.0625},
        {
            "name": "vit",
            "in_shape": [3, 32, 32],
            "n_classes": 10,
            "embed_dim": 16,
            "depth": 1,
            "heads": 2,
            "mlp_dim": 16,
            "patch_size": 8,
        },
    ):
        models = pair(config)
        fused = rebasin_weight_matching(models, x_bn=x)
        assert torch.isfinite(predict(fused, ds.x_test)).all()
        fused = fuse(
            models, x, y, "kf", "linear", importance="deeplift", progress=False
        ).model
        assert torch.isfinite(predict(fused, ds.x_test)).all()


def test_attribution_share_equals_the_per_class_importance_sums() -> None:
    """One pass over the fusion set gives each class's attribution, as a pass per class would."""
    import numpy as np

    from wslib.fusion.hfkf import attribution_share
    from wslib.fusion.importance import neuron_importance

    models = drawn_models(cnn1d([4, 4], [1, 12]), 2)
    x = torch.randn(18, 1, 12)
    y = torch.tensor([0] * 8 + [1] * 6 + [2] * 4)  # classes of unequal sizes
    for method in ("conductance", "deeplift"):
        per_class = np.array(
            [
                [
                    float(
                        neuron_importance(
                            m,
                            ["features.3"],
                            x[y == c],
                            y[y == c],
                            method,
                            progress=False,
                        )["features.3"].sum()
                    )
                    for c in range(3)
                ]
                for m in models
            ]
        )
        expected = per_class / per_class.sum(0, keepdims=True)
        np.testing.assert_allclose(
            attribution_share(models, x, y, method),
            expected,
            rtol=1e-6,  # float32 attributions, batched otherwise
        )


def test_weight_matching_is_computed_once_per_pair_and_seed(monkeypatch) -> None:
    """Fusing the same models again (another importance) reuses the matching."""
    from wslib.fusion import baselines

    calls = []
    real = baselines.weight_matching

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003
        calls.append(kwargs.get("seed"))
        return real(*args, **kwargs)

    monkeypatch.setattr(baselines, "weight_matching", counting)
    monkeypatch.setattr(baselines, "_MATCHINGS", {})
    models = drawn_models(mlp([5], [1, 6]), 3)
    first = baselines.rebasin_weight_matching(models, seed=0)
    again = baselines.rebasin_weight_matching(models, seed=0)
    assert calls == [0, 0]  # models 1 and 2 matched to model 0, once each
    assert all(
        torch.equal(v, again.state_dict()[k]) for k, v in first.state_dict().items()
    )
    baselines.rebasin_weight_matching(models, seed=1)
    assert calls == [0, 0, 1, 1]
    with torch.no_grad():
        next(models[1].parameters()).add_(1.0)
    baselines.rebasin_weight_matching(models, seed=0)
    assert calls == [0, 0, 1, 1, 0]  # a changed model is matched afresh
