"""The fusion baselines pinned against independent references (survivors of mutation testing).

Weighted averaging of state dicts against a loop, BatchNorm statistics
against the convolution's moments over the fusion set, the ensemble against
the mean softmax by hand, OTFusion against the docstring's formula with
``ot.emd`` and a permuted copy, Git Re-Basin against exhaustive permutations
of four hidden neurons, distillation's soft targets against the formula and
Adam's first step, ``fuse_by``'s dispatch, the error messages, and runs on the
stand-in GPU of :mod:`tests.devicecheck`.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from typing import Any

import numpy as np
import ot
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.devicecheck import DEVICE, DeviceDiscipline, to_device
from tests.kit import cnn1d, mlp, seeded_model, seeded_models
from wslib.core.matching import weight_matching
from wslib.core.neurons import neuron_structure
from wslib.fusion import baselines
from wslib.fusion.baselines import (
    Ensemble,
    _standardised,
    average_states,
    averaging,
    distill,
    fuse_by,
    importance_average,
    last_layer_kd,
    last_linear,
    matched,
    otfusion,
    permuted_importance_average,
    rebasin_activation_matching,
    rebasin_weight_matching,
    soft_target_loss,
)

ONE = mlp([4], in_shape=[1, 5])  # one hidden level of four neurons
TWO = mlp([4, 3], in_shape=[1, 5])  # two hidden levels
BN = cnn1d([2], in_shape=[1, 6], bn=True)


def inputs(n: int = 40, shape: tuple[int, ...] = (1, 5), seed: int = 5) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


def labels(n: int = 40) -> torch.Tensor:
    return torch.arange(n) % 3


def d(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state in float64."""
    return {k: v.detach().double() for k, v in model.state_dict().items()}


def close_states(got: nn.Module, want: dict[str, torch.Tensor], tol=1e-5) -> None:
    state = got.state_dict()
    assert state.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(
            state[k].double(), want[k].double(), atol=tol, rtol=tol
        )


def permuted(model: nn.Module, perms: list[list[int]]) -> nn.Module:
    """A copy of the MLP with hidden level ``i``'s neurons reordered by ``perms[i]``."""
    out = copy.deepcopy(model)
    s = out.state_dict()
    for i, p in enumerate(perms):
        idx = torch.tensor(p)
        s[f"linears.{i}.weight"] = s[f"linears.{i}.weight"][idx]
        s[f"linears.{i}.bias"] = s[f"linears.{i}.bias"][idx]
        s[f"linears.{i + 1}.weight"] = s[f"linears.{i + 1}.weight"][:, idx]
    out.load_state_dict(s)
    return out


