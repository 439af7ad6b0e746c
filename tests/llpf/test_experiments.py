"""Result assembly of the LLPF chapters: tables, metrics and the run cache of chapter 4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from wslib.core.data import Dataset
from wslib.core.interpolation import lerp_state, linear_path
from wslib.core.models import build_model
from wslib.core.train import evaluate
from wslib.llpf import experiments
from wslib.llpf.experiments import (
    ablation_comparison,
    ablation_seed_table,
    ablation_verdict,
    chapter_methods,
    chosen_settings,
    compare_methods,
    comparison_key,
    comparison_metrics,
    comparison_table,
    comparison_verdict,
    first_step_increase,
    layer_panels,
    layerwise_lines,
    layerwise_metrics,
    layerwise_table,
    line_table,
    m2m_metrics,
    m2m_summary,
    m2o_table,
    method_comparison,
    method_prefix,
    paper_table,
    profile_folder,
    seed_table,
    segment_rises,
    spheres_metrics,
    stage_list,
    tuned_methods,
    tuning_sweep,
)
from wslib.llpf.layerwise import data_flow_stage_names, data_flow_stages
from wslib.llpf.protocols import CODE, PathSetup
from wslib.runs.verdicts import Verdict

IN = [1, 8]
MLP = {"name": "mlp", "in_shape": IN, "n_classes": 3, "widths": [6, 5]}


def dataset(n: int = 48, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * n, *IN, generator=g)
    y = torch.randint(0, 3, (2 * n,), generator=g)
    return Dataset("toy", x[:n], y[:n], x[n:], y[n:], 3)


def pair() -> list[torch.nn.Module]:
    models = []
    for s in (0, 1):
        torch.manual_seed(s)
        models.append(build_model(MLP).eval())
    return models


def path_result(losses: list[float], **extra) -> dict:
    """A stand-in for an evaluated path (only what the tables read)."""
    losses = np.array(losses)
    return {
        "train_loss": losses,
        "test_acc": np.linspace(0.9, 0.8, len(losses)),
        "dense_loss": np.array(
            [[0.5 * (a + b) + 0.1] for a, b in zip(losses, losses[1:])]
        ),
        "peak_excess": float(losses.max() - max(losses[0], losses[-1])),
        "peak_loss": float(losses.max()),
        "min_test_acc": 0.8,
        "grad_steps": 10,
        "seconds": 1.5,
        **extra,
    }


def test_profile_folder() -> None:
    assert profile_folder(None, "cpu") is None
    assert profile_folder("data/llpf", "cpu") == Path("data/llpf/cpu")


# --- chapter 2 ------------------------------------------------------------------


def test_layerwise_lines_move_one_stage_at_a_time() -> None:
    ds = dataset()
    a, b = pair()
    ts = [0.0, 0.5, 1.0]
    whole, single = layerwise_lines(a, b, ts, ds)
    ref = linear_path(a, a.state_dict(), b.state_dict(), ts, ds.x_train, ds.y_train)
    assert np.array_equal(whole["train_loss"], ref["train_loss"])
    assert list(single) == data_flow_stage_names(a)
    # the end of a stage's line is A with that stage of B
    stage = data_flow_stages(a)[1]
    hybrid = build_model(MLP)
    hybrid.load_state_dict(lerp_state(a.state_dict(), b.state_dict(), 1.0, stage))
    loss = evaluate(hybrid, ds.x_train, ds.y_train)[0]
    assert single[data_flow_stage_names(a)[1]]["train_loss"][-1] == pytest.approx(loss)
    assert single["linears.0"]["train_loss"][0] == pytest.approx(whole["train_loss"][0])


def test_stage_list_names_each_models_stages() -> None:
    a, _ = pair()
    assert stage_list({"mlp": a}) == "mlp: linears.0, linears.1, linears.2"


def test_layer_panels_keep_at_most_per_panel_lines() -> None:
    single = {"a": dict.fromkeys("123"), "b": dict.fromkeys("123456789")}
    assert layer_panels(single, per_panel=7) == [
        ("a", ["1", "2", "3"]),
        ("b", ["1", "2", "3", "4"]),
        ("b", ["5", "6", "7", "8", "9"]),
    ]
    assert layer_panels(single, per_panel=3)[-1] == ("b", ["7", "8", "9"])


def lines_of(losses: list[float]) -> dict:
    losses = np.array(losses)
    return {
        "train_loss": losses,
        "barrier": np.array(losses.max() - losses[[0, -1]].mean()),
    }


def test_layerwise_table_and_metrics() -> None:
    whole = {"m": lines_of([1.0, 1.5, 3.0, 1.2])}
    single = {
        "m": {
            "s0": lines_of([1.0, 1.1, 4.0, 2.0]),
            "s1": lines_of([1.0, 1.2, 1.1, 1.0]),
        }
    }
    table = layerwise_table(whole, single)
    assert list(table.moved) == ["whole model", "only s0", "only s1"]
    assert list(table["loss after first step"]) == [1.5, 1.1, 1.2]
    assert (table["loss at A"] == 1.0).all()
    assert list(table["loss at end"]) == [1.2, 2.0, 1.0]
    assert first_step_increase(whole["m"]) == pytest.approx(0.5)
    metrics = layerwise_metrics(whole, single)
    assert metrics["m"] == pytest.approx(
        {
            "whole_barrier": 3.0 - 1.1,
            "max_single_layer_barrier": 4.0 - 1.5,
            "whole_first_step_increase": 0.5,
            "max_single_first_step_increase": 0.2,
        }
    )


# --- chapter 3 ------------------------------------------------------------------


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


# --- chapter 4 ------------------------------------------------------------------


def test_comparison_key_follows_the_content_of_data_and_modes() -> None:
    a, b = pair()
    methods = chapter_methods({"ticks": 2}, {"Bezier": {"method": "curve"}})
    key = comparison_key(PathSetup(dataset(), 8, 2, 0.1), MLP, [a, b], methods, 0)
    same = comparison_key(PathSetup(dataset(), 8, 2, 0.1), MLP, pair(), methods, 0)
    assert key == same
    other_data = comparison_key(
        PathSetup(dataset(seed=1), 8, 2, 0.1), MLP, [a, b], methods, 0
    )
    assert other_data["data"] != key["data"]
    c = build_model(MLP)
    assert (
        comparison_key(PathSetup(dataset(), 8, 2, 0.1), MLP, [a, c], methods, 0) != key
    )
    assert (
        comparison_key(PathSetup(dataset(), 8, 2, 0.2), MLP, [a, b], methods, 0) != key
    )
    assert (
        comparison_key(PathSetup(dataset(), 8, 2, 0.1), MLP, [a, b], methods, 1) != key
    )
    assert (
        comparison_key(PathSetup(dataset(), 8, 2, 0.1), MLP, [a, b], methods, 0, 5)
        != key
    )


def test_compare_methods_runs_each_seed_once_and_caches_it(
    tmp_path, monkeypatch
) -> None:
    calls = []

    def fake(setup, pair, methods, seed, name):
        calls.append((name, seed))
        return {m: path_result([0, seed + 1.0, 0]) for m in methods}

    monkeypatch.setattr(experiments, "compare_at_equal_steps", fake)
    s = PathSetup(dataset(), 8, 2, 0.1)
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
        seen.append((root, key["path_seed"], code))
        return {"LLPF": path_result([0, 1, 0])}

    monkeypatch.setattr(experiments, "cached_run", fake_cache)
    s = PathSetup(dataset(), 8, 2, 0.1)
    methods = {"mlp": chapter_methods({}, {})}
    compare_methods(s, {"mlp": MLP}, {"mlp": pair()}, methods, [3], "c")
    assert seen == [("c", 3, CODE)]


def test_tuning_sweep_gives_baselines_the_budget_of_llpf_and_picks_the_lowest(
    monkeypatch,
) -> None:
    seen = []

    def fake(setup, pair, settings, seed, budget=None, name=None):
        seen.append((settings["method"], settings["lr"], seed, budget))
        steps = 40 if settings["method"] == "llpf" else budget
        excess = abs(settings["lr"] - 0.1) + (
            0.5 if settings["method"] == "llpf" else 0
        )
        return {"peak_excess": excess, "grad_steps": int(steps * settings["lr"] * 10)}

    monkeypatch.setattr(experiments, "method_run", fake)
    s = PathSetup(dataset(), 8, 2, 0.1)
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


def comparison_runs() -> dict:
    return {
        "m": {
            "LLPF": [path_result([0, 1, 0]), path_result([0, 2, 0])],
            "polychain": [path_result([0, 0.5, 0]), path_result([0, 0.5, 0])],
            "AutoNEB": [path_result([0, 3, 0]), path_result([0, 4, 0])],
        },
        "n": {
            "LLPF": [path_result([0, 1, 0])],
            "polychain": [path_result([0, 2, 0])],
            "AutoNEB": [path_result([0, 0.1, 0])],
        },
    }


def test_comparison_table_metrics_and_the_best_method() -> None:
    compare = comparison_table(comparison_runs())
    assert list(compare.method[:3]) == ["LLPF", "polychain", "AutoNEB"]
    llpf = compare.iloc[0]
    assert (llpf["peak excess mean"], llpf["peak excess std"]) == (1.5, 0.5)
    assert llpf["worst peak loss"] == 2.0
    assert method_comparison(compare, "n")[0] == "AutoNEB"
    assert method_prefix("Bezier (authors' recipe)") == "bezier_authors_recipe"
    first, runner_up, c = method_comparison(compare, "m")
    assert (first, runner_up, c.verdict) == ("polychain", "LLPF", Verdict.ABOVE)
    assert c.difference == pytest.approx(1.0)
    verdict = comparison_verdict(compare, "m")
    assert verdict.startswith("on the m, polychain had the lowest mean peak excess")
    assert "1.000 below LLPF" in verdict and "more than" in verdict
    close = pd.DataFrame(
        {
            "model": ["k", "k"],
            "method": ["X", "Y"],
            "peak excess mean": [0.2, 0.1],
            "peak excess std": [0.06, 0.05],
            "seeds": [2, 2],
        }
    )
    assert method_comparison(close, "k")[2].verdict is Verdict.WITHIN
    assert comparison_verdict(close, "k").startswith("on the k, Y had")
    assert "0.100 below X" in comparison_verdict(close, "k")
    assert "within the spread between seeds" in comparison_verdict(close, "k")
    single = close.assign(seeds=[1, 1])
    assert method_comparison(single, "k")[2].verdict is Verdict.UNKNOWN
    assert "with one path seed, no spread" in comparison_verdict(single, "k")
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


# --- chapter 5 ------------------------------------------------------------------


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


def test_ablation_over_seeds_pairs_the_runs_of_each_seed() -> None:
    fdf = {"m": [path_result([0, 1.0, 0]), path_result([0, 3.0, 0])]}
    once = {"m": [path_result([0, 2.0, 0]), path_result([0, 2.5, 0])]}
    table = ablation_seed_table(fdf, once)
    row = table.loc["m"]
    assert (row["FDF mean"], row["all at once mean"]) == (2.0, 2.25)
    assert row["difference mean"] == pytest.approx(0.25)  # all at once - FDF
    assert row["difference std"] == pytest.approx(0.75 * 2**0.5)  # of (1.0, -0.5)
    assert (row["seeds FDF lower"], row["seeds"]) == (1, 2)
    assert ablation_comparison(table, "m").verdict is Verdict.WITHIN
    verdict = ablation_verdict(table, "m")
    assert verdict.startswith("m: FDF and all at once within the spread")
    assert "(all at once - FDF +0.250 on average" in verdict
    assert "FDF lower in 1 of 2 seeds" in verdict
    table.loc["m", "difference std"] = 0.1
    assert ablation_comparison(table, "m").verdict is Verdict.ABOVE
    assert ablation_verdict(table, "m").startswith("m: FDF lower than all at once")
    table.loc["m", "difference mean"] = -0.25
    assert ablation_comparison(table, "m").verdict is Verdict.BELOW
    one = ablation_seed_table({"m": fdf["m"][:1]}, {"m": once["m"][:1]})
    assert ablation_comparison(one, "m").verdict is Verdict.UNKNOWN
    with pytest.raises(ValueError, match="FDF runs"):
        ablation_seed_table({"m": fdf["m"][:1]}, once)


def test_a_diverged_setting_reads_as_nan_and_is_never_chosen(monkeypatch) -> None:
    def fake(setup, pair, settings, seed, budget=None, name=None):
        excess = None if settings["lr"] > 1 else settings["lr"]  # NaN cached as None
        return {"peak_excess": excess, "grad_steps": 10}

    monkeypatch.setattr(experiments, "method_run", fake)
    s = PathSetup(dataset(), 8, 2, 0.1)
    methods = {"mlp": chapter_methods({"lr": 0.1}, {})}
    grid = {"LLPF": [{"lr": 5.0}, {"lr": 0.3}]}
    sweep = tuning_sweep(s, {"mlp": MLP}, {"mlp": pair()}, methods, grid, 0)
    assert np.isnan(sweep["peak excess"][0])
    assert tuned_methods(methods, sweep)["mlp"]["LLPF"]["lr"] == 0.3
