"""The runs the LLPF chapters make, with the book's refinement rule.

Every LLPF run of the book refines until the moving average of the batch
losses is under the larger training loss of its endpoints plus a margin
(:meth:`PathSetup.refine`), and every path is evaluated the same way
(:meth:`PathSetup.evaluate`, see :mod:`wslib.llpf.evaluation`). On top:

- :func:`m2m_path`, :func:`m2m_run`: one model-to-model path (chapter 3);
- :func:`m2o_path`, :func:`m2o_run`, :func:`hybrid_path`, :func:`hybrid_run`:
  towards the origin and across variance spheres (chapter 5).

Chapter 4's runs of every method between two modes are in
:mod:`wslib.llpf.methods`. Nothing here reads a profile; each chapter's
tables live in its module (:mod:`wslib.llpf.ch03_m2m`, ...). :data:`CODE`
names the modules whose source determines the result of these runs and of
:mod:`wslib.llpf.methods`' (the key of their run cache).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from wslib.core.files import note_entry, stable_hash, tensor_digest
from wslib.core.neurons import StateDict
from wslib.core.norms import has_batchnorm
from wslib.core.settings import Settings, plain
from wslib.core.train import (
    PrecisionName,
    evaluate,
    model_device,
    precision_autocast,
)
from wslib.core.workspace import workspace
from wslib.llpf.evaluation import evaluate_path
from wslib.llpf.layerwise import (
    M2MSettings,
    M2OSettings,
    hybrid,
    m2m,
    m2o,
    movable_names,
    sphere_variance_ratio,
)
from wslib.llpf.path import LLPFPath
from wslib.llpf.stages import data_flow_stage_names
from wslib.llpf.ticks import Refine, tensor_variances
from wslib.runs.resumable import Persist

if TYPE_CHECKING:
    from wslib.core.data import Dataset

# The modules whose source determines the result of a run of this module: the
# ones it imports (directly or not), and the models' code, which defines the
# networks whose paths are searched. tests/llpf checks it against the imports.
#: The modules whose source keys the chapters' cached paths and runs.
CODE = (
    "wslib.core.files",
    "wslib.core.interpolation",
    "wslib.core.models",
    "wslib.core.pooling",
    "wslib.core.neurons",
    "wslib.core.norms",
    "wslib.core.seeds",
    "wslib.core.settings",
    "wslib.core.train",
    "wslib.core.recipes",
    "wslib.llpf.autoneb",
    "wslib.llpf.curves",
    "wslib.llpf.evaluation",
    "wslib.llpf.layerwise",
    "wslib.llpf.methods",
    "wslib.llpf.path",
    "wslib.llpf.stages",
    "wslib.llpf.ticks",
    "wslib.llpf.protocols",
    "wslib.runs.cache",
    "wslib.runs.results",
    "wslib.runs.resumable",
    "wslib.runs.steps",
    "wslib.runs.store",
)
Pair = Sequence[nn.Module]


def endpoint_loss(models: Sequence[nn.Module], ds: Dataset) -> float:
    """The larger full training-set loss of ``models`` (the endpoints of a path)."""
    return max(evaluate(m, ds.x_train, ds.y_train)[0] for m in models)


@torch.no_grad()
def batch_mode_loss(
    model: nn.Module, ds: Dataset, batch_size: int, *, precision: PrecisionName = "fp32"
) -> float:
    """Mean training loss of ``model`` in training mode over batches of ``batch_size``.

    What the refinement's stop rule sees: BatchNorm normalises with the
    statistics of each batch, and with ``precision`` ``"bf16"`` the forward
    pass runs under bfloat16 autocast. The training set is split once, in a
    fixed shuffled order, into full batches (a smaller set is one batch); the
    model runs on a copy, so its running statistics stay as they are.
    """
    probe = copy.deepcopy(model).train()
    dev = model_device(probe)
    n = len(ds.x_train)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    size = min(batch_size, n)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    autocast = precision_autocast(dev, precision)
    for start in range(0, n - size + 1, size):
        idx = order[start : start + size]
        with autocast:
            out = probe(ds.x_train[idx].to(dev))
            loss = nn.functional.cross_entropy(out, ds.y_train[idx].to(dev))
        total += loss.double()
    return float(total) / (n // size)


def threshold_loss(
    models: Sequence[nn.Module],
    ds: Dataset,
    batch_size: int,
    *,
    precision: PrecisionName = "fp32",
) -> float:
    """The larger endpoint loss, measured as the refinement's stop rule measures it.

    The stop rule averages training-mode batch losses; the threshold must be
    the same kind of loss, or under BatchNorm (batch statistics in training
    mode, running statistics in eval mode) a threshold from the eval-mode
    loss can sit below anything the rule can see, and every tick runs to
    ``r_max``. We measure the threshold the way the rule does, rather than
    the rule in eval mode, because an eval-mode rule would need a second
    forward pass per step and running statistics that refinement keeps
    changing. Without BatchNorm the two modes agree, and the full-set
    eval-mode loss (:func:`endpoint_loss`, what the evaluation reports) is
    used unchanged, unless the refinement runs in ``precision`` ``"bf16"``:
    then the threshold too is a bfloat16 batch loss.
    """
    if precision == "fp32" and not any(has_batchnorm(m) for m in models):
        return endpoint_loss(models, ds)
    return max(batch_mode_loss(m, ds, batch_size, precision=precision) for m in models)


@dataclass(frozen=True, kw_only=True)
class PathRun(Settings):
    """One LLPF path's settings in a chapter (a profile's ``llpf`` entry).

    ``ticks`` and ``record_every`` (a point is recorded, and checkpointed,
    every that many ticks), and the refinement's SGD learning rate ``lr``,
    step limit ``r_max`` and ``precision``; the rest of the refinement rule
    is the chapter's :class:`PathSetup`. A chapter's mapping is read with
    :meth:`~wslib.core.settings.Settings.of` (an unknown or missing name is
    refused); the values are checked where they are used
    (:class:`~wslib.llpf.layerwise.M2MSettings`, :class:`~wslib.llpf.ticks.Refine`).
    """

    ticks: int
    record_every: int
    lr: float
    r_max: int
    precision: PrecisionName = "fp32"


@dataclass(frozen=True, kw_only=True)
class SphereRun(PathRun):
    """An M2O path's settings: :class:`PathRun`'s, the variance's ``shrink``
    per tick and, optionally, ``target_ratio``: the fraction of its start
    variance at which every movable tensor stops."""

    shrink: float
    target_ratio: float | None = None


@dataclass(frozen=True, kw_only=True)
class M2OPhase(Settings):
    """The M2O phase of a hybrid path: its ``ticks`` and ``shrink``."""

    ticks: int
    shrink: float


@dataclass(frozen=True)
class PathSetup:
    """What every LLPF run of a chapter shares.

    Attributes
    ----------
    ds : the data set (refinement on its training set, evaluation on both).
    batch_size, r_min : the refinement's batch size and moving-average window.
    margin : how far above the endpoint loss the refinement may stop.
    dense : evaluated points inside each segment between recorded points.
    checkpoint_dir : folder of the path checkpoints (None: no checkpoints).
    """

    ds: Dataset
    batch_size: int
    r_min: int
    margin: float
    dense: int = 1
    checkpoint_dir: str | Path | None = None

    def key(self) -> dict[str, Any]:
        """Every field, as plain data, for the key of a run made with this setup:
        the data set by the digest of its tensors; ``checkpoint_dir`` left out
        (where checkpoints are kept changes no result; each checkpoint is
        guarded by its own key). A field added here enters the key by itself."""
        ds = self.ds
        fields = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("ds", "checkpoint_dir")
        }
        data = tensor_digest(ds.x_train, ds.y_train, ds.x_test, ds.y_test)
        return {"data": data, **plain(fields)}

    def refine(self, models: Sequence[nn.Module], run: PathRun) -> Refine:
        """The book's refinement rule: threshold = larger endpoint training loss + margin.

        ``models`` are the endpoints (one model for M2O); ``run`` gives the
        SGD learning rate ``lr``, the step limit ``r_max`` (the cap on each
        tick's refinement: a path whose ticks stop there above the threshold
        warns) and the ``precision``. The endpoint loss is measured as the
        stop rule measures its batches (:func:`threshold_loss`).
        """
        threshold = threshold_loss(
            models, self.ds, self.batch_size, precision=run.precision
        )
        return Refine(
            lr=run.lr,
            batch_size=self.batch_size,
            r_min=self.r_min,
            r_max=run.r_max,
            threshold=threshold + self.margin,
            precision=run.precision,
        )

    def checkpoint(
        self,
        name: str,
        seed: int,
        *,
        all_at_once: bool = False,
        settings: Mapping[str, Any] | None = None,
        ends: Sequence[nn.Module] = (),
    ) -> Path | None:
        """The checkpoint folder of the run of ``name`` with path seed ``seed``.

        Runs with other ``settings`` or other endpoint models ``ends`` get
        other files (digests of them in the name), so chapters that share a
        run share its file and no run overwrites another's: two sweep seeds
        run the same path seed between other modes.
        """
        if self.checkpoint_dir is None:
            return None
        tag = f"seed{seed}" + ("-all" if all_at_once else "")
        if settings is not None:
            tag += "-" + stable_hash(dict(settings), length=8)
        if ends:
            tag += "-" + tensor_digest(*(m.state_dict() for m in ends), length=8)
        folder = workspace().path(self.checkpoint_dir) / f"{name}-{tag}"
        note_entry(folder)
        return folder

    def evaluate(self, model: nn.Module, path: LLPFPath) -> dict[str, Any]:
        """Every metric of one path (:func:`wslib.llpf.evaluation.evaluate_path`)."""
        ds = self.ds
        return evaluate_path(
            model,
            path,
            ds.x_train,
            ds.y_train,
            ds.x_test,
            ds.y_test,
            dense=self.dense,
        )


def m2m_path(
    setup: PathSetup,
    pair: Pair,
    settings: PathRun | Mapping[str, Any],
    seed: int,
    *,
    name: str | None = None,
    all_at_once: bool = False,
) -> LLPFPath:
    """The M2M path from ``pair[0]`` to ``pair[1]`` with the book's refinement rule.

    ``settings``: a :class:`PathRun` (or its mapping); ``seed`` is the path
    seed. With a ``name`` the run is checkpointed under that name (see
    :meth:`PathSetup.checkpoint`) at every recorded point, so a save never
    writes a point that is not part of the path.
    """
    run = PathRun.of(settings, "M2M settings")
    a, b = pair
    checkpoint = (
        None
        if name is None
        else setup.checkpoint(
            name, seed, all_at_once=all_at_once, settings=run.key(), ends=pair
        )
    )
    return m2m(
        a,
        a.state_dict(),
        b.state_dict(),
        setup.ds.x_train,
        setup.ds.y_train,
        M2MSettings(
            ticks=run.ticks,
            refine=setup.refine(pair, run),
            seed=seed,
            record_every=run.record_every,
            all_at_once=all_at_once,
        ),
        persist=Persist(checkpoint, checkpoint_every=run.record_every),
    )


def m2m_run(
    setup: PathSetup,
    pair: Pair,
    settings: PathRun | Mapping[str, Any],
    seed: int,
    *,
    name: str | None = None,
    all_at_once: bool = False,
) -> dict[str, Any]:
    """:func:`m2m_path`, evaluated, with the names of its stages (``stage_names``)."""
    path = m2m_path(setup, pair, settings, seed, name=name, all_at_once=all_at_once)
    res = setup.evaluate(pair[0], path)
    res["stage_names"] = data_flow_stage_names(pair[0])
    return res


def variance_along(
    path: LLPFPath, reference: StateDict, names: Sequence[str]
) -> np.ndarray:
    """Mean over the named tensors of var(point) / var(reference), at every recorded point."""
    return np.array([sphere_variance_ratio(reference, s, names) for s in path.states])


def m2o_path(
    setup: PathSetup,
    model: nn.Module,
    settings: SphereRun | Mapping[str, Any],
    seed: int,
    *,
    compliance: bool = True,
    name: str | None = None,
) -> LLPFPath:
    """The M2O path from ``model`` (``settings``: a :class:`SphereRun` or its mapping).

    With a ``name`` the run is checkpointed (see :meth:`PathSetup.checkpoint`).

    With a ``target_ratio`` every movable tensor (of more than one element)
    stops at that fraction of its start variance (see
    :func:`~wslib.llpf.layerwise.m2o`), so runs with other settings end on the
    same sphere.
    """
    run = SphereRun.of(settings, "M2O settings")
    names = movable_names(model)
    target = None
    if run.target_ratio is not None:
        start = tensor_variances(model.state_dict(), names)
        target = {n: run.target_ratio * v for n, v in start.items() if v > 0}
    checkpoint = (
        None
        if name is None
        else setup.checkpoint(
            name,
            seed,
            settings={**run.key(), "m2o_compliance": compliance},
            ends=[model],
        )
    )
    return m2o(
        model,
        model.state_dict(),
        setup.ds.x_train,
        setup.ds.y_train,
        M2OSettings(
            ticks=run.ticks,
            shrink=run.shrink,
            refine=setup.refine([model], run),
            compliance=compliance,
            target_variance=target,
            seed=seed,
            record_every=run.record_every,
        ),
        persist=Persist(checkpoint, checkpoint_every=run.record_every),
    )


def m2o_run(
    setup: PathSetup,
    model: nn.Module,
    settings: SphereRun | Mapping[str, Any],
    seed: int,
    *,
    compliance: bool = True,
    name: str | None = None,
) -> dict[str, Any]:
    """:func:`m2o_path`, evaluated.

    Adds ``variance``: the mean variance ratio of the movable tensors to the
    start at every recorded point.
    """
    path = m2o_path(setup, model, settings, seed, compliance=compliance, name=name)
    res = setup.evaluate(model, path)
    res["variance"] = variance_along(path, model.state_dict(), movable_names(model))
    return res


def hybrid_path(
    setup: PathSetup,
    source: nn.Module,
    dest: nn.Module,
    m2o_phase: M2OPhase | Mapping[str, Any],
    m2m_settings: PathRun | Mapping[str, Any],
    seed: int,
    *,
    name: str | None = None,
) -> LLPFPath:
    """The hybrid path from ``source`` to ``dest`` on a smaller sphere.

    M2O (``m2o_phase``: an :class:`M2OPhase`) until every movable tensor has
    ``dest``'s variance, then M2M (``m2m_settings``: a :class:`PathRun`); one
    refinement, set by both endpoints. Each may be given as its mapping. With
    a ``name`` both phases are checkpointed (see
    :func:`~wslib.llpf.layerwise.hybrid`).
    """
    phase = M2OPhase.of(m2o_phase, "hybrid M2O phase")
    run = PathRun.of(m2m_settings, "hybrid M2M settings")
    checkpoint = (
        None
        if name is None
        else setup.checkpoint(
            name,
            seed,
            settings={"m2o": phase.key(), **run.key()},
            ends=[source, dest],
        )
    )
    return hybrid(
        source,
        source.state_dict(),
        dest.state_dict(),
        setup.ds.x_train,
        setup.ds.y_train,
        m2o_ticks=phase.ticks,
        shrink=phase.shrink,
        m2m_ticks=run.ticks,
        refine=setup.refine([source, dest], run),
        seed=seed,
        record_every=run.record_every,
        persist=Persist(checkpoint, checkpoint_every=run.record_every),
    )


def hybrid_run(
    setup: PathSetup,
    source: nn.Module,
    dest: nn.Module,
    m2o_phase: M2OPhase | Mapping[str, Any],
    m2m_settings: PathRun | Mapping[str, Any],
    seed: int,
    *,
    name: str | None = None,
) -> dict[str, Any]:
    """:func:`hybrid_path`, evaluated.

    Adds ``variance`` (relative to the source), ``dest_variance`` (``dest``'s,
    relative to the source) and ``switch`` (position of the last M2O point; 1
    when the M2M phase never started).
    """
    names = movable_names(source)
    path = hybrid_path(setup, source, dest, m2o_phase, m2m_settings, seed, name=name)
    res = setup.evaluate(source, path)
    res["variance"] = variance_along(path, source.state_dict(), names)
    res["dest_variance"] = sphere_variance_ratio(
        source.state_dict(), dest.state_dict(), names
    )
    phases = np.array(path.phase)
    res["m2o_ticks"] = int(path.ticks[int(np.sum(phases == "m2o")) - 1])
    res["switch"] = (
        float(res["position"][np.argmax(phases == "m2m") - 1])
        if "m2m" in phases
        else 1.0
    )
    return res
