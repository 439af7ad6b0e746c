"""AutoNEB pinned against its rules (survivors of mutation testing).

The initial chain against evenly spaced points on the line written out, the
number of NEB iterations and pivots each one moves, the checkpoint key
against the hash of every setting, validation and its messages, the resume
of a model with buffers, and a run on the stand-in GPU of
:mod:`tests.devicecheck`.
"""

from __future__ import annotations

import copy
import importlib
import math
from pathlib import Path

import pytest
import torch

from tests.devicecheck import DeviceDiscipline, to_device
from tests.kit import QUIET, cnn1d, mlp
from tests.llpf.resumable_kit import (
    Kill,
    Stop,
    data,
    endpoints,
    reference_key,
    same_states,
)
from wslib.core.files import code_version
from wslib.llpf.autoneb import AutoNEBSettings, autoneb
from wslib.runs.resumable import Persist

autoneb_module = importlib.import_module("wslib.llpf.autoneb")
MLP = mlp([5], in_shape=[1, 6])
BN = cnn1d([2], in_shape=[1, 6], bn=True)  # a model with buffers
# Two cycles of 3 iterations, no insertion: the chain keeps its pivots.
SMALL = {
    "n_init": 2,
    "cycles": 2,
    "steps_per_cycle": 3,
    "lrs": [0.1, 0.05],
    "batch_size": 8,
    "check_examples": 16,
    "insert_tol": math.inf,
}


def key_of_run(monkeypatch: pytest.MonkeyPatch, *args, **kwargs) -> str:
    """The checkpoint key ``autoneb(*args, **kwargs)`` hands its resumable run."""
    keys: list[str] = []

    def resumable(persist, what, key, *rest, **options):
        keys.append(key)
        raise Stop

    monkeypatch.setattr(autoneb_module, "Resumable", resumable)
    persist = kwargs.pop("persist")
    with pytest.raises(Stop):
        autoneb(*args, AutoNEBSettings(**kwargs), persist=persist)
    return keys[0]


# --- the chain ------------------------------------------------------------------


@pytest.mark.parametrize("n_init", [1, 3])
def test_the_initial_chain_is_evenly_spaced_on_the_line(n_init: int) -> None:
    """No iteration, no insertion: pivots at k / (n_init + 1) of the way, ends exact."""
    model, a, b = endpoints()
    x, y = data()
    path = autoneb(
        model, a, b, x, y, AutoNEBSettings(n_init=n_init, cycles=1, steps_per_cycle=0, lrs=[0.1], check_examples=16, insert_tol=math.inf),
        persist=QUIET,
    )  # fmt: skip
    assert len(path.states) == n_init + 2
    for k, state in enumerate(path.states):
        f = k / (n_init + 1)
        for n in a:
            torch.testing.assert_close(state[n], a[n] + f * (b[n] - a[n]))
    assert all(torch.equal(path.states[0][n], a[n]) for n in a)
    assert all(torch.equal(path.states[-1][n], b[n]) for n in b)
    assert path.total_grad_steps == 0
    assert path.phase == ["autoneb"] * (n_init + 2)


def test_each_cycle_takes_its_iterations_on_every_interior_pivot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = autoneb_module.neb_step

    def counting(chain, grads, lr, spring):
        calls.append(len(grads))
        return real(chain, grads, lr, spring)

    monkeypatch.setattr(autoneb_module, "neb_step", counting)
    model, a, b = endpoints()
    x, y = data()
    path = autoneb(model, a, b, x, y, AutoNEBSettings(**SMALL), persist=QUIET)
    assert calls == [2] * 6  # 2 cycles x 3 iterations, 2 interior pivots each
    assert path.total_grad_steps == 12
    assert len(path.states) == 4


def test_autoneb_leaves_the_model_in_eval_mode() -> None:
    model, a, b = endpoints(BN)
    x, y = data()
    autoneb(model, a, b, x, y, AutoNEBSettings(**SMALL), persist=QUIET)
    assert not any(m.training for m in model.modules())


# --- validation -----------------------------------------------------------------

NEED = r"^need n_init >= 0, steps_per_cycle >= 0 and max_pivots >= n_init \+ 2$"


@pytest.mark.parametrize(
    "bad",
    [
        {"n_init": -1},
        {"steps_per_cycle": -1},
        {"n_init": 3, "max_pivots": 4},
        {"n_init": 1, "max_pivots": 2},
    ],
)
def test_autoneb_refuses_bad_sizes_with_its_message(bad: dict) -> None:
    model, a, b = endpoints()
    x, y = data()
    with pytest.raises(ValueError, match=NEED):
        autoneb(model, a, b, x, y, AutoNEBSettings(**{**SMALL, **bad}), persist=QUIET)


def test_the_smallest_valid_sizes_run() -> None:
    """No interior pivot, no iteration, room for exactly the two ends."""
    model, a, b = endpoints()
    x, y = data()
    path = autoneb(
        model, a, b, x, y, AutoNEBSettings(**{**SMALL, "n_init": 0, "steps_per_cycle": 0,
                              "max_pivots": 2}), persist=QUIET,
    )  # fmt: skip
    assert len(path.states) == 2 and path.total_grad_steps == 0


@pytest.mark.parametrize("which", [0, 1])
def test_autoneb_refuses_a_non_finite_endpoint(which: int) -> None:
    model, a, b = endpoints()
    x, y = data()
    ends = [dict(a), dict(b)]
    name = next(iter(a))
    ends[which][name] = torch.full_like(a[name], float("nan"))
    with pytest.raises(ValueError, match=rf"^state {which}: tensor {name} .*NaN"):
        autoneb(model, *ends, x, y, AutoNEBSettings(**SMALL), persist=QUIET)


