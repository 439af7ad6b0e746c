"""wslib.runs.units: units grouped by stage; every cache refuses to compute when told.

A split sweep (``bookkit sweep --split``) runs the units stage by
stage, then the notebooks. ``WSLIB_CACHED_ONLY=1`` is the check that a split
chapter's units covered all its work (``tests/book/test_split.py``), so each
cache's refusal is tested here: the run cache, the model zoo, an LLPF path.
"""

from __future__ import annotations

import pytest
import torch

from bookkit import sweep
from tests.kit import drawn_models, mlp
from tests.runs.test_zoo import CONFIG
from wslib.core.seeds import derive_seeds
from wslib.llpf.layerwise import M2MSettings, m2m
from wslib.llpf.ticks import Refine
from wslib.runs.cache import cached_run
from wslib.runs.resumable import Persist
from wslib.runs.units import CACHED_ONLY, NotCached, Unit, by_stage, refuse_compute
from wslib.runs.zoo import Zoo


def unit(name: str, stage: int) -> Unit:
    return Unit(name, stage, lambda: None)


def test_units_are_grouped_by_stage_lowest_first() -> None:
    units = [unit("b", 1), unit("a", 0), unit("c", 1), unit("d", 3)]
    stages = by_stage(units)
    assert [[u.name for u in s] for s in stages] == [["a"], ["b", "c"], ["d"]]


def test_repeated_unit_names_are_named() -> None:
    with pytest.raises(ValueError, match="repeated: a"):
        by_stage([unit("a", 0), unit("a", 1), unit("b", 0)])


@pytest.fixture()
def cached_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHED_ONLY, "1")


def test_refusal_only_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHED_ONLY, "0")
    refuse_compute("anything")  # no error
    monkeypatch.setenv(CACHED_ONLY, "1")
    with pytest.raises(NotCached, match="the thing is not cached"):
        refuse_compute("the thing")


def test_run_cache_refuses_a_miss_and_serves_a_hit(tmp_path, monkeypatch) -> None:
    stored = cached_run(tmp_path, {"a": 1}, lambda: {"x": 1.0})
    monkeypatch.setenv(CACHED_ONLY, "1")
    assert cached_run(tmp_path, {"a": 1}, lambda: {"x": 2.0}) == stored
    with pytest.raises(NotCached, match="run .* is not cached"):
        cached_run(tmp_path, {"a": 2}, lambda: {"x": 2.0})


def test_a_run_without_a_cache_folder_refuses_too(cached_only) -> None:
    with pytest.raises(NotCached, match="without a cache folder"):
        cached_run(None, {"a": 1}, lambda: {"x": 1.0})


def test_zoo_refuses_to_train(tmp_path, cached_only) -> None:
    """The data set it reads on the way is the test's own (the data set is
    loaded, and cached, before the model's key is known)."""
    zoo = Zoo(
        tmp_path / "zoo", data_root=tmp_path / "data", device="cpu", progress=False
    )
    with pytest.raises(NotCached, match="model .* is not cached"):
        zoo.get(CONFIG)


def test_llpf_path_refuses_to_move_but_a_finished_one_loads(
    tmp_path, monkeypatch
) -> None:
    model, other = drawn_models(mlp([5], in_shape=[1, 6]), 2, seed=0, train=True)
    dest = other.state_dict()
    x, y = torch.randn(32, 1, 6), torch.randint(0, 3, (32,))  # drawn after the models
    refine = Refine(lr=0.05, batch_size=16, r_min=2, r_max=3, threshold=10.0)

    def find(folder: str) -> object:
        start = model.state_dict()
        persist = Persist(tmp_path / folder)
        return m2m(
            model,
            start,
            dest,
            x,
            y,
            M2MSettings(ticks=3, refine=refine),
            persist=persist,
        )

    done = find("done")
    monkeypatch.setenv(CACHED_ONLY, "1")
    assert find("done").ticks == done.ticks
    with pytest.raises(NotCached, match="LLPF path .* is not cached"):
        find("new")


def test_a_split_sweep_runs_units_stage_by_stage_then_the_notebooks() -> None:
    jobs = [sweep.Job(nb, 0, "smoke") for nb in ("03_llpf_m2m", "01_symmetries")]
    phases = sweep.split(jobs)
    assert phases[-1] == jobs  # every notebook last, the unsplit one included
    units = [job for phase in phases[:-1] for job in phase]
    assert units and {job.nb for job in units} == {"03_llpf_m2m"}
    first = [f"mode mlp seed {s}" for s in derive_seeds(0, "mode", 2)]
    assert [job.unit for job in phases[0]][:2] == first
    assert all(job.unit.startswith(("m2m", "all-at-once", "peak")) for job in phases[1])
    command = phases[1][0].command()
    assert command[1:4] == ["-m", "bookkit", "part"]
    assert command[-1] == phases[1][0].unit
    assert phases[1][0].log.startswith("03_llpf_m2m.units/")
