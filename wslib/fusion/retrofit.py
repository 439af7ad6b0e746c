"""The fused weights of a level: least squares on the fusion set (``linear``) or
gradient steps on its targets (``gradient``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from wslib.core.train import batches
from wslib.fusion.levels import Affine, neuron_matrix, solve_dtype


def design_matrix(
    module: Affine, inputs: torch.Tensor, *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Rows of the affine map's inputs, ``(samples, fan_in)``, in neuron_matrix's sample order."""
    x = inputs.to(dtype)
    if isinstance(module, nn.Linear):
        return (
            x.reshape(-1, x.shape[-1])
            if x.dim() == 2
            else x.reshape(-1, module.in_features)
        )
    k, s = module.kernel_size, module.stride
    p = cast(tuple[int, ...], module.padding)  # the book's convs pad by numbers
    if isinstance(module, nn.Conv1d):
        x = F.pad(x, (p[0], p[0])).unfold(2, k[0], s[0])  # (N, C, L, k)
        return x.permute(0, 2, 1, 3).reshape(-1, x.shape[1] * k[0])
    cols = F.unfold(x, k, padding=p, stride=s)  # (N, C*kh*kw, L)
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def ridge_solve(
    rows: Callable[[slice], torch.Tensor],
    targets: torch.Tensor,
    n: int,
    ridge: float,
    *,
    chunk: int = 256,
) -> torch.Tensor:
    """Ridge least squares ``A @ sol ~ targets.T`` for ``A = rows(all n examples)``.

    ``rows(slice)`` gives the design rows of those examples (each example has
    ``targets.shape[1] // n`` consecutive rows); the Gram matrix is
    accumulated over ``chunk`` examples at a time, on the device and in the
    dtype of the rows (float64 where the device has it, see
    :func:`~wslib.fusion.levels.solve_dtype`), and ``ridge`` is relative to its mean diagonal.
    """
    if n < 1:
        raise ValueError(f"no examples to fit (n={n})")
    per_example = targets.shape[1] // n
    gram: torch.Tensor | None = None
    rhs: torch.Tensor | None = None
    total_rows = 0
    for start in range(0, n, chunk):
        a = rows(slice(start, start + chunk))
        t = targets[:, start * per_example : start * per_example + len(a)].to(a)
        total_rows += len(a)
        gram = a.T @ a if gram is None else gram + a.T @ a
        rhs = a.T @ t.T if rhs is None else rhs + a.T @ t.T
    assert gram is not None and rhs is not None  # n >= 1: one chunk at least
    if total_rows < len(gram):
        warnings.warn(
            f"least squares with {total_rows} samples for {len(gram)} unknowns per neuron "
            "is underdetermined (the ridge term picks one solution); use a larger "
            "fusion set",
            stacklevel=2,
        )
    lam = ridge * gram.diagonal().mean()
    eye = torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram + lam * eye, rhs)


def set_affine(module: Affine, sol: torch.Tensor) -> None:
    """Write a solution in :func:`ridge_solve`'s layout, ``(fan_in [+ 1], k)``, into an affine layer.

    The last row is the bias when the layer has one.
    """
    bias = module.bias is not None
    with torch.no_grad():
        w = sol[: len(sol) - bias].T.reshape(module.weight.shape)
        module.weight.copy_(w.to(module.weight))
        if module.bias is not None:
            module.bias.copy_(sol[-1].to(module.bias))


@torch.no_grad()
def affine_outputs(
    module: Affine, inputs: torch.Tensor, *, batch_size: int = 512
) -> torch.Tensor:
    """The layer's outputs on ``inputs`` as :func:`~wslib.fusion.levels.neuron_matrix` rows, on its device.

    Computed by the layer itself, in its dtype and in the batches of
    :func:`~wslib.fusion.levels.layer_io`, so they are the values a model holding this layer gives.
    """
    dev = module.weight.device
    out = [module(inputs[idx].to(dev)) for idx in batches(len(inputs), batch_size)]
    return neuron_matrix(torch.cat(out))


def retrofit_linear(
    module: Affine,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    ridge: float = 1e-8,
    prior: torch.Tensor | None = None,
) -> None:
    """Closed-form ridge least squares of an affine layer to ``targets`` (``(k, samples)``).

    The bias, if the layer has one, is fitted through a ones column (see
    :func:`ridge_solve`). With a ``prior`` ``W0`` (``ridge_solve``'s layout,
    bias last) the ridge term pulls toward it instead of zero,
    ``min ||A W - T||^2 + lam ||W - W0||^2``: the layer is set to ``W0`` and
    the step ``W - W0`` is fitted to what its outputs leave of the targets.
    Those outputs come from the layer itself (:func:`affine_outputs`), so a
    prior that reproduces float32 targets leaves exactly zero, and stays.
    The system is solved on the layer's device, in float64 where the device
    supports it (:func:`~wslib.fusion.levels.solve_dtype`).
    """

    bias = module.bias is not None
    dev = module.weight.device
    dtype = solve_dtype(dev)

    def rows(sl: slice) -> torch.Tensor:
        a = design_matrix(module, inputs[sl].to(dev), dtype=dtype)
        if not bias:
            return a
        return torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype, device=dev)], 1)

    if prior is not None:
        set_affine(module, prior)
        targets = targets.to(dev, dtype) - affine_outputs(module, inputs).to(dtype)
    step = ridge_solve(rows, targets, len(inputs), ridge)
    set_affine(module, step if prior is None else prior.to(step) + step)


