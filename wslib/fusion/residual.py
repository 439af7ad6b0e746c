"""HF / KF fusion of residual networks: ResNets with BatchNorm and pre-LN transformers.

A chain net (:mod:`wslib.fusion`) is fused one layer after the other. In a
residual network some neurons live on a *residual stream*: one channel is
written by several layers (the stem or a projection shortcut, then every
block of the stage) and read by all of them, so it is one neuron group of
the neuron structure with several *taps* (the stream's value after each
write; pre-ReLU in the ResNets). Here:

1. **Grouping.** Every group (a block's inner neurons, a transformer block's
   MLP neurons, a residual stream) is grouped once, HF or KF, from the base
   models' activations at all of its taps side by side; its targets at each
   tap are the importance-weighted centroids there. Stream importance is the
   mean of the scores at the outputs of the blocks that write it.
2. **Retrofitting**, in data-flow order, on the fused model's own inputs: each
   affine layer, or the layers that write one stream value together (a
   block's last conv and its projection shortcut), is fitted to the targets
   minus what an identity shortcut already carries, by ridge least squares.
3. **Gradient variant, whole blocks** (the paper's level; default): after
   the least-squares fits of a block's affine steps, the whole block (a
   ResNet BasicBlock up to its pre-ReLU sum, or a pre-LN transformer block) is
   fitted end to end on its own fused input: the mean squared error of its
   output against the stream's targets at the block output, minimised over
   all of the block's parameters by :func:`~wslib.fusion.retrofit.minimise`
   (full-batch L-BFGS by default), keeping the better of start and end
   (:func:`fit_block`). The stem and the head stay affine least-squares fits.
   With ``GradientConfig(blocks=False)`` the gradient variant instead runs the
   optimiser on each affine step's least-squares objective (convex, so it
   ends where the Linear variant is). Differences from the paper: L-BFGS on
   the whole fusion set rather than SGD/Adam with early stopping, and the
   inner neurons of a block are targeted only through the block's output.

Layers without a linear-in-weights role are set as follows, and stated:

- **BatchNorm.** A fitted affine map ``W u + b`` becomes the conv weight ``W``
  and a BN layer whose running statistics are those of ``W u`` on the fusion
  set and whose gamma/beta undo them (``gamma = sqrt(var + eps)``,
  ``beta = mean + b``): the eval-mode function is exactly the fit, and
  train-mode BN on similar batches stays close to it.
- **LayerNorm** gets the identity affine map (gamma 1, beta 0) in the
  least-squares fit; it still normalises, and the layer after it is fitted on
  its output. The whole-block Gradient fit (``GradientConfig.blocks``) then
  trains every parameter of the block, LayerNorm and BatchNorm included.
- **Attention heads are not grouped.** The fused ``qkv`` layer is fitted to
  reproduce model 0's queries, keys and values from the fused stream; the
  output projection is fitted to the stream targets.
- The transformer's position embedding is fitted together with the patch
  embedding (one offset per token and feature).
- **The ridge term pulls toward zero**, not toward the aligned parents'
  weights as for chains (:func:`wslib.fusion.hfkf.aligned_prior`). Such a
  prior would need, per fitted piece, the grouping of its *source* (a stream,
  a block's inner neurons, the data) besides that of its output, each base
  model's BatchNorm folded into its convs and its LayerNorm affine into the
  next layer (the fused LayerNorms are reset to the identity), and a rule for
  the attention steps, whose ``qkv`` targets and ``proj`` inputs are model
  0's ungrouped features; and because the fused BatchNorms get the
  statistics of the fused convs' outputs (below), even an exact prior would
  return a model fused with its copy only up to float32 rounding, not by
  construction. A model fused with its copy is returned where the fusion set
  identifies every weight (tested to 1e-4); a neuron that never fires on the
  fusion set loses its outgoing weights, as chains did.

The taps (every intermediate value the fusion reads) and the plan (what is
fitted, in which order, to which targets) are in :mod:`wslib.fusion.taps`.

**Device.** Everything runs on the device of the fused model (that of the
base models' first, as :func:`wslib.fusion.hfkf.fuse` places it): the taps, the
targets, the least-squares systems (float64 where the device supports it,
:func:`~wslib.fusion.levels.solve_dtype`), the gradient fits and the
BatchNorm statistics. The grouping and the representation costs run there
too (:func:`~wslib.fusion.grouping.group_labels`); only per-neuron matrices
leave it, for SciPy's Hungarian solver and scikit-learn's k-means.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wslib.core.models import BasicBlock, Transformer, TransformerBlock
from wslib.core.neurons import neuron_structure
from wslib.core.seeds import derive_seed
from wslib.core.train import model_device
from wslib.fusion.grouping import cost_decomposition, group_labels, weighted_centroids
from wslib.fusion.levels import (
    Affine,
    FusionResult,
    GroupingName,
    RetrofitName,
    normalised_scores,
    solve_dtype,
)
from wslib.fusion.retrofit import (
    GradientConfig,
    design_matrix,
    held_out_split,
    minimise,
    ridge_solve,
)
from wslib.fusion.taps import (
    Fit,
    Step,
    Taps,
    arch_plan,
    block_output,
    evaluating,
    tap_matrix,
)

# --- fitting one step -----------------------------------------------------------------------------


class _Piece:
    """Design rows and coefficients of one :class:`~wslib.fusion.taps.Fit` in the fused model."""

    def __init__(
        self, model: nn.Module, fit: Fit, source: torch.Tensor, dtype: torch.dtype
    ) -> None:
        self.model, self.fit, self.source, self.dtype = model, fit, source, dtype
        self.module = (
            cast(Affine, model.get_submodule(fit.module))
            if fit.module != "pos"
            else None
        )

    def design(self, sl: slice) -> torch.Tensor:
        if self.module is None:  # position embedding: one indicator column per token
            n, t = self.source[sl].shape[:2]
            eye = torch.eye(t, dtype=self.dtype, device=self.source.device)
            return eye.repeat(n, 1)
        return design_matrix(self.module, self.source[sl], dtype=self.dtype)

    @torch.no_grad()
    def coefficients(self) -> torch.Tensor:
        """The current map as ``(fan_in, k)`` (BN folded into the conv)."""
        if self.module is None:  # the embedding's bias is folded into the positions
            model = cast(Transformer, self.model)  # only a transformer has positions
            bias = cast(torch.Tensor, model.embed.bias)  # the patch embedding has one
            return (model.pos[0] + bias).to(self.dtype).clone()
        w = self.module.weight.to(self.dtype).reshape(self.module.weight.shape[0], -1)
        if self.fit.bn is not None:
            bn: Any = self.model.get_submodule(self.fit.bn)  # with running statistics
            scale = (bn.weight / (bn.running_var + bn.eps).sqrt()).to(self.dtype)
            w = w * scale[:, None]
        return w.T.clone()

    @torch.no_grad()
    def write(self, coef: torch.Tensor) -> None:
        """Set the map to ``coef``; BN gets the statistics of the new conv output, undone by gamma/beta."""
        if self.module is None:
            model = cast(Transformer, self.model)  # only a transformer has positions
            model.pos.copy_(coef[None].to(model.pos))
            cast(torch.Tensor, model.embed.bias).zero_()  # the embedding has a bias
            return
        self.module.weight.copy_(
            coef.T.reshape(self.module.weight.shape).to(self.module.weight)
        )
        if self.fit.bn is None:
            if self.module.bias is not None:
                self.module.bias.zero_()  # the step's bias is added afterwards
            return
        bn: Any = self.model.get_submodule(self.fit.bn)  # with running statistics
        out = self.module(self.source).transpose(0, 1).flatten(1)  # (channels, samples)
        mean, var = out.mean(1), out.var(1, unbiased=False)
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
        bn.weight.copy_((var + bn.eps).sqrt())
        bn.bias.copy_(mean)

    def bias_holder(self) -> torch.Tensor:
        """The tensor to which the step's bias is added (BN beta or the layer's own bias)."""
        if self.fit.bn is not None:
            return cast(torch.Tensor, self.model.get_submodule(self.fit.bn).bias)
        assert self.module is not None  # the position embedding's step has no bias
        return cast(torch.Tensor, self.module.bias)

    @torch.no_grad()
    def current_bias(self) -> torch.Tensor:
        """The current bias of the map (BN folded)."""
        if self.fit.bn is None:
            assert self.module is not None  # the position embedding's step has no bias
            return cast(torch.Tensor, self.module.bias).to(self.dtype).clone()
        bn: Any = self.model.get_submodule(self.fit.bn)  # with running statistics
        return (
            bn.bias - bn.weight * bn.running_mean / (bn.running_var + bn.eps).sqrt()
        ).to(self.dtype)


def _rows(pieces: Sequence[_Piece], sl: slice, bias: bool) -> torch.Tensor:
    a = torch.cat([p.design(sl) for p in pieces], 1)
    if not bias:
        return a
    return torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype, device=a.device)], 1)


def _solve_gradient(
    pieces: Sequence[_Piece],
    target: torch.Tensor,
    n: int,
    bias: bool,
    config: GradientConfig,
    seed: int,
) -> torch.Tensor:
    """Gradient fit (:func:`~wslib.fusion.retrofit.minimise`) of the coefficients from their current values."""
    per = target.shape[1] // n
    rows = _rows(pieces, slice(0, n), bias)
    a, dev = rows.float(), rows.device
    t = target.T.float()
    start = [p.coefficients() for p in pieces]
    if bias:
        start.append(cast(torch.Tensor, sum(p.current_bias() for p in pieces))[None])
    coef = torch.cat(start).float().requires_grad_(True)
    val, train = (
        (
            idx.to(dev)[:, None] * per + torch.arange(per, device=dev)[None]
        ).flatten()  # the rows of those examples
        for idx in held_out_split(n, config.val_fraction, seed)
    )
    minimise(
        [coef],
        lambda: F.mse_loss(a[train] @ coef, t[train]),
        lambda: F.mse_loss(a[val] @ coef, t[val]).item(),
        config,
    )
    return coef.detach().to(rows.dtype)


def _write(pieces: Sequence[_Piece], sol: torch.Tensor, bias: bool) -> None:
    start = 0
    for p in pieces:
        size = p.design(slice(0, 1)).shape[1]
        p.write(sol[start : start + size])
        start += size
    if bias:
        with torch.no_grad():
            holder = pieces[0].bias_holder()
            holder.add_(sol[start].to(holder))


def _as_output(target: torch.Tensor, like: torch.Tensor, tokens: bool) -> torch.Tensor:
    """Inverse of :func:`~wslib.fusion.taps.tap_matrix`: ``(neurons, samples)`` back to the shape of ``like``."""
    if tokens or like.dim() == 2:
        return target.T.reshape(like.shape)
    return target.reshape(like.shape[1], like.shape[0], *like.shape[2:]).movedim(0, 1)


@torch.no_grad()
def restat_batchnorm(block: BasicBlock, x: torch.Tensor) -> None:
    """Give a BasicBlock's BatchNorms the statistics of their inputs on ``x``, same eval function.

    After an end-to-end fit the running statistics no longer describe the
    convs' outputs; gamma and beta are rescaled so that the eval-mode map
    is unchanged.
    """
    inner_in = F.relu(block.bn1(block.conv1(x)))
    # the BatchNorms with their running statistics
    pairs: list[tuple[nn.Module, Any, torch.Tensor]] = [
        (block.conv1, block.bn1, x),
        (block.conv2, block.bn2, inner_in),
    ]
    if block.shortcut is not None:
        pairs.append((block.shortcut.conv, block.shortcut.bn, x))
    for conv, bn, source in pairs:
        out = conv(source).transpose(0, 1).flatten(1)
        mean, var = out.mean(1), out.var(1, unbiased=False)
        scale = bn.weight / (bn.running_var + bn.eps).sqrt()
        bn.bias.add_(scale * (mean - bn.running_mean))
        bn.weight.copy_(scale * (var + bn.eps).sqrt())
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)


def fit_block(
    block: BasicBlock | TransformerBlock,
    x: torch.Tensor,
    target: torch.Tensor,
    tokens: bool,
    config: GradientConfig,
    seed: int,
) -> dict[str, float]:
    """Fit a whole block end to end: :func:`~wslib.fusion.taps.block_output` on ``x`` against ``target``.

    ``target`` is ``(neurons, samples)`` (:func:`~wslib.fusion.taps.tap_matrix` layout). All of
    the block's parameters move (eval mode: BatchNorm as its running affine
    map) under :func:`~wslib.fusion.retrofit.minimise`, which keeps the better
    of the start and the end on the selection loss (the held-out examples of
    ``config.val_fraction``, else all). Returns the start's and the result's
    selection MSE.
    """
    block.eval()
    with torch.no_grad():
        like = block_output(block, x[:1])
    t = _as_output(target.to(like), like.expand(len(x), *like.shape[1:]), tokens)
    val, train = (
        i.to(x.device) for i in held_out_split(len(x), config.val_fraction, seed)
    )
    params = [p for p in block.parameters() if p.requires_grad]
    with torch.enable_grad():
        out = minimise(
            params,
            lambda: F.mse_loss(block_output(block, x[train]), t[train]),
            lambda: F.mse_loss(block_output(block, x[val]), t[val]).item(),
            config,
        )
    if not isinstance(block, TransformerBlock):
        restat_batchnorm(block, x)
    return out


# --- the fusion ---------------------------------------------------------------------------------


def _group_targets(
    plan: Sequence[Step],
    base: Sequence[Taps],
    scores: Sequence[dict[str, torch.Tensor]],
    fused_sizes: dict[str, int],
    grouping: GroupingName,
    tokens: bool,
    seed: int,
    dtype: torch.dtype = torch.float64,
) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """Targets ``(k, samples)`` at every grouped tap, and what the grouping saw (for the costs).

    The grouping, the targets and what it saw stay on the taps' device.
    """
    targets: dict[str, torch.Tensor] = {}
    seen: dict[str, dict] = {}
    for group in dict.fromkeys(s.group for s in plan if s.group is not None):
        taps = [s.tap for s in plan if s.group == group]
        mats = {
            tap: [tap_matrix(b[tap], tokens, dtype=dtype) for b in base] for tap in taps
        }
        points = torch.cat([torch.cat(mats[tap], 0) for tap in taps], 1)
        sizes = [len(m) for m in mats[taps[0]]]
        w = np.concatenate([normalised_scores(s[group]) for s in scores])
        k = fused_sizes[group]
        labels = group_labels(points, sizes, w, k, grouping, seed=seed)
        centroids = weighted_centroids(points, w, labels, k)
        widths = [mats[tap][0].shape[1] for tap in taps]
        targets.update(zip(taps, centroids.split(widths, 1)))
        seen[group] = {"taps": taps, "points": points, "weights": w, "labels": labels}
    return targets, seen


def fuse_residual(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    grouping: GroupingName,
    retrofit: RetrofitName,
    fused: nn.Module,
    head_weights: np.ndarray,
    scores: Sequence[dict[str, torch.Tensor]],
    ridge: float,
    gradient: GradientConfig,
    seed: int,
) -> FusionResult:
    """HF/KF fusion of ResNets or transformers into ``fused`` (in place); see the module docstring.

    Called by :func:`wslib.fusion.hfkf.fuse`, which checks the inputs; ``head_weights``
    are the normalised per-class weights of each model's logits. Computes on
    ``fused``'s device (see the module docstring); the base models' modes are
    left as they were.
    """
    start = time.perf_counter()
    taps_of, plan, tokens = arch_plan(models[0])
    dev = model_device(fused)
    dtype = solve_dtype(dev)
    fused.eval()
    x = x.to(dev)
    with evaluating(models):
        base = [
            {k: v.to(dev) for k, v in taps_of(m, x.to(model_device(m))).items()}
            for m in models
        ]
    sizes = {g.name: g.size for g in neuron_structure(fused).groups}
    targets, seen = _group_targets(
        plan, base, scores, sizes, grouping, tokens, seed, dtype
    )
    logits = torch.stack([b["head"].to(dtype) for b in base])
    weights = torch.as_tensor(head_weights, dtype=dtype, device=dev)
    targets["head"] = tap_matrix(
        (weights[:, None, :] * logits).sum(0), tokens, dtype=dtype
    )
    for norm in (m for m in fused.modules() if isinstance(m, nn.LayerNorm)):
        nn.init.ones_(norm.weight)
        nn.init.zeros_(norm.bias)
    blocks = retrofit == "gradient" and gradient.blocks
    block_fits: list[dict] = []
    for i, step in enumerate(plan):
        own = taps_of(fused, x)
        target = _step_target(step, targets, base[0], own, tokens, dtype)
        pieces = [_Piece(fused, f, own[f.source], dtype) for f in step.fits]
        if retrofit == "linear" or blocks:
            sol = ridge_solve(
                functools.partial(_rows, pieces, bias=step.bias), target, len(x), ridge
            )
        else:
            sol = _solve_gradient(
                pieces,
                target,
                len(x),
                step.bias,
                gradient,
                derive_seed(seed, "step", i),
            )
        _write(pieces, sol, step.bias)
        if blocks and step.block is not None:
            fit = fit_block(
                cast(BasicBlock | TransformerBlock, fused.get_submodule(step.block)),
                own[f"{step.block}.in"],
                targets[step.tap],
                tokens,
                gradient,
                derive_seed(seed, "step", i),
            )
            block_fits.append({"block": step.block, **fit})
    result = FusionResult(fused.eval(), [s.tap for s in plan], block_fits=block_fits)
    result.costs = _costs(seen, taps_of(fused, x), tokens, dtype)
    result.seconds = time.perf_counter() - start
    return result


def _step_target(
    step: Step,
    targets: dict[str, torch.Tensor],
    first: Taps,
    own: Taps,
    tokens: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """What ``step`` fits: its tap's grouped targets (model 0's values for an
    ungrouped tap, ``first``), less what the identity shortcut already carries
    in the fused model's own taps ``own``."""
    target = (
        targets[step.tap]
        if step.tap in targets
        else tap_matrix(first[step.tap], tokens, dtype=dtype)
    )
    if step.residual is not None:
        target = target - tap_matrix(own[step.residual], tokens, dtype=dtype)
    return target


def _costs(
    seen: dict[str, dict[str, Any]], own: Taps, tokens: bool, dtype: torch.dtype
) -> list[dict[str, Any]]:
    """The representation cost of each grouped level (Theorem 1's decomposition),
    the fused model's own taps ``own`` against the base models' points."""
    costs = []
    for group, g in seen.items():
        out = torch.cat(
            [tap_matrix(own[tap], tokens, dtype=dtype) for tap in g["taps"]], 1
        )
        costs.append(
            {
                "level": group,
                **cost_decomposition(g["points"], g["weights"], g["labels"], out),
            }
        )
    return costs
