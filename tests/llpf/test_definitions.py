"""LLPF against brute-force references on tiny cases, and its refusals and warnings.

Each test pins a definition (stop rule, angular compliance, peak excess, the
M2O target sphere, the AutoNEB update) by recomputing it the slow, obvious
way, so a wrong algorithm gives a different number.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from tests.kit import QUIET, pair_states, same_state, toy_tensors
from wslib.core.interpolation import lerp_state
from wslib.llpf.autoneb import AutoNEBSettings, autoneb, neb_step
from wslib.llpf.curves import CurveSettings, curve_point, fit_curve, lr_factor
from wslib.llpf.evaluation import evaluate_path
from wslib.llpf.layerwise import (
    ComplianceSGD,
    M2MSettings,
    M2OSettings,
    hybrid,
    m2m,
    m2o,
    movable_names,
)
from wslib.llpf.ticks import Refine, refine_point, tensor_variances
from wslib.runs.resumable import Persist

FROZEN = Refine(lr=1e-12, batch_size=16, r_min=1, r_max=1, threshold=1e9)
REFINE = Refine(lr=0.05, batch_size=16, r_min=2, r_max=4, threshold=0.0)


def full_loss(model: nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> float:
    probe = copy.deepcopy(model)
    probe.load_state_dict(state)
    probe.eval()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(probe(x), y))


# --- the refinement's stop rule -----------------------------------------------


def reference_losses(model, x, y, refine, seed, n) -> list[float]:
    """The batch losses of ``n`` plain SGD steps with the refinement's sampling."""
    work = copy.deepcopy(model).train()
    opt = torch.optim.SGD(work.parameters(), lr=refine.lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(n):
        idx = torch.randint(len(x), (refine.batch_size,), generator=gen)
        loss = nn.functional.cross_entropy(work(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def expected_stop(losses: list[float], r_min: int, threshold: float) -> int:
    for k in range(r_min, len(losses) + 1):
        if np.mean(losses[k - r_min : k]) <= threshold:
            return k
    return len(losses)


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8])
def test_refinement_stops_when_the_moving_average_is_under_the_threshold(
    quantile: float,
) -> None:
    model, _, _ = pair_states()
    x, y = toy_tensors(64)
    probe = Refine(lr=0.3, batch_size=8, r_min=3, r_max=40, threshold=0.0)
    losses = reference_losses(model, x, y, probe, 7, probe.r_max)
    windows = [np.mean(losses[k - 3 : k]) for k in range(3, len(losses) + 1)]
    threshold = float(np.quantile(windows, quantile))
    refine = Refine(lr=0.3, batch_size=8, r_min=3, r_max=40, threshold=threshold)
    work = copy.deepcopy(model)
    opt = torch.optim.SGD(work.parameters(), lr=refine.lr)
    steps, loss = refine_point(
        work, opt, x, y, refine, torch.Generator().manual_seed(7)
    )
    k = expected_stop(losses, 3, threshold)
    assert steps == k
    assert loss == pytest.approx(np.mean(losses[k - 3 : k]), rel=1e-5)


def test_refinement_takes_at_least_r_min_steps() -> None:
    model, _, _ = pair_states()
    x, y = toy_tensors(64)
    refine = Refine(lr=0.1, batch_size=8, r_min=4, r_max=9, threshold=1e9)
    opt = torch.optim.SGD(model.parameters(), lr=refine.lr)
    gen = torch.Generator().manual_seed(0)
    assert refine_point(model, opt, x, y, refine, gen)[0] == 4
    never = Refine(lr=0.1, batch_size=8, r_min=4, r_max=9, threshold=0.0)
    assert refine_point(model, opt, x, y, never, gen)[0] == 9


# --- angular compliance ------------------------------------------------------


@pytest.mark.parametrize("compliance", [True, False])
def test_compliance_scales_weight_steps_by_the_variance_ratio(compliance: bool) -> None:
    model, start, _ = pair_states()
    names = [n for n, _ in model.named_parameters()]
    start_var = tensor_variances(start, names)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = toy_tensors(64)
    opt = ComplianceSGD(model, 0.1, start_var, compliance)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    for n, p in model.named_parameters():
        ratio = float(before[n].var()) / start_var[n]
        scale = ratio if compliance and p.dim() > 1 else 1.0
        expected = before[n] - 0.1 * scale * grads[n]
        assert torch.allclose(p.detach(), expected, atol=1e-7), n
    assert ratio == pytest.approx(0.25, rel=1e-5)


# --- peak excess and dense points --------------------------------------------


def permuted(state: dict) -> dict:
    """The same function as ``state`` with the hidden neurons of the first layer reversed."""
    out = dict(state)
    perm = torch.arange(6).flip(0)
    out["linears.0.weight"] = state["linears.0.weight"][perm]
    out["linears.0.bias"] = state["linears.0.bias"][perm]
    out["linears.1.weight"] = state["linears.1.weight"][:, perm]
    return out


def trained(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    work = copy.deepcopy(model)
    opt = torch.optim.SGD(work.parameters(), lr=0.5)
    for _ in range(200):
        loss = nn.functional.cross_entropy(work(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return work.state_dict()


def test_peak_excess_is_the_worst_loss_on_points_and_segments_over_the_worse_end() -> (
    None
):
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    good = trained(model, x, y)
    other = permuted(good)
    # worst loss inside a segment, then a worse end than the start
    states = [good, other, lerp_state(b, a, 0.5), a]
    dense = 2
    res = evaluate_path(model, states, x, y, x, y, dense=dense, progress=False)
    points = [full_loss(model, s, x, y) for s in states]
    inner = [
        [full_loss(model, lerp_state(s, t, f), x, y) for f in (1 / 3, 2 / 3)]
        for s, t in zip(states[:-1], states[1:])
    ]
    assert res["train_loss"] == pytest.approx(points, rel=1e-5)
    assert np.asarray(res["dense_loss"]) == pytest.approx(np.array(inner), rel=1e-5)
    worst = max(max(points), max(max(r) for r in inner))
    assert res["peak_loss"] == pytest.approx(worst, rel=1e-5)
    assert res["peak_excess"] == pytest.approx(
        worst - max(points[0], points[-1]), rel=1e-5
    )
    # the barrier against the straight interpolation of the endpoint losses,
    # at positions by recorded index: point k at k / 3, inner points between
    pos = [k / 3 for k in range(4)]
    line = [(1 - t) * points[0] + t * points[-1] for t in pos]
    over = [p - q for p, q in zip(points, line)]
    for k, row in enumerate(inner):
        for j, loss in enumerate(row):
            t = (k + (j + 1) / 3) / 3
            over.append(loss - ((1 - t) * points[0] + t * points[-1]))
    assert res["interp_barrier"] == pytest.approx(max(over), rel=1e-5)
    # the case is built so that every term matters
    assert max(max(r) for r in inner) > max(points)
    assert points[0] != points[-1]


def test_a_path_low_only_at_its_points_is_caught_by_its_segments() -> None:
    model, _, _ = pair_states()
    x, y = toy_tensors(64)
    good = trained(model, x, y)
    res = evaluate_path(
        model, [good, permuted(good)], x, y, x, y, dense=1, progress=False
    )
    assert res["train_loss"][0] == pytest.approx(res["train_loss"][1], rel=1e-5)
    mid = full_loss(model, lerp_state(good, permuted(good), 0.5), x, y)
    assert res["peak_excess"] == pytest.approx(mid - res["train_loss"][0], rel=1e-5)
    assert res["peak_excess"] > 0.01


# --- M2O towards a target sphere ---------------------------------------------


def ticks_to_target(v: float, target: float, shrink: float, tol: float) -> int:
    """Ticks a tensor of variance ``v`` needs to reach ``target`` (frozen refinement)."""
    k = 0
    while abs(v / target - 1) > tol:
        factor = max((1 - shrink) ** 2, target / v) if target < v else None
        if factor is None:
            factor = min((1 - shrink) ** -2, target / v)
        v *= factor
        k += 1
    return k


@pytest.mark.parametrize("scale", [0.3, 1.6])
def test_m2o_phase_ends_on_the_target_sphere_at_the_expected_tick(
    scale: float,
) -> None:
    model, a, b = pair_states()
    dest = {k: v * scale for k, v in b.items()}
    x, y = toy_tensors(64)
    names = movable_names(model)
    va, vd = tensor_variances(a, names), tensor_variances(dest, names)
    expected = max(ticks_to_target(va[n], vd[n], 0.1, 0.01) for n in names)
    path = hybrid(
        model,
        a,
        dest,
        x,
        y,
        m2o_ticks=200,
        shrink=0.1,
        m2m_ticks=3,
        refine=FROZEN,
        record_every=1,
        persist=QUIET,
    )
    assert path.phase.count("m2o") == expected + 1
    switch = path.states[expected]
    reached = tensor_variances(switch, names)
    assert all(reached[n] == pytest.approx(vd[n], rel=0.011) for n in names)
    assert same_state(path.states[-1], dest)


def test_m2o_stops_once_the_target_is_reached_before_refinement() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    names = movable_names(model)
    target = {n: v * 0.5 for n, v in tensor_variances(a, names).items()}
    pushy = Refine(lr=0.5, batch_size=16, r_min=3, r_max=3, threshold=0.0)
    path = m2o(
        model,
        a,
        x,
        y,
        M2OSettings(
            ticks=100, shrink=0.2, refine=pushy, target_variance=target, record_every=1
        ),
        persist=QUIET,
    )
    assert len(path.refine_loss) < 10


def test_finished_m2o_run_is_not_extended_on_resume(tmp_path) -> None:
    model, a, _ = pair_states()
    x, y = toy_tensors(64)
    target = {n: v * 0.5 for n, v in tensor_variances(a, movable_names(model)).items()}
    options = {
        "ticks": 50,
        "shrink": 0.2,
        "refine": REFINE,
        "target_variance": target,
        "record_every": 1,
    }
    persist = Persist(tmp_path / "m2o.pt", checkpoint_every=100, progress=False)
    first = m2o(model, a, x, y, M2OSettings(**options), persist=persist)
    assert first.ticks[-1] < 50
    for _ in range(2):
        again = m2o(model, a, x, y, M2OSettings(**options), persist=persist)
        assert again.ticks == first.ticks
        assert all(same_state(s, t) for s, t in zip(first.states, again.states))


def test_checkpoint_of_another_path_seed_is_not_resumed(tmp_path) -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    options = {"ticks": 4, "refine": REFINE, "record_every": 1}
    ckpt = tmp_path / "path.pt"
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(seed=1, **options),
        persist=Persist(ckpt, progress=False),
    )
    fresh = m2m(model, a, b, x, y, M2MSettings(seed=2, **options), persist=QUIET)
    with pytest.warns(UserWarning, match="another run"):
        other = m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(seed=2, **options),
            persist=Persist(ckpt, progress=False),
        )
    assert all(same_state(s, t) for s, t in zip(fresh.states, other.states))


# --- refusals and warnings ---------------------------------------------------


def test_nan_in_a_model_is_refused() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    bad = dict(b)
    bad["linears.1.weight"] = b["linears.1.weight"].clone()
    bad["linears.1.weight"][0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        m2m(model, a, bad, x, y, M2MSettings(ticks=3), persist=QUIET)
    with pytest.raises(ValueError, match="NaN or infinite"):
        m2o(model, bad, x, y, M2OSettings(ticks=3), persist=QUIET)


def test_m2o_target_above_the_start_is_refused_unless_growing() -> None:
    model, a, _ = pair_states()
    x, y = toy_tensors(64)
    up = {n: v * 2.0 for n, v in tensor_variances(a, movable_names(model)).items()}
    with pytest.raises(ValueError, match="only shrinks"):
        m2o(model, a, x, y, M2OSettings(ticks=3, target_variance=up), persist=QUIET)
    path = m2o(
        model,
        a,
        x,
        y,
        M2OSettings(
            ticks=50,
            shrink=0.1,
            refine=FROZEN,
            target_variance=up,
            grow=True,
            record_every=1,
        ),
        persist=QUIET,
    )
    end = tensor_variances(path.states[-1], list(up))
    assert all(end[n] == pytest.approx(up[n], rel=0.011) for n in up)


def test_m2o_out_of_ticks_before_the_target_warns() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    small = {k: v * 0.2 for k, v in b.items()}
    with pytest.warns(UserWarning, match="ran out of ticks"):
        path = hybrid(
            model,
            a,
            small,
            x,
            y,
            m2o_ticks=2,
            shrink=0.05,
            m2m_ticks=20,
            refine=REFINE,
            persist=QUIET,
        )
    assert same_state(path.states[-1], small)


def test_m2m_last_tick_long_jump_warns() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    with pytest.warns(UserWarning, match=r"straight jump over (9[5-9]|100)%"):
        m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=5, step=1e-3, refine=FROZEN),
            persist=QUIET,
        )


def test_m2m_with_a_small_final_gap_does_not_warn() -> None:
    import warnings

    model, a, b = pair_states()
    x, y = toy_tensors(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m2m(model, a, b, x, y, M2MSettings(ticks=12, refine=FROZEN), persist=QUIET)


# --- AutoNEB and curves ------------------------------------------------------


def test_neb_step_removes_the_tangent_gradient_and_adds_the_spring() -> None:
    chain = [
        torch.tensor([0.0, 0.0]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([4.0, 0.0]),
    ]
    grad = torch.tensor([3.0, 5.0])
    new = neb_step(chain, [grad], lr=0.1, spring=2.0)
    tau = torch.tensor([1.0, 0.0])  # (p2 - p0) / |p2 - p0|
    g_perp = torch.tensor([0.0, 5.0])
    spring = 2.0 * (math.sqrt(9 + 1) - math.sqrt(2)) * tau
    expected = chain[1] - 0.1 * g_perp + 0.1 * spring
    assert torch.allclose(new[1], expected, atol=1e-6)
    assert torch.equal(new[0], chain[0]) and torch.equal(new[2], chain[2])


def test_autoneb_spends_exactly_the_total_steps() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    for total in (0, 7, 23):
        path = autoneb(
            model,
            a,
            b,
            x,
            y,
            AutoNEBSettings(
                n_init=2,
                cycles=3,
                lrs=[0.1, 0.05, 0.02],
                batch_size=16,
                check_examples=32,
                max_pivots=6,
                insert_tol=-1.0,
                total_steps=total,
            ),
            persist=QUIET,
        )
        assert path.total_grad_steps == total
    with pytest.raises(ValueError, match="total_steps"):
        autoneb(
            model, a, b, x, y, AutoNEBSettings(n_init=0, total_steps=5), persist=QUIET
        )


def test_curve_points_follow_their_formulas() -> None:
    a, bend, b = (
        {"w": torch.tensor([1.0])},
        {"w": torch.tensor([5.0])},
        {"w": torch.tensor([3.0])},
    )
    assert float(curve_point(a, bend, b, 0.25, "bezier")["w"]) == pytest.approx(
        0.5625 * 1 + 0.375 * 5 + 0.0625 * 3
    )
    assert float(curve_point(a, bend, b, 0.25, "polychain")["w"]) == pytest.approx(3.0)
    assert float(curve_point(a, bend, b, 0.75, "polychain")["w"]) == pytest.approx(4.0)


def test_garipov_schedule_and_constant_schedule() -> None:
    assert [lr_factor("garipov", f) for f in (0.0, 0.5, 0.7, 0.9, 0.95)] == (
        pytest.approx([1.0, 1.0, 1.0 - 0.2 / 0.4 * 0.99, 0.01, 0.01])
    )
    assert lr_factor("constant", 0.95) == 1.0
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    with pytest.raises(ValueError, match="schedule"):
        fit_curve(model, a, b, x, y, CurveSettings(schedule="cosine"), persist=QUIET)


def test_curve_weight_decay_is_on_the_network_at_t() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    wd, lr = 0.3, 0.5
    path = fit_curve(
        model,
        a,
        b,
        x,
        y,
        CurveSettings(
            steps=1, lr=lr, momentum=0.0, batch_size=16, n_eval=3, weight_decay=wd
        ),
        persist=QUIET,
    )
    gen = torch.Generator().manual_seed(0)
    t = float(torch.rand((), generator=gen))
    idx = torch.randint(len(x), (16,), generator=gen)
    bend = {n: (0.5 * (a[n] + b[n])).clone().requires_grad_(True) for n in a}
    point = curve_point(a, bend, b, t, "bezier")
    out = functional_call(model, point, x[idx])
    loss = nn.functional.cross_entropy(out, y[idx])
    (loss + 0.5 * wd * sum((w**2).sum() for w in point.values())).backward()
    moved = {n: (bend[n] - lr * bend[n].grad).detach() for n in a}
    middle = curve_point(a, moved, b, 0.5, "bezier")
    for n in a:
        assert torch.allclose(path.states[1][n], middle[n], atol=1e-6), n


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold": float("nan")},
        {"threshold": -0.1},
        {"threshold": float("inf")},
        {"lr": float("nan")},
        {"lr": float("inf")},
    ],
)
def test_refine_refuses_values_that_would_run_silently_wrong(bad: dict) -> None:
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"{name} must be"):
        Refine(**bad)