OPTIMIZERS: tuple[Literal["lbfgs", "adam"], ...] = ("lbfgs", "adam")


@dataclass(frozen=True)
class GradientConfig:
    """Gradient retrofitting of one level: full-batch L-BFGS (default) or Adam.

    ``"lbfgs"``: up to ``max_epochs`` L-BFGS iterations with a strong-Wolfe
    line search and step ``lr`` (1: the quasi-Newton step), stopping early
    once an iteration changes the loss by less than 1e-9 of its start. ``"adam"``: ``max_epochs``
    full-batch Adam steps of size ``lr`` times the RMS of the starting
    parameters (the step scales with the weights), cosine-annealed to zero,
    stopped after ``patience`` epochs without improvement (0: never).
    ``val_fraction`` > 0 holds out that part of the fusion set and selects the
    result on it; 0 fits and selects on the whole set. Either way the result is
    the better of the start and the end of the run (Adam: the best epoch) on
    the selection loss, so it is never worse than the start.

    ``blocks`` (ResNets and transformers only): the Gradient variant fits every
    residual or transformer block end to end, its output against the stream's
    targets, from the least-squares fits of the block's affine steps (the
    paper's level); False: each affine step alone, by this optimiser on its
    least-squares objective.
    """

    lr: float = 1.0
    max_epochs: int = 100
    patience: int = 0
    val_fraction: float = 0.0
    optimizer: Literal["lbfgs", "adam"] = "lbfgs"
    blocks: bool = True

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not isinstance(self.blocks, bool):
            raise TypeError(f"blocks must be True or False, got {self.blocks!r}")
        if self.lr <= 0 or self.max_epochs < 0 or self.patience < 0:
            raise ValueError(
                "GradientConfig needs lr > 0, max_epochs >= 0 and patience >= 0"
            )


def minimise(
    params: Sequence[torch.Tensor],
    train_loss: Callable[[], torch.Tensor],
    select_loss: Callable[[], float],
    config: GradientConfig,
) -> dict[str, float]:
    """Minimise ``train_loss()`` over ``params`` (full batch) and keep the best values.

    The candidates are the starting values and the values the optimiser
    reaches (Adam: after every epoch); the one with the lowest
    ``select_loss()`` is written back. Returns the start's and the result's
    selection loss.
    """
    with torch.no_grad():
        start_loss = select_loss()
    best, best_values = start_loss, [p.detach().clone() for p in params]
    opt: torch.optim.Optimizer

    def consider() -> bool:
        nonlocal best, best_values
        with torch.no_grad():
            current = select_loss()
        if current < best:
            best, best_values = current, [p.detach().clone() for p in params]
            return True
        return False

    if config.optimizer == "lbfgs" and config.max_epochs > 0:
        with torch.no_grad():
            loss_scale = float(train_loss())
        opt = torch.optim.LBFGS(
            params,
            lr=config.lr,
            max_iter=config.max_epochs,
            history_size=20,
            tolerance_grad=1e-12,
            tolerance_change=1e-9 * loss_scale,  # stop once the loss stalls
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = train_loss()
            loss.backward()
            return loss

        opt.step(closure)
        consider()
    elif config.max_epochs > 0:
        with torch.no_grad():
            scale = torch.cat([p.detach().flatten() for p in params]).pow(2).mean()
        step = config.lr * (float(scale.sqrt()) if scale > 0 else 1.0)
        opt = torch.optim.Adam(params, lr=step)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.max_epochs)
        since = 0
        for _ in range(config.max_epochs):
            loss = train_loss()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            since = 0 if consider() else since + 1
            if config.patience and since >= config.patience:
                break
    with torch.no_grad():
        for p, value in zip(params, best_values):
            p.copy_(value)
    return {"start": start_loss, "best": best}


def held_out_split(
    n: int, val_fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the held-out and the training examples, drawn once with ``seed``.

    ``val_fraction`` 0: no held-out part; both index sets are all examples.
    The indices are drawn on the CPU (reproducible on every device); move
    them to the data's device.
    """
    if val_fraction == 0:
        every = torch.arange(n, device="cpu")
        return every, every
    n_val = max(1, round(val_fraction * n))
    if n_val >= n:
        raise ValueError(
            f"fusion set of {n} examples is too small to hold out {n_val}; "
            "lower GradientConfig.val_fraction"
        )
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(n, generator=gen, device="cpu")
    return order[:n_val], order[n_val:]


def retrofit_gradient(
    module: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    config: GradientConfig = GradientConfig(),
    seed: int = 0,
) -> dict[str, float]:
    """Fit a level to ``targets`` (module-output shape) by gradient steps on the MSE.

    Training starts from the module's current weights (see
    :class:`GradientConfig` and :func:`minimise`); the result is never worse
    than the start on the selection loss. Returns the start's and the
    result's selection MSE.
    """
    dev = next(module.parameters()).device
    val, train = (
        i.to(dev) for i in held_out_split(len(inputs), config.val_fraction, seed)
    )
    x, t = inputs.to(dev), targets.to(dev, torch.float32)
    x_tr, t_tr, x_val, t_val = x[train], t[train], x[val], t[val]
    return minimise(
        list(module.parameters()),
        lambda: F.mse_loss(module(x_tr), t_tr),
        lambda: F.mse_loss(module(x_val), t_val).item(),
        config,
    )