def hidden(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Pre-activations of each hidden level of an MLP, by hand (float64)."""
    s, h, out = d(model), x.flatten(1).double(), []
    n = len([k for k in s if k.endswith(".weight")])
    for i in range(n - 1):
        z = h @ s[f"linears.{i}.weight"].T + s[f"linears.{i}.bias"]
        out.append(z)
        h = z.relu()
    return out


def permute_one(
    s: dict[str, torch.Tensor], perm: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    idx = torch.tensor(perm)
    return {
        "linears.0.weight": s["linears.0.weight"][idx],
        "linears.0.bias": s["linears.0.bias"][idx],
        "linears.1.weight": s["linears.1.weight"][:, idx],
        "linears.1.bias": s["linears.1.bias"],
    }


def mean_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: sum(s[k] for s in states) / len(states) for k in states[0]}


# --- average_states / averaging ---------------------------------------------------------------


def test_weighted_average_of_states_is_the_loop_and_integer_buffers_come_from_the_first() -> (
    None
):
    g = torch.Generator().manual_seed(0)
    states = [
        {"w": torch.randn(3, 2, generator=g), "n": torch.tensor(7 + i)}
        for i in range(3)
    ]
    weights = [1, 2, 5]
    got = average_states(states, weights=weights)
    want = sum(w * s["w"].double() for w, s in zip(weights, states)) / 8
    torch.testing.assert_close(got["w"], want.float())
    assert got["w"].dtype == torch.float32
    assert got["n"] == 7 and got["n"].dtype == torch.int64
    plain = average_states(states)
    torch.testing.assert_close(
        plain["w"], (sum(s["w"].double() for s in states) / 3).float()
    )


def test_average_weights_of_any_dtype_are_normalised_in_float64() -> None:
    states = [{"w": torch.full((2,), float(i), dtype=torch.float64)} for i in (1, 2, 4)]
    got = average_states(states, weights=np.ones(3, np.float16))
    torch.testing.assert_close(
        got["w"], torch.full((2,), 7 / 3, dtype=torch.float64), rtol=1e-13, atol=0
    )


def bn_moments(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of the BN cnn's convolution over ``x``, by hand."""
    z = F.conv1d(
        x.double(), model.state_dict()["features.0.weight"].double(), padding=2
    )
    z = z.movedim(1, 0).reshape(z.shape[1], -1)
    return z.mean(1), z.var(1)


def assert_bn_stats_over(model: nn.Module, x: torch.Tensor) -> None:
    mean, var = bn_moments(model, x)
    s = model.state_dict()
    torch.testing.assert_close(
        s["features.1.running_mean"].double(), mean, rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        s["features.1.running_var"].double(), var, rtol=1e-4, atol=1e-5
    )


def test_averaging_recomputes_batchnorm_statistics_on_x_bn() -> None:
    models = seeded_models(BN, (0, 1))
    x = inputs(30, (1, 6))
    fused = averaging(models, x_bn=x)
    assert not fused.training
    assert_bn_stats_over(fused, x)
    want = mean_state([d(m) for m in models])
    torch.testing.assert_close(d(fused)["head.weight"], want["head.weight"])


@pytest.mark.parametrize("method", ["averaging", "rebasin_wm"])
def test_fuse_by_recomputes_batchnorm_statistics_on_the_fusion_set(method: str) -> None:
    models = seeded_models(BN, (0, 1))
    x = inputs(30, (1, 6))
    fused = fuse_by(method, models, x, labels(30))
    assert_bn_stats_over(fused, x)


def test_rebasin_weight_matching_recomputes_batchnorm_statistics_on_x_bn() -> None:
    models = seeded_models(BN, (0, 1))
    x = inputs(30, (1, 6))
    assert_bn_stats_over(rebasin_weight_matching(models, x_bn=x), x)


# --- the ensemble -----------------------------------------------------------------------------


def test_ensemble_is_the_log_of_the_mean_softmax() -> None:
    models = seeded_models(ONE, (0, 1, 2))
    x = inputs(10)
    with torch.no_grad():
        probs = [F.softmax(m(x), 1) for m in models]
        got = Ensemble(models)(x)
    torch.testing.assert_close(got, torch.log(sum(probs) / 3))


def test_ensemble_weights_each_class_across_the_models() -> None:
    models = seeded_models(ONE, (0, 1))
    x = inputs(10)
    cw = np.array([[1.0, 3.0, 0.5], [2.0, 1.0, 4.0]])
    with torch.no_grad():
        probs = [F.softmax(m(x), 1).double() for m in models]
        got = Ensemble(models, class_weights=cw)(x)
    mix = torch.zeros_like(probs[0])
    for i in range(2):
        for c in range(3):
            mix[:, c] += cw[i, c] / cw[:, c].sum() * probs[i][:, c]
    want = torch.log(mix / mix.sum(1, keepdim=True))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_class_no_member_can_predict_gets_a_finite_log_probability() -> None:
    head = nn.Linear(5, 2)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([500.0, -500.0]))
    model = nn.Sequential(nn.Flatten(), head)
    out = Ensemble([model, copy.deepcopy(model)])(inputs(4))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 1], torch.full((4,), math.log(1e-12)))


