"""The levels of a chain net and the steps of one level, pinned against references
(survivors of mutation testing).

``chain_levels`` against the layer names listed by hand and toy modules whose
neuron structure breaks the chain in one way each; the checks of models,
fusion sets, class weights and scores against their whole messages;
``layer_io`` against a forward pass by hand; the neuron matrices against
explicit reshapes; centroids and squared distances against ``np.add.at`` and
loops; HF's matching against brute force over the permutations of four
neurons; the isometric rows against pairwise distances; k-means against
scikit-learn's with the documented start and stopping rule; the cost
decomposition against the docstring's sums and Theorem 1; design matrices
against the layer's own outputs; ridge least squares against
``np.linalg.solve`` in float64 (chunked against unchunked, 256 examples a
chunk by default); ``retrofit_linear``
against the closed form with and without a prior; ``minimise`` against
torch's L-BFGS with the documented settings, Adam's steps by hand and its
selection rule; the held-out split against ``torch.randperm``. Device code
runs on the stand-in GPU of :mod:`tests.devicecheck`, made stricter here
(:class:`StrictDiscipline`: CUDA's indexing and in-place rules, MPS's lack of
float64), on the meta device, and with an MPS-like float32 solve.
"""

from __future__ import annotations

import copy
import itertools
import re
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.cluster import KMeans
from torch import nn
from torch.utils._pytree import tree_flatten

from tests.devicecheck import DEVICE, DeviceDiscipline, DeviceMixError, to_device
from tests.kit import cnn1d, cnn2d, mlp, seeded_model, transformer1d, warning_sites
from wslib.core.neurons import NeuronGroup, NeuronStructure, Slot
from wslib.fusion import grouping, retrofit
from wslib.fusion.checks import (
    check_finite,
    check_fusion_inputs,
    check_fusion_set,
    check_same_architecture,
    check_same_classes,
    check_scores,
)
from wslib.fusion.grouping import (
    _product_centroids,
    _scatter_centroids,
    cost_decomposition,
    group_labels,
    hf_groups,
    hungarian_groups,
    isometric_rows,
    kmeans_groups,
    squared_distances,
    weighted_centroids,
)
from wslib.fusion.importance import Scores
from wslib.fusion.levels import (
    FusionResult,
    chain_levels,
    from_neuron_matrix,
    head_weights,
    layer_io,
    level_widths,
    neuron_matrix,
    normalised_scores,
    solve_dtype,
)
from wslib.fusion.retrofit import (
    GradientConfig,
    affine_outputs,
    design_matrix,
    held_out_split,
    minimise,
    retrofit_gradient,
    retrofit_linear,
    ridge_solve,
    set_affine,
)

MLP = mlp([4, 3], in_shape=[1, 5])
CNN = cnn1d([2, 3], in_shape=[1, 6])


def raises(kind: type[Exception], message: str) -> Any:
    """``pytest.raises`` for exactly ``message``."""
    return pytest.raises(kind, match=f"^{re.escape(message)}$")


def randn(
    *shape: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.randn(
        *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype
    )


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


class StrictDiscipline(DeviceDiscipline):
    """:class:`DeviceDiscipline` that also refuses what CUDA and MPS refuse beyond it:
    indexing a host tensor with device indices, an in-place operation writing device
    values into a host tensor, and (``float64=False``, as on MPS) float64 device tensors."""

    def __init__(self, float64: bool = True) -> None:
        super().__init__()
        self.float64 = float64

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func is torch.Tensor.__getitem__ and not self.on_device(args[0]):
            if any(self.on_device(t) for t in tree_flatten(args[1:])[0]):
                raise DeviceMixError("a host tensor indexed with device indices")
        in_place = name.startswith("__i") or (
            name.endswith("_") and not name.startswith("_")
        )
        if in_place and name != "copy_" and args and isinstance(args[0], torch.Tensor):
            others = tree_flatten((args[1:], kwargs))[0]
            if not self.on_device(args[0]) and any(self.on_device(t) for t in others):
                raise DeviceMixError(f"{name} writes device values into a host tensor")
        out = super().__torch_function__(func, types, args, kwargs)
        for t in tree_flatten(out)[0]:
            if not self.float64 and self.on_device(t) and t.dtype == torch.float64:
                raise DeviceMixError(
                    f"{name} made a float64 tensor on a float32 device"
                )
        return out


# --- chain_levels and level_widths -----------------------------------------------------------


class Toy(nn.Module):
    """Layers ``a`` to ``d`` (``e`` an embedding) and a neuron structure given by hand."""

    def __init__(self, groups: list[NeuronGroup]) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(2, 2) for _ in range(4))
        self.e = nn.Embedding(2, 2)
        self.groups = groups

    def neuron_structure(self) -> NeuronStructure:
        return NeuronStructure(tuple(self.groups))


def group(name: str, *slots: tuple[str, str]) -> NeuronGroup:
    return NeuronGroup(name, 2, tuple(Slot(n, 0, role) for n, role in slots))  # type: ignore[arg-type]


def link(name: str, producer: str, consumer: str) -> NeuronGroup:
    return group(
        name,
        (f"{producer}.weight", "out"),
        (f"{producer}.bias", "out"),
        (f"{consumer}.weight", "in"),
    )


def not_a_chain(name: str) -> str:
    return (
        f"Toy group {name!r} is not one layer feeding one layer; level-wise fusion "
        "supports the chain architectures mlp, cnn1d and vgg11 (no BN)"
    )


def test_chain_levels_list_the_producers_then_the_head() -> None:
    assert chain_levels(seeded_model(MLP, 0)) == ["linears.0", "linears.1", "linears.2"]
    assert chain_levels(seeded_model(CNN, 0)) == ["features.0", "features.3", "head"]
    assert chain_levels(seeded_model(cnn2d([2]), 0)) == ["features.0", "head"]
    assert chain_levels(Toy([link("g", "a", "b"), link("h", "b", "c")])) == [
        "a",
        "b",
        "c",
    ]


def test_level_widths_are_the_hidden_group_sizes() -> None:
    assert level_widths(seeded_model(MLP, 0)) == [4, 3]
    assert level_widths(seeded_model(CNN, 0)) == [2, 3]


def test_chain_levels_refuse_models_without_a_neuron_structure_or_with_batchnorm() -> (
    None
):
    with raises(
        TypeError, "Linear has no neuron_structure(); build it with build_model"
    ):
        chain_levels(nn.Linear(2, 2))
    with raises(
        ValueError,
        "neuron-level fusion needs models without BatchNorm (build cnn1d/vgg11 with bn=False)",
    ):
        chain_levels(seeded_model(cnn1d([2], in_shape=[1, 6], bn=True), 0))


@pytest.mark.parametrize(
    "slots",
    [
        [("a.weight", "out"), ("b.weight", "out"), ("c.weight", "in")],  # two producers
        [("a.bias", "out"), ("c.weight", "in")],  # no producing weight
        [("a.weight", "out"), ("b.weight", "in"), ("c.weight", "in")],  # two consumers
        [("a.weight", "out")],  # no consumer
        [("a.weight", "out"), ("b.weight", "in"), ("a.bias", "free")],  # a free slot
    ],
)
def test_chain_levels_refuse_a_group_that_is_not_one_layer_feeding_one(
    slots: list[tuple[str, str]],
) -> None:
    with raises(ValueError, not_a_chain("g")):
        chain_levels(Toy([group("g", *slots)]))


def test_chain_levels_name_the_transformer_that_is_no_chain() -> None:
    model = seeded_model(
        transformer1d(patch_size=2, embed_dim=8, depth=1, heads=2, mlp_dim=8), 0
    )
    message = (
        "Transformer group 'stream' is not one layer feeding one layer; level-wise fusion "
        "supports the chain architectures mlp, cnn1d and vgg11 (no BN)"
    )
    with raises(ValueError, message):
        chain_levels(model)


