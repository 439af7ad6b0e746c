"""How the path methods feed a net its data on a device.

On CUDA, image batches go to the device once in channels_last, the layout
cuDNN's fastest convolutions read (as ``fit`` places them); on any other
device, and for data that are not images, in the standard layout, so a CPU
run computes exactly as before. The batch indices are drawn on the host and
sent through pinned memory without blocking. Checked on the stand-in CUDA
device of :mod:`tests.core.test_mutants_train`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.core.test_mutants_train import (
    CNN,
    IndexCopies,
    StandIn,
    StrictDevice,
    images,
    input_layouts,
    seeded,
    stand_in,  # noqa: F401  (a fixture: the generators and devices kept apart)
)
from tests.kit import QUIET
from wslib.core.interpolation import evaluate_states
from wslib.core.train import data_layout, on_device
from wslib.llpf.autoneb import AutoNEBSettings, autoneb
from wslib.llpf.curves import CurveSettings, fit_curve
from wslib.llpf.ticks import Refine, refine_point

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(
    ("shape", "device", "layout"),
    [
        ((2, 3, 4, 4), CUDA, torch.channels_last),
        ((2, 1, 8), CUDA, torch.contiguous_format),
        ((2, 3, 4, 4), CPU, torch.contiguous_format),
        ((2, 3, 4, 4), torch.device("mps"), torch.contiguous_format),
    ],
)
def test_channels_last_is_for_images_on_cuda_only(shape, device, layout) -> None:
    assert data_layout(torch.zeros(shape), device) == layout


def test_on_the_cpu_data_keep_their_values_and_take_the_standard_layout() -> None:
    x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    placed = on_device(x, CPU)
    assert placed.is_contiguous() and torch.equal(placed, x)


def path_methods(model: torch.nn.Module, x, y) -> dict[str, Callable[[], object]]:
    """Refinement, a Bezier curve, AutoNEB and a path's evaluation on ``model``."""
    a = {k: v.clone() for k, v in model.state_dict().items()}
    b = {k: v + 0.01 for k, v in a.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    refine = Refine(batch_size=4, r_min=1, r_max=2, threshold=0.0)
    return {
        "refine": lambda: refine_point(
            model, opt, x, y, refine, torch.Generator().manual_seed(0)
        ),
        "curve": lambda: fit_curve(
            model,
            a,
            b,
            x,
            y,
            CurveSettings(steps=2, n_eval=2, batch_size=4),
            persist=QUIET,
        ),
        "autoneb": lambda: autoneb(
            model,
            a,
            b,
            x,
            y,
            AutoNEBSettings(
                n_init=1,
                cycles=1,
                steps_per_cycle=1,
                lrs=(0.01,),
                check_examples=4,
                batch_size=4,
            ),
            persist=QUIET,
        ),
        "evaluation": lambda: evaluate_states(
            model, [a, b], x, y, x, y, progress=False
        ),
    }


@pytest.mark.usefixtures("stand_in")
@pytest.mark.parametrize("method", ["refine", "curve", "autoneb", "evaluation"])
def test_on_cuda_every_path_method_feeds_images_in_channels_last(method: str) -> None:
    """The copies the curve, AutoNEB and evaluation make keep the hook."""
    x, y = images(8)
    model = seeded(CNN)
    layouts = input_layouts(model)
    with StrictDevice(), StandIn("cuda"):
        model.to("cuda")
        path_methods(model, x, y)[method]()
    assert layouts and all(layouts)


def test_on_the_cpu_every_path_method_feeds_the_standard_layout() -> None:
    x, y = images(8)
    for method in ("refine", "curve", "autoneb", "evaluation"):
        model = seeded(CNN)
        layouts = input_layouts(model)
        path_methods(model, x.to(memory_format=torch.channels_last), y)[method]()
        assert layouts and not any(layouts), method


@pytest.mark.usefixtures("stand_in")
@pytest.mark.parametrize("method", ["refine", "curve", "autoneb"])
def test_on_cuda_batch_indices_are_pinned_and_copied_without_blocking(
    method: str,
) -> None:
    x, y = images(8)
    model = seeded(CNN)
    copies = IndexCopies()
    with StrictDevice(), StandIn("cuda"):
        model.to("cuda")
        run = path_methods(model, x, y)[method]
        with copies:
            run()
    assert copies.pinned >= 1  # the batch of every step
    assert copies.blocking.count(False) == copies.pinned


@pytest.mark.parametrize("method", ["refine", "curve", "autoneb"])
def test_on_the_cpu_batch_indices_are_drawn_as_before(method: str) -> None:
    """The same draws of the host generator: a pinned copy would fail here."""
    x, y = images(8)
    copies = IndexCopies()
    with copies:
        path_methods(seeded(CNN), x, y)[method]()
    assert copies.pinned == 0
