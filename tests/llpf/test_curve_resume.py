"""Issue 20: Bezier / PolyChain curves and AutoNEB resume from their checkpoints."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.kit import QUIET, mlp
from wslib.core.configs import build_model
from wslib.core.data import Dataset
from wslib.llpf.autoneb import AutoNEBSettings, autoneb
from wslib.llpf.curves import CurveSettings, fit_curve
from wslib.llpf.methods import baseline_checkpoint, method_run
from wslib.llpf.protocols import PathSetup
from wslib.runs.resumable import Persist
from wslib.runs.units import CACHED_ONLY, NotCached

# The modules (the package exports functions of the same names).
curves = importlib.import_module("wslib.llpf.curves")
autoneb_module = importlib.import_module("wslib.llpf.autoneb")
MLP = mlp([5], in_shape=[1, 6])
# Momentum, the authors' schedule and weight decay: every piece of state counts.
CURVE = {
    "kind": "bezier",
    "steps": 12,
    "lr": 0.1,
    "momentum": 0.9,
    "batch_size": 8,
    "n_eval": 4,
    "seed": 3,
    "weight_decay": 1e-3,
    "schedule": "garipov",
}
NEB = {
    "n_init": 1,
    "cycles": 3,
    "lrs": [0.2, 0.1, 0.05],
    "batch_size": 8,
    "check_examples": 16,
    "max_pivots": 5,
    "insert_tol": -1.0,  # a pivot inserted after every cycle: the chain grows
    "total_steps": 9,
    "seed": 2,
}


class Kill(Exception):
    """Stands for a killed job."""


def pair() -> tuple[nn.Module, dict, dict]:
    torch.manual_seed(0)
    a = build_model(MLP)
    torch.manual_seed(1)
    b = build_model(MLP)
    return a, a.state_dict(), b.state_dict()


def data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 1, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def kill_after(n: int):
    def hook(k: int) -> None:
        if k == n:
            raise Kill

    return hook


def count_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the SGD steps of curves (each one draws a ``t``)."""
    calls: list[int] = []
    real = curves.curve_point

    def counting(a, bend, b, t, kind):
        if torch.is_grad_enabled():
            calls.append(1)
        return real(a, bend, b, t, kind)

    monkeypatch.setattr(curves, "curve_point", counting)
    return calls


def same_states(p, q) -> None:
    assert len(p.states) == len(q.states)
    for s, r in zip(p.states, q.states):
        assert s.keys() == r.keys()
        for k in s:
            assert torch.equal(s[k], r[k]), k


# --- curves -------------------------------------------------------------------


@pytest.mark.parametrize("kill", [5, 7])
def test_curve_killed_then_resumed_equals_an_uninterrupted_run(
    tmp_path: Path, kill: int
) -> None:
    model, a, b = pair()
    x, y = data()
    whole = fit_curve(model, a, b, x, y, CurveSettings(**CURVE), persist=QUIET)
    ckpt = tmp_path / "curve.pt"
    killed = Persist(ckpt, checkpoint_every=5, progress=False, on_tick=kill_after(kill))
    with pytest.raises(Kill):
        fit_curve(model, a, b, x, y, CurveSettings(**CURVE), persist=killed)
    assert torch.load(ckpt, weights_only=True)["tick"] == 5
    seen: list[int] = []
    again = Persist(ckpt, checkpoint_every=5, progress=False, on_tick=seen.append)
    resumed = fit_curve(model, a, b, x, y, CurveSettings(**CURVE), persist=again)
    assert seen == list(range(6, CURVE["steps"] + 1))
    same_states(resumed, whole)
    assert resumed.total_grad_steps == whole.total_grad_steps == CURVE["steps"]
    assert torch.load(ckpt, weights_only=True)["tick"] == CURVE["steps"]


def test_curve_checkpoint_holds_the_whole_state(tmp_path: Path) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "curve.pt"
    killed = Persist(ckpt, checkpoint_every=4, progress=False, on_tick=kill_after(4))
    with pytest.raises(Kill):
        fit_curve(model, a, b, x, y, CurveSettings(**CURVE), persist=killed)
    saved = torch.load(ckpt, weights_only=True)
    assert saved["tick"] == 4
    momentum = saved["optimizer"]["state"]
    assert len(momentum) == len(saved["bend"])
    assert all(v["momentum_buffer"].abs().sum() > 0 for v in momentum.values())
    gen = torch.Generator().manual_seed(CURVE["seed"])
    for _ in range(4):  # each step draws t and a batch
        torch.rand((), generator=gen)
        torch.randint(len(x), (CURVE["batch_size"],), generator=gen)
    assert torch.equal(saved["generator"], gen.get_state())
    mid = {n: 0.5 * (a[n] + b[n]) for n in saved["bend"]}
    assert any(not torch.equal(saved["bend"][n], mid[n]) for n in mid)
    assert saved["seconds"] > 0


