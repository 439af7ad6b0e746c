"""Chapter 7's protocol and results: the rate search, the layer scales, the solver,
the costs; summaries, tables, metrics and verdicts over planted runs."""

from __future__ import annotations

import pytest
import torch

from tests.pathcond import toy
from tests.pathcond.planted import (
    BASE,
    CONFIGS,
    FAST,
    NEVER,
    SLOW,
    empty_grid,
    rate_search,
    run,
)
from wslib.pathcond.ch07_mlp import (
    config_list,
    config_text,
    cost_rows,
    evaluate_rates,
    first_layer_fan,
    g_share,
    head_bias,
    layer_scale_rows,
    methods_list,
    rate_range_text,
    solver_comparison,
    tune_rates,
)
from wslib.pathcond.ch07_results import (
    ablation_rows,
    ablation_text,
    activation_rows,
    add_cost_metrics,
    best_rate_text,
    best_rates_text,
    epochs_rows,
    grid_edge_text,
    long_rows,
    long_text,
    mlp_metrics,
    reached_text,
    size_points,
    solver_text,
    speedup_rows,
    speedup_verdict,
    speedups_text,
    summarise_grid,
    summarise_runs,
    sweep_rows,
    tuned_verdict_text,
)
from wslib.pathcond.grid import RunGrid
from wslib.pathcond.rescaling import am_over_gm
from wslib.pathcond.solver import PAPER_SWEEPS
from wslib.runs.stats import RateSearch, summarise_epochs

# --- the protocol -----------------------------------------------------------------


def test_tune_rates_trains_on_the_tuning_seed_for_the_given_epochs(toy_grid, fake_jobs):
    pairs = [("const", "baseline"), ("low", "pathcond")]
    search = tune_rates(toy_grid, pairs, [1.0, 0.1], [10**0.25], seed=9, epochs=5)
    trained = [job for call in fake_jobs for job in call]
    assert {(j["seed"], j["recipe"].epochs) for j in trained} == {(9, 5)}
    # the fake accuracy is [lr]: only lr >= 0.99 reaches the threshold at once
    assert search.best[("const", "baseline")] == 1.78
    assert search.tried[("low", "pathcond")] == [1.78, 1.0, 0.1]


def test_evaluate_rates_trains_each_pair_at_its_rate_on_every_seed(toy_grid, fake_jobs):
    rates = {("const", "baseline"): 0.3, ("low", "pathcond"): 0.03}
    runs = evaluate_rates(toy_grid, rates, [0, 1], epochs=4)
    assert list(runs) == list(rates)
    for pair, pair_runs in runs.items():
        assert [r["seed"] for r in pair_runs] == [0, 1]
        assert {r["recipe"].lr for r in pair_runs} == {rates[pair]}
        assert {r["recipe"].epochs for r in pair_runs} == {4}
        assert {r["init_scale"] for r in pair_runs} == {
            toy.CONFIGS[pair[0]]["init_scale"]
        }


def test_g_share_and_the_names_of_mlp_parts():
    g = {"linears.0.weight": torch.ones(3), "linears.0.bias": torch.ones(1)}
    g["linears.1.bias"] = torch.full((2,), 2.0)
    assert g_share(g, "linears.0.") == pytest.approx(4 / 8)
    assert g_share(g, head_bias([5])) == pytest.approx(4 / 8)
    assert head_bias([5, 6, 7]) == "linears.3.bias"
    assert first_layer_fan(toy.BASE, [16, 8]) == (13, 8)
    assert first_layer_fan(toy.BASE, [16]) == (13, 3)


