"""Bezier / PolyChain curves pinned against independent references (survivors of mutation testing).

The curve's point against the Bernstein formula and linear interpolation by
hand, the checkpoint key against the hash of everything that determines the
run written out, the learning rate of every step against the authors'
schedule, the validation messages, and a run on the stand-in GPU of
:mod:`tests.devicecheck`.
"""

from __future__ import annotations

import copy
import importlib
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
from wslib.llpf.curves import (
    CurveSettings,
    checkpoint_key,
    curve_point,
    fit_curve,
    missing_fields,
)
from wslib.runs.resumable import Persist

curves = importlib.import_module("wslib.llpf.curves")
MLP = mlp([5], in_shape=[1, 6])
BN = cnn1d([2], in_shape=[1, 6], bn=True)  # a model with buffers
SMALL = {"steps": 4, "batch_size": 8, "n_eval": 3}


def key_of_run(monkeypatch: pytest.MonkeyPatch, *args, **kwargs) -> str:
    """The checkpoint key ``fit_curve(*args, **kwargs)`` hands its resumable run."""
    keys: list[str] = []

    def resumable(persist, what, key, *rest, **options):
        keys.append(key)
        raise Stop

    monkeypatch.setattr(curves, "Resumable", resumable)
    persist = kwargs.pop("persist")
    with pytest.raises(Stop):
        fit_curve(*args, CurveSettings(**kwargs), persist=persist)
    return keys[0]


# --- the curve's points ---------------------------------------------------------


def test_curve_points_against_bernstein_and_linear_interpolation() -> None:
    g = torch.Generator().manual_seed(0)
    a, bend, b = ({"w": torch.randn(7, generator=g)} for _ in range(3))
    for t in [0.0, 0.2, 0.5, 0.7, 1.0]:
        bern = [(1 - t) ** 2, 2 * t * (1 - t), t**2]
        want = sum(c * p["w"] for c, p in zip(bern, (a, bend, b)))
        torch.testing.assert_close(curve_point(a, bend, b, t, "bezier")["w"], want)
        if t < 0.5:
            want = a["w"] + (2 * t) * (bend["w"] - a["w"])
        else:
            want = bend["w"] + (2 * t - 1) * (b["w"] - bend["w"])
        torch.testing.assert_close(curve_point(a, bend, b, t, "polychain")["w"], want)


def per_tensor_point(a, bend, b, t: float, kind: str) -> dict[str, torch.Tensor]:
    """The curve's point written tensor by tensor (the arithmetic before the
    fused ``torch._foreach`` form)."""
    if kind == "bezier":
        return {
            n: (1 - t) ** 2 * a[n] + 2 * t * (1 - t) * bend[n] + t**2 * b[n] for n in a
        }
    if t < 0.5:
        return {n: a[n] + 2 * t * (bend[n] - a[n]) for n in a}
    return {n: bend[n] + (2 * t - 1) * (b[n] - bend[n]) for n in a}


@pytest.mark.parametrize("kind", ["bezier", "polychain"])
def test_the_fused_point_and_its_gradient_are_bit_identical_to_the_per_tensor_form(
    kind: str,
) -> None:
    g = torch.Generator().manual_seed(2)
    shapes = {"conv": (4, 3, 3, 3), "bias": (4,), "fc": (5, 4)}
    a, b = ({n: torch.randn(s, generator=g) for n, s in shapes.items()} for _ in "ab")
    bend = {n: torch.randn(s, generator=g).requires_grad_() for n, s in shapes.items()}
    for t in [0.0, 0.123, 1 / 3, 0.5, 0.61, 0.9, 1.0]:
        got, want = (
            curve_point(a, bend, b, t, kind),
            per_tensor_point(a, bend, b, t, kind),
        )
        assert list(got) == list(shapes)
        assert all(torch.equal(got[n], want[n]) for n in shapes)
        grads = [
            torch.autograd.grad(
                sum((p**3).sum() for p in point.values()), list(bend.values())
            )
            for point in (got, want)
        ]
        assert all(torch.equal(x, y) for x, y in zip(*grads, strict=True))


