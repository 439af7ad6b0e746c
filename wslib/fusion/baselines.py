"""Baselines of the fusion chapters.

Vanilla weight averaging, the ensemble (mean softmax), last-layer knowledge
distillation, OTFusion (Singh & Jaggi, 2020; exact optimal transport with
POT's ``ot.emd``, activation- or weight-based ground cost, align then average)
and Git Re-Basin (Ainsworth et al., 2023; weight matching from
:mod:`wslib.core.matching`, activation matching), each aligning every model to
model 0 before averaging.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast, get_args

import numpy as np
import ot
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from wslib.core.files import tensor_digest
from wslib.core.matching import weight_matching
from wslib.core.neurons import (
    NeuronStructure,
    StateDict,
    neuron_structure,
    permute_state,
)
from wslib.core.norms import has_batchnorm, reset_bn_stats
from wslib.core.train import batches, model_device, predict
from wslib.fusion.checks import (
    check_fusion_inputs,
    check_same_architecture,
    check_scores,
)
from wslib.fusion.hfkf import fuse, model_importance
from wslib.fusion.importance import ImportanceName
from wslib.fusion.levels import (
    GroupingName,
    RetrofitName,
    chain_levels,
    layer_io,
    neuron_matrix,
    normalised_scores,
)
from wslib.fusion.retrofit import GradientConfig

# The ground costs of :func:`otfusion`.
OTCostName = Literal["activation", "weight"]
OT_COSTS: tuple[OTCostName, ...] = get_args(OTCostName)


def average_states(
    states: Sequence[StateDict], *, weights: Sequence[float] | None = None
) -> StateDict:
    """Weighted mean of state dicts (integer buffers are taken from the first)."""
    w = (
        np.full(len(states), 1.0 / len(states))
        if weights is None
        else np.asarray(weights, float)
    )
    w = w / w.sum()
    out = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.clone()
            continue
        total = sum(float(wi) * s[key].double() for wi, s in zip(w, states))
        out[key] = cast(torch.Tensor, total).to(first.dtype)
    return out


def _from_state(
    template: nn.Module, state: StateDict, x_bn: torch.Tensor | None
) -> nn.Module:
    model = copy.deepcopy(template).cpu()
    model.load_state_dict(state)
    if has_batchnorm(model) and x_bn is not None:
        reset_bn_stats(model, x_bn.cpu())
    return model.eval()


def _cpu_states(models: Sequence[nn.Module]) -> list[StateDict]:
    return [{k: v.detach().cpu() for k, v in m.state_dict().items()} for m in models]


def averaging(
    models: Sequence[nn.Module], *, x_bn: torch.Tensor | None = None
) -> nn.Module:
    """Vanilla averaging of the weights (BatchNorm statistics recomputed on ``x_bn``)."""
    check_same_architecture(models)
    fused = _from_state(models[0], average_states(_cpu_states(models)), x_bn)
    return fused.to(_device(models))


class Ensemble(nn.Module):
    """Mean of the models' softmax outputs, optionally weighted per class.

    ``forward`` returns the log of the (renormalised) mean probabilities, so
    its argmax is the ensemble's prediction. ``class_weights`` has shape
    ``(n_models, n_classes)``; it is a buffer created on the first member's
    device, so it follows the members when the ensemble is moved.
    """

    class_weights: torch.Tensor | None

    def __init__(
        self, models: Sequence[nn.Module], *, class_weights: np.ndarray | None = None
    ) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)
        w = (
            None
            if class_weights is None
            else torch.as_tensor(
                np.asarray(class_weights),
                dtype=torch.float32,
                device=model_device(self.members[0]),
            )
        )
        self.register_buffer("class_weights", w)  # a buffer: .to() moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([F.softmax(m(x), 1) for m in self.members])
        if self.class_weights is None:
            mean = probs.mean(0)
        else:
            w = self.class_weights / self.class_weights.sum(0, keepdim=True)
            mean = (w[:, None, :] * probs).sum(0)
        return torch.log(mean / mean.sum(1, keepdim=True) + 1e-12)


def last_layer_kd(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    *,
    class_weights: np.ndarray | None = None,
    head: str | None = None,
    temperature: float = 2.0,
    epochs: int = 100,
    lr: float = 1e-2,
    seed: int = 0,
) -> nn.Module:
    """Model 0 with only its last layer distilled from the ensemble on the fusion set ``x``."""
    check_same_architecture(models)
    dev = _device(models)
    teacher = Ensemble(
        [copy.deepcopy(m).eval() for m in models], class_weights=class_weights
    )
    student = copy.deepcopy(models[0]).eval()
    head = head or last_linear(student)
    with torch.no_grad():
        x = x.to(dev)
        soft = F.softmax(teacher(x) / temperature, 1)
        feats = layer_io(student, [head], x, kind="input")[head].to(dev)
    layer = student.get_submodule(head)
    _fit_soft_targets(layer, feats, soft, epochs, lr, temperature, 128, seed)
    return student.eval()


def last_linear(model: nn.Module) -> str:
    """Name of the model's last Linear layer (its head)."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no Linear head")
    return names[-1]


