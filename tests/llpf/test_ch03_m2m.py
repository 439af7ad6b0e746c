"""Chapter 3 tables and metrics (wslib.llpf.ch03_m2m)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.llpf.path_results import path_result
from wslib.llpf.ch03_m2m import (
    ablation_comparison,
    ablation_seed_table,
    ablation_verdict,
    line_table,
    m2m_metrics,
    m2m_summary,
    seed_table,
    segment_rises,
)
from wslib.runs.verdicts import Verdict


def test_line_table_and_m2m_summary() -> None:
    lines = {"m": {"barrier": np.array(2.0), "test_acc": np.array([0.9, 0.3, 0.8])}}
    table = line_table(lines, {"m": 0.1})
    assert table.loc["m"].to_dict() == {
        "endpoint loss (max)": 0.1,
        "barrier": 2.0,
        "min test acc": pytest.approx(0.3),
    }
    summary = m2m_summary(lines, {"m": path_result([0.1, 0.4, 0.2])})
    assert summary.loc["m", "LLPF peak excess"] == pytest.approx(0.2)
    assert summary.loc["m", "endpoint test acc (min)"] == pytest.approx(0.8)
    assert summary.loc["m", "linear barrier"] == 2.0


def test_segment_rises_compare_each_midpoint_with_its_ends() -> None:
    res = {"train_loss": [1.0, 3.0, 2.0], "dense_loss": [[2.5, 3.5], [1.0, 2.1]]}
    assert segment_rises(res) == pytest.approx([0.5, -0.9])


def test_seed_table_uses_the_population_std() -> None:
    runs = {"m": [path_result([0, 1, 0]), path_result([0, 3, 0])]}
    table = seed_table(runs)
    assert table.loc["m", "peak excess mean"] == 2.0
    assert table.loc["m", "peak excess std"] == 1.0


def test_m2m_metrics() -> None:
    lines = {n: {"barrier": np.array(b)} for n, b in (("a", 2.0), ("b", 3.0))}
    paths = {"a": path_result([0, 1, 0]), "b": path_result([0, 2, 0.5])}
    ablation = {"b": path_result([0, 5, 0]), "a": path_result([0, 0.5, 0])}
    seeds = seed_table({"a": [paths["a"], path_result([0, 3, 0])]})
    metrics = m2m_metrics(lines, paths, seeds, ablation)
    assert metrics["a"] == {
        "linear_barrier": 2.0,
        "llpf_peak_excess": 1.0,
        "llpf_min_test_acc": 0.8,
        "grad_steps": 10,
        "seconds": 1.5,
    }
    assert metrics["seed_std_peak_excess"] == 1.0
    assert metrics["seed_std_by_arch"] == {"a": 1.0}
    assert metrics["ablation"] == {
        "fdf_peak_excess": 1.5,
        "all_at_once_peak_excess": 5.0,
    }
    assert set(metrics["ablation_by_arch"]) == {"a", "b"}
    # dense points: midpoint + 0.1; largest rise over all models and segments
    assert metrics["max_segment_midpoint_rise"] == pytest.approx(
        max(segment_rises(r).max() for r in paths.values())
    )


def test_ablation_over_seeds_pairs_the_runs_of_each_seed() -> None:
    fdf = {"m": [path_result([0, 1.0, 0]), path_result([0, 3.0, 0])]}
    once = {"m": [path_result([0, 2.0, 0]), path_result([0, 2.5, 0])]}
    table = ablation_seed_table(fdf, once)
    row = table.loc["m"]
    assert (row["FDF mean"], row["all at once mean"]) == (2.0, 2.25)
    assert row["difference mean"] == pytest.approx(0.25)  # all at once - FDF
    assert row["difference std"] == pytest.approx(0.75 * 2**0.5)  # of (1.0, -0.5)
    assert (row["seeds FDF lower"], row["seeds"]) == (1, 2)
    # two seeds: the 95% interval 0.25 ± 12.7 * 0.75: undecided
    assert ablation_comparison(table, "m").verdict is Verdict.UNDECIDED
    verdict = ablation_verdict(table, "m")
    assert verdict.startswith("m: undecided between FDF and all at once")
    assert "(all at once - FDF: +0.250 [-9.280, +9.780] (n = 2, 95%)" in verdict
    assert "FDF lower in 1 of 2 seeds" in verdict
    table.loc["m", "difference std"] = 0.01  # interval 0.25 ± 0.09
    assert ablation_comparison(table, "m").verdict is Verdict.ABOVE
    assert ablation_verdict(table, "m").startswith("m: FDF lower than all at once")
    table.loc["m", "difference mean"] = -0.25
    assert ablation_comparison(table, "m").verdict is Verdict.BELOW
    table.loc["m", "difference mean"] = 0.001  # 90% interval within ± 0.01
    table.loc["m", "difference std"] = 0.0005
    assert ablation_comparison(table, "m").verdict is Verdict.EQUIVALENT
    one = ablation_seed_table({"m": fdf["m"][:1]}, {"m": once["m"][:1]})
    c = ablation_comparison(one, "m")
    assert c.verdict is Verdict.UNDECIDED and c.interval is None
    with pytest.raises(ValueError, match="FDF runs"):
        ablation_seed_table({"m": fdf["m"][:1]}, once)
