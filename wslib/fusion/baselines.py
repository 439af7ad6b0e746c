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
from collections.abc import Sequence

import numpy as np
import ot
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from wslib.core.matching import weight_matching
from wslib.core.neurons import StateDict, permute_state
from wslib.core.norms import has_batchnorm, reset_bn_stats
from wslib.core.train import batches
from wslib.fusion.hfkf import fuse
from wslib.fusion.levels import (
    GradientConfig,
    chain_levels,
    check_same_architecture,
    layer_io,
    neuron_matrix,
)

OT_COSTS = ("activation", "weight")


def average_states(
    states: Sequence[StateDict], weights: Sequence[float] | None = None
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
        out[key] = sum(float(wi) * s[key].double() for wi, s in zip(w, states)).to(
            first.dtype
        )
    return out


def _from_state(
    template: nn.Module, state: StateDict, x_bn: torch.Tensor | None
) -> nn.Module:
    model = copy.deepcopy(template).cpu()
    model.load_state_dict(state)
    if has_batchnorm(model) and x_bn is not None:
        reset_bn_stats(model, x_bn)
    return model.eval()


def _cpu_states(models: Sequence[nn.Module]) -> list[StateDict]:
    return [{k: v.detach().cpu() for k, v in m.state_dict().items()} for m in models]


def averaging(
    models: Sequence[nn.Module], x_bn: torch.Tensor | None = None
) -> nn.Module:
    """Vanilla averaging of the weights (BatchNorm statistics recomputed on ``x_bn``)."""
    check_same_architecture(models)
    return _from_state(models[0], average_states(_cpu_states(models)), x_bn)


class Ensemble(nn.Module):
    """Mean of the models' softmax outputs, optionally weighted per class.

    ``forward`` returns the log of the (renormalised) mean probabilities, so
    its argmax is the ensemble's prediction. ``class_weights`` has shape
    ``(n_models, n_classes)``.
    """

    def __init__(
        self, models: Sequence[nn.Module], class_weights: np.ndarray | None = None
    ) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)
        w = (
            None
            if class_weights is None
            else torch.as_tensor(np.asarray(class_weights), dtype=torch.float32)
        )
        self.register_buffer("class_weights", w)

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
    class_weights: np.ndarray | None = None,
    head: str | None = None,
    temperature: float = 2.0,
    epochs: int = 100,
    lr: float = 1e-2,
    seed: int = 0,
) -> nn.Module:
    """Model 0 with only its last layer distilled from the ensemble on the fusion set ``x``."""
    check_same_architecture(models)
    teacher = Ensemble([copy.deepcopy(m).cpu().eval() for m in models], class_weights)
    student = copy.deepcopy(models[0]).cpu().eval()
    head = head or last_linear(student)
    with torch.no_grad():
        soft = F.softmax(teacher(x) / temperature, 1)
        feats = layer_io(student, [head], x, "input")[head]
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
    cost: str = "activation",
) -> nn.Module:
    """OTFusion: align every model to model 0 level by level with exact OT, then average.

    Per level, the transport ``T`` between model ``j``'s and model 0's neurons
    (uniform marginals, squared-Euclidean ground cost on the activations over
    ``x`` or on the incoming weights after aligning their inputs) gives the
    aligned rows ``n_0 T^T W_j``; the next level's input columns are mixed with
    the same map.
    """
    if cost not in OT_COSTS:
        raise ValueError(f"cost must be one of {OT_COSTS}, got {cost!r}")
    if cost == "activation" and x is None:
        raise ValueError("activation-based OTFusion needs the fusion inputs x")
    check_same_architecture(models)
    levels = chain_levels(models[0])
    states = _cpu_states(models)
    acts = (
        [layer_io(m, levels[:-1], x) for m in models] if cost == "activation" else None
    )
    aligned = [states[0]]
    for j in range(1, len(models)):
        state, p_prev = dict(states[j]), None
        for li, name in enumerate(levels):
            w = _align_in(state[f"{name}.weight"].double(), p_prev)
            b = state[f"{name}.bias"].double()
            if li == len(levels) - 1:
                state[f"{name}.weight"], state[f"{name}.bias"] = w.float(), b.float()
                break
            w0 = states[0][f"{name}.weight"].double()
            if cost == "activation":
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
            m_cost = torch.cdist(fa, fb).pow(2).numpy()
            na, nb = len(fa), len(fb)
            plan = ot.emd(np.full(na, 1 / na), np.full(nb, 1 / nb), m_cost)
            p = torch.as_tensor(plan * nb)  # columns sum to 1
            state[f"{name}.weight"] = torch.einsum("i...,ij->j...", w, p).float()
            state[f"{name}.bias"] = (b @ p).float()
            p_prev = p
        aligned.append(state)
    return _from_state(models[0], average_states(aligned), None)


