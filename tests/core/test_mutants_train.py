"""Training, found by mutation testing (``make mutation MODULE=core/train``).

What a user of :func:`wslib.core.train.fit` sees beyond the numbers: where
the work runs (a stand-in device, :mod:`tests.devicecheck`, and a stand-in
CUDA, :class:`StandIn`, whose tensors are CPU tensors that answer
``device="cuda"``), the layout of images on CUDA, its progress bar, its
warnings, and the arithmetic of the epoch's sums.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from tests.devicecheck import DEVICE, DeviceDiscipline, DeviceMixError
from tests.kit import cnn1d, cnn2d, mlp
from wslib.core import train as train_module
from wslib.core.configs import build_model
from wslib.core.train import (
    Recipe,
    augment_images,
    batch_indices,
    batches,
    evaluate,
    fit,
    make_optimizer,
    optimizer_step,
    pick_device,
    precision_autocast,
    seed_everything,
)

Tensor = torch.Tensor
HOST_GENERATOR = torch.Generator
"""torch's generator class (a test may replace ``torch.Generator``)."""


# --- a stricter stand-in device and a stand-in CUDA ------------------------------------


class StrictDevice(DeviceDiscipline):
    """:class:`DeviceDiscipline` refusing two more things device code must not do:
    an in-place operation on a host tensor with a device operand (CUDA refuses
    to write a device result into a host tensor), and indexing a device tensor
    with host index tensors (CUDA copies them from the host at every call)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if args and isinstance(args[0], Tensor):
            name = getattr(func, "__name__", "")
            others = [
                t for t in tree_flatten((args[1:], kwargs))[0] if isinstance(t, Tensor)
            ]
            in_place = name.startswith("__i") or (
                name.endswith("_") and not name.startswith("_") and name != "copy_"
            )
            if (
                in_place
                and not self.on_device(args[0])
                and any(self.on_device(t) for t in others)
            ):
                raise DeviceMixError(
                    f"{name} writes a device result into a host tensor"
                )
            if (
                func is Tensor.__getitem__
                and self.on_device(args[0])
                and any(not self.on_device(t) and t.dim() for t in others)
            ):
                raise DeviceMixError("a device tensor indexed with host indices")
        return super().__torch_function__(func, types, args, kwargs)


class StandInGenerator(HOST_GENERATOR):
    """A CPU generator that answers ``device`` with the device it was asked for."""

    def __new__(cls, device: Any = "cpu") -> StandInGenerator:
        where = torch.device(device)
        made = super().__new__(cls, "cpu" if where.type != "cpu" else device)
        made.where = where
        StandInGenerator.requested.append(where)
        return made

    requested: list[torch.device] = []

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.where


class StandIn(TorchFunctionMode):
    """Device ``kind`` (``"cuda"``) played by :data:`DEVICE`; enter it inside a
    :class:`StrictDevice`. Device arguments naming ``kind`` go to :data:`DEVICE`,
    device tensors answer ``kind``, and, as on CUDA, a random draw must be made
    on its generator's device. Pinning host memory is a no-op."""

    def __init__(self, kind: str = "cuda") -> None:
        super().__init__()
        self.kind = torch.device(kind)

    def swap(self, arg: Any) -> Any:
        if isinstance(arg, torch.device | str) and str(arg).split(":")[0] == str(
            self.kind
        ):
            return DEVICE
        return arg

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is torch.device:
            return func(*args, **kwargs)
        if func is Tensor.pin_memory:  # host memory the device reads: here, any
            return args[0]
        generator = kwargs.get("generator")
        if isinstance(generator, HOST_GENERATOR):
            where = torch.device(kwargs.get("device") or "cpu")
            if generator.device.type != where.type:
                raise DeviceMixError(
                    f"a generator on {generator.device} cannot draw on {where}"
                )
        args, kwargs = tree_map(self.swap, (args, kwargs))
        out = func(*args, **kwargs)
        if func == Tensor.device.__get__ and out == DEVICE:
            return self.kind
        return out


