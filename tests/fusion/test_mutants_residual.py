"""The residual fusion pinned against independent references (survivors of mutation testing).

The plans, the importance modules and the fitted tap names against lists
written out by hand for a ResNet with an identity and a projection stage and
a two-block transformer; :func:`tap_matrix` against loops over examples,
positions and tokens; :func:`block_output` against the blocks' own forward;
the position embedding's design rows against one indicator per token; a
written solution against the affine map it stands for; the gradient solve
against least squares on the training rows of the documented held-out split;
:func:`residual_importance` against the mean of :func:`neuron_importance`'s
scores; and :func:`fuse_residual` against exact reparameterisations: a model
fused with a copy of itself gives itself back, with a copy whose residual
streams are rescaled by ``lam`` it gives the model with streams scaled by
``(1 + lam) / 2``, and with a copy whose attention heads are reordered the
``qkv`` layer reproduces model 0's queries, keys and values. Also the
result's levels, block fits, costs and timing, the ridge's pull, the seeds of
the gradient steps, and a run on the stand-in GPU of :mod:`tests.devicecheck`.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten

from tests.devicecheck import DEVICE, DeviceDiscipline, to_device
from tests.kit import class_blocks, mlp, resnet1d, seeded_model, transformer1d
from wslib.core.models import ResNet, Transformer
from wslib.core.seeds import derive_seed
from wslib.fusion import grouping, residual
from wslib.fusion import retrofit as retrofit_module
from wslib.fusion.importance import neuron_importance
from wslib.fusion.levels import FusionResult
from wslib.fusion.residual import (
    _as_output,
    _group_targets,
    _Piece,
    _rows,
    _solve_gradient,
    _write,
    fit_block,
    fuse_residual,
)
from wslib.fusion.retrofit import GradientConfig, held_out_split
from wslib.fusion.taps import (
    Fit,
    Step,
    arch_plan,
    block_output,
    importance_modules,
    residual_importance,
    resnet_plan,
    resnet_taps,
    tap_matrix,
    transformer_plan,
    transformer_taps,
)

RESNET = resnet1d([2, 3], [1, 6], blocks_per_stage=2)
"""Stage 0: two identity blocks on ``stream0``; stage 1: a projection, then an identity block."""
SMALL_RESNET = resnet1d([2, 3], [1, 6], blocks_per_stage=1)
TRANSFORMER = transformer1d(
    [1, 6], embed_dim=4, depth=2, heads=2, mlp_dim=4, patch_size=2
)
"""Three tokens of four features, two blocks of two heads."""
ONE_BLOCK = transformer1d(
    [1, 6], embed_dim=4, depth=1, heads=2, mlp_dim=4, patch_size=2
)
N = 24  # examples in the fusion set


def fusion_set(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    return class_blocks(n // 3, 0, n_classes=3, in_shape=[1, 6])


def base_model(config: dict, seed: int = 0) -> nn.Module:
    """A seeded model whose BatchNorms hold the statistics of one train pass over the fusion set."""
    model = seeded_model(config, seed, train=True)
    with torch.no_grad():
        model(fusion_set()[0])
    return model.eval()


def uniform_scores(models: list[nn.Module]) -> list[dict[str, torch.Tensor]]:
    return [
        {g.name: torch.ones(g.size) for g in m.neuron_structure().groups}
        for m in models
    ]


def fuse(
    models: list[nn.Module],
    fused: nn.Module,
    retrofit: str = "linear",
    gradient: GradientConfig | None = None,
    ridge: float = 1e-8,
    x: torch.Tensor | None = None,
) -> FusionResult:
    """HF fusion of ``models`` into ``fused`` with uniform importance and equal head weights."""
    return fuse_residual(
        models,
        fusion_set()[0] if x is None else x,
        "hf",
        retrofit,  # type: ignore[arg-type]
        fused,
        np.full((len(models), 3), 1 / len(models)),
        uniform_scores(models),
        ridge,
        gradient or GradientConfig(),
        3,
    )


def outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# --- the plans ----------------------------------------------------------------------------------


def test_resnet_plan_lists_every_step_in_data_flow_order() -> None:
    p0, p1, q0, q1 = "stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1"
    expected = [
        Step("stream0", "stem", (Fit("stem.conv", "x", "stem.bn"),)),
        Step(
            "stage0.block0", f"{p0}.bn1", (Fit(f"{p0}.conv1", f"{p0}.in", f"{p0}.bn1"),)
        ),
        Step(
            "stream0",
            f"{p0}.sum",
            (Fit(f"{p0}.conv2", f"{p0}.h", f"{p0}.bn2"),),
            residual=f"{p0}.in",
            block=p0,
        ),
        Step(
            "stage0.block1", f"{p1}.bn1", (Fit(f"{p1}.conv1", f"{p1}.in", f"{p1}.bn1"),)
        ),
        Step(
            "stream0",
            f"{p1}.sum",
            (Fit(f"{p1}.conv2", f"{p1}.h", f"{p1}.bn2"),),
            residual=f"{p1}.in",
            block=p1,
        ),
        Step(
            "stage1.block0", f"{q0}.bn1", (Fit(f"{q0}.conv1", f"{q0}.in", f"{q0}.bn1"),)
        ),
        Step(
            "stream1",
            f"{q0}.sum",
            (
                Fit(f"{q0}.conv2", f"{q0}.h", f"{q0}.bn2"),
                Fit(f"{q0}.shortcut.conv", f"{q0}.in", f"{q0}.shortcut.bn"),
            ),
            block=q0,
        ),
        Step(
            "stage1.block1", f"{q1}.bn1", (Fit(f"{q1}.conv1", f"{q1}.in", f"{q1}.bn1"),)
        ),
        Step(
            "stream1",
            f"{q1}.sum",
            (Fit(f"{q1}.conv2", f"{q1}.h", f"{q1}.bn2"),),
            residual=f"{q1}.in",
            block=q1,
        ),
        Step(None, "head", (Fit("head", "pooled"),)),
    ]
    got = resnet_plan(seeded_model(RESNET, 0))
    assert got == expected
    assert [(s.bias, s.residual, s.block) for s in got] == [
        (True, s.residual, s.block) for s in expected
    ]


def test_transformer_plan_lists_every_step() -> None:
    """The plan of a two-block transformer, written out step by step."""
    expected = [
        Step("stream", "embed", (Fit("embed", "x"), Fit("pos", "tokens")), bias=False),
        Step(None, "blocks.0.qkv", (Fit("blocks.0.attn.qkv", "blocks.0.norm1"),)),
        Step(
            "stream",
            "blocks.0.attn_sum",
            (Fit("blocks.0.attn.proj", "blocks.0.mix"),),
            residual="blocks.0.in",
        ),
        Step(
            "block0.mlp", "blocks.0.fc1", (Fit("blocks.0.mlp.fc1", "blocks.0.norm2"),)
        ),
        Step(
            "stream",
            "blocks.0.mlp_sum",
            (Fit("blocks.0.mlp.fc2", "blocks.0.h"),),
            residual="blocks.0.attn_sum",
            block="blocks.0",
        ),
        Step(None, "blocks.1.qkv", (Fit("blocks.1.attn.qkv", "blocks.1.norm1"),)),
        Step(
            "stream",
            "blocks.1.attn_sum",
            (Fit("blocks.1.attn.proj", "blocks.1.mix"),),
            residual="blocks.1.in",
        ),
        Step(
            "block1.mlp", "blocks.1.fc1", (Fit("blocks.1.mlp.fc1", "blocks.1.norm2"),)
        ),
        Step(
            "stream",
            "blocks.1.mlp_sum",
            (Fit("blocks.1.mlp.fc2", "blocks.1.h"),),
            residual="blocks.1.attn_sum",
            block="blocks.1",
        ),
        Step(None, "head", (Fit("head", "pooled"),)),
    ]
    got = transformer_plan(seeded_model(TRANSFORMER, 0))
    assert got == expected
    assert got[0].bias is False and all(s.bias is True for s in got[1:])


def test_every_fit_and_group_of_the_plans_exists_in_the_model() -> None:
    for config in (RESNET, TRANSFORMER):
        model = seeded_model(config, 0)
        groups = {g.name for g in model.neuron_structure().groups}
        _, plan, _ = arch_plan(model)
        assert {s.group for s in plan} - {None} == groups
        for fit in (f for s in plan for f in s.fits if f.module != "pos"):
            model.get_submodule(fit.module)
            if fit.bn is not None:
                assert isinstance(model.get_submodule(fit.bn), nn.BatchNorm1d)


def test_importance_modules_of_a_resnet_are_the_writers_of_each_group() -> None:
    assert importance_modules(seeded_model(RESNET, 0)) == {
        "stream0": ["stem", "stages.0.0", "stages.0.1"],
        "stage0.block0": ["stages.0.0.bn1"],
        "stage0.block1": ["stages.0.1.bn1"],
        "stage1.block0": ["stages.1.0.bn1"],
        "stream1": ["stages.1.0", "stages.1.1"],
        "stage1.block1": ["stages.1.1.bn1"],
    }


def test_importance_modules_of_a_transformer() -> None:
    assert importance_modules(seeded_model(TRANSFORMER, 0)) == {
        "stream": ["blocks.0", "blocks.1"],
        "block0.mlp": ["blocks.0.mlp.fc1"],
        "block1.mlp": ["blocks.1.mlp.fc1"],
    }


@pytest.mark.parametrize("function", [arch_plan, importance_modules])
def test_a_chain_model_is_refused(function: Any) -> None:
    with pytest.raises(TypeError) as info:
        function(seeded_model(mlp([3]), 0))
    assert str(info.value) == "MLP is not a ResNet or Transformer"


def test_arch_gives_the_taps_the_plan_and_the_token_layout() -> None:
    resnet, transformer = seeded_model(RESNET, 0), seeded_model(TRANSFORMER, 0)
    assert arch_plan(resnet) == (resnet_taps, resnet_plan(resnet), False)
    assert arch_plan(transformer) == (
        transformer_taps,
        transformer_plan(transformer),
        True,
    )


# --- taps as (neurons, samples) -----------------------------------------------------------------


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_tap_matrix_of_conv_outputs_has_examples_times_positions_columns() -> None:
    v = randn(2, 3, 5)  # (examples, channels, positions)
    want = torch.tensor(
        [[float(v[n, c, p]) for n in range(2) for p in range(5)] for c in range(3)]
    )
    got = tap_matrix(v, False)
    assert got.dtype == torch.float64 and torch.equal(got, want.double())


def test_tap_matrix_of_2d_conv_outputs() -> None:
    v = randn(2, 3, 4, 5)
    want = [
        [float(v[n, c, i, j]) for n in range(2) for i in range(4) for j in range(5)]
        for c in range(3)
    ]
    assert torch.equal(tap_matrix(v, False), torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("tokens", [False, True])
def test_tap_matrix_of_flat_features_is_the_transpose(tokens: bool) -> None:
    v = randn(4, 3)
    assert torch.equal(tap_matrix(v, tokens), v.T.double())


def test_tap_matrix_of_tokens_has_examples_times_tokens_columns() -> None:
    v = randn(2, 5, 3)  # (examples, tokens, features)
    want = [[float(v[n, t, d]) for n in range(2) for t in range(5)] for d in range(3)]
    got = tap_matrix(v, True)
    assert got.dtype == torch.float64 and torch.equal(
        got, torch.tensor(want, dtype=torch.float64)
    )


def test_tap_matrix_takes_the_dtype_asked_for() -> None:
    v = randn(2, 3, 5).double()
    assert tap_matrix(v, False, dtype=torch.float32).dtype == torch.float32
    assert tap_matrix(v, True, dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize(
    "shape, tokens",
    [((2, 3, 5), False), ((2, 3, 4, 5), False), ((4, 3), False), ((2, 5, 3), True)],
)
def test_as_output_inverts_tap_matrix(shape: tuple[int, ...], tokens: bool) -> None:
    v = randn(*shape).double()
    assert torch.equal(_as_output(tap_matrix(v, tokens), v, tokens), v)


# --- blocks -------------------------------------------------------------------------------------


def with_random_batchnorm(model: nn.Module, seed: int = 1) -> nn.Module:
    """The model with random BatchNorm statistics and affine maps (eval mode)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=gen))
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.randn(c, generator=gen))
                m.bias.copy_(torch.randn(c, generator=gen))
    return model.eval()


