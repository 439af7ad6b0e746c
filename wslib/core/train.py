"""Training and evaluation: one seed function, one fit loop, one evaluation."""

from __future__ import annotations

import copy
import functools
import math
import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

# the recipe's names stay importable from here, beside the fit loop that reads them
from wslib.core.recipes import PrecisionName as PrecisionName
from wslib.core.recipes import Recipe as Recipe
from wslib.core.recipes import check_precision as check_precision
from wslib.core.seeds import check_seed


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (CPU and CUDA); let cuDNN pick its fastest kernels.

    On a CPU the same seed gives the same numbers. On CUDA the seed fixes every
    random choice (initialisation, data order, splits) but not the order of
    floating-point reductions in cuDNN's kernels: metrics agree across runs to
    the noise of those reductions, not bit for bit. Bitwise GPU determinism
    (``torch.use_deterministic_algorithms``) would cost the gpu profile much of
    its speed for no change in any verdict.
    """
    seed = check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True


def precision_autocast(device: torch.device, precision: str) -> torch.autocast:
    """bfloat16 autocast on ``device`` for ``"bf16"``; a disabled one for ``"fp32"``."""
    check_precision(precision)
    return torch.autocast(device.type, torch.bfloat16, precision == "bf16")


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` if given, else CUDA when available, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's parameters (the CPU for a model without any).

    Data meets a model through this helper (``x.to(model_device(model))``), so
    a model on CUDA never receives a CPU tensor.
    """
    param = next(model.parameters(), None)
    return torch.device("cpu") if param is None else param.device


def make_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """The optimizer a recipe names."""
    params = model.parameters()
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(
        params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay
    )


class Stepper(Protocol):
    """An optimizer as training loops use it: ``torch.optim.SGD`` or one of the book's."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the parameters (drop them with ``set_to_none``)."""

    def step(self) -> None:
        """One update of the parameters from their gradients."""


def optimizer_step(
    opt: Stepper, device: torch.device
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``(zero_grad, step)`` of ``opt``: on a CPU, SGD's without its per-step overhead.

    ``torch.optim``'s wrappers cost about half a millisecond a step, a fifth of
    a step of the book's CPU MLPs. On a CPU, SGD's step is done here with the
    arithmetic of torch's single-tensor SGD (the CPU's default; no dampening,
    no Nesterov), reading the learning rate the scheduler sets and keeping the
    momentum buffers in the optimizer's state (its ``state_dict`` saves them),
    so every weight is bit-identical (a test compares them). Elsewhere, and
    for Adam, the optimizer's own methods.
    """
    own = functools.partial(opt.zero_grad, set_to_none=True), opt.step
    if device.type != "cpu" or type(opt) is not torch.optim.SGD:
        return own
    (group, *more) = opt.param_groups
    if more or any(group[k] for k in ("dampening", "nesterov", "maximize")):
        return own
    params: list[torch.Tensor] = list(group["params"])

    def zero_grad() -> None:
        for p in params:
            p.grad = None

    @torch.no_grad()
    def step() -> None:
        lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad if decay == 0 else p.grad.add(p, alpha=decay)
            if momentum != 0:
                state = opt.state[p]  # where torch keeps it: state_dict() saves it
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.detach().clone()
                else:
                    buf.mul_(momentum).add_(grad, alpha=1)
                grad = buf
            p.add_(grad, alpha=-lr)

    return zero_grad, step


def batches(
    n: int, batch_size: int, *, generator: torch.Generator | None = None
) -> Iterator[torch.Tensor]:
    """Index batches over ``range(n)``; shuffled when a generator is given.

    The indices live on the generator's device, so a CUDA generator's batches
    are drawn without a copy from the host at every step.
    """
    order = (
        torch.randperm(n, generator=generator, device=generator.device)
        if generator is not None
        else torch.arange(n, device="cpu")  # whatever the default device
    )
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def augment_images(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per-image random horizontal flip and 4-pixel random crop of a batch (N, C, H, W)."""
    if x.dim() != 4:
        raise ValueError(
            "augment=True needs images of shape (N, C, H, W); turn it off for 1-D data"
        )
    n, c, h, w = x.shape
    where = generator.device  # a CUDA generator draws on the device
    flip = (torch.rand(n, generator=generator, device=where) < 0.5).to(x.device)
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    padded = nn.functional.pad(x, (4, 4, 4, 4))
    dy, dx = torch.randint(0, 9, (2, n), generator=generator, device=where).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chans = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chans, rows, cols]


