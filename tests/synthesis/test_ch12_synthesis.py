"""Chapter 12's protocols: data subsets, verdict rule, the four questions' runs and tables."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy import stats

from tests.kit import FakeZoo, drawn_models, mlp, readable_dataset, seeded_models
from wslib.core.connectivity import max_output_diff
from wslib.core.neurons import permute_state, random_permutations
from wslib.core.seeds import derive_seed, derive_seeds
from wslib.core.train import Recipe, evaluate, fit
from wslib.runs.steps import cached_step
from wslib.runs.verdicts import LOSS_MARGIN
from wslib.synthesis import ch12_results
from wslib.synthesis import ch12_synthesis as ex
from wslib.synthesis.alignment import STEPS, pathcond_gauge, with_state

IN = [1, 10]
MLP = mlp([8, 8], IN)
SETTINGS = {
    "ts": [0.0, 0.5, 1.0],
    "llpf": {
        "ticks": 4,
        "record_every": 2,
        "lr": 0.05,
        "r_max": 3,
        "r_min": 1,
        "batch_size": 16,
        "margin": 10.0,
    },
    "finetune": {"epochs": 1, "lr": 0.01, "batch_size": 16},
    "gradient": {"max_epochs": 2},
    "bezier": {"steps": 3, "lr": 0.01},
}


def test_random_subset_draws_matching_rows_per_seed() -> None:
    ds = readable_dataset()
    small = ex.random_subset(ds, 10, 5, seed=1)
    assert (len(small.y_train), len(small.y_test)) == (10, 5)
    assert torch.equal(small.x_train[:, 0, 0], small.y_train.float())
    assert torch.equal(small.x_test[:, 0, 0], small.y_test.float())
    again, other = (
        ex.random_subset(ds, 10, 5, seed=1),
        ex.random_subset(ds, 10, 5, seed=2),
    )
    assert torch.equal(again.x_train, small.x_train)
    assert not torch.equal(other.x_train, small.x_train)
    with pytest.raises(ValueError, match="n_train, n_test >= 1"):
        ex.random_subset(ds, 0, 5, seed=1)


def test_fusion_set_has_per_class_examples_of_every_class() -> None:
    ds = readable_dataset()
    x, y = ex.fusion_set(ds, 4, seed=0)
    assert np.bincount(y.numpy()).tolist() == [4, 4, 4]
    assert torch.equal(x[:, 0, 0], y.float())
    assert not torch.equal(ex.fusion_set(ds, 4, seed=1)[0], x)
    with pytest.raises(ValueError, match="per_class must be >= 1"):
        ex.fusion_set(ds, 0, seed=0)


def test_all_pairs() -> None:
    assert ex.all_pairs([1, 2, 3]) == [(1, 2), (1, 3), (2, 3)]
    with pytest.raises(ValueError, match="at least two models"):
        ex.all_pairs([1])


@pytest.mark.parametrize(
    ("values", "reference", "word"),
    [
        ([1.0, 1.1, 0.9], [2.0, 2.0, 2.0], "lower"),
        ([3.0, 3.1, 2.9], [2.0, 2.0, 2.0], "higher"),
        ([1.0, 3.0, 2.0], [2.0, 2.0, 1.9], "none"),  # mean 0.03, std 1
        ([1.0], [2.0], "none"),  # one seed: the spread is unknown
        ([2.0, 2.0], [2.0, 2.0], "same"),  # no difference at all
        ([2.001, 2.0, 2.002], [2.0, 2.001, 2.0], "same"),  # within ± 0.01
    ],
)
def test_compare_reads_the_interval_of_the_paired_difference(
    values: list[float], reference: list[float], word: str
) -> None:
    result = ex.compare(values, reference, 0.01)
    assert result["word"] == word
    d = np.subtract(values, reference)
    assert result["diff_mean"] == pytest.approx(d.mean())
    assert result["n"] == len(d)
    if len(d) > 1 and d.std() > 0:
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        assert result["interval"] == pytest.approx([ci.low, ci.high])


def test_compare_at_the_edge_of_the_interval() -> None:
    # differences 1 and 3: mean 2 ± 12.7; 1.9, 2.0, 2.1: mean 2 ± 0.25
    assert ex.compare([1.0, 3.0], [0.0, 0.0], None)["word"] == "none"
    assert ex.compare([1.9, 2.0, 2.1], [0.0, 0.0, 0.0], None)["word"] == "higher"
    assert ex.compare([-1.0, -1.0], [0.0, 0.0], None)["word"] == "lower"
    assert ex.compare([0.0, 0.0], [0.0, 0.0], None)["word"] == "none"  # no margin
    with pytest.raises(ValueError, match="equally long"):
        ex.compare([1.0], [1.0, 2.0], None)


def test_sample_mean_std() -> None:
    r = ex.sample_mean_std([1.0, 3.0])
    assert (r["mean"], r["values"]) == (2.0, [1.0, 3.0])
    assert r["std"] == pytest.approx(2**0.5)
    assert ex.sample_mean_std([5.0])["std"] == 0.0


def alignment_fixture() -> dict:
    def step(barriers: list[float]) -> dict:
        return {"barriers": barriers, "barrier_mean": float(np.mean(barriers))}

    return {
        "mlp": {
            "none": step([9.0, 9.0, 9.0]),
            "weight matching": step([1.0, 1.1, 0.9]),
            "PathCond gauge + WM": step([0.5, 0.6, 0.4]),
            "ENorm gauge + WM": step([1.0, 1.2, 0.9]),
            "WM + scale matching": step([2.0, 2.1, 1.9]),
        }
    }


def test_alignment_verdicts_compare_with_weight_matching() -> None:
    verdicts = ch12_results.alignment_verdicts(alignment_fixture())
    words = {s: v["word"] for s, v in verdicts["mlp"].items()}
    assert words == {
        "PathCond gauge + WM": "lower",
        "ENorm gauge + WM": "none",
        "WM + scale matching": "higher",
    }
    assert ch12_results.count_words(verdicts) == {
        "lower": 1,
        "higher": 1,
        "same": 0,
        "none": 1,
    }
    text = ch12_results.alignment_sentence(verdicts)
    assert text.startswith("Removing the rescaling symmetry too helps only sometimes")
    assert "1 lowered" in text and "1 raised" in text and "1 are undecided" in text


def test_alignment_sentence_heads() -> None:
    row = {"lower": {"word": "lower"}, "none": {"word": "none"}}
    assert ch12_results.alignment_sentence(
        {"a": row, "b": {"x": {"word": "lower"}}}
    ).startswith("Removing both symmetries helps")
    none = {"a": {"x": {"word": "none"}, "y": {"word": "higher"}}}
    assert ch12_results.alignment_sentence(none).startswith(
        "Removing the rescaling symmetry too does not help"
    )


def test_alignment_run_uses_every_pair() -> None:
    ds = readable_dataset()
    result = ex.alignment_run({"mlp": drawn_models(MLP, 3)}, ds, [0.0, 1.0], seed=0)
    assert list(result["mlp"]) == list(STEPS)
    assert len(result["mlp"]["none"]["barriers"]) == 3


def pair_runs() -> list[dict]:
    """One real pair study and a second one made from it (other numbers, same layout)."""
    ds = readable_dataset()
    fusion = ex.fusion_set(ds, 6, seed=0)
    a, b = drawn_models(MLP, 2, seed=1)
    run = ex.pair_study(a, b, ds, fusion, SETTINGS, seed=0)
    other = copy.deepcopy(run)
    for v in ex.KF_VARIANTS:
        other["fused_parent"][v]["barrier"] += 0.3
    other["parent_parent"]["aligned"]["barrier"] += 0.1
    for path, c in other["conditioning"].items():
        c["amgm"] = [x * (1.1 if path == "LLPF" else 1.0) for x in c["amgm"]]
    return [run, other]


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    with pytest.warns(UserWarning):  # tiny settings: LLPF and retrofits warn
        return pair_runs()


def test_pair_study_reports_both_questions(runs: list[dict]) -> None:
    run = runs[0]
    assert set(run["fused_parent"]) == set(ex.KF_VARIANTS)
    for v in ex.KF_VARIANTS:
        r = run["fused_parent"][v]
        assert {"barrier", "llpf_peak_excess", "fused_acc", "finetuned_acc"} <= set(r)
    assert set(run["parent_parent"]) == {"unaligned", "aligned"}
    cond = run["conditioning"]
    assert set(cond) == set(ex.PATHS)
    assert len(cond["straight line"]["loss"]) == len(SETTINGS["ts"])
    assert len(cond["Bezier"]["loss"]) == len(SETTINGS["ts"])
    assert len(cond["LLPF"]["loss"]) >= 3
    for path in ex.PATHS:
        ends = cond[path]["loss"][0], cond[path]["loss"][-1]
        assert ends == pytest.approx(
            (cond["LLPF"]["loss"][0], cond["LLPF"]["loss"][-1])
        )
        assert cond[path]["loss_gauge"] == pytest.approx(cond[path]["loss"], rel=1e-4)


def test_straight_line_barrier_between_parents_is_the_line_barrier(
    runs: list[dict],
) -> None:
    line = runs[0]["conditioning"]["straight line"]["loss"]
    barrier = max(line) - 0.5 * (line[0] + line[-1])
    assert runs[0]["parent_parent"]["unaligned"]["barrier"] == pytest.approx(
        barrier, rel=1e-5
    )


def test_summarise_pairs_wires_the_verdicts(runs: list[dict]) -> None:
    s = ex.summarise_pairs(runs)
    for v in ex.KF_VARIANTS:
        values = [r["fused_parent"][v]["barrier"] for r in runs]
        assert s["fused_parent"][v]["barrier"]["values"] == pytest.approx(values)
        ref = [r["parent_parent"]["aligned"]["barrier"] for r in runs]
        assert s["basin"][v]["barrier"] == ex.compare(values, ref, LOSS_MARGIN)
    line = [np.mean(r["conditioning"]["straight line"]["amgm"]) for r in runs]
    llpf = [np.mean(r["conditioning"]["LLPF"]["amgm"]) for r in runs]
    assert s["conditioning_verdict"]["LLPF"] == ex.compare(llpf, line, None)
    assert s["conditioning"]["LLPF"]["amgm"] == runs[0]["conditioning"]["LLPF"]["amgm"]
    assert s["gauge_loss_change_max"] < 1e-4
    assert -1.0 <= s["loss_amgm_correlation"] <= 1.0
    assert "PathCond gauge left the loss" in ch12_results.conditioning_sentence(s)
    assert ch12_results.basin_sentence(s["basin"]).startswith(
        "With the linear retrofit"
    )
    assert list(ch12_results.basin_table(s).index)[-1] == "parents, aligned"
    assert list(ch12_results.conditioning_table(s).index) == list(ex.PATHS)


def test_conditioning_sentence_flags_a_changed_loss() -> None:
    verdict = {"LLPF": {"word": "lower"}, "Bezier": {"word": "none"}}
    summary = {"conditioning_verdict": verdict, "gauge_loss_change_max": 1e-3}
    assert "a bug" in ch12_results.conditioning_sentence(summary)
    summary["gauge_loss_change_max"] = 1e-6
    text = ch12_results.conditioning_sentence(summary)
    assert "LLPF path are better conditioned" in text and "unchanged" in text


def test_basin_sentence_words() -> None:
    basin = {
        "linear": {"barrier": {"word": "lower"}, "llpf_peak_excess": {"word": "none"}},
        "gradient": {
            "barrier": {"word": "higher"},
            "llpf_peak_excess": {"word": "lower"},
        },
    }
    text = ch12_results.basin_sentence(basin)
    assert (
        "linear retrofit, the barrier from the fused model to a parent is lower" in text
    )
    assert (
        "gradient retrofit, the barrier from the fused model to a parent is higher"
        in text
    )


def test_gauge_fusion_fuses_the_gauged_models(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = readable_dataset()
    fusion = ex.fusion_set(ds, 6, seed=0)
    groups = [drawn_models(MLP, 2, seed=3), drawn_models(MLP, 2, seed=4)]
    given: list[list[torch.nn.Module]] = []
    real = ex.fuse_by

    def spy(method: str, group: list, x: torch.Tensor, y: torch.Tensor, **kw: int):
        given.append(group)
        return real(method, group, x, y, **kw)

    monkeypatch.setattr(ex, "fuse_by", spy)
    result = ex.gauge_fusion({"full": groups}, ds, fusion, ["kf_linear"], seed=0)
    r = result["full"]["kf_linear"]
    assert len(r["with"]["values"]) == len(r["without"]["values"]) == 2
    assert r["verdict"] == ex.compare(
        r["with"]["values"], r["without"]["values"], ex.ACCURACY_MARGIN
    )
    assert len(given) == 4  # (without, with) per seed
    for k, group in enumerate(groups):
        without, with_gauge = given[2 * k], given[2 * k + 1]
        assert without == group
        for m, g in zip(group, with_gauge):
            state = pathcond_gauge(m, IN)
            assert all(torch.allclose(g.state_dict()[n], state[n]) for n in state)
            assert max_output_diff(m, g.state_dict(), ds.x_test, False) < 1e-4
            assert not torch.allclose(
                g.state_dict()["linears.0.weight"], m.linears[0].weight
            )
    assert "(regime, method) cases" in ch12_results.gauge_sentence(result)


def test_gauge_sentence_counts() -> None:
    cell = {"verdict": {"word": "none"}}
    gauge = {"full": {"a": cell, "b": {"verdict": {"word": "higher"}}}}
    text = ch12_results.gauge_sentence(gauge)
    assert text.startswith("The gauge changes fusion in some cases")
    assert "of 2 (regime, method) cases" in text and "without in 1" in text
    assert "undecided in 1" in text
    assert ch12_results.gauge_sentence({"full": {"a": cell}}).startswith(
        "The runs do not decide"
    )
    same = {"full": {"a": {"verdict": {"word": "same"}}}}
    assert ch12_results.gauge_sentence(same).startswith("The gauge makes no difference")


def test_shard_models_seeds_and_parts() -> None:
    zoo = FakeZoo(train=True)
    groups = ex.shard_models(zoo, {"name": "d"}, MLP, {"epochs": 1}, n_seeds=2, seed=5)
    assert [len(g) for g in groups] == [2, 2]
    got = [(c["seed"], c["split"]["seed"], c["split"]["part"]) for c in zoo.requests]
    model = derive_seeds(5, "model", 4)
    split = derive_seeds(5, "split", 2)
    assert got == [
        (model[0], split[0], 0),
        (model[1], split[0], 1),
        (model[2], split[1], 0),
        (model[3], split[1], 1),
    ]
    assert all(c["split"]["kind"] == "shards" for c in zoo.requests)


def test_base_accuracy_is_the_test_accuracy() -> None:
    ds = readable_dataset()
    group = drawn_models(MLP, 2, seed=6)
    want = [evaluate(m, ds.x_test, ds.y_test)[1] for m in group]
    assert ex.base_accuracy({"full": [group]}, ds)["full"]["values"] == pytest.approx(
        want
    )


def test_pair_studies_run_every_pair_with_its_seed_each_cached(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    @cached_step(code=ex.CODE)
    def fake_study(a, b, ds, fusion, settings, seed, *, train=None, run_cache=None):  # noqa: ANN001, ANN202
        calls.append(seed)
        return {"seed": seed}

    monkeypatch.setattr(ex, "pair_study", fake_study)
    ds = readable_dataset()
    models = seeded_models(MLP, range(3))
    fusion = (ds.x_train[:4], ds.y_train[:4])
    args = (models, ds, fusion, {"ts": [0.0, 1.0]}, 3)
    first = ex.pair_studies(*args, run_cache=str(tmp_path))
    again = ex.pair_studies(*args, run_cache=str(tmp_path))
    seeds = [derive_seed(3, "pair", k) for k in range(3)]
    assert first == again == [{"seed": s} for s in seeds]
    assert calls == seeds  # three pairs, each computed once


def test_parents_are_aligned_to_the_fused_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fused model that is a permuted copy of its parent is at barrier 0 from it."""
    ds = readable_dataset()
    (a,) = drawn_models(MLP, 1, seed=3)
    fit(
        a,
        ds.x_train,
        ds.y_train,
        Recipe(epochs=20, lr=0.1, batch_size=16),
        progress=False,
    )
    a.eval()
    structure = a.neuron_structure()
    perms = random_permutations(structure, generator=torch.Generator().manual_seed(0))
    copy_of_a = with_state(a, permute_state(a.state_dict(), structure, perms))
    monkeypatch.setattr(
        ex, "fused_model", lambda *args: (copy_of_a, {"fused_acc": 0.0})
    )
    run = ex.pair_study(a, a, ds, ex.fusion_set(ds, 6, seed=0), SETTINGS, seed=0)
    for v in ex.KF_VARIANTS:
        assert run["fused_parent"][v]["barrier"] == pytest.approx(0.0, abs=1e-6)
    unaligned = ex.connection(
        copy_of_a, a.state_dict(), ds, SETTINGS["ts"], SETTINGS["llpf"], 0
    )
    assert unaligned["barrier"] > 1e-3  # fmt: skip