def test_chain_levels_refuse_a_broken_chain_an_empty_one_and_non_affine_levels() -> (
    None
):
    with raises(ValueError, "group 'h': c does not follow b"):
        chain_levels(Toy([link("g", "a", "b"), link("h", "c", "d")]))
    with raises(ValueError, "Toy has no hidden neurons; there is nothing to fuse"):
        chain_levels(Toy([]))
    with raises(TypeError, "level 'e' is not a Linear or Conv layer"):
        chain_levels(Toy([link("g", "a", "e")]))
    with raises(TypeError, "level 'e' is not a Linear or Conv layer"):
        chain_levels(Toy([link("g", "e", "a")]))


# --- check_same_architecture, check_finite, check_fusion_set -------------------------------


def test_one_architecture_passes_and_no_model_is_refused() -> None:
    models = [seeded_model(MLP, s) for s in range(3)]
    check_same_architecture(models)
    check_same_architecture(models[:1])
    with raises(ValueError, "need at least one model"):
        check_same_architecture([])


def test_another_architecture_is_named_with_the_models_index() -> None:
    a, b = seeded_model(MLP, 0), seeded_model(MLP, 1)
    with raises(
        ValueError,
        "model 2 (ConvNet) has another architecture than model 0 (MLP); "
        "fuse models of one architecture",
    ):
        check_same_architecture([a, b, seeded_model(CNN, 0)])
    deeper = seeded_model(mlp([4, 3, 2], in_shape=[1, 5]), 0)
    with raises(
        ValueError,
        "model 1 (MLP) has another architecture than model 0 (MLP); "
        "fuse models of one architecture",
    ):
        check_same_architecture([a, deeper])


class Ranked(nn.Module):
    """One buffer ``t`` of the given shape."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.register_buffer("t", torch.zeros(shape))


def test_tensors_of_another_rank_are_refused() -> None:
    with raises(ValueError, "model 2 has tensors of another rank than model 0"):
        check_same_architecture(
            [Ranked(2, 3), Ranked(4, 5), Ranked(6)], same_widths=False
        )


def test_other_widths_are_refused_only_when_widths_must_agree() -> None:
    a, b = seeded_model(MLP, 0), seeded_model(MLP, 1)
    wide = seeded_model(mlp([4, 5], in_shape=[1, 5]), 0)
    with raises(
        ValueError,
        "model 2 has other layer widths than model 0 ([4, 5] vs [4, 3]); "
        "this method needs equal widths (use KF otherwise)",
    ):
        check_same_architecture([a, b, wide])
    check_same_architecture([a, b, wide], same_widths=False)


def test_finite_models_and_inputs_pass() -> None:
    models = [seeded_model(MLP, s) for s in range(2)]
    check_finite(models, randn(4, 1, 5), fused=seeded_model(MLP, 2))
    check_finite(models, torch.arange(3))


def broken(value: float, name: str = "linears.1.bias") -> nn.Module:
    model = seeded_model(MLP, 0)
    with torch.no_grad():
        model.get_parameter(name)[0] = value
    return model


def test_the_first_nan_or_infinite_weight_is_named() -> None:
    good = seeded_model(MLP, 0)
    with raises(
        ValueError,
        "model 1 has NaN or infinite values in 'linears.1.bias'; fuse trained models "
        "with finite weights (check the run that produced it)",
    ):
        check_finite([good, broken(float("nan")), broken(1.0)], randn(2, 1, 5))
    with raises(
        ValueError,
        "model 0 has NaN or infinite values in 'linears.0.weight'; fuse trained models "
        "with finite weights (check the run that produced it)",
    ):
        check_finite(
            [broken(float("inf"), "linears.0.weight"), broken(float("nan"))], randn(2)
        )
    with raises(
        ValueError,
        "the fused model has NaN or infinite values in 'linears.1.bias'; fuse trained "
        "models with finite weights (check the run that produced it)",
    ):
        check_finite([good], randn(2), fused=broken(-float("inf")))


def test_non_finite_inputs_are_refused() -> None:
    x = randn(3, 1, 5)
    x[2, 0, 1] = float("nan")
    with raises(ValueError, "the fusion set's inputs hold NaN or infinite values"):
        check_finite([seeded_model(MLP, 0)], x)
    with raises(ValueError, "the fusion set's inputs hold NaN or infinite values"):
        check_finite([], torch.tensor([0.0, float("inf")]))


def test_fusion_labels_must_lie_in_range_and_cover_every_class() -> None:
    check_fusion_set(torch.tensor([2, 0, 1, 1]), 3)
    check_fusion_set([0, 1], 2)  # type: ignore[arg-type]
    with raises(
        ValueError,
        "fusion labels must lie in [0, 3) for models with 3 classes, got labels from 0 to 3",
    ):
        check_fusion_set(torch.tensor([0, 1, 2, 3]), 3)
    with raises(
        ValueError,
        "fusion labels must lie in [0, 3) for models with 3 classes, got labels from -1 to 2",
    ):
        check_fusion_set(torch.tensor([-1, 0, 1, 2]), 3)
    with raises(
        ValueError,
        "the fusion set has no examples of classes [1, 3]; draw a class-balanced fusion "
        "set (wslib.core.data.balanced_subset) from the union of the training data",
    ):
        check_fusion_set(np.array([0, 2, 2]), 4)  # type: ignore[arg-type]
    with raises(
        ValueError,
        "the fusion set has no examples of classes [0, 1]; draw a class-balanced fusion "
        "set (wslib.core.data.balanced_subset) from the union of the training data",
    ):
        check_fusion_set(torch.tensor([], dtype=torch.long), 2)


def test_fusion_labels_given_as_a_list_are_read_on_the_host_whatever_the_default_device() -> (
    None
):
    torch.set_default_device("meta")
    try:
        check_fusion_set([1, 0, 2], 3)  # type: ignore[arg-type]
        with raises(
            ValueError,
            "fusion labels must lie in [0, 2) for models with 2 classes, got labels from 0 to 5",
        ):
            check_fusion_set([0, 5, 1], 2)  # type: ignore[arg-type]
    finally:
        torch.set_default_device(None)


# --- check_fusion_inputs ---------------------------------------------------------------------


def test_fusion_inputs_need_one_label_each_and_some_examples() -> None:
    model = seeded_model(MLP, 0)
    with raises(
        ValueError, "the fusion set has 3 inputs but 2 labels; give one label per input"
    ):
        check_fusion_inputs(model, randn(3, 1, 5), torch.zeros(2))
    with raises(
        ValueError,
        "the fusion set is empty; draw one with wslib.core.data.balanced_subset",
    ):
        check_fusion_inputs(model, randn(0, 1, 5), torch.zeros(0))


def test_inputs_of_another_shape_are_named_with_the_models_error() -> None:
    model = seeded_model(MLP, 0)
    x = randn(4, 1, 6)
    try:
        model(x[:1])
    except RuntimeError as error:
        first = str(error).splitlines()[0]
    message = (
        f"the models cannot read the fusion set's inputs of shape (1, 6) per example "
        f"({first}); draw the fusion set from the data set the models were trained on"
    )
    with raises(ValueError, message):
        check_fusion_inputs(model, x, torch.zeros(4))


def test_one_example_goes_through_in_eval_mode_without_gradients() -> None:
    model = seeded_model(MLP, 0, train=True)
    seen: list[tuple[int, bool, bool]] = []
    model.register_forward_hook(
        lambda m, a, o: seen.append((len(a[0]), m.training, torch.is_grad_enabled()))
    )
    check_fusion_inputs(model, randn(5, 1, 5), torch.zeros(5))
    assert seen == [(1, False, False)]
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    check_fusion_inputs(model, randn(5, 1, 5), torch.zeros(5))
    assert not model.training


def test_fusion_inputs_on_the_host_reach_a_model_on_the_device() -> None:
    with DeviceDiscipline():
        model = to_device(seeded_model(MLP, 0))
        check_fusion_inputs(model, randn(3, 1, 5), torch.zeros(3))
    assert not model.training


# --- check_same_classes, head_weights, check_scores -----------------------------------------


def test_the_common_class_count_is_read_from_the_heads() -> None:
    models = [seeded_model(CNN, s) for s in range(2)]
    levels_ = chain_levels(models[0])
    assert check_same_classes(models, False, levels_) == 3
    assert check_same_classes(models, True, ["features.0"]) == 3
    assert check_same_classes(models, False, ["features.0"]) == 2
    assert check_same_classes(models[:1], False, levels_) == 3
    five = seeded_model(cnn1d([2, 3], in_shape=[1, 6], n_classes=5), 0)
    with raises(
        ValueError,
        "the models have [3, 3, 5] classes; fuse models with the same output classes",
    ):
        check_same_classes([*models, five], False, levels_)
    with raises(
        ValueError,
        "the models have [5, 3] classes; fuse models with the same output classes",
    ):
        check_same_classes([five, models[0]], True, [])


def test_head_weights_default_to_the_mean_and_normalise_each_column() -> None:
    np.testing.assert_array_equal(head_weights(None, 4, 2), np.full((4, 2), 0.25))
    got = head_weights(np.array([[1, 0, 2], [3, 1, 2]]), 2, 3)
    np.testing.assert_array_equal(got, [[0.25, 0.0, 0.5], [0.75, 1.0, 0.5]])
    assert got.dtype == np.float64
    thirds = head_weights(np.array([[1, 2], [2, 1]], dtype=np.float32), 2, 2)
    np.testing.assert_array_equal(thirds, [[1 / 3, 2 / 3], [2 / 3, 1 / 3]])


def test_head_weights_refuse_bad_shapes_values_and_empty_classes() -> None:
    with raises(ValueError, "class_weights must have shape (2, 3), got (3, 2)"):
        head_weights(np.ones((3, 2)), 2, 3)
    for bad in (-0.5, float("nan"), float("inf")):
        w = np.ones((2, 3))
        w[1, 2] = bad
        with raises(ValueError, "class_weights must be finite and non-negative"):
            head_weights(w, 2, 3)
    with raises(
        ValueError,
        "class_weights give classes [0, 2] zero total weight; give every class a "
        "positive weight in some model (class_share does)",
    ):
        head_weights(np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 2, 3)


def test_scores_must_cover_every_model_and_match_the_importance() -> None:
    uniform = {"a": torch.ones(3), "b": torch.full((2,), 7.0), "c": torch.zeros(0)}
    check_scores([uniform, uniform], "uniform", 2)
    check_scores([{"a": torch.ones(1)}], "uniform", 1)
    check_scores([Scores({"a": torch.arange(3.0)}, "conductance")], "conductance", 1)
    check_scores([{"a": torch.arange(3.0)}], "conductance", 1)
    with raises(ValueError, "need importance scores for 3 models, got 2"):
        check_scores([uniform, uniform], "uniform", 3)
    with raises(
        ValueError,
        "scores of model 1 were computed with 'conductance' but importance='deeplift'; "
        "pass matching scores or scores=None",
    ):
        check_scores([Scores({}, "deeplift"), Scores({}, "conductance")], "deeplift", 2)
    with raises(
        ValueError,
        "importance='uniform' but the scores of model 1 are not uniform; "
        "pass the importance they were computed with",
    ):
        check_scores(
            [uniform, {"a": torch.ones(2), "b": torch.tensor([1.0, 2.0])}], "uniform", 2
        )


# --- layer_io and the neuron matrix -----------------------------------------------------------


def by_hand(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Outputs of the MLP's three linear layers, by hand."""
    outs, h = [], x.flatten(1)
    for layer in model.linears:
        h = layer(h)
        outs.append(h)
        h = h.relu()
    return outs


