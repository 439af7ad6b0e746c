"""HF/KF fusion (:mod:`wslib.fusion.hfkf`) pinned against independent references.

Pinned: :func:`class_share` against hand-computed shares (integer, fractional
and unseen classes, float64 out, no warnings); :func:`attribution_share`'s
default method and a class missing from the fusion set; the augmented fusion
set against a plain loop of ``torch.roll`` over the same seeded draws, its
shifts against the docstring's range and its errors; :func:`head_grouping`,
:func:`aligned_rows` in the dtype asked for, :func:`aligned_prior` against a
float64 loop, :func:`level_prior`'s shape check; and :func:`fuse` on chains:
HF's start ``W0`` against brute-force matching of four hidden neurons (a
large ridge, or the gradient variant without steps, stays there), a level
without alignment pulled toward zero or left at the fused model's weights,
the seeds that reach k-means and each level's held-out split, the progress
bar, the result's levels, the grouping's dtype on a device without float64
(a stand-in for MPS), and :func:`depth_map`'s message. :func:`fuse`'s
defaults (KF, seed 0, progress bars, a copy of model 0 as the fused model)
against explicit calls; its seconds against a clock around it; the grouping
reaching a residual fusion; the fused model moved to the models' device; and
the refusals of bad groupings, fused models of another depth, kind or class
count, with their whole messages; :func:`model_importance`'s progress bar
for chains and residual nets.
"""

from __future__ import annotations

import itertools
import re
import time
import warnings
from typing import Any, cast

import numpy as np
import pytest
import torch
from torch import nn

from tests.devicecheck import DEVICE, DeviceDiscipline, to_device
from tests.kit import cnn1d, mlp, seeded_model, seeded_models, transformer1d
from wslib.core.seeds import derive_seed
from wslib.fusion import hfkf, residual
from wslib.fusion.grouping import kmeans_groups
from wslib.fusion.hfkf import (
    Grouping,
    aligned_prior,
    aligned_rows,
    attribution_share,
    augment_fusion_set,
    class_share,
    depth_map,
    fuse,
    head_grouping,
    level_prior,
    model_importance,
)
from wslib.fusion.importance import example_scores
from wslib.fusion.levels import RetrofitName, layer_io, neuron_matrix
from wslib.fusion.retrofit import GradientConfig

ONE = mlp([4], in_shape=[1, 5])  # one hidden level of four neurons, 3 classes
DEEP = mlp([4, 4, 4], in_shape=[1, 4])  # three hidden levels of four
SHALLOW = mlp([4, 4], in_shape=[1, 4])  # two hidden levels of four
ONE_BLOCK = transformer1d(  # one token; residual groups of four neurons
    [1, 5], embed_dim=4, depth=1, heads=2, mlp_dim=4, patch_size=5
)


def inputs(n: int = 60, shape: tuple[int, ...] = (1, 5), seed: int = 5) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


def labels(n: int = 60) -> torch.Tensor:
    return torch.arange(n) % 3


def linear(model: nn.Module, i: int) -> nn.Linear:
    """The MLP's ``i``-th affine layer."""
    return cast(nn.Linear, model.get_submodule(f"linears.{i}"))


def uniform_scores(
    models: list[nn.Module], x: torch.Tensor, y: torch.Tensor
) -> list[dict[str, torch.Tensor]]:
    return [model_importance(m, x, y, "uniform", progress=False) for m in models]


# --- class_share ------------------------------------------------------------------------------