@pytest.mark.parametrize("where", ["stages.0.0", "stages.1.0"])
def test_block_output_is_the_blocks_sum_before_its_relu(where: str) -> None:
    block = with_random_batchnorm(seeded_model(SMALL_RESNET, 0)).get_submodule(where)
    x = randn(3, 2, 6)
    with torch.no_grad():
        out = block_output(block, x)
        shortcut = x if block.shortcut is None else block.shortcut(x)
        by_hand = block.bn2(block.conv2(F.relu(block.bn1(block.conv1(x))))) + shortcut
        assert torch.equal(out, by_hand)
        assert torch.allclose(F.relu(out), block(x)) and (out < 0).any()


def test_block_output_uses_the_inner_neurons_given() -> None:
    block = with_random_batchnorm(seeded_model(SMALL_RESNET, 0)).stages[1][0]
    x, inner = randn(3, 2, 6), randn(3, 3, 3, seed=1)
    with torch.no_grad():
        want = block.bn2(block.conv2(inner)) + block.shortcut(x)
        assert torch.equal(block_output(block, x, inner=inner), want)


def test_block_output_of_a_transformer_block_is_the_block() -> None:
    block = seeded_model(TRANSFORMER, 0).blocks[1]
    x = randn(2, 3, 4)
    with torch.no_grad():
        assert torch.equal(block_output(block, x), block(x))