def test_layer_io_gives_each_layers_inputs_or_outputs_in_batches() -> None:
    model, x = seeded_model(MLP, 0, train=True), randn(7, 1, 5)
    outs = layer_io(model, ["linears.0", "linears.2"], x, batch_size=3)
    ins = layer_io(model, ["linears.1"], x, kind="input", batch_size=2)
    want = by_hand(model, x)
    assert list(outs) == ["linears.0", "linears.2"] and list(ins) == ["linears.1"]
    torch.testing.assert_close(outs["linears.0"], want[0])
    torch.testing.assert_close(outs["linears.2"], want[2])
    torch.testing.assert_close(ins["linears.1"], want[0].relu())
    assert model.training
    assert all(
        not m._forward_hooks and not m._forward_pre_hooks for m in model.modules()
    )


def test_layer_io_runs_in_eval_mode_and_brings_the_values_to_the_host() -> None:
    model = seeded_model(MLP, 0)
    modes: list[bool] = []
    model.linears[1].register_forward_hook(lambda m, a, o: modes.append(m.training))
    model.train()
    layer_io(model, ["linears.1"], randn(3, 1, 5))
    assert modes == [False] and model.training
    with DeviceDiscipline():
        on_device = to_device(copy.deepcopy(model))
        got = layer_io(on_device, ["linears.0"], randn(3, 1, 5).to(DEVICE))["linears.0"]
        assert got.device != DEVICE
    torch.testing.assert_close(got, by_hand(model, randn(3, 1, 5))[0])


def test_neuron_matrix_puts_each_channel_in_a_row_and_inverts() -> None:
    act = randn(2, 3, 4)
    mat = neuron_matrix(act)
    assert mat.dtype == torch.float64 and mat.shape == (3, 8)
    for c in range(3):
        torch.testing.assert_close(
            mat[c], act[:, c, :].flatten().double(), rtol=0, atol=0
        )
    torch.testing.assert_close(neuron_matrix(act[:, :, 0]), act[:, :, 0].T.double())
    images = randn(2, 3, 4, 5)
    torch.testing.assert_close(
        from_neuron_matrix(neuron_matrix(images), images), images.double()
    )
    fewer = from_neuron_matrix(neuron_matrix(images)[:2], images)
    torch.testing.assert_close(fewer, images[:, :2].double())
    torch.testing.assert_close(from_neuron_matrix(mat[1:], act), act[:, 1:].double())


# --- centroids, distances, HF and KF ----------------------------------------------------------


def centroids_by_loop(
    points: np.ndarray, weights: np.ndarray, labels: np.ndarray, k: int
) -> np.ndarray:
    sums = np.zeros((k, points.shape[1]))
    np.add.at(sums, labels, weights[:, None] * points)
    return sums / np.bincount(labels, weights, minlength=k)[:, None]


def test_weighted_centroids_are_np_add_at_sums_over_the_group_weights() -> None:
    p, w = rng().normal(size=(7, 4)), rng(1).uniform(0.5, 2.0, 7)
    labels = np.array([2, 0, 1, 2, 0, 0, 2])
    got = weighted_centroids(p, w, labels, 3)
    assert got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), centroids_by_loop(p, w, labels, 3))
    single = weighted_centroids(p.astype(np.float32), w, labels, 3)
    assert single.dtype == torch.float64