def test_class_share_is_each_models_part_of_the_class_total() -> None:
    counts = np.array(
        [
            [6.0, 0.0, 0.3, 0.0],
            [2.0, 0.0, 0.1, 1.0],
            [0.0, 0.0, 0.1, 0.0],
        ]
    )
    want = np.array(
        [
            [0.75, 1 / 3, 0.6, 0.0],
            [0.25, 1 / 3, 0.2, 1.0],
            [0.0, 1 / 3, 0.2, 0.0],
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unseen class divides nothing by zero
        got = class_share(counts)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_class_share_of_integer_or_float32_counts_is_float64(dtype: type) -> None:
    got = class_share(np.array([[1, 0], [3, 0]], dtype=dtype))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [[0.25, 0.5], [0.75, 0.5]])


# --- attribution_share ------------------------------------------------------------------------


def test_attribution_share_defaults_to_conductance() -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(12), labels(12)
    np.testing.assert_array_equal(
        attribution_share(models, x, y), attribution_share(models, x, y, "conductance")
    )


def test_a_class_absent_from_the_fusion_set_gets_equal_attribution_shares() -> None:
    models = seeded_models(ONE, (0, 1, 2))
    x, y = inputs(12), torch.tensor([0, 2] * 6)  # class 1 never appears
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = attribution_share(models, x, y, "conductance")
    sums = np.array(
        [
            example_scores(m, "linears.0", x, y, "conductance").sum(1).numpy()
            for m in models
        ]
    )  # (models, examples)
    want = np.full((3, 3), 1 / 3)
    for c in (0, 2):
        means = sums[:, y.numpy() == c].mean(1)
        want[:, c] = means / means.sum()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


# --- augment_fusion_set -----------------------------------------------------------------------


def augmented_loop(
    x: torch.Tensor, y: torch.Tensor, copies: int, shift: int, noise: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per copy: one shift per example in ``[-shift, shift]``, then the noise, from one generator."""
    gen = torch.Generator().manual_seed(seed)
    xs = [x]
    for _ in range(copies):
        shifts = torch.randint(-shift, shift + 1, (len(x),), generator=gen)
        rolled = torch.stack(
            [torch.roll(x[i], int(s), dims=-1) for i, s in enumerate(shifts)]
        )
        xs.append(rolled + noise * torch.randn(x.shape, generator=gen))
    return torch.cat(xs), y.repeat(copies + 1)


def test_augmented_copies_with_the_defaults_are_rolled_and_noised_by_the_loop() -> None:
    x, y = inputs(20, (2, 7)), labels(20)  # channels != length
    got_x, got_y = augment_fusion_set(x, y, 2)
    want_x, want_y = augmented_loop(x, y, 2, shift=3, noise=0.1, seed=0)
    torch.testing.assert_close(got_x, want_x, rtol=0, atol=1e-6)
    assert torch.equal(got_y, want_y)


def test_augmented_images_are_rolled_along_their_columns() -> None:
    x, y = inputs(10, (2, 3, 6), seed=1), labels(10)
    got_x, got_y = augment_fusion_set(x, y, 3, shift=2, noise=0.5, seed=4)
    want_x, want_y = augmented_loop(x, y, 3, shift=2, noise=0.5, seed=4)
    torch.testing.assert_close(got_x, want_x, rtol=0, atol=1e-6)
    assert torch.equal(got_y, want_y)


def test_every_shift_in_the_range_and_no_other_is_drawn() -> None:
    x, y = inputs(200, (1, 11)), labels(200)
    got, _ = augment_fusion_set(x, y, 1, noise=0.0)
    seen = set()
    for original, copy in zip(x, got[len(x) :]):
        hits = [s for s in range(-5, 6) if torch.equal(torch.roll(original, s), copy)]
        assert len(hits) == 1
        seen.add(hits[0])
    assert seen == set(range(-3, 4))


def test_no_copies_return_the_fusion_set_itself() -> None:
    x, y = inputs(8, (1, 6)), labels(8)
    got_x, got_y = augment_fusion_set(x, y, 0)
    assert torch.equal(got_x, x) and torch.equal(got_y, y)


@pytest.mark.parametrize(
    ("copies", "shape"), [(-1, (1, 6)), (1, (6,))], ids=["negative", "flat"]
)
def test_augment_fusion_set_refuses_negative_copies_and_flat_inputs(
    copies: int, shape: tuple[int, ...]
) -> None:
    msg = "augment_fusion_set needs copies >= 0 and inputs of shape (N, C, ..., L)"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        augment_fusion_set(inputs(4, shape), labels(4), copies)


# --- the prior ----------------------------------------------------------------------------


def test_head_grouping_maps_every_models_class_to_itself() -> None:
    g = head_grouping(2, 3)
    np.testing.assert_array_equal(g.labels, [0, 1, 2, 0, 1, 2])
    assert list(g.sizes) == [3, 3] and g.k == 3
    np.testing.assert_array_equal(g.of_model(1), [0, 1, 2])


@pytest.mark.parametrize("grouped", [False, True])
def test_aligned_rows_come_in_the_dtype_asked_for(grouped: bool) -> None:
    layer = nn.Linear(3, 2).double()
    w, b = layer.weight.detach(), layer.bias.detach()
    if grouped:
        got = aligned_rows(layer, np.array([1, 0, 1]), 2, torch.float32)
        w = torch.stack([w[:, 1], w[:, 0] + w[:, 2]], 1)
    else:
        got = aligned_rows(layer, None, 0, torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.cat([w, b[:, None]], 1).float())


def prior_loop(
    layers: list[nn.Linear],
    out: list[np.ndarray],
    weights: list[np.ndarray],
    ins: list[np.ndarray],
    k: int,
    k_in: int,
) -> np.ndarray:
    """``W0`` as ``(fan_in + 1, k)`` by a float64 loop over members and their inputs."""
    acc, total = np.zeros((k, k_in + 1)), np.zeros(k)
    for layer, o, w, i in zip(layers, out, weights, ins):
        lw, lb = layer.weight.detach().double().numpy(), layer.bias.detach().double()
        for n in range(layer.out_features):
            row = np.zeros(k_in + 1)
            for j in range(layer.in_features):
                row[i[j]] += lw[n, j]
            row[-1] = float(lb[n])
            acc[o[n]] += w[n] * row
            total[o[n]] += w[n]
    return (acc / total[:, None]).T


def test_aligned_prior_sums_the_grouped_inputs_in_float64() -> None:
    torch.manual_seed(3)
    layers = [nn.Linear(12, 6), nn.Linear(12, 6)]  # float32 weights
    ins = [np.arange(12) % 3, (np.arange(12) + 1) % 3]  # four base inputs per fused one
    out = [np.array([0, 1, 2, 3, 3, 2]), np.array([1, 0, 3, 2, 0, 1])]
    rng = np.random.default_rng(0)
    w = [rng.uniform(0.2, 2, 6), rng.uniform(0.2, 2, 6)]
    got = aligned_prior(
        layers,
        Grouping(np.concatenate(out), [6, 6], 4),
        np.concatenate(w),
        Grouping(np.concatenate(ins), [12, 12], 3),
    )
    assert got.dtype == torch.float64
    want = prior_loop(layers, out, w, ins, 4, 3)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-13, atol=1e-15)


def test_level_prior_is_none_when_the_fused_layer_has_another_shape() -> None:
    models = seeded_models(ONE, (0, 1))
    out = Grouping(np.r_[np.arange(4), [2, 0, 3, 1]], [4, 4], 4)
    w = np.ones(8)
    same = level_prior(models, "linears.0", nn.Linear(5, 4), out, w, None)
    assert same is not None
    torch.testing.assert_close(
        same, aligned_prior([linear(m, 0) for m in models], out, w, None)
    )
    for other in (nn.Linear(7, 4), nn.Linear(5, 4, bias=False), nn.Linear(5, 3)):
        assert level_prior(models, "linears.0", other, out, w, None) is None


# --- fuse on chains -----------------------------------------------------------------------


def preactivations(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """The hidden level's pre-activations of a one-level MLP, ``(neurons, N)``, float64."""
    s = {k: v.detach().double() for k, v in model.state_dict().items()}
    z = x.flatten(1).double() @ s["linears.0.weight"].T + s["linears.0.bias"]
    return z.T.numpy()


def hf_start(models: list[nn.Module], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF's ``W0`` of two one-level MLPs: the best of all 24 matchings, averaged."""
    a, b = preactivations(models[0], x), preactivations(models[1], x)
    perm = min(
        itertools.permutations(range(4)),
        key=lambda p: float(((a - b[list(p)]) ** 2).sum()),
    )
    sa, sb = (
        {k: v.detach().double() for k, v in m.state_dict().items()} for m in models
    )
    idx = torch.tensor(perm)
    return {
        "linears.0.weight": (sa["linears.0.weight"] + sb["linears.0.weight"][idx]) / 2,
        "linears.0.bias": (sa["linears.0.bias"] + sb["linears.0.bias"][idx]) / 2,
        "linears.1.weight": (sa["linears.1.weight"] + sb["linears.1.weight"][:, idx])
        / 2,
        "linears.1.bias": (sa["linears.1.bias"] + sb["linears.1.bias"]) / 2,
    }


@pytest.mark.parametrize(
    ("retrofit", "options"),
    [
        ("linear", {"ridge": 1e9}),
        ("gradient", {"gradient": GradientConfig(max_epochs=0)}),
    ],
    ids=["large-ridge", "no-steps"],
)
def test_hf_stays_at_the_aligned_parents_weights(
    retrofit: RetrofitName, options: dict[str, Any]
) -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    result = fuse(models, x, y, "hf", retrofit, progress=False, **options)
    got = result.model.state_dict()
    for key, want in hf_start(models, x).items():
        torch.testing.assert_close(got[key].double(), want, rtol=1e-5, atol=1e-6)
    assert result.levels == ["linears.0", "linears.1"]


def test_a_level_without_alignment_is_pulled_toward_zero() -> None:
    models = seeded_models(DEEP, (0, 1))
    fused = seeded_model(SHALLOW, 2)  # level 0 reproduces base level 1: no alignment
    x, y = inputs(shape=(1, 4)), labels()
    result = fuse(models, x, y, "kf", "linear", fused=fused, ridge=1e9, progress=False)
    first = linear(result.model, 0)
    assert first.weight.abs().max() < 1e-6 and first.bias.abs().max() < 1e-6
    assert linear(result.model, 1).weight.abs().max() > 0.05  # pulled toward W0
    assert result.levels == ["linears.0", "linears.1", "linears.2"]


def test_the_gradient_variant_starts_a_level_without_alignment_at_the_fused_model() -> (
    None
):
    models = seeded_models(DEEP, (0, 1))
    fused = seeded_model(SHALLOW, 2)
    x, y = inputs(shape=(1, 4)), labels()
    config = GradientConfig(max_epochs=0)
    result = fuse(
        models, x, y, "kf", "gradient", fused=fused, gradient=config, progress=False
    )
    got, start = linear(result.model, 0), linear(fused, 0)
    assert torch.equal(got.weight, start.weight) and torch.equal(got.bias, start.bias)


def kf_clustering(models: list[nn.Module], x: torch.Tensor, k: int, seed: int) -> float:
    """The clustering error of scikit-learn's k-means++ with ``seed`` on the hidden neurons."""
    points = torch.cat(
        [neuron_matrix(layer_io(m, ["linears.0"], x)["linears.0"]) for m in models]
    )
    w = np.ones(len(points))
    groups = kmeans_groups(points, w, k, seed=seed)
    p = points.numpy()
    return float(
        sum(((p[groups == g] - p[groups == g].mean(0)) ** 2).sum() for g in range(k))
    )


def test_the_seed_picks_k_means_plus_plus_starts() -> None:
    config = mlp([8], in_shape=[1, 5])
    models = seeded_models(config, (0, 1))
    fused = seeded_model(mlp([3], in_shape=[1, 5]), 0)  # k = 3, not model 0's width
    x, y = inputs(), labels()
    want = {s: kf_clustering(models, x, 3, s) for s in (0, 1, 2, 3)}
    assert len({round(v, 6) for v in want.values()}) > 1  # the seeds do matter here
    for s, cost in want.items():
        result = fuse(models, x, y, "kf", fused=fused, seed=s, progress=False)
        assert result.costs[0]["clustering"] == pytest.approx(cost, rel=1e-9)


def test_each_level_holds_out_its_own_split_of_the_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, Any]] = []
    real = hfkf.retrofit_gradient

    def spy(
        module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, **kw: Any
    ) -> dict[str, float]:
        seen.append(kw)
        return real(module, inputs, targets, **kw)

    monkeypatch.setattr(hfkf, "retrofit_gradient", spy)
    models = seeded_models(ONE, (0, 1))
    config = GradientConfig(max_epochs=2, val_fraction=0.25)
    fuse(
        models,
        inputs(),
        labels(),
        "hf",
        "gradient",
        gradient=config,
        seed=7,
        progress=False,
    )
    assert [kw["seed"] for kw in seen] == [derive_seed(7, "level", i) for i in (0, 1)]
    assert all(kw["config"] is config for kw in seen)


def test_the_progress_bar_names_the_grouping_and_leaves_no_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    scores = uniform_scores(models, x, y)
    capsys.readouterr()
    fuse(models, x, y, "kf", scores=scores, progress=False)
    assert capsys.readouterr().err == ""
    fuse(models, x, y, "kf", scores=scores, progress=True)
    err = capsys.readouterr().err
    assert err.startswith("\rkf:") and err.endswith("\r") and "\n" not in err


def test_depth_map_refuses_a_deeper_fused_chain() -> None:
    msg = (
        "the fused model has 2 hidden levels, the base models 1; KF maps a deeper "
        "model into a shallower one, not the reverse"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        depth_map(["l0", "head"], ["a", "b", "out"])


def test_neurons_are_grouped_in_the_solve_dtype_of_a_device_without_float64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[torch.dtype] = []
    real = hfkf.group_labels

    def spy(points: torch.Tensor, *args: Any, **kw: Any) -> np.ndarray:
        seen.append(points.dtype)
        return real(points, *args, **kw)

    monkeypatch.setattr(hfkf, "solve_dtype", lambda device: torch.float32)  # as on MPS
    monkeypatch.setattr(hfkf, "group_labels", spy)
    fuse(seeded_models(ONE, (0, 1)), inputs(), labels(), "kf", progress=False)
    assert seen == [torch.float32]


# --- fuse's defaults and inputs -----------------------------------------------------------


def same_states(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_fuse_groups_by_kf_by_default() -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    default = fuse(models, x, y, progress=False)
    assert same_states(default.model, fuse(models, x, y, "kf", progress=False).model)
    assert not same_states(
        default.model, fuse(models, x, y, "hf", progress=False).model
    )


def test_fuse_seeds_k_means_with_0_by_default() -> None:
    models = seeded_models(mlp([8], in_shape=[1, 5]), (0, 1))
    fused = seeded_model(mlp([3], in_shape=[1, 5]), 0)  # k = 3: k-means++ starts
    x, y = inputs(), labels()
    default = fuse(models, x, y, fused=fused, progress=False)
    zero = fuse(models, x, y, fused=fused, seed=0, progress=False)
    one = fuse(models, x, y, fused=fused, seed=1, progress=False)
    assert default.costs == zero.costs and same_states(default.model, zero.model)
    assert one.costs[0]["clustering"] != zero.costs[0]["clustering"]


def test_fuse_shows_the_importance_and_level_bars_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    capsys.readouterr()
    fuse(models, x, y, "kf")
    err = capsys.readouterr().err
    assert err.count("importance (uniform)") >= 2  # a bar per model's scores
    assert "\rkf:" in err
    fuse(models, x, y, "kf", progress=False)  # scores computed quietly too
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("config", [ONE, ONE_BLOCK], ids=["chain", "residual"])
def test_model_importance_shows_its_bar_by_default_and_hides_it_when_asked(
    config: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    model = seeded_model(config, 0)
    x, y = inputs(12), labels(12)
    capsys.readouterr()
    got = [model_importance(model, x, y, "uniform")]
    assert "importance (uniform)" in capsys.readouterr().err
    got.append(model_importance(model, x, y, "uniform", progress=True))
    assert "importance (uniform)" in capsys.readouterr().err
    got.append(model_importance(model, x, y, "uniform", progress=False))
    assert capsys.readouterr().err == ""
    for scores in got:  # uniform: one for every neuron of every group
        assert scores.method == "uniform" and len(scores) >= 1
        assert all(v.tolist() == [1.0] * 4 for v in scores.values())


def test_fuse_reports_the_seconds_it_took() -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    scores = uniform_scores(models, x, y)
    start = time.perf_counter()
    result = fuse(models, x, y, "kf", scores=scores, progress=False)
    elapsed = time.perf_counter() - start
    assert isinstance(result.seconds, float) and 0 < result.seconds <= elapsed


def test_fuse_passes_the_grouping_to_a_residual_fusion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []
    real = residual.group_labels

    def spy(
        points: torch.Tensor,
        sizes: Any,
        w: np.ndarray,
        k: int,
        grouping: str,
        **kw: Any,
    ) -> np.ndarray:
        seen.append(grouping)
        return real(points, sizes, w, k, grouping, **kw)

    monkeypatch.setattr(residual, "group_labels", spy)
    models = seeded_models(ONE_BLOCK, (0, 1))
    x, y = inputs(12), labels(12)
    for grouping in ("hf", "kf"):
        seen.clear()
        fuse(models, x, y, grouping, progress=False)  # type: ignore[arg-type]
        assert seen and set(seen) == {grouping}


def test_fuse_names_the_valid_groupings_and_retrofits() -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    msg = "grouping must be one of ('hf', 'kf') and retrofit one of ('linear', 'gradient')"
    for grouping, retrofit in (("km", "linear"), ("kf", "ridge"), ("km", "ridge")):
        with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
            fuse(models, x, y, grouping, retrofit, progress=False)  # type: ignore[arg-type]


def test_the_default_fused_model_is_a_copy_of_model_0() -> None:
    models = [seeded_model(ONE, 0), seeded_model(mlp([6], in_shape=[1, 5]), 1)]
    x, y = inputs(), labels()
    got = fuse(models, x, y, "kf", progress=False)
    assert linear(got.model, 0).out_features == 4  # model 0's width, not model 1's 6
    want = fuse(models, x, y, "kf", fused=models[0], progress=False)
    assert same_states(got.model, want.model)


def test_a_host_fused_model_is_fitted_on_the_models_device() -> None:
    x, y = inputs(), labels()
    want = fuse(seeded_models(ONE, (0, 1)), x, y, "hf", progress=False).model
    with DeviceDiscipline():
        models = [to_device(m) for m in seeded_models(ONE, (0, 1))]
        fused = seeded_model(ONE, 2)  # on the host
        got = fuse(models, x, y, "hf", fused=fused, progress=False).model
        assert all(p.device == DEVICE for p in got.parameters())
    for key, value in want.state_dict().items():
        torch.testing.assert_close(got.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_hf_refuses_a_fused_model_of_another_depth() -> None:
    msg = (
        "model 1 (MLP) has another architecture than model 0 (MLP); "
        "fuse models of one architecture"
    )
    models, fused = seeded_models(DEEP, (0, 1)), seeded_model(SHALLOW, 2)
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        fuse(models, inputs(shape=(1, 4)), labels(), "hf", fused=fused, progress=False)


def test_kf_refuses_a_fused_model_of_another_kind() -> None:
    models = seeded_models(ONE, (0, 1))
    x, y = inputs(), labels()
    same_depth = seeded_model(cnn1d([4], in_shape=[1, 5]), 2)
    msg = (
        "model 1 (ConvNet) has another architecture than model 0 (MLP); "
        "fuse models of one architecture"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        fuse(models, x, y, "kf", fused=same_depth, progress=False)
    deep = seeded_models(DEEP, (0, 1))
    shallower = seeded_model(cnn1d([4], in_shape=[1, 4]), 2)
    msg = "a fused ConvNet for base MLP models; fuse into a model of the base architecture"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        fuse(deep, inputs(shape=(1, 4)), y, "kf", fused=shallower, progress=False)


def test_a_fused_model_with_other_classes_is_refused() -> None:
    models = seeded_models(DEEP, (0, 1))
    fused = seeded_model(mlp([5, 5], in_shape=[1, 4], n_classes=2), 2)  # head (2, 5)
    msg = (
        "the fused model has 2 classes, the models 3; "
        "fuse models with the same output classes"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        fuse(models, inputs(shape=(1, 4)), labels(), "kf", fused=fused, progress=False)