def test_layer_scale_rows_describe_every_layer_before_and_after():
    rows, g_pairs = layer_scale_rows(toy.BASE, toy.CONFIGS, seed=0)
    assert [(r["config"], r["layer"]) for r in rows] == [
        (c, i) for c in toy.CONFIGS for i in range(3)
    ]
    low = [r for r in rows if r["config"] == "low"]
    for when in ("before", "after"):
        assert sum(r[f"share of Σg {when}"] for r in low) == pytest.approx(1.0)
    n_params = 12 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3
    assert low[0]["share of params"] == pytest.approx(12 * 8 / n_params)
    g_before, g_after = g_pairs["low"]
    assert low[0]["share of Σg after"] == pytest.approx(g_share(g_after, "linears.0."))
    assert low[0]["share of Σg after"] != pytest.approx(low[0]["share of Σg before"])
    assert low[0]["log10 GM g before"] == pytest.approx(
        float(g_before["linears.0.weight"].double().log10().mean())
    )
    assert am_over_gm(g_after) < am_over_gm(g_before)
    assert low[-1]["AM/GM of g before -> after"] == (
        f"{am_over_gm(g_before):.3g} -> {am_over_gm(g_after):.3g}"
    )
    # PathCond keeps the output biases' g (no hidden neuron owns them)
    head = head_bias(toy.CONFIGS["low"]["widths"])
    assert torch.allclose(g_before[head], g_after[head])


def test_solver_comparison_converged_against_ten_sweeps():
    cfg = {"widths": [8, 24, 6], "init_scale": 0.1}
    row = solver_comparison(toy.BASE, "low", cfg, 0, 2)
    assert row["config"] == "low"
    full = row["F (converged)"]
    block, neuron = (
        row[f"F ({k}, {PAPER_SWEEPS} sweeps)"] for k in ("block", "per neuron")
    )
    assert full <= block * (1 - 1e-12) and full <= neuron  # F < 0 here
    assert block <= neuron + 1e-9 * abs(neuron)
    assert row["sweeps (converged)"] > PAPER_SWEEPS
    assert 0 < row["median scale diff. (10 sweeps vs converged)"] < 1
    with pytest.raises(ValueError, match="repeats"):
        solver_comparison(toy.BASE, "low", toy.CONFIGS["low"], 0, 0)


def test_cost_rows_one_per_configuration():
    rows = cost_rows(toy.BASE, toy.CONFIGS, toy.toy_data(), 8, 0, 2)
    assert [r["config"] for r in rows] == list(toy.CONFIGS)
    for r in rows:
        assert r["rescale_over_epoch"] == pytest.approx(
            r["rescale_seconds"] / r["epoch_seconds"]
        )


def test_the_rate_search_stops_each_run_at_the_threshold_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid, seen = RunGrid(toy.BASE, None, toy.RECIPE, toy.CONFIGS), []

    def train(jobs, desc="runs"):
        seen.extend(jobs)
        return [{"acc": [0.5, 0.99]} for _ in jobs]

    monkeypatch.setattr(grid, "train", train)
    pair = (next(iter(toy.CONFIGS)), "baseline")
    tune_rates(grid, [pair], [0.1, 0.01], [2.0], seed=5, epochs=9)
    assert seen and {j.stop_at for j in seen} == {0.99}
    assert {j.epochs for j in seen} == {9}
    # the grid gives up after half the epochs, a neighbour after the best's 2
    assert [j.give_up_after for j in seen] == [4, 4, 2]
    assert grid.job(*pair, 0).stop_at is None  # evaluation runs go the full length


# --- the results ------------------------------------------------------------------


@pytest.fixture
def grid() -> RunGrid:
    """A grid whose runs are planted: PathCond twice as fast as the baseline on ``low``."""
    g = empty_grid()
    curves = {("const", "baseline"): FAST, ("const", "pathcond"): FAST}
    curves |= {
        ("low", "baseline"): SLOW,
        ("low", "pathcond"): FAST,
        ("low", "enorm"): NEVER,
    }
    for (name, method), acc in curves.items():
        for seed, test in ((0, 0.4), (1, 0.6)):
            g.runs[g.job(name, method, seed)] = run(acc, test)
    return g


