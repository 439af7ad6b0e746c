"""Chapter 4: methods, tuning, comparison and the papers' numbers (wslib.llpf.ch04_baselines)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import wslib.runs.steps as steps
from tests.kit import MLP, pair, toy_dataset
from tests.llpf.path_results import comparison_runs, path_result
from wslib.llpf import ch04_baselines
from wslib.llpf.ch04_baselines import (
    chapter_methods,
    chosen_settings,
    compare_methods,
    comparison_metrics,
    comparison_table,
    comparison_verdict,
    method_comparison,
    method_prefix,
    paper_table,
    tuned_methods,
    tuning_sweep,
)
from wslib.llpf.methods import NOT_KEYED
from wslib.llpf.protocols import CODE, PathSetup
from wslib.runs.steps import cached_step
from wslib.runs.verdicts import Verdict


def test_compare_methods_runs_each_seed_once_and_caches_it(
    tmp_path, monkeypatch
) -> None:
    calls = []

    @cached_step(code=CODE, not_keyed=NOT_KEYED)
    def fake(setup, pair, methods, seed, *, name=None, run_cache=None):
        calls.append((name, seed))
        return {m: path_result([0, seed + 1.0, 0]) for m in methods}

    monkeypatch.setattr(ch04_baselines, "compare_at_equal_steps", fake)
    s = PathSetup(toy_dataset(), 8, 2, 0.1)
    methods = chapter_methods({}, {"bezier": {}, "AutoNEB": {}})
    args = (s, {"mlp": MLP}, {"mlp": pair()}, {"mlp": methods}, [0, 1])
    runs = compare_methods(*args, run_cache=tmp_path)
    assert calls == [("mlp", 0), ("mlp", 1)]
    assert list(runs["mlp"]) == ["LLPF", "bezier", "AutoNEB"]
    assert [r["peak_excess"] for r in runs["mlp"]["bezier"]] == [1.0, 2.0]
    again = compare_methods(*args, run_cache=tmp_path)
    assert calls == [("mlp", 0), ("mlp", 1)] and again == runs
    compare_methods(*args)  # no cache: computed again
    assert len(calls) == 4


def test_compare_methods_keys_the_cache_by_the_code_of_the_runs(monkeypatch) -> None:
    seen = []

    def fake_cache(root, key, compute, code):
        seen.append((root, key["arguments"]["seed"], code))
        return {"LLPF": path_result([0, 1, 0])}

    monkeypatch.setattr(steps, "cached_run", fake_cache)
    s = PathSetup(toy_dataset(), 8, 2, 0.1)
    methods = {"mlp": chapter_methods({}, {})}
    compare_methods(s, {"mlp": MLP}, {"mlp": pair()}, methods, [3], run_cache="c")
    assert seen == [("c", 3, CODE)]


def test_tuning_sweep_gives_baselines_the_budget_of_llpf_and_picks_the_lowest(
    monkeypatch,
) -> None:
    seen = []

    def fake(setup, pair, settings, seed, budget=None, name=None, run_cache=None):
        seen.append((settings["method"], settings["lr"], seed, budget))
        steps = 40 if settings["method"] == "llpf" else budget
        excess = abs(settings["lr"] - 0.1) + (
            0.5 if settings["method"] == "llpf" else 0
        )
        return {"peak_excess": excess, "grad_steps": int(steps * settings["lr"] * 10)}

    monkeypatch.setattr(ch04_baselines, "method_run", fake)
    s = PathSetup(toy_dataset(), 8, 2, 0.1)
    methods = {"mlp": chapter_methods({"lr": 0.1}, {"B": {"method": "curve", "lr": 1}})}
    grid = {"LLPF": [{"lr": 0.05}, {"lr": 0.2}], "B": [{"lr": 0.3}, {"lr": 0.12}]}
    sweep = tuning_sweep(s, {"mlp": MLP}, {"mlp": pair()}, methods, grid, 9)
    assert seen[0] == ("llpf", 0.1, 9, None)
    assert [b for m, _, _, b in seen if m == "curve"] == [40, 40]
    assert list(sweep["lr"]) == [0.05, 0.2, 0.3, 0.12]
    assert list(sweep["gradient steps"]) == [20, 80, 120, 48]
    tuned = tuned_methods(methods, sweep)
    assert tuned["mlp"]["LLPF"] == {"method": "llpf", "lr": 0.05}
    assert tuned["mlp"]["B"] == {"method": "curve", "lr": 0.12}
    best = chosen_settings(sweep)
    assert list(best["lr"]) == [0.05, 0.12]


def test_comparison_table_metrics_and_the_best_method() -> None:
    compare = comparison_table(comparison_runs())
    assert list(compare.method[:3]) == ["LLPF", "polychain", "AutoNEB"]
    llpf = compare.iloc[0]
    assert (llpf["peak excess mean"], llpf["peak excess std"]) == (1.5, 0.5)
    assert llpf["worst peak loss"] == 2.0
    assert method_comparison(compare, "n")[0] == "AutoNEB"
    assert method_prefix("Bezier (authors' recipe)") == "bezier_authors_recipe"
    first, runner_up, c = method_comparison(compare, "m")
    # paired gaps 0.5 and 1.5 over two path seeds: 1.0 ± 12.7 * 0.5, undecided
    assert (first, runner_up, c.verdict) == ("polychain", "LLPF", Verdict.UNDECIDED)
    assert c.difference == pytest.approx(1.0)
    verdict = comparison_verdict(compare, "m")
    assert verdict.startswith("on the m, polychain had the lowest mean peak excess")
    assert "1.000 below LLPF" in verdict and "undecided (the 95% interval" in verdict

    def frame(x: list[float], y: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "model": ["k", "k"],
                "method": ["X", "Y"],
                "peak excess mean": [np.mean(x), np.mean(y)],
                "peak excess std": [np.std(x), np.std(y)],
                "peak excess values": [x, y],
                "seeds": [len(x), len(y)],
            }
        )

    # X - Y per seed: 0.10, 0.11, 0.09: lower on the paired interval
    close = frame([0.2, 0.31, 0.19], [0.1, 0.2, 0.1])
    assert method_comparison(close, "k")[2].verdict is Verdict.ABOVE
    assert comparison_verdict(close, "k").startswith("on the k, Y had")
    assert "lower on the 95% interval of the paired gap" in comparison_verdict(
        close, "k"
    )
    # the same means, unpaired the gaps would be lost in the spread
    same = frame([0.101, 0.2, 0.3], [0.1, 0.2, 0.3])
    assert method_comparison(same, "k")[2].verdict is Verdict.EQUIVALENT
    assert "no different in practice" in comparison_verdict(same, "k")
    single = frame([0.2], [0.1])
    assert method_comparison(single, "k")[2].interval is None
    assert "with one path seed, undecided" in comparison_verdict(single, "k")
    diverged = close.assign(**{"peak excess mean": [float("nan"), 0.1]})
    assert method_comparison(diverged, "k")[1] == "none"
    assert "fewer than two methods" in comparison_verdict(diverged, "k")
    metrics = comparison_metrics(compare)
    assert metrics["m"]["polychain_peak_excess"] == 0.5
    assert metrics["m"]["autoneb_worst_peak_loss"] == 4.0
    assert metrics["n"]["llpf_grad_steps"] == 10.0
    assert len(metrics["m"]) == 12


def test_paper_table_summarises_each_method_over_models() -> None:
    table = paper_table(comparison_table(comparison_runs()))
    assert list(table.index) == ["LLPF", "polychain", "AutoNEB"]
    assert table.loc["AutoNEB", "architectures run here"] == "m, n"
    assert table.loc["AutoNEB", "consistency (max seed std of peak excess)"] == 0.5
    assert table.loc["AutoNEB", "worst training loss on the path"] == 4.0
    assert table.loc["LLPF", "crosses spheres"].startswith("yes")


def test_a_diverged_setting_reads_as_nan_and_is_never_chosen(monkeypatch) -> None:
    def fake(setup, pair, settings, seed, budget=None, name=None, run_cache=None):
        excess = None if settings["lr"] > 1 else settings["lr"]  # NaN cached as None
        return {"peak_excess": excess, "grad_steps": 10}

    monkeypatch.setattr(ch04_baselines, "method_run", fake)
    s = PathSetup(toy_dataset(), 8, 2, 0.1)
    methods = {"mlp": chapter_methods({"lr": 0.1}, {})}
    grid = {"LLPF": [{"lr": 5.0}, {"lr": 0.3}]}
    sweep = tuning_sweep(s, {"mlp": MLP}, {"mlp": pair()}, methods, grid, 0)
    assert np.isnan(sweep["peak excess"][0])
    assert tuned_methods(methods, sweep)["mlp"]["LLPF"]["lr"] == 0.3
