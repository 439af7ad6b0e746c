"""LLPF path finders and the path evaluation: invariants on tiny models and data."""

from __future__ import annotations

import pytest
import torch

from tests.kit import (
    MLP,
    QUIET,
    RESNET,
    TRANSFORMER,
    pair_states,
    same_state,
    toy_tensors,
)
from wslib.core.norms import norm_parameter_names
from wslib.llpf.autoneb import AutoNEBSettings
from wslib.llpf.curves import CurveSettings
from wslib.llpf.evaluation import evaluate_path
from wslib.llpf.layerwise import M2MSettings, M2OSettings, hybrid, m2m, m2o
from wslib.llpf.ticks import Refine, project_on_spheres, tensor_variances
from wslib.runs.resumable import Persist

REFINE = Refine(lr=0.05, batch_size=16, r_min=2, r_max=4, threshold=0.0)


class Interrupt(RuntimeError):
    """Raised by a callback to simulate a killed run."""


@pytest.mark.parametrize("config", [MLP, RESNET, TRANSFORMER])
def test_m2m_path_starts_and_ends_on_the_modes(config: dict) -> None:
    model, a, b = pair_states(config)
    x, y = toy_tensors(64)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=6, refine=REFINE, record_every=2),
        persist=QUIET,
    )
    assert same_state(path.states[0], a)
    assert same_state(path.states[-1], b)
    assert path.ticks == [0, 2, 4, 6]
    assert path.grad_steps == sorted(path.grad_steps) and path.total_grad_steps > 0


def test_m2m_between_identical_modes_ends_on_them() -> None:
    """Identical ends (distance 0): no division by the start's distance."""
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(64)
    path = m2m(
        model,
        a,
        a,
        x,
        y,
        M2MSettings(ticks=4, refine=REFINE, record_every=2),
        persist=QUIET,
    )
    assert same_state(path.states[0], a) and same_state(path.states[-1], a)


def test_fdf_moves_input_stage_first() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(64)
    frozen = Refine(lr=1e-12, batch_size=16, r_min=1, r_max=1, threshold=0.0)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=10, refine=frozen, stage_ticks=4, record_every=1),
        persist=QUIET,
    )
    moved = path.states[2]  # after two ticks only stage 0 moves
    assert not torch.allclose(moved["linears.0.weight"], a["linears.0.weight"])
    assert torch.allclose(moved["linears.2.weight"], a["linears.2.weight"], atol=1e-6)


def test_variance_correction_puts_tensors_back_on_the_sphere() -> None:
    model, a, b = pair_states(MLP)
    target = tensor_variances(a, [n for n, _ in model.named_parameters()])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3).add_(0.1)
    project_on_spheres(model, target)
    now = tensor_variances(model.state_dict(), list(target))
    for name, v in target.items():
        assert now[name] == pytest.approx(v, rel=1e-4)
    x, y = toy_tensors(64)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=5, refine=REFINE, record_every=1),
        persist=QUIET,
    )
    for state in path.states[1:-1]:
        inner = tensor_variances(state, list(target))
        assert all(inner[n] == pytest.approx(target[n], rel=1e-3) for n in target)


def test_m2m_is_deterministic_per_seed() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(64)
    run = [
        m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=5, refine=REFINE, seed=s, record_every=1),
            persist=QUIET,
        )
        for s in (3, 3, 4)
    ]
    assert all(same_state(s, t) for s, t in zip(run[0].states, run[1].states))
    assert not same_state(run[0].states[2], run[2].states[2])


def test_killed_run_resumes_on_the_same_path(tmp_path) -> None:
    model, a, b = pair_states(RESNET)
    x, y = toy_tensors(64)
    options = {
        "ticks": 9,
        "refine": REFINE,
        "seed": 5,
        "record_every": 2,
    }
    full = m2m(model, a, b, x, y, M2MSettings(**options), persist=QUIET)

    def kill(tick: int, _: torch.nn.Module) -> None:
        if tick == 7:
            raise Interrupt

    ckpt = tmp_path / "path.pt"
    with pytest.raises(Interrupt):
        m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(**options),
            persist=Persist(ckpt, checkpoint_every=3, progress=False, on_tick=kill),
        )
    assert torch.load(ckpt / "index.pt", weights_only=True)["tick"] == 6
    resumed = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(**options),
        persist=Persist(ckpt, checkpoint_every=3, progress=False),
    )
    assert resumed.ticks == full.ticks and resumed.grad_steps == full.grad_steps
    assert all(same_state(s, t) for s, t in zip(full.states, resumed.states))