def test_empty_or_weightless_groups_are_refused() -> None:
    p = np.ones((3, 2))
    with raises(ValueError, "groups [1, 3] are empty or weightless"):
        weighted_centroids(p, np.ones(3), np.array([0, 2, 2]), 4)
    with raises(ValueError, "groups [0] are empty or weightless"):
        weighted_centroids(p, np.array([0.0, 1.0, 1.0]), np.array([0, 1, 1]), 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_product_centroids_of_other_devices_equal_the_scatter_ones(
    dtype: torch.dtype,
) -> None:
    p, w = randn(6, 3, dtype=dtype), rng(2).uniform(0.5, 2.0, 6)
    labels = np.array([1, 0, 1, 1, 0, 2])
    total = np.bincount(labels, w, minlength=3)
    got = _product_centroids(p, w, labels, total)
    assert got.dtype == dtype
    assert _scatter_centroids(p, w, labels, total).dtype == dtype
    want = centroids_by_loop(p.double().numpy(), w, labels, 3)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(
        _scatter_centroids(p, w, labels, total).double().numpy(), want, rtol=1e-6
    )


def test_weighted_centroids_of_points_on_another_device_stay_there() -> None:
    p = torch.empty(
        5, 3, device="meta"
    )  # neither the CPU nor its stand-in: the product path
    got = weighted_centroids(p, np.ones(5), np.array([0, 1, 0, 1, 2]), 3)
    assert (
        got.device.type == "meta" and got.shape == (3, 3) and got.dtype == torch.float64
    )


def test_weighted_centroids_stay_on_the_points_device() -> None:
    p, w, labels = (
        randn(5, 3, dtype=torch.float64),
        np.ones(5),
        np.array([0, 1, 0, 1, 1]),
    )
    with DeviceDiscipline():
        got = weighted_centroids(p.to(DEVICE), w, labels, 2)
        assert got.device == DEVICE
        got = got.cpu()
    np.testing.assert_allclose(got.numpy(), centroids_by_loop(p.numpy(), w, labels, 2))


def test_squared_distances_are_every_pairs_and_never_negative() -> None:
    a, b = randn(4, 3, dtype=torch.float64), randn(5, 3, seed=1, dtype=torch.float64)
    want = [[float(((a[i] - b[j]) ** 2).sum()) for j in range(5)] for i in range(4)]
    got = squared_distances(a, b)
    assert got.shape == (4, 5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    big = torch.full((3, 2), 1e8, dtype=torch.float64) + randn(
        3, 2, dtype=torch.float64
    )
    same = squared_distances(big, big)
    assert bool((same >= 0).all())
    assert float(same.diagonal().abs().max()) < 1e-3


def brute_force_partner(
    a: np.ndarray, b: np.ndarray, wa: np.ndarray, wb: np.ndarray
) -> tuple[int, ...]:
    """The partner of each neuron of ``a`` with the least docstring cost, by brute force."""

    def cost(perm: tuple[int, ...]) -> float:
        return sum(
            wa[i] * wb[j] / (wa[i] + wb[j]) * float(((a[i] - b[j]) ** 2).sum())
            for i, j in enumerate(perm)
        )

    return min(itertools.permutations(range(len(a))), key=cost)


def test_hungarian_groups_find_the_least_weighted_cost_matching() -> None:
    for seed in range(4):
        a, b = rng(seed).normal(size=(4, 3)), rng(seed + 10).normal(size=(4, 3))
        wa, wb = rng(seed + 20).uniform(0.1, 3, 4), rng(seed + 30).uniform(0.1, 3, 4)
        partner = brute_force_partner(a, b, wa, wb)
        labels = hungarian_groups(a, b, wa, wb)
        want = np.empty(4, dtype=np.int64)
        want[list(partner)] = np.arange(4)
        np.testing.assert_array_equal(labels, np.concatenate([np.arange(4), want]))
        assert labels.dtype == np.int64


def test_hungarian_groups_follow_the_weights() -> None:
    # a at 0 and 3, b at 2 and 3.5: unweighted, a_0-b_0 and a_1-b_1 (4 + 0.25) beat the
    # swap (12.25 + 1); when b_1 weighs nearly nothing, only b_0's partner counts: a_1.
    a, b = np.array([[0.0], [3.0]]), np.array([[2.0], [3.5]])
    assert hungarian_groups(a, b, np.ones(2), np.ones(2)).tolist() == [0, 1, 0, 1]
    light = np.array([1.0, 1e-6])
    assert hungarian_groups(a, b, np.ones(2), light).tolist() == [0, 1, 1, 0]
    assert hungarian_groups(b, a, light, np.ones(2)).tolist() == [0, 1, 1, 0]


def test_hungarian_groups_need_equal_levels_and_run_where_a_is() -> None:
    with raises(ValueError, "HF needs two levels of equal width, got 3 and 4 neurons"):
        hungarian_groups(np.ones((3, 2)), np.ones((4, 2)), np.ones(3), np.ones(4))
    with raises(ValueError, "HF needs two levels of equal width, got 3 and 3 neurons"):
        hungarian_groups(np.ones((3, 2)), np.ones((3, 5)), np.ones(3), np.ones(3))
    a, b = rng(1).normal(size=(4, 3)), rng(2).normal(size=(4, 3))
    want = hungarian_groups(a, b, np.ones(4), np.ones(4))
    with DeviceDiscipline():
        got = hungarian_groups(
            torch.from_numpy(a).to(DEVICE), b, np.ones(4), np.ones(4)
        )
    np.testing.assert_array_equal(got, want)


def test_hf_groups_match_every_model_to_model_0() -> None:
    mats = [rng(s).normal(size=(4, 3)) for s in range(3)]
    ws = [rng(s + 5).uniform(0.5, 2, 4) for s in range(3)]
    want = np.concatenate(
        [np.arange(4)]
        + [hungarian_groups(mats[0], m, ws[0], w)[4:] for m, w in zip(mats[1:], ws[1:])]
    )
    np.testing.assert_array_equal(hf_groups(mats, ws), want)
    message = "HF needs at least two models and one weight vector each"
    with raises(ValueError, message):
        hf_groups(mats[:1], ws[:1])
    with raises(ValueError, message):
        hf_groups(mats[:2], ws)
    with raises(ValueError, message):
        hf_groups(mats, ws[:2])


def pairwise(x: np.ndarray) -> np.ndarray:
    return ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)


def test_isometric_rows_keep_the_points_or_their_distances() -> None:
    few = rng().normal(size=(5, 3)).astype(np.float32)
    got = isometric_rows(few)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, few.astype(np.float64))
    square = rng().normal(size=(4, 4))
    np.testing.assert_array_equal(isometric_rows(square), square)
    wide = rng().normal(3.0, 1.0, size=(5, 40))
    rows = isometric_rows(torch.from_numpy(wide))
    assert rows.shape == (5, 5)
    np.testing.assert_allclose(pairwise(rows), pairwise(wide), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(rows.sum(0), 0.0, atol=1e-6)  # centred


def test_isometric_rows_of_device_points_are_computed_there() -> None:
    wide = rng(4).normal(size=(4, 10))
    with StrictDiscipline():
        rows = isometric_rows(torch.from_numpy(wide).to(DEVICE))
    np.testing.assert_allclose(pairwise(rows), pairwise(wide), rtol=1e-9, atol=1e-9)


def test_isometric_rows_are_the_same_a_block_of_columns_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wide = rng(4).normal(size=(4, 10))
    whole = isometric_rows(wide)
    monkeypatch.setattr(grouping, "_GRAM_COLUMNS", 3)
    np.testing.assert_allclose(
        pairwise(isometric_rows(wide)), pairwise(whole), atol=1e-9
    )
    np.testing.assert_allclose(pairwise(whole), pairwise(wide), rtol=1e-9, atol=1e-9)


def clusters(per: int = 3, k: int = 3, columns: int = 2, seed: int = 0) -> np.ndarray:
    """``k`` far-apart clusters of ``per`` points each, one point of each cluster first."""
    centres = np.arange(k)[:, None] * 50.0 * np.ones(columns)
    noise = rng(seed).normal(size=(per, k, columns))
    return (centres[None] + noise).reshape(per * k, columns)


def test_kmeans_groups_find_separated_clusters() -> None:
    p = clusters()
    got = kmeans_groups(p, np.ones(9), 3, init_first=True)
    np.testing.assert_array_equal(got, np.tile(np.arange(3), 3))
    assert got.dtype == np.int64
    free = kmeans_groups(torch.from_numpy(clusters(columns=30)), np.ones(9), 3, seed=4)
    assert len(set(free[:3])) == 3 and all(free[3:] == np.tile(free[:3], 2))
    with raises(ValueError, "k=10 groups but only 9 neurons"):
        kmeans_groups(p, np.ones(9), 10)


def sklearn_labels(
    x: np.ndarray, w: np.ndarray, k: int, init_first: bool, seed: int = 0
) -> np.ndarray:
    """scikit-learn's weighted k-means with the documented start, to convergence (tol 0)
    or 300 Lloyd iterations."""
    km = KMeans(
        k,
        init=x[:k] if init_first else "k-means++",
        n_init=1 if init_first else 4,
        random_state=seed,
        tol=0.0,
        max_iter=300,
    )
    return km.fit(x, sample_weight=w).labels_


@pytest.mark.parametrize("seed", [16, 24, 34])
def test_kmeans_groups_are_sklearns_weighted_k_means(seed: int) -> None:
    r = rng(seed)
    x, w = r.normal(size=(12, 2)), r.uniform(0.1, 5, 12)
    np.testing.assert_array_equal(
        kmeans_groups(x, w, 4), sklearn_labels(x, w, 4, False)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = kmeans_groups(x, w, 4, init_first=True)
    np.testing.assert_array_equal(first, sklearn_labels(x, w, 4, True))


def test_kmeans_groups_stop_at_convergence_or_300_iterations() -> None:
    r = rng(1)
    crawl = np.sort(r.uniform(0, 1, 200))[:, None]  # slow from the five leftmost points
    w = r.uniform(0.1, 5, 200)
    np.testing.assert_array_equal(
        kmeans_groups(crawl, w, 5, init_first=True), sklearn_labels(crawl, w, 5, True)
    )
    slow = np.linspace(0, 1, 1000)[:, None] ** 2  # some 500 Lloyd iterations
    np.testing.assert_array_equal(
        kmeans_groups(slow, np.ones(1000), 30, init_first=True),
        sklearn_labels(slow, np.ones(1000), 30, True),
    )


def test_kmeans_groups_take_as_many_groups_as_points() -> None:
    p = rng().normal(size=(3, 2))
    assert sorted(kmeans_groups(p, np.ones(3), 3).tolist()) == [0, 1, 2]


def test_group_labels_dispatch_to_hf_and_kf() -> None:
    r = rng(16)
    p, w = torch.from_numpy(r.normal(size=(12, 2))), r.uniform(0.1, 5, 12)
    hf = group_labels(p, [4, 4, 4], w, 4, "hf")
    want = hf_groups([p[:4], p[4:8], p[8:]], [w[:4], w[4:8], w[8:]])
    np.testing.assert_array_equal(hf, want)
    assert (hf != kmeans_groups(p, w, 4, init_first=True)).any()
    np.testing.assert_array_equal(
        group_labels(p, [4, 8], w, 4, "kf"), kmeans_groups(p, w, 4, init_first=True)
    )
    np.testing.assert_array_equal(
        group_labels(p, [5, 7], w, 4, "kf"), kmeans_groups(p, w, 4, seed=0)
    )
    seeded = group_labels(p, [5, 7], w, 4, "kf", seed=1)
    np.testing.assert_array_equal(seeded, kmeans_groups(p, w, 4, seed=1))
    assert (seeded != kmeans_groups(p, w, 4, seed=0)).any()


# --- the representation cost ------------------------------------------------------------------


def spread(
    p: np.ndarray, w: np.ndarray, labels: np.ndarray, centres: np.ndarray
) -> float:
    return sum(
        w[i] * float(((p[i] - centres[labels[i]]) ** 2).sum()) for i in range(len(p))
    )


def test_cost_decomposition_is_the_docstrings_sums_and_theorem_1() -> None:
    n, k = 150, 4  # more than one block of rows
    p, w = rng().normal(size=(n, 5)), rng(1).uniform(0.5, 2.0, n)
    labels = np.arange(n) % k
    fused = rng(2).normal(size=(k, 5))
    got = cost_decomposition(p, w, labels, fused.astype(np.float32))
    f32 = fused.astype(np.float32).astype(np.float64)
    targets = centroids_by_loop(p, w, labels, k)
    group_w = np.bincount(labels, w, minlength=k)
    want = {
        "cost": spread(p, w, labels, f32),
        "clustering": spread(p, w, labels, targets),
        "approximation": float((group_w * ((targets - f32) ** 2).sum(1)).sum()),
    }
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-10)
    assert got["cost"] == pytest.approx(
        got["clustering"] + got["approximation"], rel=1e-10
    )


def test_the_cost_is_the_same_a_few_rows_at_a_time_and_on_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, w = rng(5).normal(size=(9, 3)), rng(6).uniform(0.5, 2.0, 9)
    labels, fused = np.arange(9) % 3, rng(7).normal(size=(3, 3))
    whole = cost_decomposition(p, w, labels, fused)
    monkeypatch.setattr(grouping, "_COST_ROWS", 2)
    assert cost_decomposition(p, w, labels, fused) == pytest.approx(whole, rel=1e-12)
    with StrictDiscipline():
        on_device = cost_decomposition(torch.from_numpy(p).to(DEVICE), w, labels, fused)
    assert on_device == pytest.approx(whole, rel=1e-12)
    monkeypatch.setattr(
        grouping, "solve_dtype", lambda device: torch.float32
    )  # as on MPS
    with StrictDiscipline(float64=False):
        single = cost_decomposition(
            torch.from_numpy(p).float().to(DEVICE), w, labels, fused
        )
    assert single == pytest.approx(whole, rel=1e-5)


# --- design matrices and ridge least squares ------------------------------------------------


def test_solve_dtype_is_float64_except_on_mps() -> None:
    assert solve_dtype(torch.device("cpu")) == torch.float64
    assert solve_dtype(torch.device("cuda")) == torch.float64
    assert solve_dtype(torch.device("mps")) == torch.float32


def affine_rows(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's outputs as samples x channels (neuron_matrix order), by the layer in float64."""
    return neuron_matrix(copy.deepcopy(module).double()(x.double())).T


def test_linear_design_rows_are_the_inputs_flattened_to_fan_in() -> None:
    x = randn(5, 4)
    torch.testing.assert_close(
        design_matrix(nn.Linear(4, 3), x), x.double(), rtol=0, atol=0
    )
    flat = randn(5, 2, 3)
    got = design_matrix(nn.Linear(6, 2), flat)
    torch.testing.assert_close(got, flat.reshape(5, 6).double(), rtol=0, atol=0)
    steps = randn(5, 4, 3)
    got = design_matrix(nn.Linear(3, 2), steps, dtype=torch.float32)
    torch.testing.assert_close(got, steps.reshape(20, 3), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("module", "shape"),
    [
        (nn.Conv1d(2, 3, 3, stride=2, padding=1), (4, 2, 7)),
        (nn.Conv1d(2, 3, 2), (3, 2, 5)),
        (nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0)), (3, 2, 5, 4)),
        (nn.Conv2d(1, 2, 2, stride=2), (2, 1, 4, 6)),
    ],
)
def test_conv_design_rows_times_the_weights_are_the_layers_outputs(
    module: nn.Conv1d | nn.Conv2d, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    module.reset_parameters()
    x = randn(*shape)
    a = design_matrix(module, x)
    assert a.dtype == torch.float64
    w = module.weight.detach().double().flatten(1)
    got = a @ w.T + module.bias.detach().double()
    torch.testing.assert_close(got, affine_rows(module, x), rtol=1e-12, atol=1e-12)
    assert design_matrix(module, x, dtype=torch.float32).dtype == torch.float32


def test_conv1d_design_rows_are_the_padded_windows() -> None:
    conv = nn.Conv1d(2, 1, 3, stride=2, padding=1)
    x = randn(2, 2, 5)
    padded = F.pad(x, (1, 1)).double()
    want = [padded[n, :, s : s + 3].flatten() for n in range(2) for s in (0, 2, 4)]
    torch.testing.assert_close(
        design_matrix(conv, x), torch.stack(want), rtol=0, atol=0
    )


def ridge_reference(a: np.ndarray, t: np.ndarray, ridge: float) -> np.ndarray:
    gram = a.T @ a
    lam = ridge * np.mean(np.diag(gram))
    return np.linalg.solve(gram + lam * np.eye(len(gram)), a.T @ t.T)


def test_ridge_solve_is_the_formula_a_chunk_of_examples_at_a_time() -> None:
    n, per = 10, 2
    a = randn(n * per, 3, dtype=torch.float64)
    t = randn(4, n * per, seed=1, dtype=torch.float64)

    def rows(sl: slice) -> torch.Tensor:
        return a[sl.start * per : min(sl.stop, n) * per]

    want = ridge_reference(a.numpy(), t.numpy(), 0.3)
    for chunk in (3, 4, 256):
        got = ridge_solve(rows, t, n, 0.3, chunk=chunk)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    default = ridge_solve(rows, t, n, 0.3)
    np.testing.assert_allclose(default.numpy(), want, rtol=1e-10, atol=1e-12)


def test_ridge_solve_works_in_the_rows_dtype_and_takes_every_chunk() -> None:
    n = 600
    a = randn(n, 3, dtype=torch.float64)
    t = (a @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64)).T
    got = ridge_solve(lambda sl: a[sl], t, n, 0.0)
    np.testing.assert_allclose(got.numpy().ravel(), [1.0, -2.0, 0.5], rtol=1e-10)
    single = ridge_solve(lambda sl: a[sl].float(), t, n, 0.0)
    assert single.dtype == torch.float32