class IndexCopies(TorchFunctionMode):
    """Record pinnings and whether each copy of an integer tensor blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.pinned = 0
        self.blocking: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None) -> Any:  # noqa: ANN001
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory:
            self.pinned += 1
            return args[0]
        if func is torch.Tensor.to and not args[0].is_floating_point():
            self.blocking.append(not kwargs.get("non_blocking", False))
        return func(*args, **kwargs)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[torch.device]:
    """``torch.Generator`` made by :class:`StandInGenerator` (the devices asked for
    are returned) and the record of devices used kept apart."""
    monkeypatch.setattr(torch, "Generator", StandInGenerator)
    monkeypatch.setattr(StandInGenerator, "requested", [])
    monkeypatch.setattr(train_module, "_DEVICES_USED", set())
    return StandInGenerator.requested


def images(n: int = 16, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` random 3x8x8 images in 3 cyclic classes."""
    x = torch.rand(n, 3, 8, 8, generator=HOST_GENERATOR().manual_seed(seed))
    return x, torch.arange(n) % 3


CNN = cnn2d([4], [3, 8, 8], 3)
SIGNALS = mlp([6], [1, 8], 3)


def seeded(config: dict, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(config)


def conv_weights(model: nn.Module) -> list[Tensor]:
    return [p for p in model.parameters() if p.dim() == 4]


def channels_last(t: Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not (
        t.is_contiguous()
    )


def input_layouts(model: nn.Module) -> list[bool]:
    """Whether each batch the model receives is channels-last (filled as it runs)."""
    seen: list[bool] = []
    model.register_forward_pre_hook(
        lambda _, inputs: seen.append(channels_last(inputs[0]))
    )
    return seen


# --- devices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "recipe", "data"),
    [
        (
            SIGNALS,
            Recipe(epochs=2, batch_size=8),
            lambda: (torch.randn(24, 1, 8), torch.arange(24) % 3),
        ),
        (CNN, Recipe(epochs=1, batch_size=8, augment=True), images),
    ],
)
def test_fit_and_evaluate_on_a_device_keep_every_tensor_there(
    config, recipe, data
) -> None:
    """Models, data, batch indices and the epoch's sums live on the device, and
    the numbers are those of a run on the host."""
    x, y = data()
    host, on_dev = seeded(config), seeded(config)
    expected = fit(host, x, y, recipe, seed=1, device="cpu", progress=False)
    with StrictDevice():
        got = fit(on_dev, x, y, recipe, seed=1, device=DEVICE, progress=False)
        assert all(p.device == DEVICE for p in on_dev.parameters())
        assert evaluate(on_dev, x, y) == evaluate(host, x, y)
    assert got == expected


def test_on_cuda_images_are_channels_last_and_shuffled_by_a_cuda_generator(
    stand_in: list[torch.device],
) -> None:
    x, y = images()
    model = seeded(CNN)
    layouts = input_layouts(model)
    with StrictDevice(), StandIn("cuda"):
        fit(model, x, y, Recipe(epochs=1, batch_size=8), progress=False, device="cuda")
        assert next(model.parameters()).device == torch.device("cuda")
        assert all(channels_last(w) for w in conv_weights(model))
    assert layouts == [True, True]  # both batches
    assert stand_in == [torch.device("cuda")]
    assert train_module.devices_used() == ["cuda"]


def test_on_cuda_signals_and_on_other_devices_keep_the_standard_layout(
    stand_in: list[torch.device],
) -> None:
    """channels_last is for images on CUDA only; off CUDA the shuffling
    generator is the CPU's."""
    x, y = torch.randn(16, 1, 8), torch.arange(16) % 3
    model = seeded(cnn1d([4], [1, 8], 3))
    with StrictDevice(), StandIn("cuda"):
        fit(model, x, y, Recipe(epochs=1, batch_size=8), progress=False, device="cuda")
    assert all(p.is_contiguous() for p in model.parameters())
    x, y = images()
    model = seeded(CNN)
    layouts = input_layouts(model)
    with StrictDevice(), StandIn("mps"):
        fit(model, x, y, Recipe(epochs=1, batch_size=8), progress=False, device="mps")
    assert stand_in == [torch.device("cuda"), torch.device("cpu")]
    assert not any(channels_last(w) for w in conv_weights(model))
    assert layouts == [False, False]


def test_on_the_cpu_fit_returns_images_models_in_the_standard_layout() -> None:
    x, y = images()
    model = seeded(CNN).to(memory_format=torch.channels_last)
    layouts = input_layouts(model)
    fit(
        model,
        x.to(memory_format=torch.channels_last),
        y,
        Recipe(epochs=1, batch_size=8),
        progress=False,
    )
    assert all(w.is_contiguous() for w in conv_weights(model))
    assert layouts == [False, False]


def test_batches_and_augmentation_draw_on_the_generators_device(
    stand_in: list[torch.device],
) -> None:
    """A CUDA generator draws on CUDA (torch refuses it elsewhere): the batch
    indices, flips and crops are made there, with no copy from the host."""
    x, _ = images(6)
    host = augment_images(x, HOST_GENERATOR().manual_seed(3))
    with StrictDevice(), StandIn("cuda"):
        gen = StandInGenerator("cuda").manual_seed(0)
        drawn = list(batches(7, 3, generator=gen))
        assert all(b.device == torch.device("cuda") for b in drawn)
        crops = augment_images(x.to("cuda"), StandInGenerator("cuda").manual_seed(3))
        assert crops.device == torch.device("cuda")
        crops = crops.cpu()
    assert sorted(torch.cat(drawn).tolist()) == list(range(7))
    assert torch.equal(crops, host)


def test_unshuffled_batches_stay_on_the_cpu_whatever_the_default_device() -> None:
    with torch.device("meta"):
        got = list(batches(5, 2))
    assert [b.device.type for b in got] == ["cpu"] * 3
    assert [b.tolist() for b in got] == [[0, 1], [2, 3], [4]]


def test_pick_device_prefers_cuda_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")


def test_bf16_autocast_is_bfloat16_on_every_device() -> None:
    """CUDA's autocast defaults to float16; the recipe asks for bfloat16."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: autocast says it is off
        on_cuda = precision_autocast(torch.device("cuda"), "bf16")
    assert on_cuda.fast_dtype == torch.bfloat16
    assert precision_autocast(torch.device("cpu"), "bf16").fast_dtype == torch.bfloat16


# --- optimisers ---------------------------------------------------------------------


def test_adam_takes_the_recipes_rate_and_decay() -> None:
    model = nn.Linear(3, 2)
    adam = make_optimizer(model, Recipe(optimizer="adam", lr=0.02, weight_decay=1e-3))
    assert isinstance(adam, torch.optim.Adam)
    (group,) = adam.param_groups
    assert group["lr"] == 0.02 and group["weight_decay"] == 1e-3


def test_the_optimizers_own_zero_grad_drops_the_gradients() -> None:
    model = nn.Linear(3, 2)
    adam = make_optimizer(model, Recipe(optimizer="adam"))
    zero_grad, step = optimizer_step(adam, torch.device("cpu"))
    model(torch.randn(4, 3)).sum().backward()
    step()
    zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_on_the_cpu_plain_sgd_steps_without_torchs_wrapper() -> None:
    """The fast CPU path is taken for ``torch.optim.SGD`` on the CPU, and only there."""
    model = nn.Linear(3, 2)
    sgd = make_optimizer(model, Recipe())
    zero_grad, step = optimizer_step(sgd, torch.device("cpu"))
    assert step != sgd.step
    model(torch.randn(4, 3)).sum().backward()
    zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert optimizer_step(sgd, torch.device("cuda"))[1] == sgd.step


# --- fit: seeds, schedules, sums ------------------------------------------------------


def test_seed_everything_takes_a_seed_above_two_to_the_32() -> None:
    seed_everything(2**32 + 5)  # NumPy's legacy seed must be below 2**32
    drawn = np.random.rand(2)
    np.random.seed(5)
    np.testing.assert_array_equal(drawn, np.random.rand(2))


def test_fit_shuffles_with_seed_0_by_default() -> None:
    x, y = torch.randn(24, 1, 8), torch.arange(24) % 3
    recipe = Recipe(epochs=2, batch_size=4)
    runs = {}
    for seed in (None, 0, 1):
        model = seeded(SIGNALS)
        kwargs = {} if seed is None else {"seed": seed}
        runs[seed] = fit(model, x, y, recipe, progress=False, **kwargs)
    assert runs[None] == runs[0] != runs[1]


def test_a_constant_schedule_keeps_the_learning_rate() -> None:
    """The first epochs of a longer constant-rate run are a shorter run's."""
    x, y = torch.randn(24, 1, 8), torch.arange(24) % 3
    short, long = (
        fit(
            seeded(SIGNALS),
            x,
            y,
            Recipe(epochs=epochs, batch_size=8, schedule="constant"),
            progress=False,
        )
        for epochs in (2, 3)
    )
    assert long["loss"][:2] == short["loss"]


def test_the_cpu_step_raises_no_scheduler_warning() -> None:
    """The scheduler cannot see the CPU step (ours), and must not say so."""
    x, y = torch.randn(16, 1, 8), torch.arange(16) % 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(seeded(SIGNALS), x, y, Recipe(epochs=2, batch_size=8), progress=False)
    assert [str(w.message) for w in caught if "lr_scheduler" in str(w.message)] == []


def test_the_epoch_loss_is_summed_in_float64() -> None:
    """Sixteen batches of loss 1 + 2**-22: a float32 sum drops the 2**-22."""
    value = 1 + 2**-22
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))

    def constant(out: Tensor, target: Tensor) -> Tensor:
        return out.sum() * 0 + torch.tensor(value, dtype=torch.float32)

    history = fit(
        model,
        torch.randn(16, 2),
        torch.zeros(16, 2),
        Recipe(epochs=1, batch_size=1),
        progress=False,
        loss_fn=constant,
    )
    assert history["loss"] == [value]