def test_ensemble_and_distillation_emit_no_warnings() -> None:
    models = seeded_models(ONE, (0, 1))
    x = inputs(20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Ensemble(models, class_weights=np.ones((2, 3)))(x)
        last_layer_kd(models, x, epochs=1)
        distill(seeded_model(ONE, 3), models[0], x, epochs=1)
        soft_target_loss(torch.randn(4, 3), F.softmax(torch.randn(4, 3), 1), 2.0)


@pytest.mark.parametrize("method", ["ensemble", "last_layer_kd"])
def test_copies_of_the_members_leave_the_models_modes_alone(method: str) -> None:
    models = seeded_models(ONE, (0, 1), train=True)
    fuse_by(method, models, inputs(), labels())
    assert all(m.training for model in models for m in model.modules())


def test_fuse_by_hands_the_class_weights_to_the_ensemble() -> None:
    models = seeded_models(ONE, (0, 1))
    x, cw = inputs(), np.array([[1.0, 3.0, 0.5], [2.0, 1.0, 4.0]])
    with torch.no_grad():
        got = fuse_by("ensemble", models, x, labels(), class_weights=cw)(x)
        want = Ensemble(models, class_weights=cw)(x)
        plain = Ensemble(models)(x)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, plain, atol=1e-3)


# --- last-layer KD and distillation -----------------------------------------------------------


class Recorded(Exception):
    """Stops a run once the call of interest is recorded."""