def test_config_list_names_every_configuration():
    assert config_text(BASE, "const", CONFIGS["const"]) == (
        "`const`: 40-8-8-10, default initialisation"
    )
    assert config_text(BASE, "low", CONFIGS["low"]).endswith("multiplied by $a=0.1$")
    lines = config_list(BASE, CONFIGS).splitlines()
    assert len(lines) == len(CONFIGS) and all(line.startswith("- `") for line in lines)
    assert lines[0].endswith(";")
    assert lines[-1].endswith("$a=0.1$.")
    assert reached_text({"n_reached": 2, "n_runs": 3}) == "2/3"
    assert rate_range_text([0.1, 3.0, 3e-6]) == "from 3 down to 3e-06"


def test_methods_list_in_first_use_order():
    text = methods_list(
        {
            "a": {"methods": ["pathcond", "baseline"]},
            "b": {"methods": ["baseline", "enorm"]},
        }
    )
    lines = text.splitlines()
    assert len(lines) == 3 and "(`pathcond`)" in lines[0] and lines[-1].endswith(".")
    assert "**baseline**" in lines[1] and "(`enorm`)" in lines[2]


def test_summarise_runs_and_grid(grid):
    s = summarise_runs([run(FAST, 0.4), run(NEVER, 0.6)])
    assert s["epochs"] == summarise_epochs([FAST, NEVER])
    assert (s["test_acc"], s["test_acc_std"]) == pytest.approx((0.5, 0.1))
    assert s["final_acc"] == pytest.approx((1.0 + 0.7) / 2)
    summaries = summarise_grid(grid, [0, 1])
    assert list(summaries) == [(c, m) for c in CONFIGS for m in CONFIGS[c]["methods"]]
    assert summaries[("low", "baseline")]["epochs"]["mean"] == 3.0
    rows = epochs_rows(summaries)
    assert rows[2] == {
        "config": "low",
        "method": "baseline",
        "epochs to 99%": "3.0 ± 0.0",
        "runs reaching 99%": "2/2",
        "test acc.": "0.500 ± 0.100",
    }
    assert rows[-1]["epochs to 99%"] == "never"


@pytest.fixture
def search() -> RateSearch:
    """A finished search: on ``low`` the baseline never reaches 0.99, PathCond at 0.3."""
    return rate_search(
        {
            (("low", "baseline"), 1.0): NEVER,
            (("low", "baseline"), 0.1): [0.5, 0.6, 0.8],
            (("low", "pathcond"), 1.0): SLOW,
            (("low", "pathcond"), 0.3): FAST,
        }
    )


def test_sweep_rows_and_best_rate_texts(search):
    rows = sweep_rows(search)
    assert [(r["method"], r["lr"], r["epochs to 99%"]) for r in rows] == [
        ("baseline", 1.0, "not by 3"),
        ("baseline", 0.1, "not by 3"),
        ("pathcond", 1.0, 3),
        ("pathcond", 0.3, 2),
    ]
    assert rows[1]["last train acc."] == 0.8
    assert (
        best_rate_text(search, ("low", "pathcond")) == "pathcond at lr 0.3 (2 epochs)"
    )
    assert best_rate_text(search, ("low", "baseline")) == (
        "baseline reaches 99% at none of its 2 rates (best final accuracy 0.800, at lr 0.1)"
    )
    assert best_rates_text(search, ["low"]).startswith("on low, baseline reaches")


def test_grid_edge_text():
    search = RateSearch(0.99)
    search.best = {("low", "baseline"): 1.0, ("low", "pathcond"): 0.01}
    search.tried = {("low", "baseline"): [1.0, 0.1], ("low", "pathcond"): [0.1, 0.01]}
    assert grid_edge_text(search) == (
        "At an end of the rates tried (a better rate may lie beyond it): baseline "
        "on `low` (lr 1), pathcond on `low` (lr 0.01)"
    )
    # a neighbour tried beyond the best rate (the refinement) takes it off the end
    search.tried = {
        ("low", "baseline"): [1.78, 1.0, 0.1],
        ("low", "pathcond"): [0.1, 0.01, 0.005],
    }
    assert grid_edge_text(search).startswith("No best rate")
    search.tried[("low", "baseline")] = [1.0, 0.1]
    assert grid_edge_text(search).endswith("baseline on `low` (lr 1)")