def test_an_underdetermined_fit_warns_at_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, t = randn(2, 3, dtype=torch.float64), randn(1, 2, dtype=torch.float64)
    with pytest.warns(UserWarning) as record:
        ridge_solve(lambda sl: a[sl], t, 2, 1e-3)
    message = (
        "least squares with 2 samples for 3 unknowns per neuron is underdetermined (the "
        "ridge term picks one solution); use a larger fusion set"
    )
    assert [str(r.message) for r in record] == [message]
    sites = warning_sites(monkeypatch)
    ridge_solve(lambda sl: a[sl], t, 2, 1e-3)
    ridge_solve(lambda sl: a[sl][:, :2], t, 2, 1e-3)  # as many samples as unknowns
    assert sites == [(UserWarning, message, __file__)]


def test_ridge_solve_asks_for_256_examples_at_a_time_by_default() -> None:
    n, per = 600, 2
    a = randn(n * per, 3, dtype=torch.float64)
    t = randn(2, n * per, seed=1, dtype=torch.float64)
    asked: list[slice] = []

    def rows(sl: slice) -> torch.Tensor:
        asked.append(sl)
        return a[sl.start * per : min(sl.stop, n) * per]

    got = ridge_solve(rows, t, n, 0.1)
    assert [(sl.start, sl.stop) for sl in asked] == [(0, 256), (256, 512), (512, 768)]
    want = ridge_reference(a.numpy(), t.numpy(), 0.1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [0, -1])
