"""Each paper's main computations on a stand-in GPU (:mod:`tests.devicecheck`).

Models on the device, data sets on the host, as on a CUDA machine: training,
evaluation, an LLPF path, PathCond's runs and rescaling, and HF/KF fusion
(chains, attribution, ResNets) run without combining a host tensor with a
device tensor and give the numbers of a plain CPU run.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.devicecheck import DEVICE, DeviceDiscipline, DeviceMixError, to_device
from tests.kit import cnn2d, mlp, resnet1d, toy_dataset, trained_model
from wslib.core.configs import build_model
from wslib.core.data import Dataset
from wslib.core.interpolation import linear_path
from wslib.core.train import Recipe, evaluate, fit
from wslib.fusion.hfkf import fuse
from wslib.llpf.layerwise import M2MSettings, m2m
from wslib.llpf.ticks import Refine
from wslib.pathcond.rescaling import pathcond_rescale
from wslib.pathcond.training import TrainSettings, train_run
from wslib.runs.resumable import Persist

IN = [1, 12]
MLP = mlp([8, 6], IN)
CNN2D = cnn2d([4, 4])
RESNET = resnet1d([4, 6], IN, blocks_per_stage=1)
RECIPE = Recipe(epochs=2, batch_size=8, lr=0.05)


def stand_in_data(shape: list[int] = IN) -> Dataset:
    """48 inputs of ``shape`` in 3 cyclic classes: 36 to train, 12 to test."""
    return toy_dataset(36, 12, shape, labels="cyclic")


def trained(config: dict, seed: int, ds: Dataset, device=None) -> torch.nn.Module:
    """A model fitted with :data:`RECIPE`."""
    return trained_model(config, seed, ds, RECIPE, device)


def test_stand_in_refuses_mixing_and_numpy() -> None:
    with DeviceDiscipline():
        w = torch.ones(3, device=DEVICE)
        assert w.device == DEVICE and w.cpu().device != DEVICE
        with pytest.raises(DeviceMixError, match="host tensor of shape"):
            w + torch.ones(3)
        with pytest.raises(DeviceMixError, match=r"\.cpu\(\) first"):
            w.numpy()
        assert float((w * torch.tensor(2.0)).sum()) == 6.0  # a host scalar may join


@pytest.mark.parametrize(
    "config, recipe",
    [
        (MLP, RECIPE),
        (CNN2D, Recipe(epochs=1, batch_size=8, augment=True, precision="bf16")),
    ],
)
def test_fit_and_evaluate_on_the_device(config: dict, recipe: Recipe) -> None:
    ds = stand_in_data(config["in_shape"])
    torch.manual_seed(0)
    host = build_model(config)
    on_dev = copy.deepcopy(host)
    h_hist = fit(
        host, ds.x_train, ds.y_train, recipe, seed=1, device="cpu", progress=False
    )
    with DeviceDiscipline():
        d_hist = fit(
            on_dev,
            ds.x_train,
            ds.y_train,
            recipe,
            seed=1,
            device=DEVICE,
            progress=False,
        )
        d_eval = evaluate(on_dev, ds.x_test, ds.y_test)
    assert d_hist == h_hist
    assert d_eval == evaluate(host, ds.x_test, ds.y_test)


@pytest.mark.parametrize("method", ["pathcond", "enorm", "kaiming"])
def test_pathcond_runs_on_the_device(method: str) -> None:
    ds = stand_in_data()
    host = train_run(
        TrainSettings(model=MLP, method=method, recipe=RECIPE, seed=0), ds, device="cpu"
    )
    with DeviceDiscipline():
        dev = train_run(
            TrainSettings(model=MLP, method=method, recipe=RECIPE, seed=0),
            ds,
            device=DEVICE,
        )
    assert dev["loss"] == host["loss"] and dev["test_acc"] == host["test_acc"]


def test_pathcond_rescale_on_the_device() -> None:
    torch.manual_seed(0)
    host = build_model(MLP).double()
    on_dev = copy.deepcopy(host)
    pathcond_rescale(host, IN)
    with DeviceDiscipline():
        pathcond_rescale(to_device(on_dev), IN)
        got = {k: v.cpu() for k, v in on_dev.state_dict().items()}
    for k, v in host.state_dict().items():
        torch.testing.assert_close(got[k], v)


def test_llpf_path_and_line_on_the_device() -> None:
    ds = stand_in_data()
    a, b = (trained(MLP, s, ds) for s in (0, 1))
    refine = Refine(threshold=5.0, r_max=5, batch_size=8)
    kwargs = {"ticks": 3, "seed": 0}
    host = m2m(
        a,
        a.state_dict(),
        b.state_dict(),
        ds.x_train,
        ds.y_train,
        M2MSettings(refine=refine, **kwargs),
        persist=Persist(progress=False),
    )
    with DeviceDiscipline():
        da, db = to_device(copy.deepcopy(a)), to_device(copy.deepcopy(b))
        dev = m2m(
            da,
            da.state_dict(),
            db.state_dict(),
            ds.x_train,
            ds.y_train,
            M2MSettings(refine=refine, **kwargs),
            persist=Persist(progress=False),
        )
        line = linear_path(
            da,
            da.state_dict(),
            db.state_dict(),
            [0.0, 0.5, 1.0],
            ds.x_train,
            ds.y_train,
            progress=False,
        )
    assert dev.refine_loss == pytest.approx(host.refine_loss, nan_ok=True)
    assert dev.grad_steps == host.grad_steps
    assert line["barrier"] >= 0


@pytest.mark.parametrize(
    "config, grouping, importance",
    [(MLP, "hf", "uniform"), (MLP, "kf", "conductance"), (RESNET, "kf", "uniform")],
)
def test_fusion_on_the_device(config: dict, grouping: str, importance: str) -> None:
    ds = stand_in_data()
    models = [trained(config, s, ds).eval() for s in (0, 1)]
    kwargs = {"grouping": grouping, "importance": importance, "progress": False}
    host = fuse(models, ds.x_train, ds.y_train, **kwargs).model
    with DeviceDiscipline():
        on_dev = [to_device(copy.deepcopy(m)) for m in models]
        fused = fuse(on_dev, ds.x_train, ds.y_train, **kwargs).model
        got = {k: v.cpu() for k, v in fused.state_dict().items()}
    for k, v in host.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)


def test_distillation_students_train_on_the_teachers_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chapter 11's students (width and depth compression) are built where the teacher is."""
    from wslib.fusion import ch11_beyond as fx
    from wslib.fusion.retrofit import GradientConfig

    ds = stand_in_data()
    teacher = trained(MLP, 0, ds).eval()
    devices: list[torch.device] = []
    original = fx.distill

    def spy(student: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
        devices.append(next(student.parameters()).device)
        return original(student, *args, **kwargs)

    monkeypatch.setattr(fx, "distill", spy)
    quick = GradientConfig(max_epochs=2)
    with DeviceDiscipline():
        on_dev = to_device(copy.deepcopy(teacher))
        narrow = {**MLP, "widths": [4, 3]}
        x, y = ds.x_train, ds.y_train
        fx.compression(on_dev, narrow, x, y, ds, quick, 1, importances=("uniform",))
        fx.depth_compression(on_dev, {**MLP, "widths": [4]}, ds, [2], quick, 1)
    assert devices == [DEVICE, DEVICE]