def check_labels(outputs: int, labels: tuple[int, int]) -> None:
    """Refuse labels (their lowest and highest) that ``outputs`` logits cannot score.

    Without the check cross-entropy ends in torch's "Target 7 is out of bounds".
    """
    low, high = labels
    if low < 0 or high >= outputs:
        raise ValueError(
            f"labels run from {low} to {high}, but the model has {outputs} outputs; "
            f"give it n_classes = the data set's number of classes (at least {high + 1})"
        )


_DEVICES_USED: set[str] = set()


def note_device(device: torch.device) -> None:
    """Record that a training run, an evaluation or a path's refinement ran on ``device``."""
    _DEVICES_USED.add(device.type)


def devices_used() -> list[str]:
    """The device types every :func:`fit`, evaluation (:func:`predict`) and path
    refinement of this process ran on.

    Stored with each results file (``env["devices_used"]``), so that a check
    reads where the work really ran, not only which devices were there: a
    silent fallback to the CPU on a CUDA machine shows as ``["cpu"]``.
    """
    return sorted(_DEVICES_USED)


def fit(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    recipe: Recipe,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    on_epoch: Callable[[int, nn.Module], None] | None = None,
    on_step: Callable[[nn.Module], None] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    stop_at: float | None = None,
    give_up_after: int | None = None,
) -> dict[str, list[float]]:
    """Train ``model`` in place; return per-epoch mean loss and accuracy.

    With ``stop_at``, training ends after the first epoch whose running
    accuracy reaches it (a learning-rate search that counts epochs to a
    threshold needs nothing later); the lists are then shorter than
    ``recipe.epochs``. With ``give_up_after`` as well, a run that has not
    reached it by that epoch ends there (what it trained is the start of the
    full run: the schedule still spans ``recipe.epochs``). A run whose weights
    are all NaN when an epoch starts (:func:`all_nan`) trains that epoch and
    repeats its loss and accuracy for the epochs left, which would be the same
    (unless ``on_step`` or ``on_epoch`` is given: then every epoch runs).

    The loss is cross-entropy unless ``loss_fn(outputs, targets)`` is given (then
    the accuracy is NaN, e.g. for a regression or autoencoder target).
    ``on_step(model)`` runs after every optimiser step, ``on_epoch(epoch, model)``
    after every epoch. The epoch's loss and accuracy are summed on the device
    (in float64, the same arithmetic as on the host) and read once per epoch:
    no host synchronisation per step.
    """
    check_give_up(stop_at, give_up_after)
    dev = pick_device(device)
    note_device(dev)
    layout = data_layout(x, dev)
    model.to(dev, memory_format=layout)  # type: ignore[call-overload]  # torch's stubs lack this overload
    x, y = on_device(x, dev), y.to(dev)
    autocast = precision_autocast(dev, recipe.precision)
    # the shuffling generator sits on the device (on a CPU: the CPU's stream)
    gen = torch.Generator(device=dev if dev.type == "cuda" else "cpu").manual_seed(seed)
    opt = make_optimizer(model, recipe)
    sched = _schedule(opt, recipe)
    epoch_run = _Epoch(model, x, y, recipe, gen, autocast, optimizer_step(opt, dev))
    # read once (one sync); checked against the first batch's outputs
    labels = (int(y.min()), int(y.max())) if loss_fn is None and len(y) else None
    history: dict[str, list[float]] = {"loss": [], "acc": []}
    bar = tqdm(range(recipe.epochs), desc="train", disable=not progress, leave=False)
    for epoch in bar:
        # weights turn NaN only after a NaN loss: no check before
        diverged = on_step is None and on_epoch is None and _diverged(history, model)
        model.train()
        total_loss, correct = epoch_run.run(labels, loss_fn, on_step)
        labels = None  # checked on the first batch
        if sched is not None:
            _schedule_step(sched)
        history["loss"].append(total_loss.item() / len(x))
        history["acc"].append(
            correct.item() / len(x) if loss_fn is None else float("nan")
        )
        bar.set_postfix(
            loss=f"{history['loss'][-1]:.3f}", acc=f"{history['acc'][-1]:.3f}"
        )
        if on_epoch is not None:
            on_epoch(epoch, model)
        if stop_at is not None and history["acc"][-1] >= stop_at:
            break
        if give_up_after is not None and epoch + 1 >= give_up_after:
            break
        if diverged:  # the later epochs would repeat this one exactly
            end = min(recipe.epochs, give_up_after or recipe.epochs)
            for values in history.values():
                values += values[-1:] * (end - epoch - 1)
            break
    model.eval()
    return history