# --- Git Re-Basin -----------------------------------------------------------------------------


def rebasin_weight_matching(
    models: Sequence[nn.Module], x_bn: torch.Tensor | None = None, seed: int = 0
) -> nn.Module:
    """Weight matching of every model to model 0 (any architecture), then averaging."""
    check_same_architecture(models)
    structure = models[0].neuron_structure()
    states = _cpu_states(models)
    aligned = [states[0]] + [
        permute_state(s, structure, weight_matching(states[0], s, structure, seed=seed))
        for s in states[1:]
    ]
    return _from_state(models[0], average_states(aligned), x_bn)


def rebasin_activation_matching(
    models: Sequence[nn.Module], x: torch.Tensor
) -> nn.Module:
    """Activation matching: per level, the assignment that maximises the correlation of
    post-ReLU activations with model 0's; then averaging (chain architectures)."""
    check_same_architecture(models)
    levels = chain_levels(models[0])
    groups = models[0].neuron_structure().groups
    acts = [layer_io(m, levels[:-1], x) for m in models]
    states = _cpu_states(models)
    aligned = [states[0]]
    for j in range(1, len(models)):
        perms = {}
        for group, name in zip(groups, levels[:-1]):
            a = _standardised(neuron_matrix(F.relu(acts[0][name])))
            b = _standardised(neuron_matrix(F.relu(acts[j][name])))
            _, cols = linear_sum_assignment((a @ b.T).numpy(), maximize=True)
            perms[group.name] = torch.as_tensor(cols, dtype=torch.long)
        aligned.append(permute_state(states[j], models[0].neuron_structure(), perms))
    return _from_state(models[0], average_states(aligned), None)


def _standardised(m: torch.Tensor) -> torch.Tensor:
    m = m - m.mean(1, keepdim=True)
    return m / (m.norm(dim=1, keepdim=True) + 1e-12)


# --- one entry point for the chapters ---------------------------------------------------------

METHODS = (
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
)
USES_IMPORTANCE = ("hf_linear", "hf_gradient", "kf_linear", "kf_gradient")


def fuse_by(
    method: str,
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    class_weights: np.ndarray | None = None,
    importance: str = "uniform",
    scores: Sequence[dict[str, torch.Tensor]] | None = None,
    fused: nn.Module | None = None,
    ridge: float = 1e-8,
    gradient: GradientConfig | None = None,
    seed: int = 0,
) -> nn.Module:
    """The model that ``method`` (one of :data:`METHODS`) makes of ``models`` on the fusion set.

    ``importance``/``scores``/``fused``/``ridge``/``gradient`` only matter for
    HF and KF; ``class_weights`` (per-class data shares) for the ensemble, the
    distillation teacher and the HF/KF head target.
    """
    if method not in METHODS:
        raise ValueError(f"unknown fusion method {method!r}; valid: {METHODS}")
    if method in USES_IMPORTANCE:
        grouping, retrofit = method.split("_")
        return fuse(
            models,
            x,
            y,
            grouping,
            retrofit,
            importance,
            fused,
            class_weights,
            ridge,
            gradient or GradientConfig(),
            scores,
            seed,
            progress=False,
        ).model
    simple = {
        "averaging": lambda: averaging(models, x),
        "ensemble": lambda: Ensemble(
            [copy.deepcopy(m).cpu().eval() for m in models], class_weights
        ),
        "last_layer_kd": lambda: last_layer_kd(models, x, class_weights, seed=seed),
        "otfusion": lambda: otfusion(models, x, "activation"),
        "rebasin_wm": lambda: rebasin_weight_matching(models, x, seed),
        "rebasin_am": lambda: rebasin_activation_matching(models, x),
    }
    return simple[method]().eval()


def distill(
    student: nn.Module,
    teacher: nn.Module,
    x: torch.Tensor,
    epochs: int = 200,
    lr: float = 3e-3,
    temperature: float = 2.0,
    batch_size: int = 128,
    seed: int = 0,
) -> nn.Module:
    """Knowledge distillation of a whole ``student`` from ``teacher`` on inputs ``x`` (in place)."""
    student = student.cpu().train()
    with torch.no_grad():
        soft = F.softmax(teacher.cpu().eval()(x) / temperature, 1)
    _fit_soft_targets(student, x, soft, epochs, lr, temperature, batch_size, seed)
    return student.eval()


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
    """Adam on the temperature-scaled KL divergence between ``module(inputs)`` and ``soft``."""
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in batches(len(inputs), batch_size, gen):
            logp = F.log_softmax(module(inputs[idx]) / temperature, 1)
            loss = F.kl_div(logp, soft[idx], reduction="batchmean") * temperature**2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