# --- OTFusion ---------------------------------------------------------------------------------


def _align_in(w: torch.Tensor, p_prev: torch.Tensor | None) -> torch.Tensor:
    """Mix the input axis of ``w`` (``(out, in * block, ...)``) with transport ``p_prev``."""
    if p_prev is None:
        return w
    n_in = p_prev.shape[0]
    block = w.shape[1] // n_in
    wr = w.reshape(w.shape[0], n_in, block, -1)
    out = torch.einsum("oibr,ij->ojbr", wr, p_prev)
    return out.reshape(w.shape[0], p_prev.shape[1] * block, *w.shape[2:])


def otfusion(
    models: Sequence[nn.Module],
    x: torch.Tensor | None = None,
    *,
    cost: OTCostName = "activation",
    scores: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> nn.Module:
    """OTFusion: align every model to model 0 level by level with exact OT, then average.

    Per level, the transport ``T`` between model ``j``'s and model 0's neurons
    (marginals: uniform, or the neurons' importance ``scores`` scaled to sum
    to 1; squared-Euclidean ground cost on the activations over ``x`` or on
    the incoming weights after aligning their inputs) gives the aligned rows
    ``diag(1/b) T^T W_j``; the next level's input columns are mixed with the
    same map. With ``scores`` each aligned neuron carries the transported
    importance ``diag(1/b) T^T s_j`` and the rows are averaged with those
    weights (:func:`importance_average`); uniform: plain averaging.
    """
    if cost not in OT_COSTS:
        raise ValueError(f"cost must be one of {OT_COSTS}, got {cost!r}")
    if cost == "activation" and x is None:
        raise ValueError("activation-based OTFusion needs the fusion inputs x")
    check_same_architecture(models)
    levels = chain_levels(models[0])
    states = _cpu_states(models)
    acts = (
        [layer_io(m, levels[:-1], x) for m in models]
        if cost == "activation" and x is not None  # x is given for activations (above)
        else None
    )
    marg = [
        _level_weights(levels[:-1], states[j], scores, j) for j in range(len(models))
    ]
    aligned = [states[0]]
    aligned_w: list[Mapping[str, Any]] = [marg[0]]
    for j in range(1, len(models)):
        state = dict(states[j])
        p_prev: torch.Tensor | None = None
        weights: dict[str, torch.Tensor] = {}
        for li, name in enumerate(levels):
            w = _align_in(state[f"{name}.weight"].double(), p_prev)
            if li == len(levels) - 1:  # the head (with or without a bias)
                state[f"{name}.weight"] = w.float()
                break
            b = state[f"{name}.bias"].double()
            w0 = states[0][f"{name}.weight"].double()
            if cost == "activation":
                assert acts is not None  # computed for activation costs
                fa, fb = neuron_matrix(acts[j][name]), neuron_matrix(acts[0][name])
            else:
                fa = torch.cat([w.reshape(len(w), -1), b[:, None]], 1)
                fb = torch.cat(
                    [
                        w0.reshape(len(w0), -1),
                        states[0][f"{name}.bias"].double()[:, None],
                    ],
                    1,
                )
            ma, mb = marg[j][name], marg[0][name]
            p = transport(torch.cdist(fa, fb).pow(2).cpu().numpy(), ma, mb)
            state[f"{name}.weight"] = torch.einsum("i...,ij->j...", w, p).float()
            state[f"{name}.bias"] = (b @ p).float()
            weights[name] = torch.as_tensor(ma) @ p
            p_prev = p
        aligned.append(state)
        aligned_w.append(weights)
    fused = importance_average(aligned, aligned_w, levels[:-1])
    return _from_state(models[0], fused, None).to(_device(models))


def transport(cost: np.ndarray, ma: np.ndarray, mb: np.ndarray) -> torch.Tensor:
    """Exact OT plan between marginals ``ma`` and ``mb`` (scaled to sum 1), columns scaled to sum 1.

    Entry ``(i, k)`` is the share of target neuron ``k`` that comes from
    source neuron ``i``.
    """
    plan = ot.emd(ma / ma.sum(), mb / mb.sum(), cost)
    return torch.as_tensor(plan / plan.sum(0, keepdims=True))


def _level_weights(
    levels: Sequence[str],
    state: StateDict,
    scores: Sequence[Mapping[str, torch.Tensor]] | None,
    j: int,
) -> dict[str, np.ndarray]:
    """Per hidden level, model ``j``'s neuron weights (mean 1): uniform or its scores."""
    out = {}
    for name in levels:
        n = len(state[f"{name}.weight"])
        if scores is None:
            out[name] = np.ones(n)
            continue
        s = scores[j][name].double().cpu().numpy()
        if len(s) != n:
            raise ValueError(
                f"scores of model {j} at {name!r} have {len(s)} entries for {n} neurons"
            )
        out[name] = normalised_scores(torch.as_tensor(s))
    return out


def importance_average(
    states: Sequence[StateDict],
    weights: Sequence[Mapping[str, Any]],
    levels: Sequence[str],
) -> StateDict:
    """Average of aligned chain states; the rows of level ``name`` weighted by ``weights[j][name]``.

    Row ``k`` (weight row and bias) of a hidden level is
    ``sum_j w_jk W_jk / sum_j w_jk``; everything else is the plain mean.
    Equal weights give :func:`average_states`.
    """
    out = average_states(states)
    for name in levels:
        w = torch.stack([torch.as_tensor(np.asarray(ws[name])) for ws in weights])
        w = (w / w.sum(0, keepdim=True)).double()  # (models, neurons)
        for key in (f"{name}.weight", f"{name}.bias"):
            rows = torch.stack([s[key].double() for s in states])
            shape = (len(states), -1, *([1] * (rows.dim() - 2)))
            out[key] = (w.reshape(shape) * rows).sum(0).to(states[0][key].dtype)
    return out


def _device(models: Sequence[nn.Module]) -> torch.device:
    return model_device(models[0])


# --- Git Re-Basin -----------------------------------------------------------------------------


_MATCHINGS: dict[str, dict[str, torch.Tensor]] = {}


def matched(
    a: StateDict, b: StateDict, structure: NeuronStructure, seed: int
) -> dict[str, torch.Tensor]:
    """:func:`~wslib.core.matching.weight_matching` of B to A, computed once per process.

    Keyed by both states' contents, the structure and the seed: chapter 10
    fuses each set of base models once per importance, and the matching
    (seconds for two VGG-11s on one CPU thread) does not depend on it.
    """
    key = tensor_digest(a, b) + repr((structure, seed))
    if key not in _MATCHINGS:
        _MATCHINGS[key] = weight_matching(a, b, structure, seed=seed)
    return _MATCHINGS[key]


def rebasin_weight_matching(
    models: Sequence[nn.Module],
    *,
    x_bn: torch.Tensor | None = None,
    seed: int = 0,
    scores: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> nn.Module:
    """Weight matching of every model to model 0 (any architecture), then averaging.

    With ``scores`` (chain architectures) the aligned rows are averaged with
    the importance of the neurons they came from (:func:`importance_average`).
    """
    check_same_architecture(models)
    structure = neuron_structure(models[0])
    states = _cpu_states(models)
    matchings = [matched(states[0], s, structure, seed) for s in states[1:]]
    perms: list[dict[str, torch.Tensor] | None] = [None, *matchings]
    aligned = [states[0]] + [
        permute_state(s, structure, p) for s, p in zip(states[1:], matchings)
    ]
    if scores is None:
        fused = average_states(aligned)
    else:
        fused = permuted_importance_average(models, aligned, perms, scores)
    return _from_state(models[0], fused, x_bn).to(_device(models))


def permuted_importance_average(
    models: Sequence[nn.Module],
    aligned: Sequence[StateDict],
    perms: Sequence[dict[str, torch.Tensor] | None],
    scores: Sequence[Mapping[str, torch.Tensor]],
) -> StateDict:
    """:func:`importance_average` of permuted chain states, each score permuted with its neurons."""
    levels = chain_levels(models[0])[:-1]
    groups = [g.name for g in neuron_structure(models[0]).groups]
    weights = []
    for j, state in enumerate(aligned):
        w = _level_weights(levels, state, scores, j)
        perm = perms[j]
        if perm is not None:
            w = {lv: w[lv][perm[g].cpu().numpy()] for g, lv in zip(groups, levels)}
        weights.append(w)
    return importance_average(aligned, weights, levels)


def rebasin_activation_matching(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    *,
    scores: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> nn.Module:
    """Activation matching: per level, the assignment that maximises the correlation of
    post-ReLU activations with model 0's; then averaging (chain architectures), weighted
    by the neurons' importance when ``scores`` are given."""
    check_same_architecture(models)
    levels = chain_levels(models[0])
    groups = neuron_structure(models[0]).groups
    acts = [layer_io(m, levels[:-1], x) for m in models]
    states = _cpu_states(models)
    aligned = [states[0]]
    all_perms: list[dict[str, torch.Tensor] | None] = [None]
    for j in range(1, len(models)):
        perms: dict[str, torch.Tensor] = {}
        for group, name in zip(groups, levels[:-1]):
            a = _standardised(neuron_matrix(F.relu(acts[0][name])))
            b = _standardised(neuron_matrix(F.relu(acts[j][name])))
            _, cols = linear_sum_assignment((a @ b.T).cpu().numpy(), maximize=True)
            perms[group.name] = torch.as_tensor(cols, dtype=torch.long)
        aligned.append(permute_state(states[j], neuron_structure(models[0]), perms))
        all_perms.append(perms)
    fused = (
        average_states(aligned)
        if scores is None
        else permuted_importance_average(models, aligned, all_perms, scores)
    )
    return _from_state(models[0], fused, None).to(_device(models))


def _standardised(m: torch.Tensor) -> torch.Tensor:
    m = m - m.mean(1, keepdim=True)
    return m / (m.norm(dim=1, keepdim=True) + 1e-12)


# --- one entry point for the chapters ---------------------------------------------------------

# The fusion methods of :func:`fuse_by` (:data:`METHODS` lists them at run time).
MethodName = Literal[
    "averaging",
    "ensemble",
    "last_layer_kd",
    "otfusion",
    "rebasin_wm",
    "rebasin_am",
    "hf_linear",
    "hf_gradient",
    "kf_linear",
    "kf_gradient",
]
#: Every fusion method of chapters 10-12, baselines and HF / KF variants.
METHODS: tuple[MethodName, ...] = get_args(MethodName)
HF_KF: tuple[MethodName, ...] = ("hf_linear", "hf_gradient", "kf_linear", "kf_gradient")
#: The methods that take neuron importance scores.
USES_IMPORTANCE: tuple[MethodName, ...] = (
    *HF_KF,
    "otfusion",
    "rebasin_wm",
    "rebasin_am",
)


def fuse_by(
    method: MethodName,
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    class_weights: np.ndarray | None = None,
    importance: ImportanceName = "uniform",
    scores: Sequence[dict[str, torch.Tensor]] | None = None,
    fused: nn.Module | None = None,
    ridge: float = 1e-8,
    gradient: GradientConfig | None = None,
    seed: int = 0,
) -> nn.Module:
    """The model that ``method`` (one of :data:`METHODS`) makes of ``models`` on the fusion set.

    ``importance``/``scores`` matter for the methods in :data:`USES_IMPORTANCE`
    (HF/KF: neuron weights; OTFusion: transport marginals and weighted
    averaging; Git Re-Basin: weighted averaging after alignment);
    ``fused``/``ridge``/``gradient`` only for HF and KF; ``class_weights``
    (per-class weights of the models' logits) for the ensemble, the
    distillation teacher and the HF/KF head target. The result is on
    ``models[0]``'s device.
    """
    if method not in METHODS:
        raise ValueError(f"unknown fusion method {method!r}; valid: {METHODS}")
    check_fusion_inputs(models[0], x, y)
    if method in HF_KF:
        grouping, retrofit = method.split("_")
        return fuse(
            models,
            x,
            y,
            cast(GroupingName, grouping),
            cast(RetrofitName, retrofit),
            importance=importance,
            fused=fused,
            class_weights=class_weights,
            ridge=ridge,
            gradient=gradient or GradientConfig(),
            scores=scores,
            seed=seed,
            progress=False,
        ).model
    if method in USES_IMPORTANCE and importance != "uniform":
        if scores is None:
            scores = [
                model_importance(m, x, y, importance, progress=False) for m in models
            ]
        check_scores(scores, importance, len(models))
    else:
        scores = None
    simple = {
        "averaging": lambda: averaging(models, x_bn=x),
        "ensemble": lambda: Ensemble(
            [copy.deepcopy(m).eval() for m in models], class_weights=class_weights
        ),
        "last_layer_kd": lambda: last_layer_kd(
            models, x, class_weights=class_weights, seed=seed
        ),
        "otfusion": lambda: otfusion(models, x, cost="activation", scores=scores),
        "rebasin_wm": lambda: rebasin_weight_matching(
            models, x_bn=x, seed=seed, scores=scores
        ),
        "rebasin_am": lambda: rebasin_activation_matching(models, x, scores=scores),
    }
    return simple[method]().eval()


def distill(
    student: nn.Module,
    teacher: nn.Module,
    x: torch.Tensor,
    *,
    epochs: int = 200,
    lr: float = 3e-3,
    temperature: float = 2.0,
    batch_size: int = 128,
    seed: int = 0,
) -> nn.Module:
    """Knowledge distillation of a whole ``student`` from ``teacher`` on inputs ``x`` (in place).

    Runs on the student's device (the teacher's outputs and ``x`` are moved
    there); the student comes back in eval mode, the teacher's mode is kept.
    """
    dev = model_device(student)
    was_training = teacher.training
    x = x.to(dev)
    with torch.no_grad():
        soft = F.softmax(predict(teacher, x).to(dev) / temperature, 1)
    teacher.train(was_training)
    student.train()
    _fit_soft_targets(student, x, soft, epochs, lr, temperature, batch_size, seed)
    return student.eval()


def soft_target_loss(
    logits: torch.Tensor, soft: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Hinton et al.'s distillation loss: ``T^2 KL(soft || softmax(logits / T))``,
    averaged over the batch; ``soft`` is the teacher's softmax at temperature ``T``
    (the ``T^2`` keeps the gradients' scale independent of ``T``)."""
    logp = F.log_softmax(logits / temperature, 1)
    return F.kl_div(logp, soft, reduction="batchmean") * temperature**2


def _fit_soft_targets(
    module: nn.Module,
    inputs: torch.Tensor,
    soft: torch.Tensor,
    epochs: int,
    lr: float,
    temperature: float,
    batch_size: int,
    seed: int,
) -> None:
    """Adam on :func:`soft_target_loss` between ``module(inputs)`` and ``soft``."""
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in batches(len(inputs), batch_size, generator=gen):
            idx = torch.as_tensor(idx, device=inputs.device)
            loss = soft_target_loss(module(inputs[idx]), soft[idx], temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
