"""The checks every fusion runs first: models of one architecture with finite
weights and the same classes, a fusion set they can read, importance scores
of the method asked for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch
from torch import nn

from wslib.core.train import model_device
from wslib.fusion.importance import ImportanceName
from wslib.fusion.levels import Affine, level_widths


def check_same_architecture(
    models: Sequence[nn.Module], *, same_widths: bool = True
) -> None:
    """Raise a ValueError unless all models share one architecture (and widths)."""
    if not models:
        raise ValueError("need at least one model")
    first = models[0]
    for i, m in enumerate(models[1:], 1):
        if type(m) is not type(first) or list(m.state_dict()) != list(
            first.state_dict()
        ):
            raise ValueError(
                f"model {i} ({type(m).__name__}) has another architecture than model 0 "
                f"({type(first).__name__}); fuse models of one architecture"
            )
        shapes = [t.dim() for t in m.state_dict().values()]
        if shapes != [t.dim() for t in first.state_dict().values()]:
            raise ValueError(f"model {i} has tensors of another rank than model 0")
        if same_widths and any(
            a.shape != b.shape
            for a, b in zip(m.state_dict().values(), first.state_dict().values())
        ):
            raise ValueError(
                f"model {i} has other layer widths than model 0 ({level_widths(m)} vs "
                f"{level_widths(first)}); this method needs equal widths (use KF otherwise)"
            )


def check_finite(
    models: Sequence[nn.Module], x: torch.Tensor, fused: nn.Module | None = None
) -> None:
    """Raise a ValueError naming the first NaN or infinite weight of a model (or
    of the caller's ``fused`` model), or the inputs."""
    named = [(f"model {i}", m) for i, m in enumerate(models)]
    named += [] if fused is None else [("the fused model", fused)]
    for label, m in named:
        for name, t in m.state_dict().items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(
                    f"{label} has NaN or infinite values in {name!r}; fuse trained "
                    "models with finite weights (check the run that produced it)"
                )
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("the fusion set's inputs hold NaN or infinite values")


def check_fusion_set(y: torch.Tensor, n_classes: int) -> None:
    """Raise a ValueError for labels outside ``[0, n_classes)`` or classes the fusion set lacks."""
    y = y if isinstance(y, torch.Tensor) else torch.as_tensor(y, device="cpu")
    if y.numel() and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(
            f"fusion labels must lie in [0, {n_classes}) for models with {n_classes} "
            f"classes, got labels from {int(y.min())} to {int(y.max())}"
        )
    present = set(y.unique().tolist())
    missing = [c for c in range(n_classes) if c not in present]
    if missing:
        raise ValueError(
            f"the fusion set has no examples of classes {missing}; draw a class-balanced "
            "fusion set (wslib.core.data.balanced_subset) from the union of the training data"
        )


def check_fusion_inputs(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Refuse a fusion set the models cannot read: one label per input, inputs of their shape.

    One example goes through ``model`` (eval mode, no gradient, its mode
    restored); a shape the model does not take is named with the fix instead
    of surfacing as a matrix-size error deep in a fusion.
    """
    if len(x) != len(y):
        raise ValueError(
            f"the fusion set has {len(x)} inputs but {len(y)} labels; give one label per input"
        )
    if not len(x):
        raise ValueError(
            "the fusion set is empty; draw one with wslib.core.data.balanced_subset"
        )
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x[:1].to(model_device(model)))
    except RuntimeError as error:
        raise ValueError(
            f"the models cannot read the fusion set's inputs of shape "
            f"{tuple(x.shape[1:])} per example ({str(error).splitlines()[0]}); draw the "
            "fusion set from the data set the models were trained on"
        ) from None
    finally:
        model.train(training)


def check_same_classes(
    models: Sequence[nn.Module], residual: bool, levels: Sequence[str]
) -> int:
    """The common number of classes of ``models`` (heads); a ValueError when they differ."""
    heads = [
        cast(Affine, m.head if residual else m.get_submodule(levels[-1]))
        for m in models
    ]
    counts = [h.weight.shape[0] for h in heads]
    if len(set(counts)) > 1:
        raise ValueError(
            f"the models have {counts} classes; "
            "fuse models with the same output classes"
        )
    return counts[0]


def check_scores(
    scores: Sequence[Mapping[str, torch.Tensor]],
    importance: ImportanceName,
    n_models: int,
) -> None:
    """Raise a ValueError when ``scores`` do not belong to ``importance`` or to every model.

    Scores from :func:`~wslib.fusion.importance.neuron_importance` carry the
    method that computed them; plain dicts are checked only for ``"uniform"``
    (all scores equal).
    """
    if len(scores) != n_models:
        raise ValueError(
            f"need importance scores for {n_models} models, got {len(scores)}"
        )
    for i, s in enumerate(scores):
        method = getattr(s, "method", None)
        if method is not None and method != importance:
            raise ValueError(
                f"scores of model {i} were computed with {method!r} but importance="
                f"{importance!r}; pass matching scores or scores=None"
            )
        if importance == "uniform" and any(
            len(v) and not torch.allclose(v.double(), v.double()[0].expand_as(v))
            for v in s.values()
        ):
            raise ValueError(
                f"importance='uniform' but the scores of model {i} are not uniform; "
                "pass the importance they were computed with"
            )