@pytest.mark.parametrize(
    "precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)]
)
def test_refinement_runs_its_forward_pass_in_its_precision(precision, dtype) -> None:
    model, _, _ = pair_states()
    x, y = toy_tensors(64)
    seen = []
    model.linears[-1].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    refine = Refine(lr=0.1, batch_size=8, r_min=2, r_max=2, precision=precision)
    opt = torch.optim.SGD(model.parameters(), lr=refine.lr)
    refine_point(model, opt, x, y, refine, torch.Generator().manual_seed(0))
    assert seen == [dtype, dtype]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_refine_names_an_unknown_precision() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        Refine(precision="fp16")


@pytest.mark.parametrize("method", ["curve", "autoneb"])
def test_baselines_train_in_their_precision(method: str) -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)
    seen: list[torch.dtype] = []
    model.linears[-1].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    if method == "curve":
        options: dict = {"steps": 2, "n_eval": 3}
        kind, method_fn = CurveSettings, fit_curve
    else:
        options = {"n_init": 1, "cycles": 1, "lrs": [0.1], "total_steps": 2}
        kind, method_fn = AutoNEBSettings, autoneb

    def run(**precision: str) -> None:
        settings = kind(batch_size=16, **options, **precision)
        method_fn(model, a, b, x, y, settings, persist=QUIET)

    run(precision="bf16")
    assert torch.bfloat16 in seen
    seen.clear()
    run()
    assert torch.bfloat16 not in seen and seen
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        run(precision="fp16")


def test_autoneb_draws_from_its_seed() -> None:
    model, a, b = pair_states()
    x, y = toy_tensors(64)

    def middle(seed: int) -> dict[str, torch.Tensor]:
        path = autoneb(
            model, a, b, x, y, AutoNEBSettings(n_init=1, cycles=1, lrs=[0.1], batch_size=8, total_steps=3, seed=seed),
            persist=QUIET,
        )  # fmt: skip
        return path.states[1]

    first, again, other = middle(1), middle(1), middle(2)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