def test_a_run_that_diverges_after_a_finite_epoch_keeps_one_entry_per_epoch() -> None:
    """Epoch 0 finite, epoch 1 NaN (every weight NaN after it): the epochs after
    repeat epoch 2's NaN, one entry each."""
    calls = []

    def blows_up(out: Tensor, target: Tensor) -> Tensor:
        calls.append(1)
        loss = nn.functional.cross_entropy(out, target)
        return loss if len(calls) == 1 else loss * float("nan")

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    x, y = torch.randn(8, 4), torch.arange(8) % 3
    history = fit(
        model, x, y, Recipe(epochs=6, batch_size=8), progress=False, loss_fn=blows_up
    )
    assert len(history["loss"]) == len(history["acc"]) == 6
    assert math.isfinite(history["loss"][0])
    assert all(math.isnan(v) for v in history["loss"][1:])
    assert len(calls) == 3  # epochs 0, 1 and 2 trained, the rest repeated


# --- fit: the progress bar ----------------------------------------------------------


def _bar(capsys: pytest.CaptureFixture[str], **progress: bool) -> tuple[str, dict]:
    """What fit prints (tqdm writes to standard error) and its history."""
    capsys.readouterr()
    x, y = torch.randn(8, 1, 8), torch.arange(8) % 3
    history = fit(seeded(SIGNALS), x, y, Recipe(epochs=2, batch_size=4), **progress)
    return capsys.readouterr().err, history


