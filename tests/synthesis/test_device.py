"""Chapter 12 on a stand-in GPU: no host tensor meets a device tensor.

The models sit on :data:`tests.devicecheck.DEVICE`, the data on the host, as
the zoo's models and the data sets do on a CUDA machine; the results equal
those of a plain CPU run.
"""

from __future__ import annotations

import pytest

from tests.devicecheck import DeviceDiscipline, to_device
from tests.kit import drawn_models, mlp, toy_dataset
from wslib.core.interpolation import lerp_state
from wslib.synthesis.alignment import alignment_study
from wslib.synthesis.conditioning import path_conditioning

IN = [1, 10]
MLP = mlp([6, 5], IN)


def test_alignment_study_on_the_device_equals_the_host_run() -> None:
    ds, (a, b) = toy_dataset(30, 10, IN, labels="cyclic"), drawn_models(MLP, 2)
    host = alignment_study({"mlp": [(a, b)]}, ds, [0.0, 0.5, 1.0], seed=0)
    with DeviceDiscipline():
        pair = (to_device(a), to_device(b))
        dev = alignment_study({"mlp": [pair]}, ds, [0.0, 0.5, 1.0], seed=0)
    for step, row in host["mlp"].items():
        assert dev["mlp"][step]["barrier_mean"] == pytest.approx(row["barrier_mean"])
        assert dev["mlp"][step]["lifting_distance_mean"] == pytest.approx(
            row["lifting_distance_mean"]
        )


def test_path_conditioning_on_the_device_equals_the_host_run() -> None:
    ds, (a, b) = toy_dataset(30, 10, IN, labels="cyclic"), drawn_models(MLP, 2)
    states = [lerp_state(a.state_dict(), b.state_dict(), t) for t in (0.0, 1.0)]
    host = path_conditioning(a, states, IN, ds.x_train, ds.y_train)
    with DeviceDiscipline():
        model = to_device(a)
        on_dev = [
            {k: v.to(model.linears[0].weight.device) for k, v in s.items()}
            for s in states
        ]
        dev = path_conditioning(model, on_dev, IN, ds.x_train, ds.y_train)
    for key, values in host.items():
        assert dev[key] == pytest.approx(values)