# --- design rows, writing a solution, the gradient solve ----------------------------------------


def test_position_piece_designs_one_indicator_column_per_token() -> None:
    model = seeded_model(TRANSFORMER, 0)
    piece = _Piece(model, Fit("pos", "tokens"), torch.ones(4, 3, 1), torch.float64)
    eye = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    got = piece.design(slice(1, 3))
    assert got.dtype == torch.float64 and torch.equal(
        got, torch.tensor(eye * 2, dtype=torch.float64)
    )


def test_rows_of_the_embedding_are_patches_then_token_indicators() -> None:
    model, x = seeded_model(TRANSFORMER, 0), randn(4, 1, 6)
    pieces = [
        _Piece(model, Fit("embed", "x"), x, torch.float64),
        _Piece(model, Fit("pos", "tokens"), torch.ones(4, 3, 1), torch.float64),
    ]
    want = [
        [float(x[n, 0, 2 * t]), float(x[n, 0, 2 * t + 1])]
        + [float(t == j) for j in range(3)]
        for n in (2, 3)
        for t in range(3)
    ]
    assert torch.equal(
        _rows(pieces, slice(2, 4), False), torch.tensor(want, dtype=torch.float64)
    )


def test_rows_with_a_bias_end_in_a_column_of_ones() -> None:
    model, pooled = seeded_model(RESNET, 0), randn(5, 3)
    rows = _rows(
        [_Piece(model, Fit("head", "pooled"), pooled, torch.float64)], slice(1, 4), True
    )
    assert rows.dtype == torch.float64 and rows.shape == (3, 4)
    assert torch.equal(
        rows,
        torch.cat([pooled[1:4].double(), torch.ones(3, 1, dtype=torch.float64)], 1),
    )


