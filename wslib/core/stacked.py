"""Several same-shaped models trained as one stacked model (``torch.func`` + ``vmap``).

A small MLP's training step on a GPU costs the same whether it multiplies 500
or 8000 rows: the time goes to kernel launches and host round trips. Runs that
differ only in their initial weights, seed and learning rate (chapter 7's
seeds, methods and rate grids) can then share each step: their parameters are
stacked along a new first axis and one vectorised forward and backward pass
serves them all. Each run keeps its own data order (its own generator, seeded
as :func:`wslib.core.train.fit` seeds it) and its own learning rate, so it
follows the same arithmetic as its solo run; only the rounding of the batched
kernels differs. On a CPU this gains nothing (the work is the same), so the
library stacks on CUDA only unless asked.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state
from tqdm.auto import tqdm

from wslib.core.train import (
    Recipe,
    batches,
    check_give_up,
    pick_device,
    precision_autocast,
)


def stack_signature(recipe: Recipe) -> tuple:
    """What runs must share to be stacked: every recipe field but the learning rate."""
    return tuple(v for k, v in sorted(recipe.to_dict().items()) if k != "lr")


def _check(models: Sequence[nn.Module], recipes: Sequence[Recipe]) -> None:
    if not models or len(models) != len(recipes):
        raise ValueError(
            f"fit_stacked needs one recipe per model, got {len(models)} models "
            f"and {len(recipes)} recipes"
        )
    shapes = [[(k, v.shape) for k, v in m.named_parameters()] for m in models]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(
            "fit_stacked needs models of one architecture (the same parameter "
            "names and shapes); train differently shaped models apart"
        )
    if any(next(m.buffers(), None) is not None for m in models):
        raise ValueError(
            "fit_stacked cannot train models with buffers (BatchNorm statistics); "
            "train them one by one with wslib.core.train.fit"
        )
    if len({stack_signature(r) for r in recipes}) > 1:
        raise ValueError(
            "stacked runs may differ in their learning rate only; group the runs "
            "by every other recipe field (wslib.core.stacked.stack_signature)"
        )
    if recipes[0].optimizer != "sgd" or recipes[0].augment:
        raise ValueError(
            "fit_stacked implements SGD without augmentation; train other "
            "recipes with wslib.core.train.fit"
        )


def _rate(recipe: Recipe, epoch: int) -> float:
    """The learning rate of ``epoch`` (cosine: annealed to zero over the epochs)."""
    if recipe.schedule == "constant":
        return recipe.lr
    return recipe.lr * (1 + math.cos(math.pi * epoch / recipe.epochs)) / 2


def fit_stacked(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    recipes: Sequence[Recipe],
    seeds: Sequence[int],
    *,
    device: str | torch.device | None = None,
    progress: bool = True,
    stop_at: float | None = None,
    give_up_after: int | None = None,
) -> list[dict[str, list[float]]]:
    """Train ``models`` in place as one stacked model; each run's history as :func:`~wslib.core.train.fit`'s.

    Model ``i`` trains with ``recipes[i]`` (they differ in ``lr`` only) on data
    shuffled by a generator seeded with ``seeds[i]``, by cross-entropy and SGD
    (momentum, weight decay and schedule as ``torch.optim.SGD`` and
    :func:`~wslib.core.train.fit` apply them). With ``stop_at``, a run stops
    after its first epoch whose running accuracy reaches it: its weights stay
    as they are from then on and its history ends there; with
    ``give_up_after``, every run still going stops after that epoch.
    """
    _check(models, recipes)
    check_give_up(stop_at, give_up_after)
    recipe, n = recipes[0], len(models)
    dev = pick_device(device)
    for m in models:
        m.to(dev)
    x, y = x.to(dev), y.to(dev)
    params = {k: v.detach() for k, v in stack_module_state(list(models))[0].items()}
    skeleton = copy.deepcopy(models[0]).to("meta")

    def one(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        return functional_call(skeleton, p, (xb,))

    forward = torch.vmap(one)
    gens = [
        torch.Generator(device=dev if dev.type == "cuda" else "cpu").manual_seed(s)
        for s in seeds
    ]
    autocast = precision_autocast(dev, recipe.precision)
    momenta: dict[str, torch.Tensor] = {}
    active = torch.ones(n, dtype=torch.bool, device=dev)
    histories: list[dict[str, list[float]]] = [{"loss": [], "acc": []} for _ in models]
    bar = tqdm(range(recipe.epochs), desc="stacked", disable=not progress, leave=False)
    for epoch in bar:
        rates = torch.tensor([_rate(r, epoch) for r in recipes], device=dev)
        rates = rates * active
        total_loss = torch.zeros(n, dtype=torch.float64, device=dev)
        correct = torch.zeros(n, dtype=torch.long, device=dev)
        orders = [batches(len(x), recipe.batch_size, generator=g) for g in gens]
        for batch in zip(*orders):
            idx = torch.stack(batch).to(dev)  # (runs, batch)
            xb, yb = x[idx], y[idx]
            leaves = {k: v.requires_grad_() for k, v in params.items()}
            with autocast:
                out = forward(leaves, xb)
                losses = nn.functional.cross_entropy(
                    out.flatten(0, 1).float(), yb.flatten(), reduction="none"
                ).view(n, -1)
            loss = losses.mean(1)
            grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
            with torch.no_grad():
                for (k, p), g in zip(params.items(), grads, strict=True):
                    params[k] = _sgd(k, p.detach(), g, recipe, rates, momenta)
            total_loss += loss.detach().double() * idx.shape[1]
            correct += (out.detach().argmax(-1) == yb).sum(1)
        accs = _record(histories, active, total_loss, correct, len(x))
        if stop_at is not None:
            active &= torch.tensor([a < stop_at for a in accs], device=dev)
            if not bool(active.any()):
                break
        if give_up_after is not None and epoch + 1 >= give_up_after:
            break
    _write_back(models, params)
    return histories


def _record(
    histories: list[dict[str, list[float]]],
    active: torch.Tensor,
    total_loss: torch.Tensor,
    correct: torch.Tensor,
    n_examples: int,
) -> list[float]:
    """Append the epoch's mean loss and accuracy to the history of each run still
    training; every run's accuracy this epoch."""
    losses = (total_loss / n_examples).tolist()
    accs = (correct.double() / n_examples).tolist()
    for i, h in enumerate(histories):
        if bool(active[i]):
            h["loss"].append(losses[i])
            h["acc"].append(accs[i])
    return accs


@torch.no_grad()
def _write_back(models: Sequence[nn.Module], params: dict[str, torch.Tensor]) -> None:
    """Copy each run's slice of the stacked parameters into its model (eval mode)."""
    for i, m in enumerate(models):
        for k, p in m.named_parameters():
            p.copy_(params[k][i])
        m.eval()


def _sgd(
    name: str,
    p: torch.Tensor,
    g: torch.Tensor,
    recipe: Recipe,
    rates: torch.Tensor,
    momenta: dict[str, torch.Tensor],
) -> torch.Tensor:
    """One step of ``torch.optim.SGD`` (no dampening, no Nesterov) on a stacked tensor."""
    d = g + recipe.weight_decay * p if recipe.weight_decay else g
    if recipe.momentum:
        buf = momenta.get(name)
        d = d.clone() if buf is None else buf.mul_(recipe.momentum).add_(d)
        momenta[name] = d
    return p - rates.view(-1, *[1] * (p.dim() - 1)) * d