def long_summaries() -> dict:
    return {
        ("low", "baseline"): summarise_runs([run(NEVER, 0.3), run(NEVER, 0.5)]),
        ("low", "pathcond"): summarise_runs([run(FAST, 0.6), run(FAST, 0.8)]),
    }


def test_mlp_metrics_speedups_and_long_texts(grid, search):
    summaries, long = summarise_grid(grid, [0, 1]), long_summaries()
    metrics = mlp_metrics(CONFIGS, summaries, search, long, 3)
    assert metrics["const"]["speedup_pathcond"]["value"] == pytest.approx(1.0)
    assert metrics["const"]["speedup_pathcond_best_lr"] is None
    assert "lr_sweep" not in metrics["const"]
    low = metrics["low"]
    assert low["speedup_pathcond"]["value"] == pytest.approx(1.5)
    assert low["epochs_to_99"]["enorm"]["n_reached"] == 0
    assert low["test_acc"] == {"baseline": 0.5, "pathcond": 0.5, "enorm": 0.5}
    best = low["speedup_pathcond_best_lr"]
    assert best["value"] == pytest.approx(3 / 2) and best["lower_bound"]
    assert (best["lr_baseline"], best["lr_pathcond"], best["epochs"]) == (0.1, 0.3, 3)
    assert low["best_lr_runs"]["pathcond"]["test_acc"] == pytest.approx(0.7)
    assert low["lr_sweep"] == {
        "baseline": {"1.0": None, "0.1": None},
        "pathcond": {"1.0": 3, "0.3": 2},
    }
    assert speedup_rows(metrics) == [
        {
            "config": "const",
            "speed-up (same lr)": "1.00x",
            "speed-up (best lr each)": "not swept",
        },
        {
            "config": "low",
            "speed-up (same lr)": "1.50x",
            "speed-up (best lr each)": ">= 1.50x",
        },
    ]
    assert speedups_text(metrics) == "1.00x on const; 1.50x on low"
    text = long_text(search, long, metrics, "low")
    assert text.startswith(
        "on low, baseline at lr 0.1: 0/2 runs reached 99% (final training accuracy 0.700), "
        "pathcond at lr 0.3: 2/2 runs reached 99% (2.0 ± 0.0 epochs); speed-up >= 1.50x"
    )
    assert "no baseline run of the sweep reached 99%" in text
    rows = long_rows(long, search.best)
    assert rows[1]["lr"] == 0.3 and rows[1]["epochs to 99%"] == "2.0 ± 0.0"
    assert rows[1]["speed-up"] == ">= 1.50x" and rows[0]["speed-up"] == ""
    assert rows[0]["reached"] == "0/2" and rows[0]["test acc."] == "0.400 ± 0.100"
    assert rows[0]["epochs to 99%"] == "never"


def test_long_text_has_no_note_when_the_baseline_reached_the_threshold(search):
    long = long_summaries()
    metrics = {
        "low": {
            "speedup_pathcond_best_lr": {
                "value": 1.5,
                "lower_bound": True,
                "upper_bound": False,
            }
        }
    }
    search.runs[(("low", "baseline"), 0.1)] = run(FAST)  # the sweep now reached it
    assert "no baseline run" not in long_text(search, long, metrics, "low")


def test_size_points_and_activation_rows(grid):
    for method, acc in (("baseline", SLOW), ("pathcond", NEVER)):
        grid.runs[grid.job("const", method, 0, widths=[4])] = run(acc)
        grid.runs[grid.job("const", method, 0, activation="gelu")] = run(acc, 0.25)
    points = size_points(grid, "const", [[4]], [0])
    assert [p["n_params"] for p in points["baseline"]] == [
        40 * 4 + 4 + 4 * 10 + 10,
        40 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10,
    ]
    assert points["baseline"][0] == {
        "n_params": 214,
        "mean": 3.0,
        "std": 0.0,
        "censored": False,
    }
    assert points["pathcond"][0]["mean"] == 3 and points["pathcond"][0]["censored"]
    rows = activation_rows(grid, "const", ["gelu"], [0])
    assert rows == [
        {
            "activation": "gelu",
            "method": "baseline",
            "epochs to 99%": 3.0,
            "reached": "1/1",
            "test acc.": 0.25,
        },
        {
            "activation": "gelu",
            "method": "pathcond",
            "epochs to 99%": None,
            "reached": "0/1",
            "test acc.": 0.25,
        },
    ]