def test_ridge_solve_without_examples_is_refused(n: int) -> None:
    with raises(ValueError, f"no examples to fit (n={n})"):
        ridge_solve(lambda sl: torch.zeros(0, 2), torch.zeros(1, 1), n, 1e-3)


# --- set_affine, affine_outputs, retrofit_linear ---------------------------------------------


def test_set_affine_writes_weights_then_the_bias_row() -> None:
    sol = randn(5, 3, dtype=torch.float64)
    lin = nn.Linear(4, 3)
    set_affine(lin, sol)
    torch.testing.assert_close(lin.weight, sol[:4].T.float())
    torch.testing.assert_close(lin.bias, sol[4].float())
    plain = nn.Linear(5, 3, bias=False)
    set_affine(plain, sol)
    torch.testing.assert_close(plain.weight, sol.T.float())
    conv = nn.Conv1d(2, 3, 2)
    set_affine(conv, sol)
    torch.testing.assert_close(conv.weight, sol[:4].T.reshape(3, 2, 2).float())
    assert conv.weight.dtype == torch.float32


def test_affine_outputs_are_the_layers_own_in_batches() -> None:
    conv = nn.Conv1d(2, 3, 3, padding=1)
    x = randn(5, 2, 4)
    sizes: list[int] = []
    conv.register_forward_hook(lambda m, a, o: sizes.append(len(o)))
    got = affine_outputs(conv, x, batch_size=2)
    assert sizes == [2, 2, 1]
    with torch.no_grad():
        want = neuron_matrix(conv(x))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert got.dtype == torch.float64
    assert not got.requires_grad


def ill_conditioned(n: int = 40, fan_in: int = 4) -> torch.Tensor:
    """Inputs with nearly collinear columns: a float32 solve would be far off."""
    base = randn(n, 1, seed=3)
    return base + 1e-3 * randn(n, fan_in, seed=4)


def with_ones(x: torch.Tensor) -> np.ndarray:
    return np.hstack([x.double().numpy(), np.ones((len(x), 1))])


def test_retrofit_linear_is_ridge_least_squares_in_float64() -> None:
    x = ill_conditioned()
    t = randn(2, 40, seed=5, dtype=torch.float64)
    lin = nn.Linear(4, 2)
    retrofit_linear(lin, x, t, ridge=1e-6)
    want = ridge_reference(with_ones(x), t.numpy(), 1e-6)
    np.testing.assert_allclose(
        lin.weight.detach().double().numpy(), want[:4].T, rtol=1e-5
    )
    np.testing.assert_allclose(lin.bias.detach().double().numpy(), want[4], rtol=1e-5)
    plain = nn.Linear(4, 2, bias=False)
    retrofit_linear(plain, x, t)
    want = ridge_reference(x.double().numpy(), t.numpy(), 1e-8)
    np.testing.assert_allclose(
        plain.weight.detach().double().numpy(), want.T, rtol=1e-5
    )