def test_rows_keep_the_pieces_dtype_whatever_the_default_dtype() -> None:
    """float32 pieces (as on MPS) give float32 rows, the bias column too, under a float64 default."""
    x = randn(3, 1, 5)
    piece = _Piece(conv_piece(x).model, Fit("conv", "x", "bn"), x, torch.float32)
    patches = [
        [float(x[n, 0, p + i]) if 0 <= p + i < 5 else 0.0 for i in (-1, 0, 1)]
        for n in range(3)
        for p in range(5)
    ]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        design, rows = piece.design(slice(0, 3)), _rows([piece], slice(0, 3), True)
    finally:
        torch.set_default_dtype(default)
    assert design.dtype == rows.dtype == torch.float32
    assert torch.equal(design, torch.tensor(patches))
    assert torch.equal(rows, torch.cat([design, torch.ones(15, 1)], 1))


def projection_step(
    model: nn.Module, x: torch.Tensor, dtype=torch.float64
) -> list[_Piece]:
    """The pieces of stage 1's projection block sum: conv2 on the inner neurons, the shortcut on its input."""
    taps = resnet_taps(model, x)
    step = resnet_plan(model)[4]
    assert step.tap == "stages.1.0.sum"
    return [_Piece(model, f, taps[f.source], dtype) for f in step.fits]


def test_a_written_solution_is_the_fitted_affine_map() -> None:
    """conv2 + BN and the projection shortcut + BN compute ``rows @ sol`` in eval mode, bias included."""
    model, x = with_random_batchnorm(seeded_model(SMALL_RESNET, 0)), randn(8, 1, 6)
    pieces = projection_step(model, x)
    sol = randn(3 * 3 + 2 + 1, 3, seed=2).double()
    _write(pieces, sol, True)
    block = model.stages[1][0]
    with torch.no_grad():
        taps = resnet_taps(model, x)
        got = block_output(block, taps["stages.1.0.in"], inner=pieces[0].source)
    want = _rows(pieces, slice(0, 8), True) @ sol
    assert gap(tap_matrix(got, False).T, want) < 1e-5


def test_a_written_head_takes_the_rows_and_the_last_row_as_bias() -> None:
    model = seeded_model(RESNET, 0)
    piece = _Piece(model, Fit("head", "pooled"), randn(5, 3), torch.float64)
    sol = randn(4, 3, seed=3).double()
    _write([piece], sol, True)
    assert torch.equal(model.head.weight, sol[:3].T.float())
    assert torch.equal(model.head.bias, sol[3].float())


def test_a_solution_is_written_in_the_models_dtype() -> None:
    """A float64 solution writes exactly what its float32 rounding writes (bias included)."""
    x = randn(8, 1, 6)
    for seed in range(8):
        sol = torch.randn(
            12, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )
        states = []
        for s in (sol, sol.float()):
            model = with_random_batchnorm(seeded_model(SMALL_RESNET, 0))
            _write(projection_step(model, x), s, True)
            states.append(model.state_dict())
        assert all(torch.equal(states[0][k], states[1][k]) for k in states[0]), seed


def conv_piece(x: torch.Tensor, seed: int = 0) -> _Piece:
    """A bias-free conv (1 -> 2 channels, kernel 3) and its BatchNorm as a fitted piece."""
    torch.manual_seed(seed)
    model = nn.ModuleDict(
        {"conv": nn.Conv1d(1, 2, 3, padding=1, bias=False), "bn": nn.BatchNorm1d(2)}
    )
    return _Piece(
        with_random_batchnorm(model), Fit("conv", "x", "bn"), x, torch.float64
    )


def test_gradient_solve_is_least_squares_on_the_training_rows_of_the_split() -> None:
    """With a held-out quarter, L-BFGS ends at the least-squares fit of the other examples' rows."""
    x = randn(12, 1, 5)  # 5 positions per example
    piece = conv_piece(x)
    a = _rows([piece], slice(0, 12), True)
    noise = randn(60, 2, seed=4).double()
    target = (a @ randn(4, 2, seed=5).double() + 0.5 * noise).T
    config = GradientConfig(max_epochs=100, val_fraction=0.25)
    got = _solve_gradient([piece], target, 12, True, config, 7)
    _, train = held_out_split(12, 0.25, 7)
    rows = (train[:, None] * 5 + torch.arange(5)[None]).flatten()
    want = torch.linalg.lstsq(a[rows], target.T[rows]).solution
    assert got.dtype == torch.float64 and got.shape == (4, 2)
    assert gap(got, want) < 1e-3