def test_unreadable_checkpoint_is_ignored_with_a_warning(tmp_path) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(64)
    ckpt = tmp_path / "path"
    ckpt.mkdir()
    (ckpt / "index.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable"):
        path = m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=3, refine=REFINE),
            persist=Persist(ckpt, progress=False),
        )
    assert same_state(path.states[-1], b)


def test_m2o_shrinks_weights_and_leaves_norm_layers() -> None:
    model, a, _ = pair_states(RESNET)
    x, y = toy_tensors(64)
    path = m2o(
        model,
        a,
        x,
        y,
        M2OSettings(ticks=6, shrink=0.2, refine=REFINE, record_every=3),
        persist=QUIET,
    )
    frozen = norm_parameter_names(model)
    assert "stem.bn.weight" in frozen
    end = path.states[-1]
    assert end["head.weight"].var() < a["head.weight"].var()
    no_refine = Refine(lr=1e-12, batch_size=16, r_min=1, r_max=1, threshold=0.0)
    still = m2o(
        model,
        a,
        x,
        y,
        M2OSettings(ticks=3, shrink=0.2, refine=no_refine, record_every=3),
        persist=QUIET,
    ).states[-1]
    assert all(torch.allclose(still[n], a[n]) for n in frozen)
    assert torch.allclose(still["head.weight"], a["head.weight"] * 0.8**3, atol=1e-6)


def test_hybrid_reaches_destination_across_spheres() -> None:
    model, a, b = pair_states(MLP)
    small = {k: v * 0.5 for k, v in b.items()}
    x, y = toy_tensors(64)
    path = hybrid(
        model,
        a,
        small,
        x,
        y,
        m2o_ticks=20,
        shrink=0.2,
        m2m_ticks=4,
        refine=REFINE,
        record_every=2,
        persist=QUIET,
    )
    assert same_state(path.states[0], a) and same_state(path.states[-1], small)
    assert "m2o" in path.phase and path.phase[-1] == "m2m"


def test_hybrid_calls_on_tick_in_both_phases_with_the_paths_ticks(tmp_path) -> None:
    model, a, b = pair_states(MLP)
    small = {k: v * 0.5 for k, v in b.items()}
    x, y = toy_tensors(64)
    seen: list[int] = []

    def on_tick(tick: int, work: torch.nn.Module) -> None:
        assert isinstance(work, torch.nn.Module)
        seen.append(tick)

    persist = Persist(tmp_path / "hyb", progress=False, on_tick=on_tick)
    path = hybrid(
        model,
        a,
        small,
        x,
        y,
        m2o_ticks=20,
        shrink=0.2,
        m2m_ticks=4,
        refine=REFINE,
        record_every=1,
        persist=persist,
    )
    switch = path.ticks[path.phase.index("m2m") - 1]
    assert 0 < switch < path.ticks[-1] == switch + 4
    assert seen == path.ticks[1:] == list(range(1, path.ticks[-1] + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyb-m2m", "hyb-m2o"]


def test_evaluate_path_reports_metrics() -> None:
    model, a, b = pair_states(RESNET)
    x, y = toy_tensors(64)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=4, refine=REFINE, record_every=1),
        persist=QUIET,
    )
    res = evaluate_path(model, path, x, y, x, y, dense=2, progress=False)
    assert res["train_loss"].shape == (5,) and res["dense_loss"].shape == (4, 2)
    assert res["distances"][0] == pytest.approx(1.0) and res["distances"][
        -1
    ] == pytest.approx(0.0)
    # the definition (brute-force check in test_definitions.py): worst of points
    # and segment points, minus the worse endpoint
    worst = max(res["train_loss"].max(), res["dense_loss"].max())
    assert res["peak_excess"] == pytest.approx(
        worst - max(res["train_loss"][0], res["train_loss"][-1])
    )
    assert res["grad_steps"] == path.total_grad_steps


def test_mismatched_models_raise_clear_errors() -> None:
    model, a, _ = pair_states(MLP)
    _, _, other = pair_states({**MLP, "widths": [7, 5]})
    x, y = toy_tensors(64)
    with pytest.raises(ValueError, match="same architecture"):
        m2m(model, a, other, x, y, M2MSettings(ticks=2), persist=QUIET)
    _, c, _ = pair_states(RESNET)
    with pytest.raises(ValueError, match="same architecture"):
        m2m(model, a, c, x, y, M2MSettings(ticks=2), persist=QUIET)
    with pytest.raises(ValueError, match="r_min"):
        Refine(r_min=5, r_max=2)


