"""Neuron-centric model fusion: Hungarian Fusion (HF), K-means Fusion (KF) and baselines.

- :mod:`~wslib.fusion.levels`: levels of a chain net, grouping, targets, retrofitting;
- :mod:`~wslib.fusion.hfkf`: :func:`~wslib.fusion.hfkf.fuse`, HF / KF for every architecture;
- :mod:`~wslib.fusion.residual`: ResNets and transformers, one residual stream at a time;
- :mod:`~wslib.fusion.taps`: what a residual fusion reads (taps) and fits, in which order (the plan);
- :mod:`~wslib.fusion.importance`: Conductance / DeepLIFT neuron importance;
- :mod:`~wslib.fusion.baselines`: averaging, ensembles, distillation, OTFusion, Git Re-Basin;
- :mod:`~wslib.fusion.protocols`: what the fusion chapters share (base models, fusion sets);
- :mod:`~wslib.fusion.ch09_cost`, :mod:`~wslib.fusion.ch10_regimes`,
  :mod:`~wslib.fusion.ch11_beyond`: the protocol of each fusion chapter and its tables
  (chapter 10's summaries and tables in :mod:`~wslib.fusion.ch10_results`).
"""

from wslib.fusion.baselines import USES_IMPORTANCE, Ensemble, distill, fuse_by
from wslib.fusion.hfkf import (
    attribution_share,
    augment_fusion_set,
    class_share,
    fuse,
    model_importance,
)
from wslib.fusion.retrofit import GradientConfig

__all__ = [
    "USES_IMPORTANCE",
    "Ensemble",
    "GradientConfig",
    "attribution_share",
    "augment_fusion_set",
    "class_share",
    "distill",
    "fuse",
    "fuse_by",
    "model_importance",
]