def test_gradient_solve_without_steps_returns_the_current_map() -> None:
    """No optimiser step: the coefficients with BatchNorm folded in and the summed biases."""
    model, x = with_random_batchnorm(seeded_model(SMALL_RESNET, 0)), randn(8, 1, 6)
    pieces = projection_step(model, x)
    target = torch.zeros(3, 8 * 3, dtype=torch.float64)
    got = _solve_gradient(pieces, target, 8, True, GradientConfig(max_epochs=0), 0)
    block = model.stages[1][0]
    parts, bias = [], torch.zeros(3, dtype=torch.float64)
    for conv, bn in (
        (block.conv2, block.bn2),
        (block.shortcut.conv, block.shortcut.bn),
    ):
        scale = bn.weight.double() / (bn.running_var.double() + bn.eps).sqrt()
        parts.append((conv.weight.double().flatten(1) * scale[:, None]).T)
        bias += bn.bias.double() - scale * bn.running_mean.double()
    want = torch.cat([*parts, bias[None]])
    assert got.dtype == torch.float64 and gap(got, want) < 1e-6


# --- fitting a whole block ----------------------------------------------------------------------


def block_case(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Stage 1's projection block, inputs ``(12, 2, 6)`` and random targets ``(3, 12 * 3)``."""
    block = with_random_batchnorm(seeded_model(SMALL_RESNET, seed)).stages[1][0]
    return block, randn(12, 2, 6), randn(3, 36, seed=1).double()


def block_mse(
    block: nn.Module, x: torch.Tensor, target: torch.Tensor, idx: torch.Tensor
) -> float:
    with torch.no_grad():
        out = tap_matrix(block_output(block, x[idx]), False)
    cols = (idx[:, None] * 3 + torch.arange(3)[None]).flatten()
    return float(((out - target[:, cols]) ** 2).mean())


@pytest.mark.parametrize("val_fraction", [0.0, 0.25])
def test_fit_block_reports_the_selection_mse_of_start_and_result(
    val_fraction: float,
) -> None:
    block, x, target = block_case()
    config = GradientConfig(max_epochs=10, val_fraction=val_fraction)
    val, _ = held_out_split(12, val_fraction, 5)
    before = block_mse(block, x, target, val)
    out = fit_block(block, x, target, False, config, 5)
    assert set(out) == {"start", "best"}
    assert out["start"] == pytest.approx(before, rel=1e-5)
    assert out["best"] == pytest.approx(block_mse(block, x, target, val), rel=1e-5)
    assert out["best"] < 0.99 * out["start"]


def test_fit_block_leaves_batchnorm_statistics_of_the_fusion_set() -> None:
    block, x, target = block_case()
    fit_block(block, x, target, False, GradientConfig(max_epochs=5), 0)
    with torch.no_grad():
        z = block.conv1(x).transpose(0, 1).flatten(1)
    assert gap(block.bn1.running_mean, z.mean(1)) < 1e-5
    assert gap(block.bn1.running_var, z.var(1, unbiased=False)) < 1e-5


def test_fit_block_casts_the_target_to_the_blocks_dtype() -> None:
    """A float64 target gives exactly the fit and the losses of its float32 rounding."""
    results = []
    for dtype in (torch.float64, torch.float32):
        block, x, target = block_case()
        out = fit_block(
            block, x, target.to(dtype), False, GradientConfig(max_epochs=3), 0
        )
        results.append((out, block.state_dict()))
    (a, sa), (b, sb) = results
    assert a == b and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_fit_block_of_a_transformer_block_fits_its_tokens() -> None:
    block = seeded_model(TRANSFORMER, 0).blocks[0]
    x, target = randn(6, 3, 4), randn(4, 18, seed=1).double()
    out = fit_block(block, x, target, True, GradientConfig(max_epochs=5), 0)
    with torch.no_grad():
        got = tap_matrix(block(x), True)
    assert out["best"] == pytest.approx(float(((got - target) ** 2).mean()), rel=1e-5)
    assert out["best"] < out["start"]


# --- the fusion ---------------------------------------------------------------------------------

LINEAR = ("linear", GradientConfig())
BLOCKS = ("gradient", GradientConfig(max_epochs=3))
AFFINE = ("gradient", GradientConfig(blocks=False))
HELD_OUT = GradientConfig(max_epochs=3, val_fraction=0.25)


def copy_fusion(
    config: dict, retrofit: str, gradient: GradientConfig, ridge: float = 1e-8
):
    """Model 0 fused with an exact copy into a model of another seed: (model 0, result)."""
    model = base_model(config)
    fused = base_model(config, seed=5)
    return model, fuse([model, copy.deepcopy(model)], fused, retrofit, gradient, ridge)


@pytest.mark.parametrize("config", [RESNET, TRANSFORMER], ids=["resnet", "transformer"])
@pytest.mark.parametrize(
    "how", [LINEAR, BLOCKS, AFFINE], ids=["linear", "blocks", "affine"]
)
def test_a_model_fused_with_its_copy_is_itself(config: dict, how: tuple) -> None:
    model, result = copy_fusion(config, *how)
    x, fresh = fusion_set()[0], randn(10, 1, 6, seed=9)
    assert result.model.training is False
    assert gap(outputs(result.model, x), outputs(model, x)) < 1e-4
    assert gap(outputs(result.model, fresh), outputs(model, fresh)) < 1e-3
    taps_of, plan, _ = arch_plan(model)
    own, base = taps_of(result.model, x), taps_of(model, x)
    assert all(gap(own[s.tap], base[s.tap]) < 1e-3 for s in plan)


def test_the_result_names_the_fitted_taps_and_the_group_costs() -> None:
    _, result = copy_fusion(SMALL_RESNET, *LINEAR)
    assert result.levels == [
        "stem",
        "stages.0.0.bn1",
        "stages.0.0.sum",
        "stages.1.0.bn1",
        "stages.1.0.sum",
        "head",
    ]
    assert result.block_fits == []
    assert [c["level"] for c in result.costs] == [
        "stream0",
        "stage0.block0",
        "stage1.block0",
        "stream1",
    ]
    for c in result.costs:
        assert set(c) == {"level", "cost", "clustering", "approximation"}
        assert c["clustering"] == 0.0  # the copy's neurons coincide with model 0's
        assert 0 <= c["cost"] < 1e-8
        assert c["cost"] == pytest.approx(c["approximation"], rel=1e-9, abs=1e-15)


def test_the_costs_measure_the_fused_models_distance_to_the_base_models() -> None:
    """Model 0 and a copy fused with a strong ridge (an inexact fit): each group costs the
    squared distance of both base models' neurons to their fused neurons, summed."""
    model = base_model(SMALL_RESNET)
    x = fusion_set()[0]
    fused = base_model(SMALL_RESNET, seed=5)
    result = fuse([model, copy.deepcopy(model)], fused, "linear", ridge=0.1, x=x)
    own, base = resnet_taps(result.model, x), resnet_taps(model, x)
    taps = {"stream0": ["stem", "stages.0.0.sum"], "stream1": ["stages.1.0.sum"]}
    for cost in (c for c in result.costs if c["level"] in taps):
        want = 2 * sum(
            float(((tap_matrix(own[t], False) - tap_matrix(base[t], False)) ** 2).sum())
            for t in taps[cost["level"]]
        )
        assert want > 1e-3 and cost["cost"] == pytest.approx(want, rel=1e-9)
        assert cost["clustering"] == 0.0
        assert cost["approximation"] == pytest.approx(cost["cost"], rel=1e-12)


@pytest.mark.parametrize(
    "config", [SMALL_RESNET, ONE_BLOCK], ids=["resnet", "transformer"]
)
def test_block_fits_name_every_block_and_never_get_worse(config: dict) -> None:
    _, result = copy_fusion(config, *BLOCKS)
    names = ["stages.0.0", "stages.1.0"] if config is SMALL_RESNET else ["blocks.0"]
    assert [b["block"] for b in result.block_fits] == names
    for b in result.block_fits:
        assert set(b) == {"block", "start", "best"} and b["best"] <= b["start"]


def test_only_the_gradient_variant_with_blocks_fits_blocks() -> None:
    for retrofit, gradient in (
        LINEAR,
        AFFINE,
        ("linear", GradientConfig(blocks=False)),
    ):
        assert copy_fusion(ONE_BLOCK, retrofit, gradient)[1].block_fits == []


def test_the_result_times_the_whole_fusion() -> None:
    start = time.perf_counter()
    _, result = copy_fusion(ONE_BLOCK, *LINEAR)
    assert 0 < result.seconds <= time.perf_counter() - start


def test_a_large_ridge_pulls_the_linear_fit_toward_zero() -> None:
    """Ridge 1e6 (relative to the Gram matrix's mean diagonal): every map nearly vanishes,
    so the fused model's logits hardly vary between examples."""
    model, result = copy_fusion(SMALL_RESNET, *LINEAR, ridge=1e6)
    x = fusion_set()[0]
    assert float(outputs(result.model, x).std(0).max()) < 1e-4
    assert float(outputs(model, x).std(0).max()) > 1e-2
    assert float(result.model.head.weight.detach().abs().max()) < 1e-4


def test_the_affine_gradient_variant_ignores_the_ridge() -> None:
    model, result = copy_fusion(SMALL_RESNET, *AFFINE, ridge=1e6)
    x = fusion_set()[0]
    assert gap(outputs(result.model, x), outputs(model, x)) < 1e-3


def stream_scaled(model: ResNet, lam: float) -> ResNet:
    """The same function with every residual stream multiplied by ``lam``.

    The BatchNorms that write a stream scale gamma and beta, the convs that read
    one (conv1, the projection) and the head divide their weights.
    """
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.stem.bn.weight.mul_(lam)
        out.stem.bn.bias.mul_(lam)
        for stage in out.stages:
            for block in stage:
                block.conv1.weight.div_(lam)
                block.bn2.weight.mul_(lam)
                block.bn2.bias.mul_(lam)
                if block.shortcut is not None:
                    block.shortcut.conv.weight.div_(lam)
                    block.shortcut.bn.weight.mul_(lam)
                    block.shortcut.bn.bias.mul_(lam)
        out.head.weight.div_(lam)
    return out


def test_a_model_fused_with_a_rescaled_copy_has_the_mean_scale() -> None:
    """Streams scaled by 1 and 1.2 are grouped neuron by neuron; their centroids are
    the streams scaled by 1.1, and every block and the head follow them."""
    model = base_model(SMALL_RESNET)
    x = fusion_set()[0]
    result = fuse([model, stream_scaled(model, 1.2)], base_model(SMALL_RESNET, seed=5))
    assert gap(outputs(result.model, x), outputs(model, x)) < 1e-4
    own, want = resnet_taps(result.model, x), resnet_taps(stream_scaled(model, 1.1), x)
    for tap in ("stem", "stages.0.0.bn1", "stages.0.0.sum", "stages.1.0.sum", "head"):
        assert gap(own[tap], want[tap]) < 1e-4, tap


def heads_swapped(model: Transformer) -> Transformer:
    """The same function with the two attention heads of every block in the other order."""
    out = copy.deepcopy(model)
    d, dh = 4, 2
    order = torch.tensor(
        [
            part * d + head * dh + i
            for part in range(3)
            for head in (1, 0)
            for i in range(dh)
        ]
    )
    cols = torch.tensor([head * dh + i for head in (1, 0) for i in range(dh)])
    with torch.no_grad():
        for block in out.blocks:
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
            block.attn.proj.weight.copy_(block.attn.proj.weight[:, cols])
    return out


def test_qkv_is_fitted_to_model_0s_queries_keys_and_values() -> None:
    model = base_model(ONE_BLOCK)
    x = fusion_set()[0]
    swapped = heads_swapped(model)
    assert gap(outputs(swapped, x), outputs(model, x)) < 1e-5
    for first, second in ((model, swapped), (swapped, model)):
        result = fuse([first, second], base_model(ONE_BLOCK, seed=5))
        own, want = transformer_taps(result.model, x), transformer_taps(first, x)
        assert gap(own["blocks.0.qkv"], want["blocks.0.qkv"]) < 1e-4
        assert gap(outputs(result.model, x), outputs(model, x)) < 1e-4


def test_the_fused_layernorms_start_as_the_identity() -> None:
    model = base_model(ONE_BLOCK)
    fused = base_model(ONE_BLOCK, seed=5)
    with torch.no_grad():
        for norm in (m for m in fused.modules() if isinstance(m, nn.LayerNorm)):
            norm.weight.uniform_(0.5, 2.0)
            norm.bias.uniform_(-1.0, 1.0)
    result = fuse([model, copy.deepcopy(model)], fused)
    norms = [m for m in result.model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 3
    assert all(
        torch.equal(m.weight, torch.ones(4)) and torch.equal(m.bias, torch.zeros(4))
        for m in norms
    )


@pytest.mark.parametrize(
    "gradient", [HELD_OUT, GradientConfig(max_epochs=2, blocks=False)]
)
def test_each_gradient_step_is_seeded_by_its_index_in_the_plan(
    gradient: GradientConfig, monkeypatch
) -> None:
    """``derive_seed(seed, "step", i)`` seeds step ``i``'s gradient solve or block fit."""
    calls: list[tuple] = []

    def spy(seed: int, role: str, index: int = 0) -> int:
        calls.append((seed, role, index))
        return derive_seed(seed, role, index)  # type: ignore[arg-type]

    monkeypatch.setattr(residual, "derive_seed", spy)
    copy_fusion(SMALL_RESNET, "gradient", gradient)
    steps = [2, 4] if gradient.blocks else list(range(6))
    assert calls == [(3, "step", i) for i in steps]


# --- importance -----------------------------------------------------------------------------------


def test_residual_importance_averages_the_scores_of_each_groups_modules(capsys) -> None:
    model = base_model(SMALL_RESNET)
    x, y = fusion_set(6)
    got = residual_importance(model, x, y, "deeplift", progress=False)
    assert capsys.readouterr().err == ""
    layers = ["stem", "stages.0.0", "stages.0.0.bn1", "stages.1.0", "stages.1.0.bn1"]
    raw = neuron_importance(model, layers, x, y, "deeplift", progress=False)
    want = {
        "stream0": (raw["stem"] + raw["stages.0.0"]) / 2,
        "stage0.block0": raw["stages.0.0.bn1"],
        "stage1.block0": raw["stages.1.0.bn1"],
        "stream1": raw["stages.1.0"],
    }
    assert got.method == "deeplift" and list(got) == list(want)
    for g, w in want.items():
        assert got[g].shape == w.shape and gap(got[g], w) < 1e-12, g


def test_residual_importance_shows_its_progress_by_default(capsys) -> None:
    x, y = fusion_set(6)
    got = residual_importance(base_model(ONE_BLOCK), x, y, "uniform")
    assert "importance (uniform)" in capsys.readouterr().err
    assert got.method == "uniform"
    assert {g: v.tolist() for g, v in got.items()} == {
        "stream": [1.0] * 4,
        "block0.mlp": [1.0] * 4,
    }


# --- on the stand-in GPU --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, gradient",
    [
        (SMALL_RESNET, GradientConfig(max_epochs=2, blocks=False, val_fraction=0.25)),
        (ONE_BLOCK, HELD_OUT),
    ],
    ids=["resnet-affine", "transformer-blocks"],
)
def test_the_fusion_runs_on_the_models_device(
    config: dict, gradient: GradientConfig
) -> None:
    """Model 0 and the fused model on the device, model 1 and the inputs on the host:
    the same fused model as on the host, on the device."""
    model, plain = copy_fusion(config, "gradient", gradient)
    x = fusion_set()[0]
    with DeviceDiscipline():
        models = [to_device(copy.deepcopy(model)), model]
        fused = to_device(base_model(config, seed=5))
        result = fuse(models, fused, "gradient", gradient, x=x)
        assert all(t.device == DEVICE for t in result.model.state_dict().values())
    for key, value in plain.model.state_dict().items():
        assert torch.equal(result.model.state_dict()[key], value), key


class NoFloat64Device(DeviceDiscipline):
    """The stand-in GPU without float64, as MPS: a float64 tensor made there is refused."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = super().__torch_function__(func, types, args, kwargs)
        for t in tree_flatten(out)[0]:
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float64
                and self.on_device(t)
            ):
                raise TypeError(
                    f"{getattr(func, '__qualname__', func)} made a float64 tensor on the device"
                )
        return out


@pytest.mark.parametrize(
    "config", [SMALL_RESNET, ONE_BLOCK], ids=["resnet", "transformer"]
)
def test_with_a_float32_solve_nothing_on_the_device_is_float64(
    config: dict, monkeypatch
) -> None:
    """Where :func:`solve_dtype` is float32 (MPS has no float64), the fusion stays in float32 there."""
    for module in (grouping, retrofit_module, residual):
        monkeypatch.setattr(module, "solve_dtype", lambda device: torch.float32)
    model, x = base_model(config), fusion_set()[0]
    with NoFloat64Device():
        models = [to_device(copy.deepcopy(model)), to_device(copy.deepcopy(model))]
        result = fuse(
            models, to_device(base_model(config, seed=5)), "gradient", HELD_OUT, x=x
        )
    assert gap(outputs(result.model, x), outputs(model, x)) < 1e-3
    assert len(result.costs) == len({s.group for s in arch_plan(model)[1]} - {None})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_targets_are_the_centroids_of_matched_neurons_in_the_dtype_asked(
    dtype: torch.dtype,
) -> None:
    """Two models' taps grouped by HF: each target is the mean of a neuron and its partner.

    The grouping sees the taps in ``dtype``; the centroids are computed in the
    device's solve dtype (float64 on the CPU)."""
    model = base_model(SMALL_RESNET)
    x = fusion_set()[0]
    other = stream_scaled(model, 1.2)
    base = [resnet_taps(model, x), resnet_taps(other, x)]
    plan = resnet_plan(model)
    sizes = {g.name: g.size for g in model.neuron_structure().groups}
    targets, seen = _group_targets(
        plan, base, uniform_scores([model, other]), sizes, "hf", False, 0, dtype
    )
    assert set(targets) == {s.tap for s in plan if s.group is not None}
    for tap, value in targets.items():
        want = (tap_matrix(base[0][tap], False) + tap_matrix(base[1][tap], False)) / 2
        assert value.dtype == torch.float64 and value.shape == want.shape
        assert gap(value, want) < 1e-6, tap
    assert list(seen) == ["stream0", "stage0.block0", "stage1.block0", "stream1"]
    assert seen["stream0"]["taps"] == ["stem", "stages.0.0.sum"]
    assert seen["stream0"]["points"].dtype == dtype
    assert seen["stream0"]["points"].shape == (4, 2 * N * 6)
    assert seen["stream0"]["labels"].tolist() == [0, 1, 0, 1]
    assert seen["stream0"]["weights"].tolist() == [1.0] * 4