def test_retrofit_linear_recovers_a_convolution() -> None:
    torch.manual_seed(1)
    teacher, student = nn.Conv1d(2, 3, 3, padding=1), nn.Conv1d(2, 3, 3, padding=1)
    x = randn(20, 2, 6)
    retrofit_linear(student, x, neuron_matrix(teacher(x).detach()))
    torch.testing.assert_close(student.weight, teacher.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(student.bias, teacher.bias, rtol=1e-5, atol=1e-6)


def test_a_prior_pulls_the_ridge_term_toward_it() -> None:
    x = randn(30, 3, seed=6)
    t = randn(2, 30, seed=7, dtype=torch.float64)
    prior = randn(4, 2, seed=8, dtype=torch.float64)
    lin = nn.Linear(3, 2)
    retrofit_linear(lin, x, t, ridge=0.5, prior=prior)
    a = with_ones(x)
    gram = a.T @ a
    lam = 0.5 * np.mean(np.diag(gram))
    want = np.linalg.solve(
        gram + lam * np.eye(4), a.T @ t.numpy().T + lam * prior.numpy()
    )
    np.testing.assert_allclose(
        lin.weight.detach().double().numpy(), want[:3].T, rtol=1e-5
    )
    np.testing.assert_allclose(lin.bias.detach().double().numpy(), want[3], rtol=1e-5)


def test_a_prior_that_reproduces_the_targets_stays_exactly() -> None:
    x = randn(30, 3, seed=6)
    lin = nn.Linear(3, 2)
    prior = torch.cat([lin.weight.detach().T, lin.bias.detach()[None]]).double()
    t = affine_outputs(lin, x).float()
    copy_ = nn.Linear(3, 2)
    retrofit_linear(copy_, x, t, prior=prior)
    assert torch.equal(copy_.weight, lin.weight) and torch.equal(copy_.bias, lin.bias)


def test_retrofit_linear_fits_a_device_layer_to_host_data() -> None:
    x, t = randn(30, 3, seed=6), randn(2, 30, seed=7)
    prior = randn(4, 2, seed=8, dtype=torch.float64)
    host = nn.Linear(3, 2)
    retrofit_linear(host, x, t, ridge=0.5, prior=prior)
    with DeviceDiscipline():
        dev = to_device(nn.Linear(3, 2))
        retrofit_linear(dev, x, t, ridge=0.5, prior=prior)
        assert dev.weight.device == DEVICE
    torch.testing.assert_close(dev.weight, host.weight, rtol=0, atol=0)
    torch.testing.assert_close(dev.bias, host.bias, rtol=0, atol=0)


def test_the_system_is_solved_in_the_devices_solve_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    solve = retrofit.ridge_solve

    def spy(
        rows: Any, targets: torch.Tensor, n: int, ridge: float, **kw: Any
    ) -> torch.Tensor:
        seen.append((rows(slice(0, n)).dtype, targets.dtype))
        return solve(rows, targets, n, ridge, **kw)

    monkeypatch.setattr(retrofit, "ridge_solve", spy)
    x, t = randn(30, 3, seed=6), randn(2, 30, seed=7, dtype=torch.float64)
    prior = randn(4, 2, seed=8, dtype=torch.float64)
    retrofit_linear(nn.Linear(3, 2), x, t, prior=prior)
    monkeypatch.setattr(
        retrofit, "solve_dtype", lambda device: torch.float32
    )  # as on MPS
    mps = nn.Linear(3, 2)
    retrofit_linear(mps, x, t, prior=prior)
    retrofit_linear(nn.Linear(3, 2, bias=False), x, t.float())
    assert (
        seen == [(torch.float64, torch.float64)] + [(torch.float32, torch.float32)] * 2
    )
    assert mps.weight.dtype == torch.float32
    layer, default = nn.Linear(3, 2), torch.get_default_dtype()
    torch.set_default_dtype(
        torch.float64
    )  # the ones column follows the rows, not the default
    try:
        retrofit_linear(layer, x, t.float())
    finally:
        torch.set_default_dtype(default)
    assert seen[-1] == (torch.float32, torch.float32)


# --- GradientConfig, minimise, held_out_split, retrofit_gradient ----------------------------


def test_gradient_config_accepts_its_bounds() -> None:
    GradientConfig(lr=1e-9, max_epochs=0, patience=0, val_fraction=0.0)
    GradientConfig(val_fraction=0.999, optimizer="adam", blocks=False)


@pytest.mark.parametrize(
    ("options", "kind", "message"),
    [
        (
            {"optimizer": "sgd"},
            ValueError,
            "optimizer must be one of ('lbfgs', 'adam'), got 'sgd'",
        ),
        ({"val_fraction": 1.0}, ValueError, "val_fraction must be in [0, 1), got 1.0"),
        (
            {"val_fraction": -0.1},
            ValueError,
            "val_fraction must be in [0, 1), got -0.1",
        ),
        ({"blocks": 1}, TypeError, "blocks must be True or False, got 1"),
        (
            {"lr": 0.0},
            ValueError,
            "GradientConfig needs lr > 0, max_epochs >= 0 and patience >= 0",
        ),
        (
            {"max_epochs": -1},
            ValueError,
            "GradientConfig needs lr > 0, max_epochs >= 0 and patience >= 0",
        ),
        (
            {"patience": -1},
            ValueError,
            "GradientConfig needs lr > 0, max_epochs >= 0 and patience >= 0",
        ),
    ],
)
def test_gradient_config_refuses_values_out_of_bounds(
    options: dict[str, Any], kind: type[Exception], message: str
) -> None:
    with raises(kind, message):
        GradientConfig(**options)


def test_gradient_config_defaults() -> None:
    c = GradientConfig()
    assert (c.lr, c.max_epochs, c.patience, c.val_fraction, c.optimizer, c.blocks) == (
        1.0,
        100,
        0,
        0.0,
        "lbfgs",
        True,
    )


def quadratic(p: torch.Tensor, target: torch.Tensor) -> Any:
    return lambda: ((p - target) ** 2).sum()


def test_lbfgs_reaches_the_minimum_and_reports_start_and_best() -> None:
    p = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    target = torch.tensor([0.5, 0.5, 0.5])
    loss = quadratic(p, target)
    got = minimise([p], loss, lambda: float(loss()), GradientConfig(max_epochs=20))
    torch.testing.assert_close(p.detach(), target, rtol=0, atol=1e-5)
    assert got["start"] == pytest.approx(0.25 + 6.25 + 6.25)
    assert got["best"] == pytest.approx(float(loss().detach()), abs=1e-12)
    assert got["best"] < 1e-9


OPTIMIZERS = pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])


@OPTIMIZERS
def test_no_epochs_leave_the_parameters_and_never_train(optimizer: str) -> None:
    p = torch.tensor([1.0, 2.0], requires_grad=True)
    calls: list[int] = []

    def train() -> torch.Tensor:
        calls.append(1)
        return (p**2).sum()

    config = GradientConfig(max_epochs=0, optimizer=optimizer)  # type: ignore[arg-type]
    got = minimise([p], train, lambda: 4.0, config)
    assert got == {"start": 4.0, "best": 4.0} and calls == []
    assert p.tolist() == [1.0, 2.0]
    assert minimise([], train, lambda: 3.0, config) == {"start": 3.0, "best": 3.0}


@OPTIMIZERS
def test_the_start_is_kept_unless_the_selection_loss_improves(optimizer: str) -> None:
    p = torch.tensor([1.0, -2.0], requires_grad=True)
    train = quadratic(p, torch.zeros(2))
    config = GradientConfig(max_epochs=5, optimizer=optimizer)  # type: ignore[arg-type]
    # the training loss moves p, but a constant selection loss never improves
    assert minimise([p], train, lambda: 1.0, config) == {"start": 1.0, "best": 1.0}
    assert p.tolist() == [1.0, -2.0]
    # a selection loss that grows away from the start keeps it too
    start = p.detach().clone()
    worse = minimise([p], train, lambda: float(((p - start) ** 2).sum()), config)
    assert worse == {"start": 0.0, "best": 0.0} and p.tolist() == [1.0, -2.0]


@pytest.mark.parametrize(("epochs", "travelled"), [(1, 1.0), (2, 1.5), (3, 2.0)])
def test_adams_steps_are_lr_times_the_rms_cosine_annealed(
    epochs: int, travelled: float
) -> None:
    p0 = torch.tensor([1.0, -2.0, 3.0, 0.0])
    c = torch.tensor([1.0, 1.0, -1.0, 2.0])
    rms = float(p0.pow(2).mean().sqrt())
    p = p0.clone().requires_grad_(True)
    config = GradientConfig(lr=0.1, max_epochs=epochs, optimizer="adam")
    got = minimise([p], lambda: (p * c).sum(), lambda: float((p * c).sum()), config)
    want = p0 - 0.1 * rms * travelled * c.sign()
    torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6)
    assert got["start"] == pytest.approx(float((p0 * c).sum()))
    assert got["best"] == pytest.approx(float((want * c).sum()), rel=1e-5)


def test_adams_step_is_lr_for_parameters_that_start_at_zero() -> None:
    zero = torch.zeros(2, requires_grad=True)
    one = GradientConfig(lr=0.1, max_epochs=1, optimizer="adam")
    minimise([zero], lambda: zero.sum(), lambda: float(zero.sum()), one)
    torch.testing.assert_close(zero.detach(), torch.full((2,), -0.1), rtol=1e-6, atol=0)