def test_a_polychain_passes_exactly_through_its_bend_at_one_half() -> None:
    g = torch.Generator().manual_seed(1)
    a, bend, b = ({"w": torch.randn(50, generator=g)} for _ in range(3))
    assert torch.equal(curve_point(a, bend, b, 0.5, "polychain")["w"], bend["w"])


def test_a_fitted_curve_starts_and_ends_at_the_modes_and_names_its_kind() -> None:
    model, a, b = endpoints()
    x, y = data()
    for kind in ("bezier", "polychain"):
        path = fit_curve(
            model, a, b, x, y, CurveSettings(kind=kind, **SMALL), persist=QUIET
        )
        assert path.phase == [kind] * 3
        assert all(torch.equal(path.states[0][k], a[k]) for k in a)
        assert all(torch.equal(path.states[-1][k], b[k]) for k in b)


# --- the checkpoint key ---------------------------------------------------------


def test_checkpoint_key_is_the_hash_of_endpoints_data_model_and_config() -> None:
    model, a, b = endpoints(BN)
    x, y = data()
    key = checkpoint_key(model, a, b, x, y, lr=0.1, kind="bezier")
    assert len(key) == 16
    assert key == reference_key(model, a, b, x, y, lr=0.1, kind="bezier")
    assert key != checkpoint_key(model, b, a, x, y, lr=0.1, kind="bezier")


def test_fit_curve_keys_every_setting_and_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = endpoints(BN)
    x, y = data()
    persist = Persist(tmp_path / "c.pt", progress=False)
    settings = {
        "kind": "polychain",
        "steps": 7,
        "lr": 0.2,
        "momentum": 0.5,
        "batch_size": 9,
        "n_eval": 4,
        "seed": 3,
        "weight_decay": 0.01,
        "schedule": "garipov",
        "precision": "bf16",
    }
    code = code_version(*curves.CODE)
    got = key_of_run(monkeypatch, model, a, b, x, y, **settings, persist=persist)
    assert got == reference_key(model, a, b, x, y, **settings, code=code)


def test_fit_curve_keys_its_documented_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = endpoints(MLP)
    x, y = data()
    defaults = {
        "kind": "bezier",
        "steps": 1000,
        "lr": 0.05,
        "momentum": 0.9,
        "batch_size": 128,
        "n_eval": 21,
        "seed": 0,
        "weight_decay": 0.0,
        "schedule": "constant",
        "precision": "fp32",
        "code": code_version(*curves.CODE),
    }
    persist = Persist(tmp_path / "c.pt", progress=False)
    got = key_of_run(monkeypatch, model, a, b, x, y, persist=persist)
    assert got == reference_key(model, a, b, x, y, **defaults)


def test_missing_fields_names_each_missing_field() -> None:
    assert missing_fields({"bend": 1}, ("bend", "optimizer", "buffers")) == (
        "no optimizer, buffers"
    )
    assert missing_fields({"bend": 1}, ("bend",)) is None


# --- validation -----------------------------------------------------------------


def test_fit_curve_validates_steps_n_eval_and_weight_decay() -> None:
    model, a, b = endpoints()
    x, y = data()
    message = r"^steps must be >= 0 and n_eval >= 2$"
    with pytest.raises(ValueError, match=message):
        fit_curve(model, a, b, x, y, CurveSettings(steps=-1, n_eval=5), persist=QUIET)
    with pytest.raises(ValueError, match=message):
        fit_curve(model, a, b, x, y, CurveSettings(steps=3, n_eval=1), persist=QUIET)
    with pytest.raises(ValueError, match=r"^weight_decay must be >= 0, got -0.1$"):
        fit_curve(
            model, a, b, x, y, CurveSettings(steps=1, weight_decay=-0.1), persist=QUIET
        )
    path = fit_curve(
        model, a, b, x, y, CurveSettings(steps=1, batch_size=4, n_eval=2), persist=QUIET
    )
    assert len(path.states) == 2


@pytest.mark.parametrize("which", [0, 1])
def test_fit_curve_refuses_a_non_finite_endpoint(which: int) -> None:
    model, a, b = endpoints()
    x, y = data()
    ends = [dict(a), dict(b)]
    name = next(iter(a))
    ends[which][name] = torch.full_like(a[name], float("nan"))
    with pytest.raises(ValueError, match=rf"^state {which}: tensor {name} .*NaN"):
        fit_curve(model, *ends, x, y, CurveSettings(**SMALL), persist=QUIET)


