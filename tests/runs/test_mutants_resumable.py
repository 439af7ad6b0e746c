"""The shared state of resumable runs, found by mutation testing
(``make mutation MODULE=runs/resumable``).

Pinned against independent references: a :class:`Resumable` driven through its
documented loop (``resume``, ``begin``, ``count``, ``settle``, ``end``) on a
fake clock (``seconds`` is the sum of the written-out tick durations) and a
fake progress bar (its arguments written out); where its checkpoint lies (the
named file, or ``index.pt`` in the named folder) and which tick it holds after
every tick, against a loop over the saving rule (every ``every`` ticks and at
the end); the exact messages of a ``.json`` checkpoint, of a rejected one and
of a refusal under ``WSLIB_CACHED_ONLY=1``; and what a resumed run restores and
does not save again.
"""

from __future__ import annotations

import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from wslib.runs import resumable
from wslib.runs.resumable import Persist, Resumable
from wslib.runs.store import Entry
from wslib.runs.units import CACHED_ONLY, NotCached

WHAT = "Test run"
TICK_SECONDS = 0.5  # what one tick's body takes on the fake clock
SAVE_SECONDS = 7.0  # what settle's work takes: never counted


class Clock:
    """A fake ``time.perf_counter`` that advances only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(
        resumable, "time", types.SimpleNamespace(perf_counter=fake.perf_counter)
    )
    return fake


def snapshot() -> dict[str, Any]:
    return {"w": torch.arange(3.0)}


def drive(run: Resumable, clock: Clock | None = None) -> int:
    """The documented loop of a run; returns how many ticks it took."""
    taken = 0
    run.begin("test run")
    while not run.done:
        if clock is not None:
            clock.now += TICK_SECONDS
        taken += 1
        run.count()
        run.settle(snapshot)
    run.end(snapshot)
    return taken


def on_disk(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def disk_ticks(every: int, ticks: int) -> list[int | None]:
    """The tick on disk after each tick: the last multiple of ``every``, or the last tick."""
    out: list[int | None] = []
    last = None
    for t in range(1, ticks + 1):
        if t % every == 0 or t == ticks:
            last = t
        out.append(last)
    return out


def recorded_disk_ticks(persist: Persist, path: Path, ticks: int, **kw: Any) -> list:
    seen: list[int | None] = []

    def record(tick: int) -> None:
        seen.append(on_disk(path)["tick"] if path.exists() else None)

    persist = Persist(persist.checkpoint, persist.checkpoint_every, False, record)
    drive(Resumable(persist, WHAT, "k", 0, ticks, **kw))
    return seen


# --- where the checkpoint lies, and when it is saved ----------------------------------


def test_a_checkpoint_is_the_named_file_unless_a_folder_is_asked(
    tmp_path: Path,
) -> None:
    drive(Resumable(Persist(tmp_path / "run.pt", progress=False), WHAT, "k", 0, 2))
    assert (tmp_path / "run.pt").is_file()
    assert on_disk(tmp_path / "run.pt")["tick"] == 2
    run = Resumable(
        Persist(tmp_path / "run.pt", progress=False), WHAT, "k", 0, 2, folder=False
    )
    assert run.entry is not None and run.entry.path == tmp_path / "run.pt"
    drive(
        Resumable(
            Persist(tmp_path / "dir", progress=False), WHAT, "k", 0, 2, folder=True
        )
    )
    assert on_disk(tmp_path / "dir" / "index.pt")["tick"] == 2


def test_a_checkpoint_is_saved_every_ten_ticks_by_default(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    got = recorded_disk_ticks(Persist(path), path, 25)
    assert got == disk_ticks(10, 25)
    assert got[8:11] == [None, 10, 10]


def test_the_run_s_every_applies_when_persist_names_none(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    assert recorded_disk_ticks(Persist(path), path, 9, every=4) == disk_ticks(4, 9)


def test_persist_checkpoint_every_overrides_the_run_s_every(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    got = recorded_disk_ticks(Persist(path, checkpoint_every=3), path, 8, every=7)
    assert got == disk_ticks(3, 8) == [None, None, 3, 3, 3, 6, 6, 8]


def test_a_run_with_no_tick_to_take_is_saved_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    run = Resumable(Persist(path, progress=False), WHAT, "k", 0, 0)
    assert run.resume() is None
    assert drive(run) == 0
    saved = on_disk(path)
    assert (saved["tick"], saved["finished"]) == (0, False)
    assert torch.equal(saved["w"], torch.arange(3.0))


# --- a run without a checkpoint, and a fresh run's state ------------------------------


def test_a_run_without_a_checkpoint_resumes_nothing_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = Resumable(Persist(progress=False), WHAT, None, 0, 3)
    assert run.resume() is None
    assert run.stored_parts == set()
    assert drive(run) == 3
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_run_takes_every_tick_and_counts_only_their_seconds(
    tmp_path: Path, clock: Clock
) -> None:
    def slow_tick(tick: int) -> None:
        clock.now += SAVE_SECONDS

    persist = Persist(tmp_path / "run.pt", 1, False, slow_tick)
    run = Resumable(persist, WHAT, "k", 0, 3)
    assert (run.tick, run.seconds, run.finished) == (0, 0.0, False)
    assert drive(run, clock) == 3
    assert (run.tick, run.seconds, run.finished) == (3, 3 * TICK_SECONDS, True)
    assert on_disk(tmp_path / "run.pt")["seconds"] == 3 * TICK_SECONDS


def test_count_and_end_before_begin_fail_naming_begin() -> None:
    run = Resumable(Persist(progress=False), WHAT, None, 0, 3)
    with pytest.raises(AssertionError, match=r"begin\(\) opens the run"):
        run.end(snapshot)
    with pytest.raises(AssertionError, match=r"begin\(\) opens the run"):
        run.count()


# --- the checkpoint's guards and messages ---------------------------------------------


@pytest.mark.parametrize("folder", [False, True])
def test_a_json_checkpoint_is_refused_with_its_message(
    tmp_path: Path, folder: bool
) -> None:
    path = tmp_path / "run.json"
    with pytest.raises(ValueError) as err:
        Resumable(Persist(path), WHAT, "k", 0, 3, folder=folder)
    assert str(err.value) == (
        f"Test run checkpoint {path}: a run's checkpoint holds tensors; "
        "name it with .pt (or no suffix), not .json"
    )
    assert not path.exists()


def test_another_run_s_checkpoint_is_ignored_with_a_warning_naming_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.pt"
    drive(Resumable(Persist(path, progress=False), WHAT, "key one", 0, 2))
    other = Resumable(Persist(path, progress=False), WHAT, "key two", 0, 2)
    with pytest.warns(UserWarning) as caught:
        assert other.resume() is None
    assert [str(w.message) for w in caught] == [
        f"Test run checkpoint {path} was written for another run (its key differs); "
        "computing it again"
    ]
    assert (other.tick, other.finished) == (0, False)
    same = Resumable(Persist(path, progress=False), WHAT, "key one", 0, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same.resume() is not None
    assert (same.tick, same.finished) == (2, True)


def _killed_run(path: Path, clock: Clock) -> None:
    """A run of 6 ticks saved every 2, killed after its 4th tick: seconds 2.0 on disk."""
    run = Resumable(Persist(path, 2, False), WHAT, "k", 0, 6)
    run.resume()
    run.begin("test run")
    for _ in range(4):
        clock.now += TICK_SECONDS
        run.count()
        run.settle(snapshot)


def test_a_checkpoint_the_caller_s_check_rejects_is_ignored(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "run.pt"
    _killed_run(path, clock)
    run = Resumable(Persist(path, progress=False), WHAT, "k", 0, 6)
    with pytest.warns(UserWarning, match=r"is incomplete \(no bias\)"):
        assert run.resume(lambda s: None if "bias" in s else "no bias") is None
    assert (run.tick, run.seconds) == (0, 0.0)
    accepted = Resumable(Persist(path, progress=False), WHAT, "k", 0, 6)
    saved = accepted.resume(lambda s: None if "w" in s else "no w")
    assert saved is not None and torch.equal(saved["w"], torch.arange(3.0))
    assert accepted.tick == 4


def test_a_checkpoint_without_the_run_s_fields_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    Entry(path, "k", "Test run checkpoint").save(
        {"tick": 3, "seconds": 1.0, "finished": False, "w": torch.zeros(2)}
    )
    run = Resumable(Persist(path, progress=False), WHAT, "k", 0, 6)
    with pytest.warns(UserWarning, match=r"is incomplete \(generator is a NoneType\)"):
        assert run.resume() is None
    with pytest.warns(UserWarning, match=r"is incomplete \(generator is a NoneType\)"):
        assert run.resume(lambda s: None) is None
    assert run.tick == 0


def test_a_resumed_run_restores_tick_and_seconds_and_goes_on(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "run.pt"
    _killed_run(path, clock)
    run = Resumable(Persist(path, 2, False), WHAT, "k", 0, 6)
    run.resume()
    assert (run.tick, run.finished) == (4, False)
    assert isinstance(run.seconds, float) and run.seconds == 4 * TICK_SECONDS
    assert drive(run, clock) == 2
    assert run.seconds == 6 * TICK_SECONDS


def test_an_int_seconds_is_restored_as_a_float(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    state = torch.Generator().manual_seed(3).get_state()
    Entry(path, "k", "Test run checkpoint").save(
        {"tick": 2, "generator": state, "seconds": 5, "finished": False}
    )
    run = Resumable(Persist(path, progress=False), WHAT, "k", 0, 6)
    assert run.resume() is not None
    assert type(run.seconds) is float and run.seconds == 5.0
    assert torch.equal(run.gen.get_state(), state)


def test_a_resumed_finished_run_is_not_saved_again(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    drive(Resumable(Persist(path, progress=False), WHAT, "k", 0, 2))
    before = path.read_bytes()
    calls: list[int] = []

    def counted() -> dict[str, Any]:
        calls.append(1)
        return {"w": torch.ones(3)}

    run = Resumable(Persist(path, progress=False), WHAT, "k", 0, 2)
    assert run.resume() is not None and run.done
    run.begin("test run")
    run.end(counted)
    assert calls == [] and path.read_bytes() == before


# --- begin: the refusal under cached-only and the progress bar ------------------------


def test_begin_under_cached_only_names_the_run_without_a_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHED_ONLY, "1")
    run = Resumable(Persist(progress=False), WHAT, None, 0, 3)
    with pytest.raises(NotCached) as err:
        run.begin("test run")
    assert str(err.value) == (
        "Test run is not cached, and WSLIB_CACHED_ONLY=1 forbids computing it: "
        "a unit of this chapter is missing (see wslib.runs.units)"
    )


def test_begin_under_cached_only_names_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.pt"
    drive(Resumable(Persist(path, progress=False), WHAT, "k", 0, 2))
    monkeypatch.setenv(CACHED_ONLY, "1")
    done = Resumable(Persist(path, progress=False), WHAT, "k", 0, 2)
    done.resume()
    done.begin("test run")  # nothing left to compute: no refusal
    fresh = Resumable(Persist(tmp_path / "new.pt", progress=False), WHAT, "k", 0, 2)
    with pytest.raises(NotCached) as err:
        fresh.begin("test run")
    assert str(err.value).startswith(f"Test run {tmp_path / 'new.pt'} is not cached, ")


class FakeBar:
    """Records the progress bar's arguments and updates."""

    made: list[dict[str, Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        FakeBar.made.append(kwargs)
        self.updates = 0

    def update(self, n: int) -> None:
        self.updates += n

    def close(self) -> None:
        pass


def test_the_progress_bar_counts_the_run_s_ticks_from_where_it_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    FakeBar.made = []
    monkeypatch.setattr(resumable, "tqdm", FakeBar)
    path = tmp_path / "run.pt"
    _killed_run(path, clock)
    run = Resumable(Persist(path, 2, True), WHAT, "k", 0, 6)
    run.resume()
    drive(run)
    quiet = Resumable(Persist(progress=False), WHAT, None, 0, 5)
    drive(quiet)
    assert FakeBar.made == [
        {"total": 6, "initial": 0, "desc": "test run", "disable": True, "leave": False},
        {
            "total": 6,
            "initial": 4,
            "desc": "test run",
            "disable": False,
            "leave": False,
        },
        {"total": 5, "initial": 0, "desc": "test run", "disable": True, "leave": False},
    ]
    assert run._bar is not None and run._bar.updates == 2