def test_a_finished_curve_returns_without_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "curve.pt"
    first = fit_curve(
        model, a, b, x, y, CurveSettings(**CURVE), persist=Persist(ckpt, progress=False)
    )
    assert torch.load(ckpt, weights_only=True)["tick"] == CURVE["steps"]
    calls = count_steps(monkeypatch)
    again = fit_curve(
        model, a, b, x, y, CurveSettings(**CURVE), persist=Persist(ckpt, progress=False)
    )
    assert calls == []
    same_states(again, first)
    assert again.total_grad_steps == CURVE["steps"]
    monkeypatch.setenv(CACHED_ONLY, "1")  # nothing to compute: no refusal
    fit_curve(
        model, a, b, x, y, CurveSettings(**CURVE), persist=Persist(ckpt, progress=False)
    )


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 4},
        {"lr": 0.2},
        {"momentum": 0.5},
        {"steps": 13},
        {"kind": "polychain"},
        {"schedule": "constant"},
        {"weight_decay": 0.0},
        {"batch_size": 9},
    ],
)
def test_a_curve_checkpoint_of_another_run_warns_and_restarts(
    tmp_path: Path, change: dict
) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "curve.pt"
    fit_curve(
        model, a, b, x, y, CurveSettings(**CURVE), persist=Persist(ckpt, progress=False)
    )
    other = {**CURVE, **change}
    with pytest.warns(UserWarning, match="written for another run"):
        restarted = fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**other),
            persist=Persist(ckpt, progress=False),
        )
    same_states(
        restarted, fit_curve(model, a, b, x, y, CurveSettings(**other), persist=QUIET)
    )


def test_curve_key_covers_the_endpoints_and_the_data(tmp_path: Path) -> None:
    model, a, b = pair()
    x, y = data()
    for i, (s, e, labels) in enumerate([(b, a, y), (a, b, (y + 1) % 3)]):
        ckpt = tmp_path / f"curve{i}.pt"
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(ckpt, progress=False),
        )
        with pytest.warns(UserWarning, match="another run"):
            fit_curve(
                model,
                s,
                e,
                x,
                labels,
                CurveSettings(**CURVE),
                persist=Persist(ckpt, progress=False),
            )


def test_a_damaged_curve_checkpoint_warns_and_a_folder_raises(tmp_path: Path) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "curve.pt"
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable"):
        restarted = fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(ckpt, progress=False),
        )
    same_states(
        restarted, fit_curve(model, a, b, x, y, CurveSettings(**CURVE), persist=QUIET)
    )
    saved = torch.load(ckpt, weights_only=True)
    del saved["optimizer"]
    torch.save(saved, ckpt)
    with pytest.warns(UserWarning, match="incomplete"):
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(ckpt, progress=False),
        )
    with pytest.raises(FileExistsError, match="is a folder"):
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(tmp_path, progress=False),
        )
    with pytest.raises(ValueError, match="checkpoint_every"):
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(ckpt, checkpoint_every=0, progress=False),
        )
    with pytest.raises(ValueError, match="name it with .pt"):
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(tmp_path / "curve.json", progress=False),
        )


def test_curves_refuse_to_compute_under_cached_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = pair()
    x, y = data()
    monkeypatch.setenv(CACHED_ONLY, "1")
    with pytest.raises(NotCached, match="Bezier curve"):
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**CURVE),
            persist=Persist(tmp_path / "c.pt", progress=False),
        )
    assert not (tmp_path / "c.pt").exists()
    with pytest.raises(NotCached, match="PolyChain curve"):
        fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(**{**CURVE, "kind": "polychain"}),
            persist=QUIET,
        )


def test_a_zero_step_curve_saves_a_finished_checkpoint(tmp_path: Path) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "curve.pt"
    fit_curve(
        model,
        a,
        b,
        x,
        y,
        CurveSettings(**{**CURVE, "steps": 0}),
        persist=Persist(ckpt, progress=False),
    )
    assert torch.load(ckpt, weights_only=True)["tick"] == 0


# --- AutoNEB ------------------------------------------------------------------


def count_neb_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = autoneb_module.neb_step

    def counting(chain, grads, lr, spring):
        calls.append(len(grads))
        return real(chain, grads, lr, spring)

    monkeypatch.setattr(autoneb_module, "neb_step", counting)
    return calls