def test_fit_curve_leaves_the_model_in_eval_mode() -> None:
    model, a, b = endpoints(BN)
    x, y = data()
    fit_curve(model, a, b, x, y, CurveSettings(**SMALL), persist=QUIET)
    assert not any(m.training for m in model.modules())


# --- training -------------------------------------------------------------------


def garipov(fraction: float) -> float:
    """The authors' schedule written out: 1, then linearly to 0.01 at 90%, then 0.01."""
    if fraction <= 0.5:
        return 1.0
    if fraction <= 0.9:
        return 1.0 + (0.01 - 1.0) * (fraction - 0.5) / 0.4
    return 0.01


@pytest.mark.parametrize("schedule", ["constant", "garipov"])
def test_every_step_uses_the_schedule_s_learning_rate(
    monkeypatch: pytest.MonkeyPatch, schedule: str
) -> None:
    model, a, b = endpoints()
    x, y = data()
    seen: list[float] = []
    real = curves.optimizer_step

    def recording(opt, dev):
        zero_grad, step = real(opt, dev)

        def stepping() -> None:
            seen.append(opt.param_groups[0]["lr"])
            step()

        return zero_grad, stepping

    monkeypatch.setattr(curves, "optimizer_step", recording)
    steps = 10
    fit_curve(
        model, a, b, x, y, CurveSettings(steps=steps, lr=0.2, batch_size=4, n_eval=2, schedule=schedule),
        persist=QUIET,
    )  # fmt: skip
    factors = [garipov(k / steps) if schedule == "garipov" else 1.0 for k in range(10)]
    assert seen == pytest.approx([0.2 * f for f in factors], rel=1e-12)


def test_a_curve_saves_only_at_its_end_by_default(tmp_path: Path) -> None:
    """Every 500 steps by default: a 12-step run writes its checkpoint at the end only."""
    model, a, b = endpoints()
    x, y = data()
    ckpt = tmp_path / "c.pt"
    exists: list[bool] = []
    persist = Persist(
        ckpt, progress=False, on_tick=lambda k: exists.append(ckpt.exists())
    )
    fit_curve(
        model,
        a,
        b,
        x,
        y,
        CurveSettings(steps=12, batch_size=4, n_eval=2),
        persist=persist,
    )
    assert exists == [False] * 11 + [True]


def test_a_curve_of_a_model_with_buffers_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    model, a, b = endpoints(BN)
    model.train()
    x, y = data()
    whole = fit_curve(model, a, b, x, y, CurveSettings(**SMALL), persist=QUIET)

    def kill(k: int) -> None:
        if k == 2:
            raise Kill

    ckpt = tmp_path / "c.pt"
    with pytest.raises(Kill):
        fit_curve(
            model, a, b, x, y, CurveSettings(**SMALL),
            persist=Persist(ckpt, checkpoint_every=1, progress=False, on_tick=kill),
        )  # fmt: skip
    assert torch.load(ckpt, weights_only=True)["buffers"]
    resumed = fit_curve(
        model, a, b, x, y, CurveSettings(**SMALL), persist=Persist(ckpt, progress=False)
    )
    same_states(resumed, whole)


def test_a_curve_on_the_stand_in_gpu_equals_the_host_run() -> None:
    """Endpoints and data on the host, the model on the device: no mixing, same curve."""
    model, a, b = endpoints()
    x, y = data()
    host = fit_curve(model, a, b, x, y, CurveSettings(**SMALL), persist=QUIET)
    with DeviceDiscipline():
        on_dev = to_device(copy.deepcopy(model))
        dev = fit_curve(on_dev, a, b, x, y, CurveSettings(**SMALL), persist=QUIET)
    same_states(dev, host)


def test_the_progress_bar_names_the_curve(capsys: pytest.CaptureFixture[str]) -> None:
    model, a, b = endpoints()
    x, y = data()
    fit_curve(
        model, a, b, x, y, CurveSettings(kind="polychain", **SMALL), persist=Persist()
    )
    assert "polychain curve:" in capsys.readouterr().err
