"""Neuron importance scores for fusion: Conductance, DeepLIFT or uniform.

The score of a neuron of a layer is the mean absolute attribution (captum's
``LayerConductance`` or ``LayerDeepLift`` on the layer's output, target = the
true label, zero baseline) over the examples and over the positions or tokens
of the layer's output. ``"uniform"`` gives every neuron the score 1.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
from captum.attr import LayerConductance, LayerDeepLift
from torch import nn
from tqdm.auto import tqdm

from wslib.core.models import TransformerBlock
from wslib.core.train import batches

# The neuron importance methods (:data:`IMPORTANCES` lists them at run time).
ImportanceName = Literal["uniform", "conductance", "deeplift"]
IMPORTANCES: tuple[ImportanceName, ...] = get_args(ImportanceName)


class Scores(dict):
    """Importance scores (layer or group name -> tensor) tagged with the ``method`` that made them."""

    def __init__(self, scores: dict[str, torch.Tensor], method: ImportanceName) -> None:
        super().__init__(scores)
        self.method = method


def _untie_activations(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in which no activation module object is used twice.

    DeepLIFT's rules are attached to activation modules; the MLP calls one
    shared ``act`` module after every layer, so the copy calls a fresh copy
    of it after each layer instead.
    """
    model = copy.deepcopy(model).eval()
    if hasattr(model, "act") and hasattr(model, "linears"):
        mlp: Any = model  # an MLP (wslib.core.models.MLP) or a model laid out like one
        acts = nn.ModuleList(copy.deepcopy(mlp.act) for _ in mlp.linears[:-1])
        mlp.acts = acts

        def forward(x: torch.Tensor) -> torch.Tensor:
            x = x.flatten(1)
            for layer, act in zip(mlp.linears[:-1], mlp.acts):
                x = act(layer(x))
            return mlp.linears[-1](x)

        mlp.forward = forward
    return model


def neuron_importance(
    model: nn.Module,
    layers: Sequence[str],
    x: torch.Tensor,
    y: torch.Tensor,
    method: ImportanceName = "conductance",
    *,
    batch_size: int = 256,
    n_steps: int = 16,
    progress: bool = True,
) -> Scores:
    """Importance score of every output neuron (channel) of each named layer.

    Parameters
    ----------
    model
        The network (evaluated in eval mode; not modified).
    layers
        Names of submodules (``model.get_submodule`` keys) whose outputs hold
        the neurons: channels on axis 1 (Linear, Conv; positions count as
        samples) or, for a Linear or a transformer block applied to tokens
        ``(N, T, D)``, on the last axis (tokens count as samples).
    x, y
        Inputs and true labels (the attribution target).
    method
        ``"uniform"``, ``"conductance"`` or ``"deeplift"``.
    batch_size, n_steps
        Examples per captum call; integration steps of Conductance.
    progress
        Show a progress bar over layers x batches.

    Returns
    -------
    dict
        Layer name -> float64 tensor of shape ``(n_neurons,)``, non-negative
        (a :class:`Scores` dict that knows ``method``).
    """
    if method not in IMPORTANCES:
        raise ValueError(f"unknown importance {method!r}; valid: {IMPORTANCES}")
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"need as many labels as inputs (> 0), got {len(x)} and {len(y)}"
        )
    model = _attribution_copy(model, method)
    dev = next(model.parameters()).device
    scores: dict[str, torch.Tensor] = {}
    steps = len(layers) * -(-len(x) // batch_size)
    bar = tqdm(
        total=steps, desc=f"importance ({method})", disable=not progress, leave=False
    )
    for name in layers:
        layer = model.get_submodule(name)
        total: torch.Tensor | None = None
        count = 0
        for idx in batches(len(x), batch_size):
            xb, yb = x[idx].to(dev), y[idx].to(dev)
            att = _channel_first(
                layer, _attribute(model, layer, xb, yb, method, n_steps)
            )
            per_neuron = att.movedim(1, 0).reshape(att.shape[1], -1)
            total = per_neuron.sum(1) if total is None else total + per_neuron.sum(1)
            count += per_neuron.shape[1]
            bar.update()
        assert total is not None  # x holds at least one example (checked above)
        scores[name] = (total / count).cpu()
    bar.close()
    return Scores(scores, method)


def example_scores(
    model: nn.Module,
    layer: str,
    x: torch.Tensor,
    y: torch.Tensor,
    method: ImportanceName = "conductance",
    *,
    batch_size: int = 256,
    n_steps: int = 16,
) -> torch.Tensor:
    """Per example, the importance of every neuron of ``layer``: ``(N, n_neurons)``, float64.

    The mean over positions of ``|attribution|`` (target: the example's
    label), so the mean over examples is :func:`neuron_importance`'s score;
    one pass over ``x`` however many classes it holds.
    """
    if method not in IMPORTANCES:
        raise ValueError(f"unknown importance {method!r}; valid: {IMPORTANCES}")
    model = _attribution_copy(model, method)
    dev = next(model.parameters()).device
    module = model.get_submodule(layer)
    rows = []
    for idx in batches(len(x), batch_size):
        xb, yb = x[idx].to(dev), y[idx].to(dev)
        att = _channel_first(module, _attribute(model, module, xb, yb, method, n_steps))
        rows.append(att.reshape(att.shape[0], att.shape[1], -1).mean(2))
    return torch.cat(rows)


def _attribution_copy(model: nn.Module, method: ImportanceName) -> nn.Module:
    """A copy of ``model`` in eval mode to attribute on (DeepLIFT: one ReLU per use)."""
    return (
        _untie_activations(model)
        if method == "deeplift"
        else copy.deepcopy(model).eval()
    )


def _channel_first(layer: nn.Module, att: torch.Tensor) -> torch.Tensor:
    """``|att|`` in float64 with the neurons on axis 1 (tokens' last axis moved there)."""
    att = att.detach().abs().double()
    if isinstance(layer, (nn.Linear, TransformerBlock)) and att.dim() == 3:
        att = att.movedim(-1, 1)
    return att


def _attribute(
    model: nn.Module,
    layer: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    method: ImportanceName,
    n_steps: int,
) -> torch.Tensor:
    if method == "uniform":
        with torch.no_grad():
            out: list[torch.Tensor] = []
            handle = layer.register_forward_hook(lambda m, i, o: out.append(o))
            model(x)
            handle.remove()
        return torch.ones_like(out[0])
    base = torch.zeros_like(x)
    if method == "conductance":
        return LayerConductance(model, layer).attribute(
            x, base, target=y, n_steps=n_steps
        )
    return LayerDeepLift(model, layer).attribute(x, base, target=y)