# --- the checkpoint -------------------------------------------------------------


def test_autoneb_keys_every_setting_and_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = endpoints(BN)
    x, y = data()
    settings = {
        "n_init": 2,
        "cycles": 3,
        "steps_per_cycle": 5,
        "lrs": [0.3, 0.2, 0.1],
        "spring": 0.5,
        "batch_size": 9,
        "insert_tol": 0.2,
        "check_points": 4,
        "check_examples": 17,
        "max_pivots": 7,
        "seed": 3,
        "total_steps": 11,
        "precision": "bf16",
    }
    persist = Persist(tmp_path / "neb.pt", progress=False)
    got = key_of_run(monkeypatch, model, a, b, x, y, **settings, persist=persist)
    code = code_version(*autoneb_module.CODE)
    assert got == reference_key(model, a, b, x, y, **settings, code=code)


def test_autoneb_keys_its_documented_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = endpoints()
    x, y = data()
    defaults = {
        "n_init": 3,
        "cycles": 4,
        "steps_per_cycle": 100,
        "lrs": [0.1, 0.05, 0.02, 0.01],
        "spring": 1.0,
        "batch_size": 128,
        "insert_tol": 0.05,
        "check_points": 3,
        "check_examples": 1024,
        "max_pivots": 12,
        "seed": 0,
        "total_steps": None,
        "precision": "fp32",
        "code": code_version(*autoneb_module.CODE),
    }
    persist = Persist(tmp_path / "neb.pt", progress=False)
    got = key_of_run(monkeypatch, model, a, b, x, y, persist=persist)
    assert got == reference_key(model, a, b, x, y, **defaults)


def test_a_zero_cycle_autoneb_saves_its_initial_chain(tmp_path: Path) -> None:
    model, a, b = endpoints()
    x, y = data()
    ckpt = tmp_path / "neb.pt"
    settings = {**SMALL, "cycles": 0, "lrs": []}
    autoneb(
        model,
        a,
        b,
        x,
        y,
        AutoNEBSettings(**settings),
        persist=Persist(ckpt, progress=False),
    )
    saved = torch.load(ckpt, weights_only=True)
    assert saved["tick"] == 0 and saved["steps"] == 0
    assert len(saved["chain"]) == SMALL["n_init"] + 2


def test_an_autoneb_checkpoint_without_its_chain_warns_and_restarts(
    tmp_path: Path,
) -> None:
    model, a, b = endpoints()
    x, y = data()
    ckpt = tmp_path / "neb.pt"
    first = autoneb(
        model,
        a,
        b,
        x,
        y,
        AutoNEBSettings(**SMALL),
        persist=Persist(ckpt, progress=False),
    )
    saved = torch.load(ckpt, weights_only=True)
    del saved["chain"], saved["steps"]
    torch.save(saved, ckpt)
    with pytest.warns(UserWarning, match=r"is incomplete \(no chain, steps\)"):
        again = autoneb(
            model,
            a,
            b,
            x,
            y,
            AutoNEBSettings(**SMALL),
            persist=Persist(ckpt, progress=False),
        )
    same_states(again, first)


def test_autoneb_of_a_model_with_buffers_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    model, a, b = endpoints(BN)
    x, y = data()
    whole = autoneb(model, a, b, x, y, AutoNEBSettings(**SMALL), persist=QUIET)

    def kill(c: int) -> None:
        if c == 1:
            raise Kill

    ckpt = tmp_path / "neb.pt"
    with pytest.raises(Kill):
        autoneb(
            model, a, b, x, y, AutoNEBSettings(**SMALL),
            persist=Persist(ckpt, progress=False, on_tick=kill),
        )  # fmt: skip
    assert torch.load(ckpt, weights_only=True)["buffers"]
    resumed = autoneb(
        model,
        a,
        b,
        x,
        y,
        AutoNEBSettings(**SMALL),
        persist=Persist(ckpt, progress=False),
    )
    same_states(resumed, whole)


# --- where it runs --------------------------------------------------------------


def test_autoneb_on_the_stand_in_gpu_equals_the_host_run(tmp_path: Path) -> None:
    """Endpoints and data on the host, the model on the device; resumed there too."""
    model, a, b = endpoints()
    x, y = data()
    host = autoneb(model, a, b, x, y, AutoNEBSettings(**SMALL), persist=QUIET)

    def kill(c: int) -> None:
        if c == 1:
            raise Kill

    ckpt = tmp_path / "neb.pt"
    with DeviceDiscipline():
        on_dev = to_device(copy.deepcopy(model))
        dev = autoneb(on_dev, a, b, x, y, AutoNEBSettings(**SMALL), persist=QUIET)
        with pytest.raises(Kill):
            autoneb(
                on_dev, a, b, x, y, AutoNEBSettings(**SMALL),
                persist=Persist(ckpt, progress=False, on_tick=kill),
            )  # fmt: skip
        resumed = autoneb(
            on_dev,
            a,
            b,
            x,
            y,
            AutoNEBSettings(**SMALL),
            persist=Persist(ckpt, progress=False),
        )
    same_states(dev, host)
    same_states(resumed, host)


def test_the_progress_bar_names_autoneb(capsys: pytest.CaptureFixture[str]) -> None:
    model, a, b = endpoints()
    x, y = data()
    autoneb(model, a, b, x, y, AutoNEBSettings(**SMALL), persist=Persist())
    assert "AutoNEB:" in capsys.readouterr().err
