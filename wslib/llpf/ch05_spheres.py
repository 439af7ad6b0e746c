"""Chapter 5, across variance spheres: M2O with and without angular compliance,
the hybrid and sharp minima.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from wslib.core.connectivity import mode_config

if TYPE_CHECKING:
    pass

from wslib.llpf.setup import mode_seeds

Result = Mapping[str, Any]


def sphere_configs(
    data: Mapping[str, Any],
    arch: Mapping[str, Any],
    recipe: Mapping[str, Any],
    norm_arch: Mapping[str, Any],
    norm_recipe: Mapping[str, Any],
    wd_source: float,
    wd_dest: float,
    sharp_recipe: Mapping[str, Any],
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Chapter 5's base models (zoo configs): ``base`` and ``normed`` (M2O), ``source``
    and ``dest`` (the hybrid: weight decay ``wd_source`` / ``wd_dest``), ``sharp a``
    and ``sharp b`` (sharp minima, one per mode seed)."""
    a, b = mode_seeds(seed)
    data, arch = dict(data), dict(arch)
    return {
        "base": mode_config(data, arch, dict(recipe), a),
        "normed": mode_config(data, dict(norm_arch), dict(norm_recipe), a),
        "source": mode_config(data, arch, {**recipe, "weight_decay": wd_source}, a),
        "dest": mode_config(data, arch, {**recipe, "weight_decay": wd_dest}, b),
        "sharp a": mode_config(data, arch, dict(sharp_recipe), a),
        "sharp b": mode_config(data, arch, dict(sharp_recipe), b),
    }


# Chapter 5's M2O runs: label -> with angular compliance (in the chapter's order).
M2O_VARIANTS = {"with angular compliance": True, "without": False}


def m2o_table(m2o_runs: Mapping[str, Result]) -> pd.DataFrame:
    """Per M2O variant: final variance ratio, peak training loss, final test accuracy, steps."""
    return pd.DataFrame(
        {
            label: {
                "final variance ratio": float(res["variance"][-1]),
                "peak training loss": float(np.max(res["train_loss"])),
                "final test acc": float(res["test_acc"][-1]),
                "gradient steps": res["grad_steps"],
            }
            for label, res in m2o_runs.items()
        }
    ).T


def spheres_metrics(
    with_compliance: Result,
    without: Result,
    hybrid: Result,
    sharp: Result,
) -> dict[str, float | int]:
    """Chapter 5's metrics: M2O with and without compliance, the hybrid, sharp minima.

    The keys are those of the book's first results files (tests/book checks
    them); the chapter's other numbers are glued from the runs.
    """
    return {
        "m2o_final_variance_ratio": float(with_compliance["variance"][-1]),
        "m2o_final_variance_ratio_no_compliance": float(without["variance"][-1]),
        "m2o_peak_loss": float(np.max(with_compliance["train_loss"])),
        "m2o_peak_loss_no_compliance": float(np.max(without["train_loss"])),
        "hybrid_peak_excess": float(hybrid["peak_excess"]),
        "hybrid_min_test_acc": float(hybrid["min_test_acc"]),
        "hybrid_grad_steps": int(hybrid["grad_steps"]),
        "sphere_variance_ratio": float(hybrid["dest_variance"]),
        "sharp_peak_excess": float(sharp["peak_excess"]),
        "sharp_grad_steps": int(sharp["grad_steps"]),
    }