@pytest.mark.parametrize("kind", ["bezier", "polychain"])
def test_curve_keeps_endpoints_and_trains_the_bend(kind: str) -> None:
    from wslib.llpf.curves import fit_curve

    model, a, b = pair_states(RESNET)
    x, y = toy_tensors(64)
    path = fit_curve(
        model,
        a,
        b,
        x,
        y,
        CurveSettings(kind=kind, steps=5, batch_size=16, n_eval=5),
        persist=QUIET,
    )
    assert same_state(path.states[0], a) and same_state(path.states[-1], b)
    assert path.total_grad_steps == 5 and len(path.states) == 5
    untrained = fit_curve(
        model, a, b, x, y, CurveSettings(kind=kind, steps=0, n_eval=5), persist=QUIET
    )
    middle = untrained.states[2]["head.weight"]
    assert torch.allclose(
        middle, 0.5 * (a["head.weight"] + b["head.weight"]), atol=1e-6
    )
    assert not torch.allclose(path.states[2]["head.weight"], middle)
    with pytest.raises(ValueError, match="curve kind"):
        fit_curve(model, a, b, x, y, CurveSettings(kind="spline"), persist=QUIET)


def test_autoneb_keeps_endpoints_and_inserts_pivots() -> None:
    from wslib.llpf.autoneb import autoneb

    model, a, b = pair_states(MLP)
    x, y = toy_tensors(64)
    path = autoneb(
        model,
        a,
        b,
        x,
        y,
        AutoNEBSettings(
            n_init=1,
            cycles=2,
            steps_per_cycle=3,
            lrs=[0.1, 0.05],
            batch_size=16,
            insert_tol=-1.0,
            check_examples=32,
            max_pivots=5,
        ),
        persist=QUIET,
    )
    assert same_state(path.states[0], a) and same_state(path.states[-1], b)
    assert len(path.states) == 5  # 3 pivots, then insertions up to max_pivots
    assert path.total_grad_steps >= 3 + 3  # one step per interior pivot per iteration
    with pytest.raises(ValueError, match="one learning rate per cycle"):
        autoneb(model, a, b, x, y, AutoNEBSettings(cycles=2, lrs=[0.1]), persist=QUIET)


@pytest.mark.parametrize(
    "config",
    [
        {"name": "resnet18", "in_shape": [3, 32, 32], "n_classes": 10, "width": 0.0625},
        {
            "name": "vit",
            "in_shape": [3, 32, 32],
            "n_classes": 10,
            "patch_size": 8,
            "embed_dim": 16,
            "depth": 2,
            "heads": 2,
            "mlp_dim": 16,
        },
    ],
)
@pytest.mark.filterwarnings("ignore:M2(O|M):UserWarning")
def test_gpu_profile_code_paths_on_tiny_cifar(tmp_path, config: dict) -> None:
    """The paper-scale architectures on CIFAR-format files, for a few ticks of every method."""
    import numpy as np

    from tests.fixtures import write_cifar10
    from wslib.core.data import load_dataset
    from wslib.llpf.autoneb import autoneb
    from wslib.llpf.curves import fit_curve

    write_cifar10(tmp_path / "cifar10", np.random.default_rng(0))
    ds = load_dataset("cifar10", root=tmp_path)
    model, a, b = pair_states(config)
    x, y = ds.x_train, ds.y_train
    refine = Refine(lr=0.01, batch_size=4, r_min=1, r_max=2, threshold=0.0)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=3, refine=refine, stage_ticks=0, record_every=1),
        persist=QUIET,
    )
    assert same_state(path.states[-1], b)
    half = {k: v * 0.5 if v.is_floating_point() else v for k, v in b.items()}
    assert same_state(
        hybrid(
            model,
            a,
            half,
            x,
            y,
            m2o_ticks=2,
            shrink=0.3,
            m2m_ticks=2,
            refine=refine,
            record_every=1,
            persist=QUIET,
        ).states[-1],
        half,
    )
    curve = fit_curve(
        model, a, b, x, y, CurveSettings(steps=2, batch_size=4, n_eval=3), persist=QUIET
    )
    neb = autoneb(
        model,
        a,
        b,
        x,
        y,
        AutoNEBSettings(
            n_init=1,
            cycles=1,
            steps_per_cycle=1,
            lrs=[0.01],
            batch_size=4,
            check_examples=8,
            max_pivots=3,
        ),
        persist=QUIET,
    )
    for p in (path, curve, neb):
        res = evaluate_path(
            model,
            p,
            ds.x_train,
            ds.y_train,
            ds.x_test,
            ds.y_test,
            dense=1,
            progress=False,
        )
        assert np.isfinite(res["peak_excess"])