@dataclass
class _Epoch:
    """One epoch of :func:`fit`: what its batches need."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    recipe: Recipe
    gen: torch.Generator
    autocast: torch.autocast
    steps: tuple[Callable[[], None], Callable[[], None]]  # zero_grad, step

    def run(
        self,
        labels: tuple[int, int] | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
        on_step: Callable[[nn.Module], None] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on every batch once; the summed loss (float64) and the number of
        correct predictions, on the device. ``labels`` (the range of ``y``) is
        checked against the first batch's outputs when given."""
        model, x, y, recipe, gen = self.model, self.x, self.y, self.recipe, self.gen
        zero_grad, step = self.steps
        dev = x.device
        total_loss = torch.zeros((), dtype=torch.float64, device=dev)
        correct = torch.zeros((), dtype=torch.long, device=dev)
        for idx in batches(len(x), recipe.batch_size, generator=gen):
            idx = idx.to(dev)  # already there on CUDA
            xb, yb = x[idx], y[idx]
            if recipe.augment:
                xb = augment_images(xb, gen)
            with self.autocast:
                out = model(xb)
                if labels is not None:
                    check_labels(out.shape[-1], labels)
                    labels = None
                loss = _loss(out, yb, loss_fn)
            zero_grad()
            loss.backward()
            step()
            if on_step is not None:
                on_step(model)
            total_loss += loss.detach().double() * len(idx)
            if loss_fn is None:
                correct += (out.argmax(1) == yb).sum()
        return total_loss, correct


def _diverged(history: dict[str, list[float]], model: nn.Module) -> bool:
    """Whether the last epoch's loss was NaN and every weight is NaN now (the
    later epochs would repeat it)."""
    return bool(history["loss"]) and math.isnan(history["loss"][-1]) and all_nan(model)