def record_fit(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake(module, inputs, soft, epochs, lr, temperature, batch_size, seed) -> None:
        seen.update(
            module=module,
            inputs=inputs,
            soft=soft,
            epochs=epochs,
            lr=lr,
            temperature=temperature,
            batch_size=batch_size,
            seed=seed,
        )

    monkeypatch.setattr(baselines, "_fit_soft_targets", fake)
    return seen


def test_last_layer_kd_fits_model_0s_head_to_the_ensembles_tempered_softmax(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = record_fit(monkeypatch)
    models = seeded_models(ONE, (0, 1))
    x, cw = inputs(), np.array([[1.0, 3.0, 0.5], [2.0, 1.0, 4.0]])
    student = last_layer_kd(models, x, class_weights=cw)
    assert (seen["epochs"], seen["lr"], seen["temperature"]) == (100, 1e-2, 2.0)
    assert (seen["batch_size"], seen["seed"]) == (128, 0)
    assert seen["module"] is student.linears[1]
    torch.testing.assert_close(seen["inputs"].double(), hidden(models[0], x)[0].relu())
    with torch.no_grad():
        log_mean = Ensemble(models, class_weights=cw)(x)
    torch.testing.assert_close(seen["soft"], F.softmax(log_mean / 2.0, 1))
    close_states(student, d(models[0]), tol=0)


def test_distill_fits_the_student_to_the_teachers_tempered_softmax(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = record_fit(monkeypatch)
    student, teacher = seeded_model(ONE, 3), seeded_model(ONE, 0)
    x = inputs()
    distill(student, teacher, x)
    assert (seen["epochs"], seen["lr"], seen["temperature"]) == (200, 3e-3, 2.0)
    assert (seen["batch_size"], seen["seed"]) == (128, 0)
    assert seen["module"] is student
    with torch.no_grad():
        torch.testing.assert_close(seen["soft"], F.softmax(teacher(x) / 2.0, 1))
    distill(student, teacher, x, temperature=5.0)
    with torch.no_grad():
        torch.testing.assert_close(seen["soft"], F.softmax(teacher(x) / 5.0, 1))


def test_the_first_adam_step_moves_every_weight_by_the_learning_rate() -> None:
    student, teacher = seeded_model(ONE, 3), seeded_model(ONE, 0)
    before = d(student)
    distill(student, teacher, inputs(), epochs=1, lr=0.05, batch_size=64)
    for k, v in d(student).items():
        torch.testing.assert_close(
            (v - before[k]).abs(), torch.full_like(v, 0.05), rtol=1e-3, atol=1e-4
        )


def test_soft_target_loss_is_t_squared_kl() -> None:
    logits, soft = torch.randn(4, 3), F.softmax(torch.randn(4, 3), 1)
    q = F.softmax(logits / 3.0, 1)
    want = 9.0 * (soft * (soft.log() - q.log())).sum(1).mean()
    torch.testing.assert_close(soft_target_loss(logits, soft, 3.0), want)


def test_last_linear_names_the_model_without_a_head() -> None:
    with pytest.raises(ValueError, match="^Sequential has no Linear head$"):
        last_linear(nn.Sequential(nn.ReLU()))


# --- OTFusion ---------------------------------------------------------------------------------


def ot_reference(
    models: list[nn.Module], x: torch.Tensor, cost: str, scores=None
) -> dict[str, torch.Tensor]:
    """Two MLPs: the docstring's align-then-average with ``ot.emd``, written out."""
    a, b = d(models[0]), d(models[1])
    n = len([k for k in a if k.endswith(".weight")])
    za, zb = hidden(models[0], x), hidden(models[1], x)
    out, p_prev = {}, None
    for i in range(n - 1):
        wa, ba = a[f"linears.{i}.weight"].numpy(), a[f"linears.{i}.bias"].numpy()
        wb, bb = b[f"linears.{i}.weight"].numpy(), b[f"linears.{i}.bias"].numpy()
        if p_prev is not None:
            wb = wb @ p_prev
        if cost == "weight":
            fa, fb = np.c_[wb, bb], np.c_[wa, ba]
        else:
            fa, fb = zb[i].T.numpy(), za[i].T.numpy()
        c = ((fa[:, None, :] - fb[None, :, :]) ** 2).sum(2)
        if scores is None:
            ma, mb = np.ones(len(wb)), np.ones(len(wa))
        else:
            sb, sa = (
                s[f"linears.{i}"].double().numpy() for s in (scores[1], scores[0])
            )
            ma, mb = sb / sb.mean(), sa / sa.mean()
        t = ot.emd(ma / ma.sum(), mb / mb.sum(), c)
        p = t / t.sum(0, keepdims=True)
        wb, bb, om_b, om_a = p.T @ wb, p.T @ bb, ma @ p, mb
        tot = om_a + om_b
        out[f"linears.{i}.weight"] = torch.as_tensor(
            (om_a[:, None] * wa + om_b[:, None] * wb) / tot[:, None]
        )
        out[f"linears.{i}.bias"] = torch.as_tensor((om_a * ba + om_b * bb) / tot)
        p_prev = p
    h = f"linears.{n - 1}"
    out[f"{h}.weight"] = torch.as_tensor(
        (a[f"{h}.weight"].numpy() + b[f"{h}.weight"].numpy() @ p_prev) / 2
    )
    out[f"{h}.bias"] = (a[f"{h}.bias"] + b[f"{h}.bias"]) / 2
    return out


def level_scores(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"linears.{i}": torch.rand(len(model.linears[i].weight), generator=g) + 0.2
        for i in range(len(model.linears) - 1)
    }


@pytest.mark.parametrize("cost", ["activation", "weight"])
@pytest.mark.parametrize("with_scores", [False, True])
def test_otfusion_of_two_mlps_is_the_docstrings_formula(
    cost: str, with_scores: bool
) -> None:
    models = seeded_models(TWO, (0, 1))
    x = inputs()
    scores = (
        [level_scores(m, 7 + j) for j, m in enumerate(models)] if with_scores else None
    )
    fused = otfusion(models, x, cost=cost, scores=scores)
    close_states(fused, ot_reference(models, x, cost, scores))


@pytest.mark.parametrize("cost", ["activation", "weight"])
def test_otfusion_recovers_a_permuted_copy(cost: str) -> None:
    a = seeded_model(TWO, 0)
    b = permuted(a, [[2, 0, 3, 1], [1, 2, 0]])
    close_states(otfusion([a, b], inputs(), cost=cost), d(a))
    close_states(otfusion([b, a], inputs(), cost=cost), d(b))


def test_otfusion_of_a_model_with_itself_is_the_model() -> None:
    a = seeded_model(ONE, 0)
    close_states(otfusion([a, copy.deepcopy(a)], inputs()), d(a))


def test_otfusion_of_three_models_averages_each_once() -> None:
    models = seeded_models(ONE, (0, 1, 2))
    x = inputs()
    fused = otfusion(models, x, cost="weight")
    pair01 = ot_reference(models[:2], x, "weight")
    pair02 = ot_reference([models[0], models[2]], x, "weight")
    a = d(models[0])
    want = {
        k: (2 * pair01[k] + 2 * pair02[k] - a[k]) / 3 for k in a
    }  # (a + b' + c') / 3
    close_states(fused, want)


def test_otfusion_cost_is_the_squared_distance() -> None:
    """Neuron rows (w, b) where the squared distance keeps the order and a cubed one swaps."""
    cos = 1 - 9 / (2 * 2.2**2)
    config = mlp([2], in_shape=[1, 1], n_classes=2)
    a, b = seeded_models(config, (0, 1))
    sa, sb = a.state_dict(), b.state_dict()
    sa["linears.0.weight"], sa["linears.0.bias"] = (
        torch.tensor([[0.0], [2.2]]),
        torch.tensor([0.0, 0.0]),
    )
    sb["linears.0.weight"] = torch.tensor([[0.0], [2.2 * cos]])
    sb["linears.0.bias"] = torch.tensor([0.0, 2.2 * math.sqrt(1 - cos**2)])
    a.load_state_dict(sa)
    b.load_state_dict(sb)
    close_states(otfusion([a, b], cost="weight"), mean_state([d(a), d(b)]))


def test_otfusion_refuses_unknown_costs_and_missing_inputs() -> None:
    models = seeded_models(ONE, (0, 1))
    with pytest.raises(
        ValueError, match=r"^cost must be one of \('activation', 'weight'\), got 'l1'$"
    ):
        otfusion(models, inputs(), cost="l1")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match="^activation-based OTFusion needs the fusion inputs x$"
    ):
        otfusion(models)


def test_otfusion_names_scores_of_the_wrong_length() -> None:
    models = seeded_models(ONE, (0, 1))
    scores = [{"linears.0": torch.ones(4)}, {"linears.0": torch.ones(3)}]
    with pytest.raises(
        ValueError,
        match=r"^scores of model 1 at 'linears.0' have 3 entries for 4 neurons$",
    ):
        otfusion(models, inputs(), scores=scores)


def test_importance_average_keeps_the_states_dtype_and_weighs_rows() -> None:
    models = seeded_models(ONE, (0, 1))
    states = [m.state_dict() for m in models]
    w = [
        {"linears.0": np.array([1.0, 2.0, 3.0, 4.0])},
        {"linears.0": np.array([3.0, 2.0, 1.0, 4.0])},
    ]
    out = importance_average(states, w, ["linears.0"])
    assert all(v.dtype == torch.float32 for v in out.values())
    share = torch.tensor([0.25, 0.5, 0.75, 0.5], dtype=torch.float64)[:, None]
    want = (
        share * d(models[0])["linears.0.weight"]
        + (1 - share) * d(models[1])["linears.0.weight"]
    )
    torch.testing.assert_close(
        out["linears.0.weight"].double(), want, rtol=1e-6, atol=1e-6
    )


# --- Git Re-Basin -----------------------------------------------------------------------------


def best_weight_perm(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
) -> tuple[int, ...]:
    """The order of B's four neurons with the largest inner product with A's weights."""

    def score(p: tuple[int, ...]) -> float:
        pb = permute_one(b, p)
        return float(sum((a[k] * pb[k]).sum() for k in a if k != "linears.1.bias"))

    return max(itertools.permutations(range(4)), key=score)


def test_rebasin_weight_matching_is_the_best_of_all_permutations() -> None:
    models = seeded_models(ONE, (0, 1))
    a, b = d(models[0]), d(models[1])
    p = best_weight_perm(a, b)
    assert p != (0, 1, 2, 3)  # the matching has work to do
    close_states(rebasin_weight_matching(models), mean_state([a, permute_one(b, p)]))


def test_rebasin_weight_matching_uses_seed_0_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(baselines, "_MATCHINGS", {})
    seeds = []
    real = baselines.weight_matching

    def spy(a, b, structure, *, seed):
        seeds.append(seed)
        return real(a, b, structure, seed=seed)

    monkeypatch.setattr(baselines, "weight_matching", spy)
    rebasin_weight_matching(seeded_models(ONE, (0, 1)))
    assert seeds == [0]


def test_matched_is_cached_per_pair_of_states(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baselines, "_MATCHINGS", {})
    a1, a2, b = (d(m) for m in seeded_models(ONE, (0, 1, 2)))
    s = neuron_structure(seeded_model(ONE, 0))
    first = matched(a1, b, s, 0)
    second = matched(a2, b, s, 0)
    for got, a in ((first, a1), (second, a2)):
        want = weight_matching(a, b, s, seed=0)
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(first["layer0"], second["layer0"])


def best_activation_perm(za: torch.Tensor, zb: torch.Tensor) -> tuple[int, ...]:
    def std(z: torch.Tensor) -> torch.Tensor:
        m = z.relu().T
        m = m - m.mean(1, keepdim=True)
        return m / m.norm(dim=1, keepdim=True)

    corr = std(za) @ std(zb).T
    return max(
        itertools.permutations(range(4)),
        key=lambda p: float(sum(corr[i, p[i]] for i in range(4))),
    )


def test_rebasin_activation_matching_is_the_best_of_all_permutations() -> None:
    models = seeded_models(ONE, (0, 1))
    x = inputs()
    p = best_activation_perm(hidden(models[0], x)[0], hidden(models[1], x)[0])
    assert p != (0, 1, 2, 3)
    want = mean_state([d(models[0]), permute_one(d(models[1]), p)])
    close_states(rebasin_activation_matching(models, x), want)


def test_rebasin_activation_matching_weighs_rows_with_the_permuted_scores() -> None:
    models = seeded_models(ONE, (0, 1))
    x = inputs()
    scores = [level_scores(m, 3 + j) for j, m in enumerate(models)]
    p = best_activation_perm(hidden(models[0], x)[0], hidden(models[1], x)[0])
    a, b = d(models[0]), permute_one(d(models[1]), p)
    wa = scores[0]["linears.0"].double() / scores[0]["linears.0"].double().mean()
    sb = scores[1]["linears.0"].double()
    wb = (sb / sb.mean())[list(p)]
    want = mean_state([a, b])
    for k in ("linears.0.weight", "linears.0.bias"):
        share = (wa / (wa + wb)).reshape(-1, *[1] * (a[k].dim() - 1))
        want[k] = share * a[k] + (1 - share) * b[k]
    close_states(rebasin_activation_matching(models, x, scores=scores), want)


def test_rebasin_activation_matching_recovers_a_permuted_copy() -> None:
    a = seeded_model(TWO, 0)
    b = permuted(a, [[3, 0, 1, 2], [2, 0, 1]])
    close_states(rebasin_activation_matching([a, b], inputs(200)), d(a))


def test_permuted_importance_average_weighs_every_hidden_level() -> None:
    models = seeded_models(TWO, (0, 1))
    states = [d(m) for m in models]
    scores = [level_scores(m, 11 + j) for j, m in enumerate(models)]
    perms = [
        None,
        {"layer0": torch.tensor([1, 0, 3, 2]), "layer1": torch.tensor([2, 1, 0])},
    ]
    got = permuted_importance_average(models, states, perms, scores)
    want = mean_state(states)
    for i, group in ((0, "layer0"), (1, "layer1")):
        s0, s1 = (s[f"linears.{i}"].double() for s in scores)
        w0, w1 = s0 / s0.mean(), (s1 / s1.mean())[perms[1][group]]
        for k in (f"linears.{i}.weight", f"linears.{i}.bias"):
            share = (w0 / (w0 + w1)).reshape(-1, *[1] * (states[0][k].dim() - 1))
            want[k] = share * states[0][k] + (1 - share) * states[1][k]
    for k in want:
        torch.testing.assert_close(got[k].double(), want[k])


def test_standardised_rows_are_centred_and_of_unit_norm_at_most() -> None:
    m = (
        torch.randn(
            4, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        )
        * 3
        + 2
    )
    s = _standardised(m)
    torch.testing.assert_close(s.mean(1), torch.zeros(4, dtype=torch.float64))
    norms = s.norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(4, dtype=torch.float64))
    assert (norms < 1).all()  # the guard adds to the norm, never takes away
    c = m - m.mean(1, keepdim=True)
    torch.testing.assert_close(s, c / c.norm(dim=1, keepdim=True))


# --- fuse_by's dispatch -----------------------------------------------------------------------


def test_fuse_by_names_unknown_methods() -> None:
    models = seeded_models(ONE, (0, 1))
    with pytest.raises(
        ValueError, match=r"^unknown fusion method 'mean'; valid: \('averaging',"
    ):
        fuse_by("mean", models, inputs(), labels())  # type: ignore[arg-type]


class Fused:
    def __init__(self, model: nn.Module) -> None:
        self.model = model


@pytest.mark.parametrize("method", ["hf_linear", "kf_gradient"])
def test_fuse_by_hands_hf_and_kf_every_option(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    out = seeded_model(ONE, 9)

    def fake(*args, **kwargs):
        calls.append((args, kwargs))
        return Fused(out)

    monkeypatch.setattr(baselines, "fuse", fake)
    models, x, y = seeded_models(ONE, (0, 1)), inputs(), labels()
    start, cw, scores = seeded_model(ONE, 4), np.ones((2, 3)), [{}, {}]
    got = fuse_by(
        method,
        models,
        x,
        y,
        class_weights=cw,
        importance="deeplift",
        scores=scores,
        fused=start,
        ridge=0.5,
        seed=3,
    )
    assert got is out
    ((args, kwargs),) = calls
    assert args == (models, x, y, *method.split("_"))
    assert (
        kwargs["fused"] is start
        and kwargs["class_weights"] is cw
        and kwargs["scores"] is scores
    )
    assert (
        kwargs["importance"] == "deeplift"
        and kwargs["ridge"] == 0.5
        and kwargs["seed"] == 3
    )
    assert (
        kwargs["gradient"] == baselines.GradientConfig() and kwargs["progress"] is False
    )
    calls.clear()
    fuse_by(method, models, x, y)
    assert calls[0][1]["seed"] == 0


def spy_importance(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []

    def fake(m, x, y, method, **kwargs):
        calls.append((m, x, y, method, kwargs))
        return {"linears.0": torch.ones(4)}

    monkeypatch.setattr(baselines, "model_importance", fake)
    return calls


def test_fuse_by_computes_importance_only_for_the_methods_that_use_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = spy_importance(monkeypatch)
    got = []
    monkeypatch.setattr(
        baselines,
        "otfusion",
        lambda models, x, cost, scores: got.append((cost, scores)) or models[0],
    )
    models, x, y = seeded_models(ONE, (0, 1)), inputs(), labels()
    fuse_by("averaging", models, x, y, importance="conductance")
    fuse_by("otfusion", models, x, y)
    assert calls == [] and got == [("activation", None)]
    fuse_by("otfusion", models, x, y, importance="conductance")
    assert [(c[0], c[1], c[2], c[3], c[4]) for c in calls] == [
        (m, x, y, "conductance", {"progress": False}) for m in models
    ]
    assert got[1][0] == "activation" and len(got[1][1]) == 2
    assert all(torch.equal(s["linears.0"], torch.ones(4)) for s in got[1][1])


def test_fuse_by_hands_seed_class_weights_and_fusion_set_to_the_baselines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}
    m0 = seeded_model(ONE, 0)
    monkeypatch.setattr(
        baselines,
        "last_layer_kd",
        lambda models, x, **kw: seen.setdefault("kd", kw) and m0,
    )
    monkeypatch.setattr(
        baselines,
        "rebasin_weight_matching",
        lambda models, **kw: seen.setdefault("wm", kw) and m0,
    )
    models, x, y, cw = seeded_models(ONE, (0, 1)), inputs(), labels(), np.ones((2, 3))
    fuse_by("last_layer_kd", models, x, y, class_weights=cw, seed=4)
    fuse_by("rebasin_wm", models, x, y, seed=4)
    assert seen["kd"]["class_weights"] is cw and seen["kd"]["seed"] == 4
    assert (
        seen["wm"]["x_bn"] is x
        and seen["wm"]["seed"] == 4
        and seen["wm"]["scores"] is None
    )
    seen.clear()
    fuse_by("last_layer_kd", models, x, y)
    fuse_by("rebasin_wm", models, x, y)
    assert seen["kd"]["seed"] == 0 and seen["wm"]["seed"] == 0


# --- on the stand-in GPU ----------------------------------------------------------------------


def on_device(model: nn.Module) -> bool:
    return all(t.device == DEVICE for t in model.state_dict().values())


def test_the_baselines_run_on_model_0s_device_with_host_inputs() -> None:
    host = seeded_models(ONE, (0, 1))
    x = inputs()
    cw = np.array([[1.0, 3.0, 0.5], [2.0, 1.0, 4.0]])
    with DeviceDiscipline():
        models = [to_device(copy.deepcopy(m)) for m in host]
        mixed = [models[0], copy.deepcopy(host[1])]  # the result follows model 0
        assert on_device(averaging(mixed))
        assert on_device(otfusion(mixed, x))
        assert on_device(rebasin_weight_matching(mixed))
        assert on_device(rebasin_activation_matching(mixed, x))
        ens = Ensemble(mixed, class_weights=cw)
        assert ens.class_weights is not None and ens.class_weights.device == DEVICE
        ens = Ensemble(models, class_weights=cw)
        ens(x.to(DEVICE))
        kd = last_layer_kd(models, x, class_weights=cw, epochs=2)
        assert on_device(kd)
        student = to_device(copy.deepcopy(host[1]))
        distill(student, copy.deepcopy(host[0]), x, epochs=2)
        assert on_device(student)


@pytest.mark.parametrize(
    "method", ["averaging", "otfusion", "rebasin_wm", "rebasin_am"]
)
def test_the_fused_model_is_built_on_model_0(method: str) -> None:
    """Two MLPs with one state layout but other activations: the result is model 0's kind."""
    models = [
        seeded_model(ONE, 0),
        seeded_model(mlp([4], in_shape=[1, 5], activation="gelu"), 1),
    ]
    fused = fuse_by(method, models, inputs(), labels())  # type: ignore[arg-type]
    assert isinstance(fused.act, nn.ReLU)
    swapped = fuse_by(method, models[::-1], inputs(), labels())  # type: ignore[arg-type]
    assert isinstance(swapped.act, nn.GELU)


def test_importance_average_returns_model_0s_dtypes() -> None:
    """Like :func:`average_states`, the first state's dtypes, whatever the others hold."""
    models = seeded_models(ONE, (0, 1))
    states = [d(models[0]), models[1].state_dict()]
    w = [{"linears.0": np.ones(4)}, {"linears.0": np.ones(4)}]
    out = importance_average(states, w, ["linears.0"])
    assert all(v.dtype == torch.float64 for v in out.values())
