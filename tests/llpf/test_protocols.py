"""The LLPF chapters' runs: the refinement rule, checkpoints, equal budgets, M2O and the hybrid."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grimp
import numpy as np
import pytest
import torch

from tests.kit import QUIET, pair, toy_dataset
from wslib.core.train import evaluate
from wslib.llpf.ch03_m2m import peak_anatomy
from wslib.llpf.evaluation import evaluate_path
from wslib.llpf.layerwise import (
    M2MSettings,
    hybrid,
    m2m,
    movable_names,
    sphere_variance_ratio,
)
from wslib.llpf.path import LLPFPath
from wslib.llpf.protocols import (
    CODE,
    PathRun,
    PathSetup,
    batch_mode_loss,
    endpoint_loss,
    hybrid_run,
    m2m_path,
    m2m_run,
    m2o_run,
    threshold_loss,
    variance_along,
)
from wslib.llpf.stages import data_flow_stage_names
from wslib.llpf.ticks import tensor_variances
from wslib.runs.resumable import Persist

FAST = {"ticks": 4, "lr": 0.05, "r_max": 3, "record_every": 2}
CURVE = {"kind": "bezier", "lr": 0.05, "momentum": 0.9, "n_eval": 5}
NEB = {
    "n_init": 1,
    "cycles": 2,
    "lrs": [0.1, 0.05],
    "spring": 1.0,
    "insert_tol": 0.05,
    "max_pivots": 4,
}


def setup(**options) -> PathSetup:
    return PathSetup(toy_dataset(), batch_size=8, r_min=2, margin=0.25, **options)


def test_endpoint_loss_is_the_larger_training_loss() -> None:
    ds = toy_dataset()
    a, b = pair()
    losses = [evaluate(m, ds.x_train, ds.y_train)[0] for m in (a, b)]
    assert endpoint_loss([a, b], ds) == max(losses)
    assert endpoint_loss([a], ds) == losses[0]


def test_refine_stops_at_the_endpoint_loss_plus_the_margin() -> None:
    s = setup()
    a, b = pair()
    refine = s.refine([a, b], PathRun(lr=0.3, r_max=7, ticks=1, record_every=1))
    assert refine.threshold == endpoint_loss([a, b], s.ds) + 0.25
    assert (refine.lr, refine.r_max, refine.batch_size, refine.r_min) == (0.3, 7, 8, 2)


def test_checkpoint_files_are_named_by_model_seed_and_variant(tmp_path) -> None:
    assert setup().checkpoint("mlp", 0) is None
    s = setup(checkpoint_dir=tmp_path)
    assert s.checkpoint("mlp", 3) == tmp_path / "mlp-seed3"
    assert s.checkpoint("mlp", 3, all_at_once=True) == tmp_path / "mlp-seed3-all"


def test_m2m_path_connects_the_pair_and_writes_its_checkpoint(tmp_path) -> None:
    s = setup(checkpoint_dir=tmp_path)
    a, b = pair()
    path = m2m_path(s, [a, b], FAST, seed=0, name="mlp")
    assert s.checkpoint("mlp", 0, settings=PathRun(**FAST).key(), ends=[a, b]).exists()
    assert all(torch.equal(path.states[0][k], v) for k, v in a.state_dict().items())
    assert all(torch.equal(path.states[-1][k], v) for k, v in b.state_dict().items())
    assert path.ticks == [0, 2, 4] and path.total_grad_steps > 0
    again = m2m_path(s, [a, b], FAST, seed=0, name="mlp")  # read back
    assert again.grad_steps == path.grad_steps and again.seconds == path.seconds


def test_the_threshold_decides_how_long_the_refinement_runs() -> None:
    a, b = pair()
    ds = toy_dataset()
    settings = {"ticks": 3, "lr": 1e-6, "r_max": 9, "record_every": 1}
    easy = PathSetup(ds, batch_size=8, r_min=2, margin=100.0)
    ends = threshold_loss([a, b], ds, 8)
    hard = PathSetup(ds, batch_size=8, r_min=2, margin=-ends)  # threshold 0
    # a tick's refinement stops after r_min steps under an easy threshold and
    # runs to r_max under an unreachable one (the last tick lands on B, no steps)
    assert m2m_path(easy, [a, b], settings, seed=0).total_grad_steps == 2 * 2
    assert m2m_path(hard, [a, b], settings, seed=0).total_grad_steps == 2 * 9


def test_m2m_run_is_the_evaluated_path_with_its_stage_names() -> None:
    s = setup()
    a, b = pair()
    res = m2m_run(s, [a, b], FAST, seed=1)
    ref = evaluate_path(
        a,
        m2m_path(s, [a, b], FAST, seed=1),
        s.ds.x_train,
        s.ds.y_train,
        s.ds.x_test,
        s.ds.y_test,
        dense=1,
        progress=False,
    )
    assert np.array_equal(res["train_loss"], ref["train_loss"])
    assert res["peak_excess"] == ref["peak_excess"]
    assert res["stage_names"] == data_flow_stage_names(a)


def test_evaluate_uses_the_setups_dense_points() -> None:
    a, b = pair()
    path = LLPFPath.of_run([a.state_dict(), b.state_dict()], 0, 0.0, "x")
    assert setup(dense=3).evaluate(a, path)["dense_loss"].shape == (1, 3)


def test_checkpoint_files_differ_by_settings(tmp_path) -> None:
    s = PathSetup(toy_dataset(), 8, 2, 0.1, checkpoint_dir=tmp_path)
    one = s.checkpoint("mlp", 0, settings={"lr": 0.1})
    assert one == s.checkpoint("mlp", 0, settings={"lr": 0.1})
    assert one != s.checkpoint("mlp", 0, settings={"lr": 0.2})
    assert one != s.checkpoint("mlp", 1, settings={"lr": 0.1})


def test_variance_along_a_path_is_relative_to_the_reference() -> None:
    a, _ = pair()
    state = a.state_dict()
    half = {k: v * 0.5 for k, v in state.items()}
    path = LLPFPath([state, half])
    ratio = variance_along(path, state, ["linears.0.weight", "linears.1.weight"])
    assert ratio == pytest.approx([1.0, 0.25])


def test_m2o_shrinks_the_variance_by_the_factor_per_tick() -> None:
    a, _ = pair()
    frozen = {"ticks": 5, "shrink": 0.1, "lr": 1e-12, "r_max": 1, "record_every": 1}
    s = PathSetup(toy_dataset(), batch_size=8, r_min=1, margin=0.0)
    res = m2o_run(s, a, frozen, seed=0, compliance=True)
    expected = [(1 - 0.1) ** (2 * t) for t in range(6)]
    assert res["variance"] == pytest.approx(expected, rel=1e-4)
    assert res["grad_steps"] == 5


def test_hybrid_ends_on_the_destination_sphere() -> None:
    source, dest = pair()
    with torch.no_grad():
        for p in dest.parameters():
            p.mul_(0.5)
    s = setup()
    res = hybrid_run(s, source, dest, {"ticks": 20, "shrink": 0.1}, FAST, seed=0)
    names = movable_names(source)
    ratio = sphere_variance_ratio(source.state_dict(), dest.state_dict(), names)
    assert res["dest_variance"] == ratio
    assert res["variance"][0] == pytest.approx(1.0)
    assert res["variance"][-1] == pytest.approx(ratio)
    # the switch is the last M2O point: its variance has reached the destination's
    path = hybrid(
        source,
        source.state_dict(),
        dest.state_dict(),
        s.ds.x_train,
        s.ds.y_train,
        m2o_ticks=20,
        shrink=0.1,
        m2m_ticks=FAST["ticks"],
        refine=s.refine([source, dest], PathRun(**FAST)),
        record_every=FAST["record_every"],
        persist=QUIET,
    )
    last_m2o = max(i for i, phase in enumerate(path.phase) if phase == "m2o")
    assert 0 < res["switch"] < 1
    assert res["switch"] == res["position"][last_m2o]
    assert res["variance"][last_m2o] == pytest.approx(ratio, rel=0.3)


def test_code_names_every_module_the_runs_import() -> None:
    graph = grimp.build_graph(
        "wslib", cache_dir=None, exclude_type_checking_imports=True
    )
    runs = {"wslib.llpf.protocols", "wslib.llpf.methods"}  # both key by CODE
    imported = set().union(*(graph.find_upstream_modules(m) for m in runs))
    # wslib.runs.units only refuses to compute under WSLIB_CACHED_ONLY=1 and
    # wslib.core.workspace only says where files go: no result depends on their
    # source, so they stay out of the cache key.
    imported = imported - {"wslib.runs.units", "wslib.core.workspace"}
    models = {"wslib.core.models", "wslib.core.pooling"}  # they run in every path
    expected = imported | runs | models
    assert set(CODE) == expected


def test_peak_anatomy_parts_add_up_to_the_peak_excess() -> None:
    s = setup()
    a, b = pair()
    settings = {"ticks": 6, "lr": 0.05, "r_max": 4, "record_every": 1}
    parts = peak_anatomy(s, [a, b], settings, seed=0)
    total = sum(
        parts[k]
        for k in ("margin", "stop_gap", "full_set_gap", "projection", "elsewhere")
    )
    assert total == pytest.approx(parts["peak_excess"], abs=1e-6)
    assert parts["margin"] == pytest.approx(0.25)
    assert parts["peak_excess"] == m2m_run(s, [a, b], settings, 0)["peak_excess"]
    assert 1 <= parts["tick"] <= 5 and parts["projection"] != 0.0
    assert parts["elsewhere"] >= -1e-5  # the point is one of the path's points


def test_m2o_run_with_a_target_ratio_ends_on_that_sphere() -> None:
    a, _ = pair()
    frozen = {"ticks": 30, "shrink": 0.1, "lr": 1e-12, "r_max": 1, "record_every": 1}
    s = PathSetup(toy_dataset(), batch_size=8, r_min=1, margin=0.0)
    for compliance in (True, False):
        res = m2o_run(s, a, {**frozen, "target_ratio": 0.3}, 0, compliance=compliance)
        assert res["variance"][-1] == pytest.approx(0.3, rel=0.011)
        assert len(res["variance"]) == 7  # 0.81^k passes 0.3 at k = 6 (clamped)


def test_on_refined_sees_the_point_before_its_projection() -> None:
    s = setup()
    a, b = pair()
    names = [n for n, _ in a.named_parameters()]
    start_var = tensor_variances(a.state_dict(), names)

    def record(tick: int, model: torch.nn.Module, store: dict) -> None:
        store[tick] = tensor_variances(model.state_dict(), names)

    before, after = {}, {}
    m2m(
        a,
        a.state_dict(),
        b.state_dict(),
        s.ds.x_train,
        s.ds.y_train,
        M2MSettings(ticks=4, refine=s.refine([a, b], PathRun(**FAST))),
        on_refined=lambda t, m: record(t, m, before),
        persist=Persist(progress=False, on_tick=lambda t, m: record(t, m, after)),
    )
    assert sorted(before) == [1, 2, 3] and sorted(after) == [1, 2, 3, 4]
    for t in before:
        assert after[t] == pytest.approx(start_var, rel=1e-4)
        assert before[t] != pytest.approx(start_var, rel=1e-4)


def test_a_bf16_refinement_measures_its_threshold_in_bf16() -> None:
    s = setup()
    a, b = pair()
    settings = PathRun(lr=0.3, r_max=7, ticks=1, record_every=1, precision="bf16")
    refine = s.refine([a, b], settings)
    bf16 = max(batch_mode_loss(m, s.ds, 8, precision="bf16") for m in (a, b))
    assert refine.precision == "bf16" and refine.threshold == bf16 + 0.25
    assert threshold_loss([a, b], s.ds, 8, precision="bf16") == bf16
    assert bf16 != pytest.approx(endpoint_loss([a, b], s.ds), rel=1e-6)
    assert bf16 == pytest.approx(endpoint_loss([a, b], s.ds), rel=0.05)


def test_a_path_s_test_metrics_are_read_on_the_test_split() -> None:
    s = setup()
    a, b = pair()
    res = s.evaluate(a, m2m_path(s, [a, b], FAST, seed=0))
    for i, model in ((0, a), (-1, b)):
        assert res["test_loss"][i] == pytest.approx(
            evaluate(model, s.ds.x_test, s.ds.y_test)[0], rel=1e-5
        )
        assert res["train_loss"][i] == pytest.approx(
            evaluate(model, s.ds.x_train, s.ds.y_train)[0], rel=1e-5
        )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({**FAST, "tick": 3}, "M2M settings: unknown setting tick; valid: lr, "),
        (
            {"ticks": 4, "lr": 0.05, "r_max": 3},
            "M2M settings: missing setting record_every",
        ),
        ({**FAST, "ticks": 0}, "ticks must be >= 1, got 0"),  # by M2MSettings
    ],
)
def test_a_wrong_path_setting_is_named_before_any_work(
    settings: dict[str, Any], message: str
) -> None:
    """A chapter's LLPF settings are read as a :class:`PathRun` first: a
    misspelt or missing name is named; a value is checked, and named, by the
    algorithm's own settings."""
    s = setup()
    with pytest.raises(ValueError, match=re.escape(message)):
        m2m_path(s, pair(), settings, seed=0)


def test_path_settings_and_their_mapping_give_one_checkpoint(tmp_path: Path) -> None:
    """A :class:`PathRun` and the mapping it was read from name one checkpoint:
    the name is made from the settings' key, not from how they were given."""
    s = setup(checkpoint_dir=tmp_path)
    a, b = pair()
    m2m_path(s, [a, b], FAST, seed=0, name="mlp")
    stamp = {p.name: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    m2m_path(s, [a, b], PathRun(**FAST), seed=0, name="mlp")
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == stamp