def test_add_cost_metrics():
    rows = [
        {
            "config": c,
            "rescale_seconds": r,
            "epoch_seconds": e,
            "rescale_over_epoch": r / e,
        }
        for c, r, e in (("const", 1.0, 4.0), ("low", 3.0, 8.0))
    ]
    solver = [{"config": "low", "F (converged)": 1.0, "s (converged)": 0.5}]
    metrics = {"const": {}, "low": {}}
    add_cost_metrics(metrics, rows, solver)
    assert metrics["const"] == {
        "rescale_seconds": 1.0,
        "epoch_seconds": 4.0,
        "rescale_over_epoch": 0.25,
    }
    assert metrics["low"]["solver"] == {
        "F (converged)": 1.0,
        "seconds (converged)": 0.5,
    }
    assert (metrics["rescale_seconds"], metrics["epoch_seconds"]) == (2.0, 6.0)


def test_solver_text():
    row = {
        "config": "low",
        "F (converged)": 1.0,
        "F (block, 10 sweeps)": 1.5,
        "F (per neuron, 10 sweeps)": 2.0,
        "s (converged)": 0.2,
        "s (block, 10 sweeps)": 0.05,
        "s (per neuron, 10 sweeps)": 0.5,
        "sweeps (converged)": 40,
        "median scale diff. (10 sweeps vs converged)": 0.125,
    }
    assert solver_text([row]) == (
        "on `low` the converged solver takes 0.2 s (40 sweeps), 10 block sweeps "
        "0.05 s and 10 per-neuron sweeps 0.5 s; 10 block sweeps leave F 0.5 above "
        "the converged value and neuron scales that differ from the converged ones "
        "by a median 12.5%"
    )


def test_speedup_verdict_respects_censoring():
    def s(value, lower=False, upper=False, both=False):
        return {
            "value": value,
            "lower_bound": lower,
            "upper_bound": upper,
            "both_censored": both,
        }

    assert speedup_verdict(s(1.2)) == "faster"
    assert speedup_verdict(s(0.8)) == "slower"
    assert speedup_verdict(s(1.0)) == "tied"
    assert speedup_verdict(s(1.0, upper=True)) == "undecided"
    assert speedup_verdict(s(1.5, lower=True)) == "faster"
    assert speedup_verdict(s(1.5, upper=True)) == "undecided"
    assert speedup_verdict(s(0.5, upper=True)) == "slower"
    assert speedup_verdict(s(0.5, lower=True)) == "undecided"
    assert speedup_verdict(s(1.5, both=True)) == "undecided"
    assert speedup_verdict(s(None)) == "undecided"