def test_fit_shows_a_train_bar_by_default_with_loss_and_accuracy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err, history = _bar(capsys)
    assert "train:" in err and "/2 [" in err  # the description, one step an epoch
    for epoch in range(2):
        loss, acc = history["loss"][epoch], history["acc"][epoch]
        assert f"acc={acc:.3f}, loss={loss:.3f}]" in err
    assert "\n" not in err and err.endswith("\r")  # cleared when done: leave=False


def test_fit_without_progress_prints_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _bar(capsys, progress=False)[0] == ""


def test_batch_indices_are_the_host_generators_draws_placed_on_the_device() -> None:
    """The given generator draws (not the global one), and the indices land on
    the device asked for, here the stand-in device."""
    want = torch.randint(10, (6,), generator=HOST_GENERATOR().manual_seed(3))
    torch.manual_seed(0)  # the global stream differs from the generator's
    with StrictDevice():
        got = batch_indices(10, 6, HOST_GENERATOR().manual_seed(3), DEVICE)
        assert got.device == DEVICE
    assert torch.equal(got, want)


@pytest.mark.usefixtures("stand_in")
def test_on_cuda_batch_indices_go_through_pinned_memory_without_blocking() -> None:
    """On CUDA the host's draw is pinned and copied to the device without
    blocking (the host does not wait for the GPU at each step); the same draw."""
    want = torch.randint(10, (6,), generator=HOST_GENERATOR().manual_seed(3))
    copies = IndexCopies()
    cuda = torch.device("cuda")
    with StrictDevice(), StandIn("cuda"), copies:
        got = batch_indices(10, 6, HOST_GENERATOR().manual_seed(3), cuda)
        assert got.device == cuda
    assert (copies.pinned, copies.blocking) == (1, [False])
    assert torch.equal(got.cpu(), want)
