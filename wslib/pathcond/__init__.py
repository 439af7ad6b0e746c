"""Path-conditioned rescaling (PathCond) of ReLU networks at initialisation.

- :mod:`~wslib.pathcond.rescaling`: diag G in one backward pass,
  :func:`~wslib.pathcond.rescaling.pathcond_rescale`;
- :mod:`~wslib.pathcond.solver`: the objective and its block coordinate descent;
- :mod:`~wslib.pathcond.lifting`: the explicit path-lifting of tiny networks
  (the brute-force reference);
- :mod:`~wslib.pathcond.enorm`: ENorm, the baseline rescaling;
- :mod:`~wslib.pathcond.training`: one initialisation method, one training run (cached);
- :mod:`~wslib.pathcond.grid`: cached training runs of named MLP configurations;
- :mod:`~wslib.pathcond.protocols`: what the chapters share (the run cache's
  folder, the cost of rescaling against an epoch);
- one module per chapter, holding its protocol and its results as text,
  tables and metrics: :mod:`~wslib.pathcond.ch06_pathlifting` (the lifting
  demos), :mod:`~wslib.pathcond.ch07_mlp` (the grid of MLP runs, the
  learning-rate tuning, the costs; its results in
  :mod:`~wslib.pathcond.ch07_results`), :mod:`~wslib.pathcond.ch08_conv` (the
  architectures);
- :mod:`~wslib.pathcond.figures`: the chapters' figures;
- :mod:`~wslib.pathcond.units`: chapters 7 and 8 as independent units of
  cached runs (see :mod:`wslib.runs.units`).
"""

from wslib.pathcond.protocols import rescale_cost
from wslib.pathcond.rescaling import (
    am_over_gm,
    check_architecture,
    diag_g,
    pathcond_rescale,
)
from wslib.pathcond.solver import optimize_rescaling
from wslib.pathcond.training import (
    INIT_METHODS,
    TrainSettings,
    prepare_model,
    train_run,
)

__all__ = [
    "INIT_METHODS",
    "TrainSettings",
    "am_over_gm",
    "check_architecture",
    "diag_g",
    "optimize_rescaling",
    "pathcond_rescale",
    "prepare_model",
    "rescale_cost",
    "train_run",
]
