"""Chapter 5 tables and metrics (wslib.llpf.ch05_spheres)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.llpf.path_results import path_result
from wslib.llpf.ch05_spheres import m2o_table, spheres_metrics


def test_m2o_table_and_spheres_metrics() -> None:
    on = path_result([1.0, 1.4, 1.2], variance=np.array([1.0, 0.5, 0.2]))
    off = path_result([1.0, 2.0, 1.9], variance=np.array([1.0, 0.6, 0.3]))
    table = m2o_table({"on": on, "off": off})
    assert table.loc["on", "final variance ratio"] == 0.2
    assert table.loc["off", "peak training loss"] == 2.0
    hybrid = path_result([0.1, 0.3, 0.1], dest_variance=0.25)
    sharp = path_result([0.1, 0.2, 0.15])
    metrics = spheres_metrics(on, off, hybrid, sharp)
    assert metrics["m2o_final_variance_ratio"] == 0.2
    assert metrics["m2o_final_variance_ratio_no_compliance"] == 0.3
    assert (
        metrics["m2o_peak_loss"] == 1.4
        and metrics["m2o_peak_loss_no_compliance"] == 2.0
    )
    assert metrics["sphere_variance_ratio"] == 0.25
    assert metrics["hybrid_peak_excess"] == pytest.approx(0.2)
    assert metrics["sharp_peak_excess"] == pytest.approx(0.05)
    assert isinstance(metrics["hybrid_grad_steps"], int)
    assert isinstance(pd.Series(metrics).round(4), pd.Series)