def _loss(
    out: torch.Tensor,
    yb: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """Cross-entropy, or ``loss_fn(out, yb)`` when given."""
    return nn.functional.cross_entropy(out, yb) if loss_fn is None else loss_fn(out, yb)


def _schedule(
    opt: torch.optim.Optimizer, recipe: Recipe
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The recipe's learning-rate schedule: cosine over its epochs, or None (constant)."""
    if recipe.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=recipe.epochs)
    return None


def _schedule_step(sched: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Step the learning-rate schedule once (an epoch ended)."""
    with warnings.catch_warnings():
        # the CPU step is ours (optimizer_step), so the scheduler, which
        # watches the optimizer's own step, thinks none was taken
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler")
        sched.step()


def all_nan(model: nn.Module) -> bool:
    """Whether every parameter of ``model`` is NaN (a diverged run: it stays so).

    Its outputs and gradients are then all NaN and an SGD step leaves every
    weight NaN, so each epoch sees the same loss (NaN) and predicts the same
    class for every example (the same accuracy, whatever the batch order).
    """
    params = list(model.parameters())
    return bool(params) and bool(torch.stack([p.isnan().all() for p in params]).all())


def check_give_up(stop_at: float | None, give_up_after: int | None) -> None:
    """Refuse a ``give_up_after`` that is not a positive epoch, or has no ``stop_at``."""
    if give_up_after is None:
        return
    if stop_at is None:
        raise ValueError(
            "give_up_after needs stop_at: a run gives up on reaching stop_at; "
            "pass stop_at, or leave give_up_after None"
        )
    if give_up_after < 1:
        raise ValueError(f"give_up_after must be an epoch >= 1, got {give_up_after}")


def data_layout(x: torch.Tensor, device: torch.device) -> torch.memory_format:
    """channels_last for a batch of images (4-d) on CUDA, the layout cuDNN's
    fastest convolutions read; the standard layout anywhere else (so a CPU
    run computes exactly as before)."""
    images = device.type == "cuda" and x.dim() == 4
    return torch.channels_last if images else torch.contiguous_format


def on_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` in :func:`data_layout` (a no-op when it is there already)."""
    return x.to(device, memory_format=data_layout(x, device))


def batch_indices(
    n: int, size: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """``size`` indices below ``n`` drawn by the host ``generator``, sent to ``device``.

    The draw stays on the host, so a path method takes the same batches on
    every device and its checkpoints keep a CPU generator's state; on CUDA the
    indices go through pinned memory without blocking, so the host does not
    wait for the GPU at every step. On the CPU this is a plain draw.
    """
    idx = torch.randint(n, (size,), generator=generator)
    if device.type == "cuda":
        return idx.pin_memory().to(device, non_blocking=True)
    return idx.to(device)


def device_slices(
    x: torch.Tensor, batch_size: int, device: torch.device
) -> Iterator[torch.Tensor]:
    """Consecutive batches of ``x`` on ``device``: one copy of ``x``, then slices.

    Evaluation and BatchNorm resets read their data in order, so the whole
    tensor goes to the device once (a no-op when it is there) instead of a
    gather and a copy per batch.
    """
    x = on_device(x, device)
    for start in range(0, len(x), batch_size):
        yield x[start : start + batch_size]


@torch.no_grad()
def predict(
    model: nn.Module, x: torch.Tensor, *, batch_size: int = 1024
) -> torch.Tensor:
    """Model outputs for ``x`` in eval mode (on the model's device), returned on the CPU."""
    dev = model_device(model)
    note_device(dev)
    model.eval()
    return torch.cat([model(xb).cpu() for xb in device_slices(x, batch_size, dev)])


@torch.no_grad()
def float64_outputs(
    model: nn.Module,
    x: torch.Tensor,
    *,
    train_mode: bool = False,
    batch_size: int = 1024,
) -> torch.Tensor:
    """``model``'s outputs on ``x`` computed in float64, on a copy on the model's device.

    The invariance and self-fusion checks compare two networks' outputs. In
    float64 the comparison sees the rounding of the weights alone, not the
    kernels a device picks (TF32, FFT or Winograd convolutions under
    ``cudnn.benchmark``), so a check gives the same answer on every device.
    The copy leaves ``model`` and its BatchNorm statistics as they are; in
    ``train_mode`` BatchNorm normalises with the statistics of all of ``x``
    (one batch), in eval mode ``x`` runs in batches of ``batch_size``.
    """
    net = copy.deepcopy(model).double().train(train_mode)
    wide = x.to(torch.float64)
    batches = (
        [wide] if train_mode else device_slices(wide, batch_size, model_device(net))
    )
    return torch.cat([net(xb.to(model_device(net))).cpu() for xb in batches])


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``(x, y)`` in eval mode."""
    out = predict(model, x, batch_size=batch_size)
    loss = nn.functional.cross_entropy(out, y.cpu()).item()
    acc = (out.argmax(1) == y.cpu()).float().mean().item()
    return loss, acc