def test_tuned_verdict_text():
    long = {
        **long_summaries(),
        ("even", "baseline"): summarise_runs([run(FAST, 0.6), run(FAST, 0.6)]),
        ("even", "pathcond"): summarise_runs([run(SLOW, 0.5), run(SLOW, 0.5)]),
    }
    assert tuned_verdict_text(long, ["low", "even"]) == (
        "PathCond reaches the threshold sooner on average than the baseline on `low` "
        "(2.0 ± 0.0 vs never within 3 epochs over 2 seeds); later on average than "
        "the baseline on `even` (3.0 ± 0.0 vs 2.0 ± 0.0 epochs over 2 seeds); its "
        "mean test accuracy is higher on `low` and not higher on `even`"
    )
    long[("tie", "baseline")] = long[("tie", "pathcond")] = long[("even", "pathcond")]
    assert tuned_verdict_text(long, ["tie"]) == (
        "PathCond reaches the threshold after as many epochs (mean) as the baseline on "
        "`tie` (3.0 ± 0.0 vs 3.0 ± 0.0 epochs over 2 seeds); its mean test accuracy "
        "is not higher on every one"
    )
    assert tuned_verdict_text(long, ["even"]) == (
        "PathCond reaches the threshold later on average than the baseline on `even` "
        "(3.0 ± 0.0 vs 2.0 ± 0.0 epochs over 2 seeds); its mean test accuracy is not "
        "higher on every one"
    )
    # 2.5 ± 0.5 against 2.67 ± 0.47: Welch's 95% interval reaches zero, undecided
    long[("close", "pathcond")] = summarise_runs([run(FAST), run(SLOW)])
    long[("close", "baseline")] = summarise_runs([run(FAST), run(SLOW), run(SLOW)])
    assert tuned_verdict_text(long, ["close"]).startswith(
        "PathCond reaches the threshold undecided against the baseline (the 95% "
        "interval of the gap in epochs over seeds reaches zero) on `close` "
        "(2.5 ± 0.5 vs 2.7 ± 0.5 epochs over 2 seeds)"
    )
    # 2.75 ± 0.43 against 3.0 ± 0.0: Welch's interval keeps the larger spread
    long[("one_sided", "pathcond")] = summarise_runs([run(FAST)] + [run(SLOW)] * 3)
    long[("one_sided", "baseline")] = summarise_runs([run(SLOW), run(SLOW)])
    assert "reaches zero) on `one_sided`" in tuned_verdict_text(long, ["one_sided"])
    # 2.5 ± 0.5 against 3.0 ± 0.0 over two seeds: undecided either way round
    long[("edge", "pathcond")] = long[("close", "pathcond")]
    long[("edge", "baseline")] = summarise_runs([run(SLOW), run(SLOW)])
    for name in ("edge", "later"):
        if name == "later":
            long[("later", "pathcond")] = long[("edge", "baseline")]
            long[("later", "baseline")] = long[("edge", "pathcond")]
        assert tuned_verdict_text(long, [name]).startswith(
            "PathCond reaches the threshold undecided against the baseline (the "
            f"95% interval of the gap in epochs over seeds reaches zero) on `{name}`"
        )
    one = {
        ("one", "pathcond"): summarise_runs([run(FAST)]),
        ("one", "baseline"): summarise_runs([run(SLOW)]),
    }
    assert "(2.0 ± 0.0 vs 3.0 ± 0.0 epochs over 1 seed)" in tuned_verdict_text(
        one, ["one"]
    )
    long[("none", "baseline")] = long[("even", "baseline")]
    long[("none", "pathcond")] = summarise_runs([run(NEVER, 0.7), run(NEVER, 0.7)])
    assert tuned_verdict_text(long, ["none"]).startswith(
        "PathCond reaches the threshold later on average than the baseline on `none` "
        "(never within 3 vs 2.0 ± 0.0 epochs"
    )
    long[("open", "baseline")] = long[("open", "pathcond")] = long[("none", "pathcond")]
    assert "run length leaves open on `open`" in tuned_verdict_text(long, ["open"])
    with pytest.raises(ValueError, match="at least one configuration"):
        tuned_verdict_text(long, [])


def test_ablation_rows_and_text(grid):
    summaries = summarise_grid(grid, [0, 1])
    rows = ablation_rows(summaries, {"low": "const"}, BASE, CONFIGS)
    assert [(r["config"], r["method"]) for r in rows] == [
        ("const", "baseline"),
        ("const", "pathcond"),
        ("low", "baseline"),
        ("low", "pathcond"),
    ]
    assert rows[0]["layout"] == "with output bias"
    paper = {**CONFIGS, "const": {**CONFIGS["const"], "output_bias": False}}
    assert ablation_rows(summaries, {"low": "const"}, BASE, paper)[0]["layout"] == (
        "no output bias (paper)"
    )
    gaps = [
        summaries[(n, "pathcond")]["final_acc"]
        - summaries[(n, "baseline")]["final_acc"]
        for n in ("const", "low")
    ]
    assert ablation_text(summaries, {"low": "const"}) == (
        f"on `const` {gaps[0]:+.3f} without the output bias and {gaps[1]:+.3f} with it "
        "(`low`)"
    )
