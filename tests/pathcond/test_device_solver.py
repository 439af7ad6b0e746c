"""PathCond's solver runs in torch on g's device and agrees with the numpy reference.

:func:`tests.pathcond.reference_solver.reference_rescaling` is the solver as
it ran on the host in numpy; the device solver must give the same scales
(within 1e-10, relative) and the same objective on the tests' nets, for both
methods, stopped at a fixed number of sweeps and run to convergence.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tests.devicecheck import DEVICE, DeviceDiscipline
from tests.kit import seeded_model
from tests.pathcond.reference_solver import reference_rescaling
from tests.pathcond.test_pathcond import ALL_ARCHS
from wslib.pathcond.rescaling import diag_g, rescalable_structure
from wslib.pathcond.solver import METHODS, PAPER_SWEEPS, optimize_rescaling

SETTINGS = [(PAPER_SWEEPS, 0.0), (1000, 1e-12)]


def _g(arch: str) -> tuple[dict[str, torch.Tensor], object]:
    model = seeded_model(ALL_ARCHS[arch], 0, train=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)
    return diag_g(model, ALL_ARCHS[arch]["in_shape"]), rescalable_structure(model)


CASES = [
    *((arch, method) for arch in ("mlp", "cnn_bn", "resnet1d") for method in METHODS),
    ("resnet18", "block"),  # per-neuron sweeps of ResNet-18 take minutes
]


@pytest.mark.parametrize(("arch", "method"), CASES)
@pytest.mark.parametrize(("sweeps", "rtol"), SETTINGS)
def test_the_device_solver_equals_the_numpy_reference(arch, method, sweeps, rtol):
    g, structure = _g(arch)
    with warnings.catch_warnings():  # both warn alike when not converged
        warnings.simplefilter("ignore", UserWarning)
        mine = optimize_rescaling(
            g, structure, method=method, max_sweeps=sweeps, rtol=rtol
        )
        ref = reference_rescaling(
            g, structure, method=method, max_sweeps=sweeps, rtol=rtol
        )
    # F stops falling at rounding level: where a sum's order differs, one
    # solver may take one sweep more to see that
    assert abs(mine.sweeps - ref.sweeps) <= 1
    n = min(len(mine.objective), len(ref.objective))
    np.testing.assert_allclose(mine.objective[:n], ref.objective[:n], rtol=1e-12)
    assert mine.z.keys() == ref.z.keys()
    for name in ref.z:
        assert isinstance(mine.z[name], np.ndarray)
        np.testing.assert_allclose(
            np.exp(mine.z[name] / 2), np.exp(ref.z[name] / 2), rtol=1e-10, atol=0
        )


def test_the_solver_does_not_change_g():
    g, structure = _g("mlp")
    before = {k: v.clone() for k, v in g.items()}
    optimize_rescaling(g, structure, max_sweeps=3, rtol=0.0)
    for k in g:
        assert torch.equal(g[k], before[k])


def test_the_solver_stays_on_g_s_device(monkeypatch):
    """On a device (the stand-in of :mod:`tests.devicecheck`) only the log-scales
    come back to the host, once at the end: no entry of g crosses."""
    g, structure = _g("cnn_bn")
    ref = optimize_rescaling(g, structure, max_sweeps=3, rtol=0.0)
    copied: dict[int, int] = {}  # id -> numel (the mode may see one call twice)
    to_host = torch.Tensor.cpu

    def counting_cpu(t: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        copied[id(t)] = t.numel()
        return to_host(t, *args, **kwargs)

    with DeviceDiscipline():
        on_device = {k: v.to(DEVICE) for k, v in g.items()}
        monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
        got = optimize_rescaling(on_device, structure, max_sweeps=3, rtol=0.0)
        monkeypatch.undo()
    assert sorted(copied.values()) == sorted(len(z) for z in ref.z.values())
    for name, z in ref.z.items():
        np.testing.assert_array_equal(got.z[name], z)
