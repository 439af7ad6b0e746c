"""Low-Loss Path Finding (LLPF) and the path finders it is compared with.

- :mod:`~wslib.llpf.path`: :class:`~wslib.llpf.path.LLPFPath`, the result of every path finder;
- :mod:`~wslib.llpf.layerwise`: M2M, M2O and the hybrid (the paper's algorithms);
- :mod:`~wslib.llpf.ticks`: the tick loop they share (refinement, checkpoints);
- :mod:`~wslib.llpf.stages`: their layer order (which tensors move from which tick);
- :mod:`~wslib.llpf.curves`: Bezier / PolyChain curves (Garipov et al.);
- :mod:`~wslib.llpf.autoneb`: AutoNEB (Draxler et al.);
- :mod:`~wslib.llpf.evaluation`: honest evaluation of any path;
- :mod:`~wslib.llpf.protocols`: the runs of the LLPF chapters (refinement rule,
  M2M, M2O and the hybrid);
- :mod:`~wslib.llpf.methods`: chapter 4's runs of every method between two
  modes, at equal gradient-step budgets;
- :mod:`~wslib.llpf.setup`: what the chapters and their units share (zoo, data,
  path setup, derived seeds, run-cache keys);
- :mod:`~wslib.llpf.ch02_layerwise`, :mod:`~wslib.llpf.ch03_m2m`,
  :mod:`~wslib.llpf.ch04_baselines`, :mod:`~wslib.llpf.ch05_spheres`: each
  chapter's tables and metrics;
- :mod:`~wslib.llpf.units`: chapters 3-5 as independent cached pieces;
- :mod:`~wslib.llpf.figures`: the panels the LLPF chapters share.
"""

from wslib.llpf.autoneb import AutoNEBSettings, autoneb
from wslib.llpf.curves import CurveSettings, fit_curve
from wslib.llpf.evaluation import dense_curve, evaluate_path
from wslib.llpf.layerwise import (
    M2MSettings,
    M2OSettings,
    hybrid,
    m2m,
    m2o,
    movable_names,
    sphere_variance_ratio,
)
from wslib.llpf.path import LLPFPath, check_same_architecture
from wslib.llpf.stages import data_flow_stage_names, data_flow_stages
from wslib.llpf.ticks import Refine
from wslib.runs.resumable import Persist  # the persist= option of the path finders

__all__ = [
    "AutoNEBSettings",
    "CurveSettings",
    "LLPFPath",
    "M2MSettings",
    "M2OSettings",
    "Persist",
    "Refine",
    "autoneb",
    "check_same_architecture",
    "data_flow_stage_names",
    "data_flow_stages",
    "dense_curve",
    "evaluate_path",
    "fit_curve",
    "hybrid",
    "m2m",
    "m2o",
    "movable_names",
    "sphere_variance_ratio",
]
