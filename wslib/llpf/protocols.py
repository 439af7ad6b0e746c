"""The runs the LLPF chapters make, with the book's refinement rule.

Every LLPF run of the book refines until the moving average of the batch
losses is under the larger training loss of its endpoints plus a margin
(:meth:`PathSetup.refine`), and every path is evaluated the same way
(:meth:`PathSetup.evaluate`, see :mod:`wslib.llpf.evaluation`). On top:

- :func:`m2m_path`, :func:`m2m_run`: one model-to-model path (chapter 3);
- :func:`compare_at_equal_steps`: LLPF, a Bezier / PolyChain curve and AutoNEB
  between the same modes, the two baselines given the gradient steps LLPF
  used (chapter 4, budget sizing in :func:`neb_steps_per_cycle`);
- :func:`m2o_run`, :func:`hybrid_run`: towards the origin and across variance
  spheres (chapter 5).

Nothing here reads a profile; result tables live in
:mod:`wslib.llpf.experiments`. :data:`CODE` names the modules whose source
determines the result of these runs (the key of their run cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from wslib.core.train import evaluate
from wslib.llpf.autoneb import autoneb
from wslib.llpf.curves import fit_curve
from wslib.llpf.evaluation import evaluate_path
from wslib.llpf.layerwise import (
    Refine,
    data_flow_stage_names,
    hybrid,
    m2m,
    m2o,
    movable_names,
    sphere_variance_ratio,
)
from wslib.llpf.path import LLPFPath

if TYPE_CHECKING:
    from wslib.core.data import Dataset

# The modules whose source determines the result of a run of this module: the
# ones it imports (directly or not), and the models' code, which defines the
# networks whose paths are searched. tests/llpf checks it against the imports.
CODE = (
    "wslib.core.files",
    "wslib.core.interpolation",
    "wslib.core.models",
    "wslib.core.neurons",
    "wslib.core.norms",
    "wslib.core.train",
    "wslib.llpf.autoneb",
    "wslib.llpf.curves",
    "wslib.llpf.evaluation",
    "wslib.llpf.layerwise",
    "wslib.llpf.path",
    "wslib.llpf.protocols",
)
Pair = Sequence[nn.Module]


def endpoint_loss(models: Sequence[nn.Module], ds: Dataset) -> float:
    """The larger full training-set loss of ``models`` (the endpoints of a path)."""
    return max(evaluate(m, ds.x_train, ds.y_train)[0] for m in models)


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

    def refine(
        self, models: Sequence[nn.Module], settings: Mapping[str, Any]
    ) -> Refine:
        """The book's refinement rule: threshold = larger endpoint training loss + margin.

        ``models`` are the endpoints (one model for M2O); ``settings`` give
        the SGD learning rate ``lr`` and the step limit ``r_max``.
        """
        return Refine(
            lr=settings["lr"],
            batch_size=self.batch_size,
            r_min=self.r_min,
            r_max=settings["r_max"],
            threshold=endpoint_loss(models, self.ds) + self.margin,
        )

    def checkpoint(
        self, name: str, seed: int, all_at_once: bool = False
    ) -> Path | None:
        """The checkpoint file of the M2M run of ``name`` with path seed ``seed``."""
        if self.checkpoint_dir is None:
            return None
        tag = f"seed{seed}" + ("-all" if all_at_once else "")
        return Path(self.checkpoint_dir) / f"{name}-{tag}.pt"

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
    settings: Mapping[str, Any],
    seed: int,
    name: str | None = None,
    all_at_once: bool = False,
) -> LLPFPath:
    """The M2M path from ``pair[0]`` to ``pair[1]`` with the book's refinement rule.

    ``settings`` give ``ticks``, ``record_every``, ``lr`` and ``r_max``;
    ``seed`` is the path seed. With a ``name`` the run is checkpointed under
    that name (see :meth:`PathSetup.checkpoint`).
    """
    a, b = pair
    checkpoint = None if name is None else setup.checkpoint(name, seed, all_at_once)
    return m2m(
        a,
        a.state_dict(),
        b.state_dict(),
        setup.ds.x_train,
        setup.ds.y_train,
        ticks=settings["ticks"],
        refine=setup.refine(pair, settings),
        seed=seed,
        record_every=settings["record_every"],
        checkpoint=checkpoint,
        all_at_once=all_at_once,
    )


def m2m_run(
    setup: PathSetup,
    pair: Pair,
    settings: Mapping[str, Any],
    seed: int,
    name: str | None = None,
    all_at_once: bool = False,
) -> dict[str, Any]:
    """:func:`m2m_path`, evaluated, with the names of its stages (``stage_names``)."""
    res = setup.evaluate(
        pair[0], m2m_path(setup, pair, settings, seed, name, all_at_once)
    )
    res["stage_names"] = data_flow_stage_names(pair[0])
    return res


def neb_steps_per_cycle(budget: int, cycles: int, n_init: int) -> int:
    """AutoNEB iterations per cycle that spend about ``budget`` gradient steps in all.

    One gradient step per interior pivot per iteration; the chain starts with
    ``n_init`` interior pivots and grows by insertion, so the count is sized
    for ``n_init + 2`` pivots (at least one iteration per cycle).
    """
    return max(1, round(budget / (cycles * (n_init + 2))))


def compare_at_equal_steps(
    setup: PathSetup,
    pair: Pair,
    llpf: Mapping[str, Any],
    curve: Mapping[str, Any],
    neb: Mapping[str, Any],
    seed: int,
    name: str | None = None,
) -> dict[str, dict[str, Any]]:
    """LLPF, a curve and AutoNEB between the same modes, evaluated alike.

    LLPF (settings ``llpf``, checkpointed under ``name``) runs first; the curve
    (``curve``: ``kind``, ``lr``, ``momentum``, ``n_eval``) then gets exactly
    the gradient steps LLPF used, AutoNEB (``neb``) about as many. Returns
    ``{"LLPF": ..., curve["kind"]: ..., "AutoNEB": ...}`` of evaluated paths.
    """
    a, b = pair
    sa, sb, x, y = a.state_dict(), b.state_dict(), setup.ds.x_train, setup.ds.y_train
    path = m2m_path(setup, pair, llpf, seed, name)
    budget = path.total_grad_steps
    res = {"LLPF": setup.evaluate(a, path)}
    bend = fit_curve(
        a, sa, sb, x, y, steps=budget, batch_size=setup.batch_size, seed=seed, **curve
    )
    res[curve["kind"]] = setup.evaluate(a, bend)
    per_cycle = neb_steps_per_cycle(budget, neb["cycles"], neb["n_init"])
    chain = autoneb(
        a,
        sa,
        sb,
        x,
        y,
        steps_per_cycle=per_cycle,
        batch_size=setup.batch_size,
        seed=seed,
        **neb,
    )
    res["AutoNEB"] = setup.evaluate(a, chain)
    return res


def variance_along(
    path: LLPFPath, reference: Mapping[str, Any], names: Sequence[str]
) -> np.ndarray:
    """Mean over the named tensors of var(point) / var(reference), at every recorded point."""
    return np.array([sphere_variance_ratio(reference, s, names) for s in path.states])


def m2o_run(
    setup: PathSetup,
    model: nn.Module,
    settings: Mapping[str, Any],
    seed: int,
    compliance: bool = True,
) -> dict[str, Any]:
    """M2O from ``model`` (``ticks``, ``shrink``, ``record_every``, ``lr``, ``r_max``), evaluated.

    Adds ``variance``: the mean variance ratio of the movable tensors to the
    start at every recorded point.
    """
    path = m2o(
        model,
        model.state_dict(),
        setup.ds.x_train,
        setup.ds.y_train,
        ticks=settings["ticks"],
        shrink=settings["shrink"],
        refine=setup.refine([model], settings),
        compliance=compliance,
        seed=seed,
        record_every=settings["record_every"],
    )
    res = setup.evaluate(model, path)
    res["variance"] = variance_along(path, model.state_dict(), movable_names(model))
    return res


def hybrid_run(
    setup: PathSetup,
    source: nn.Module,
    dest: nn.Module,
    m2o_phase: Mapping[str, Any],
    m2m_settings: Mapping[str, Any],
    seed: int,
) -> dict[str, Any]:
    """The hybrid path from ``source`` to ``dest`` on a smaller sphere, evaluated.

    M2O (``m2o_phase``: ``ticks``, ``shrink``) until every movable tensor has
    ``dest``'s variance, then M2M (``m2m_settings``); one refinement, set by
    both endpoints. Adds ``variance`` (relative to the source),
    ``dest_variance`` (``dest``'s, relative to the source) and ``switch``
    (position of the last M2O point; 1 when the M2M phase never started).
    """
    names = movable_names(source)
    path = hybrid(
        source,
        source.state_dict(),
        dest.state_dict(),
        setup.ds.x_train,
        setup.ds.y_train,
        m2o_ticks=m2o_phase["ticks"],
        shrink=m2o_phase["shrink"],
        m2m_ticks=m2m_settings["ticks"],
        refine=setup.refine([source, dest], m2m_settings),
        seed=seed,
        record_every=m2m_settings["record_every"],
    )
    res = setup.evaluate(source, path)
    res["variance"] = variance_along(path, source.state_dict(), names)
    res["dest_variance"] = sphere_variance_ratio(
        source.state_dict(), dest.state_dict(), names
    )
    phases = np.array(path.phase)
    res["switch"] = (
        float(res["position"][np.argmax(phases == "m2m") - 1])
        if "m2m" in phases
        else 1.0
    )
    return res