def count_epochs(config: GradientConfig, select: Any) -> int:
    """Adam's epochs on ``|p|^2``; the parameters and the result checked against ``select``."""
    p = torch.tensor([1.0, -2.0], requires_grad=True)
    calls: list[int] = []
    values: list[tuple[float, list[float]]] = []

    def train() -> torch.Tensor:
        calls.append(1)
        return (p**2).sum()

    def selection() -> float:
        values.append((select(p.detach()), p.detach().tolist()))
        return values[-1][0]

    got = minimise([p], train, selection, config)
    best, where = min(values, key=lambda v: v[0])  # the first of equal values
    assert got == {"start": values[0][0], "best": best} and p.tolist() == where
    return len(calls)


def test_adam_stops_after_patience_epochs_without_improvement() -> None:
    improving = lambda p: float((p**2).sum())  # noqa: E731
    flat = lambda p: 1.0  # noqa: E731
    adam = {"optimizer": "adam", "max_epochs": 10, "lr": 0.01}
    assert count_epochs(GradientConfig(**adam, patience=2), improving) == 10  # type: ignore[arg-type]
    assert count_epochs(GradientConfig(**adam, patience=1), improving) == 10  # type: ignore[arg-type]
    assert count_epochs(GradientConfig(**adam, patience=3), flat) == 3  # type: ignore[arg-type]
    assert count_epochs(GradientConfig(**adam, patience=1), flat) == 1  # type: ignore[arg-type]
    assert count_epochs(GradientConfig(**adam), flat) == 10  # type: ignore[arg-type]
    assert 1 < count_epochs(GradientConfig(max_epochs=10), improving) <= 13


def rosenbrock(q: torch.Tensor, scale: float) -> Any:
    return lambda: scale * ((1 - q[0]) ** 2 + 100 * (q[1] - q[0] ** 2) ** 2)


def lbfgs_by_hand(scale: float, lr: float, iterations: int) -> tuple[torch.Tensor, int]:
    """Rosenbrock's valley from (-1.2, 1) by torch's L-BFGS with the documented settings."""
    q = torch.tensor([-1.2, 1.0], requires_grad=True)
    loss = rosenbrock(q, scale)
    opt = torch.optim.LBFGS(
        [q],
        lr=lr,
        max_iter=iterations,
        history_size=20,
        tolerance_grad=1e-12,
        tolerance_change=1e-9 * float(loss().detach()),
        line_search_fn="strong_wolfe",
    )
    calls = [0]

    def closure() -> torch.Tensor:
        calls[0] += 1
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)
    return q.detach(), calls[0]


@pytest.mark.parametrize(
    ("scale", "lr", "iterations"), [(1.0, 0.5, 60), (1.0, 1.0, 1), (1e-10, 1.0, 30)]
)
def test_lbfgs_runs_the_documented_iterations(
    scale: float, lr: float, iterations: int
) -> None:
    want, want_calls = lbfgs_by_hand(scale, lr, iterations)
    q = torch.tensor([-1.2, 1.0], requires_grad=True)
    loss = rosenbrock(q, scale)
    calls = [0]

    def train() -> torch.Tensor:
        calls[0] += 1
        return loss()

    config = GradientConfig(lr=lr, max_epochs=iterations)
    got = minimise([q], train, lambda: float(loss()), config)
    assert torch.equal(q.detach(), want)
    assert calls[0] == want_calls + 1  # and once for the loss scale
    assert got["best"] == float(rosenbrock(want, scale)()) <= got["start"]


def test_held_out_split_draws_with_the_seed() -> None:
    val, train = held_out_split(6, 0.0, 3)
    assert val.tolist() == train.tolist() == list(range(6))
    for n, fraction, n_val in (
        (10, 0.25, 2),
        (10, 0.35, 4),
        (10, 0.01, 1),
        (7, 0.5, 4),
    ):
        val, train = held_out_split(n, fraction, 5)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(5))
        assert val.tolist() == order[:n_val].tolist()
        assert train.tolist() == order[n_val:].tolist()
        assert val.device.type == train.device.type == "cpu"
    assert (
        held_out_split(10, 0.3, 1)[0].tolist() != held_out_split(10, 0.3, 2)[0].tolist()
    )
    with raises(
        ValueError,
        "fusion set of 2 examples is too small to hold out 2; lower GradientConfig.val_fraction",
    ):
        held_out_split(2, 0.75, 0)


def test_retrofit_gradient_selects_on_the_held_out_part_with_seed_0() -> None:
    lin = nn.Linear(3, 2)
    x, t = randn(10, 3, seed=1), randn(10, 2, seed=2)
    config = GradientConfig(max_epochs=3, val_fraction=0.3)
    val, _ = held_out_split(10, 0.3, 0)
    with torch.no_grad():
        start = F.mse_loss(lin(x[val]), t[val]).item()
    a, b = copy.deepcopy(lin), copy.deepcopy(lin)
    got = retrofit_gradient(a, x, t, config=config)
    assert got["start"] == start and got["best"] <= start
    assert retrofit_gradient(b, x, t, config=config, seed=0) == got
    assert torch.equal(a.weight, b.weight)
    other = retrofit_gradient(copy.deepcopy(lin), x, t, config=config, seed=1)
    assert other["start"] != start


def test_retrofit_gradient_compares_with_float32_targets() -> None:
    lin = nn.Linear(3, 2)
    x = randn(6, 3)
    with torch.no_grad():
        t = lin(x).double() + 1e-10  # below float32's resolution
    got = retrofit_gradient(lin, x, t, config=GradientConfig(max_epochs=0))
    assert got == {"start": 0.0, "best": 0.0}


def test_retrofit_gradient_fits_a_device_module_to_host_data() -> None:
    lin = nn.Linear(3, 2)
    x, t = randn(10, 3, seed=1), randn(10, 2, seed=2, dtype=torch.float64)
    config = GradientConfig(max_epochs=3, val_fraction=0.3)
    host = copy.deepcopy(lin)
    want = retrofit_gradient(host, x, t, config=config)
    with DeviceDiscipline():
        dev = to_device(copy.deepcopy(lin))
        got = retrofit_gradient(dev, x, t, config=config)
    assert got == want
    torch.testing.assert_close(dev.weight, host.weight, rtol=0, atol=0)


# --- FusionResult and normalised_scores -------------------------------------------------------


def test_fusion_result_defaults_are_empty_and_not_shared() -> None:
    a, b = FusionResult(nn.Linear(1, 1), ["x"]), FusionResult(nn.Linear(1, 1), [])
    assert (a.costs, a.seconds, a.block_fits) == ([], 0.0, [])
    a.costs.append({})
    a.block_fits.append({})
    assert b.costs == [] and b.block_fits == []


def test_normalised_scores_have_mean_one_and_a_floor() -> None:
    got = normalised_scores(torch.tensor([0.0, 1.0, 3.0]))
    np.testing.assert_allclose(got, [1e-6, 0.75, 2.25], rtol=1e-12)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(normalised_scores(torch.zeros(3)), np.ones(3))
    np.testing.assert_array_equal(
        normalised_scores(torch.tensor([-1.0, -2.0])), np.ones(2)
    )
    np.testing.assert_allclose(
        normalised_scores(torch.tensor([0.0, 2.0]), floor=0.25), [0.25, 2.0]
    )
    np.testing.assert_allclose(
        normalised_scores(torch.tensor([1.0, 1e-9]), floor=0.0), [2.0, 2e-9], rtol=1e-6
    )


def test_normalised_scores_without_a_positive_mean_are_ones_of_their_shape() -> None:
    for scores in (torch.zeros(3), torch.tensor([-1.0, 0.5, -2.0, 0.0])):
        got = normalised_scores(scores)
        assert got.shape == scores.shape and got.dtype == np.float64
        np.testing.assert_array_equal(got, np.ones(len(scores)))