@pytest.mark.parametrize("kill", [1, 2])
def test_autoneb_killed_then_resumed_equals_an_uninterrupted_run(
    tmp_path: Path, kill: int
) -> None:
    model, a, b = pair()
    x, y = data()
    whole = autoneb(model, a, b, x, y, AutoNEBSettings(**NEB), persist=QUIET)
    ckpt = tmp_path / "neb.pt"
    with pytest.raises(Kill):
        autoneb(
            model,
            a,
            b,
            x,
            y,
            AutoNEBSettings(**NEB),
            persist=Persist(ckpt, progress=False, on_tick=kill_after(kill)),
        )
    saved = torch.load(ckpt, weights_only=True)
    assert saved["tick"] == kill
    assert saved["steps"] == round(NEB["total_steps"] * kill / NEB["cycles"])
    assert len(saved["chain"]) == NEB["max_pivots"]  # the inserted pivots are saved
    seen: list[int] = []
    resumed = autoneb(
        model,
        a,
        b,
        x,
        y,
        AutoNEBSettings(**NEB),
        persist=Persist(ckpt, progress=False, on_tick=seen.append),
    )
    assert seen == list(range(kill + 1, NEB["cycles"] + 1))
    same_states(resumed, whole)
    assert resumed.total_grad_steps == whole.total_grad_steps == NEB["total_steps"]


def test_a_finished_autoneb_returns_without_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "neb.pt"
    first = autoneb(
        model, a, b, x, y, AutoNEBSettings(**NEB), persist=Persist(ckpt, progress=False)
    )
    calls = count_neb_steps(monkeypatch)
    monkeypatch.setenv(CACHED_ONLY, "1")
    again = autoneb(
        model, a, b, x, y, AutoNEBSettings(**NEB), persist=Persist(ckpt, progress=False)
    )
    assert calls == []
    same_states(again, first)
    assert again.total_grad_steps == NEB["total_steps"]


@pytest.mark.parametrize(
    "change",
    [{"seed": 3}, {"lrs": [0.2, 0.1, 0.04]}, {"total_steps": 10}, {"insert_tol": 9.0}],
)
def test_an_autoneb_checkpoint_of_another_run_warns_and_restarts(
    tmp_path: Path, change: dict
) -> None:
    model, a, b = pair()
    x, y = data()
    ckpt = tmp_path / "neb.pt"
    autoneb(
        model, a, b, x, y, AutoNEBSettings(**NEB), persist=Persist(ckpt, progress=False)
    )
    other = {**NEB, **change}
    with pytest.warns(UserWarning, match="AutoNEB checkpoint .* another run"):
        restarted = autoneb(
            model,
            a,
            b,
            x,
            y,
            AutoNEBSettings(**other),
            persist=Persist(ckpt, progress=False),
        )
    same_states(
        restarted, autoneb(model, a, b, x, y, AutoNEBSettings(**other), persist=QUIET)
    )


def test_autoneb_refuses_to_compute_under_cached_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = pair()
    x, y = data()
    monkeypatch.setenv(CACHED_ONLY, "1")
    with pytest.raises(NotCached, match="AutoNEB"):
        autoneb(
            model,
            a,
            b,
            x,
            y,
            AutoNEBSettings(**NEB),
            persist=Persist(tmp_path / "neb.pt", progress=False),
        )


# --- the chapter's runs ---------------------------------------------------------


def setup(folder: Path | None) -> PathSetup:
    x, y = data()
    ds = Dataset("toy", x[:30], y[:30], x[30:], y[30:], 3)
    return PathSetup(ds, batch_size=8, r_min=2, margin=0.1, checkpoint_dir=folder)


def test_method_run_checkpoints_the_baselines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = [pair()[0], build_model(MLP)]
    curve = {"method": "curve", "kind": "bezier", "lr": 0.1, "n_eval": 3}
    neb = {"method": "autoneb", "n_init": 1, "cycles": 2, "lrs": [0.1, 0.05]}
    plain = {k: method_run(setup(None), models, s, 1, budget=6) for k, s in
             (("curve", curve), ("neb", neb))}  # fmt: skip
    for label, settings in (("curve", curve), ("neb", neb)):
        ckpt = baseline_checkpoint(setup(tmp_path), models, settings, 1, 6)
        assert ckpt.parent == tmp_path and ckpt.name.startswith(settings["method"])
        res = method_run(setup(tmp_path), models, settings, 1, budget=6)
        assert ckpt.is_file()
        assert np.array_equal(res["train_loss"], plain[label]["train_loss"])
        monkeypatch.setenv(CACHED_ONLY, "1")  # finished: read, not computed
        again = method_run(setup(tmp_path), models, settings, 1, budget=6)
        assert np.array_equal(again["train_loss"], res["train_loss"])
        monkeypatch.delenv(CACHED_ONLY)
    assert baseline_checkpoint(setup(None), models, curve, 1, 6) is None
    names = {
        baseline_checkpoint(setup(tmp_path), models, curve, 1, 6),
        baseline_checkpoint(setup(tmp_path), models, curve, 2, 6),
        baseline_checkpoint(setup(tmp_path), models, curve, 1, 7),
        baseline_checkpoint(setup(tmp_path), models, {**curve, "lr": 0.2}, 1, 6),
        baseline_checkpoint(setup(tmp_path), models[::-1], curve, 1, 6),
    }
    assert len(names) == 5
