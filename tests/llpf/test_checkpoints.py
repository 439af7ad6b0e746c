"""LLPF path checkpoints: keyed by the data's content, damaged files are run again.

A checkpoint is a folder (one file per recorded state and an index: an entry
with parts of :mod:`wslib.runs.store`). Every case goes through :func:`m2m`
with ``checkpoint=`` a folder whose files the test overwrites.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.kit import QUIET, mlp
from wslib.core.configs import build_model
from wslib.llpf.layerwise import M2MSettings, m2m
from wslib.llpf.path import LLPFPath
from wslib.llpf.ticks import Refine
from wslib.runs.resumable import Persist
from wslib.runs.store import MARK, checksum

TICKS = 3
REFINE = Refine(lr=0.05, batch_size=16, r_min=2, r_max=3, threshold=0.0)
MLP = mlp([5], in_shape=[1, 6])


def setting() -> tuple[torch.nn.Module, dict, dict, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(MLP)
    torch.manual_seed(1)
    dest = build_model(MLP).state_dict()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(48, 1, 6, generator=gen)
    y = torch.randint(0, 3, (48,), generator=gen)
    return model, model.state_dict(), dest, x, y


def find(ckpt: Path, x: torch.Tensor, y: torch.Tensor) -> tuple[LLPFPath, int]:
    """The path from the checkpointed run and the number of ticks this call ran."""
    model, start, dest, _, _ = setting()
    ticks: list[int] = []
    path = m2m(
        model,
        start,
        dest,
        x,
        y,
        M2MSettings(ticks=TICKS, refine=REFINE),
        persist=Persist(
            ckpt, progress=False, on_tick=lambda tick, _: ticks.append(tick)
        ),
    )
    return path, len(ticks)


def same_path(p: LLPFPath, q: LLPFPath) -> bool:
    return p.ticks == q.ticks and all(
        torch.equal(s[k], t[k]) for s, t in zip(p.states, q.states) for k in s
    )


def test_finished_run_is_loaded_not_run_again(tmp_path: Path) -> None:
    *_, x, y = setting()
    ckpt = tmp_path / "path"
    first, ran = find(ckpt, x, y)
    assert ran == TICKS
    again, ran = find(ckpt, x, y)
    assert ran == 0 and same_path(first, again)


def test_shuffled_labels_of_the_same_length_run_again(tmp_path: Path) -> None:
    """The key holds the data's content, not its length."""
    *_, x, y = setting()
    ckpt = tmp_path / "path.pt"
    find(ckpt, x, y)
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    assert not torch.equal(shuffled, y)
    with pytest.warns(UserWarning, match="another run"):
        _, ran = find(ckpt, x, shuffled)
    assert ran == TICKS


def _drop(field: str) -> Callable[[dict], dict]:
    return lambda saved: {k: v for k, v in saved.items() if k != field}


def _set(field: str, value: object) -> Callable[[dict], dict]:
    return lambda saved: {**saved, field: value}


def _parts(change: Callable[[dict], dict]) -> Callable[[dict], dict]:
    return lambda saved: {**saved, "parts": change(dict(saved["parts"]))}


DAMAGES: dict[str, Callable[[dict], object]] = {
    "list": lambda saved: list(saved.values()),
    "tensor": lambda saved: torch.zeros(2),
    "no-key": _drop("key"),
    "no-tick": _drop("tick"),
    "no-path": _drop("path"),
    "no-generator": _drop("generator"),
    "no-parts": _drop("parts"),
    "path-list": _set("path", [1, 2]),
    "path-missing-field": lambda saved: {
        **saved,
        "path": {k: v for k, v in saved["path"].items() if k != "ticks"},
    },
    "path-with-states": lambda saved: {
        **saved,
        "path": {**saved["path"], "states": []},
    },
    "current-list": _set("current", [torch.zeros(2)]),
    "more-ticks-than-states": lambda saved: {
        **saved,
        "path": {**saved["path"], "ticks": saved["path"]["ticks"] + [99]},
    },
    "no-state": _set("parts", {}),
    "generator-list": _set("generator", [1, 2]),
    "generator-short": lambda saved: {**saved, "generator": saved["generator"][:8]},
    "tick-string": _set("tick", "3"),
    "a-part-unlisted": _parts(lambda parts: dict(list(parts.items())[:-1])),
    "a-part-checksum-wrong": _parts(lambda parts: {**parts, "state-000001.pt": "0"}),
}


def index(ckpt: Path) -> dict:
    return torch.load(ckpt / "index.pt", weights_only=True)


@pytest.mark.parametrize("damage", DAMAGES)
def test_checkpoint_of_the_wrong_shape_is_run_again(
    tmp_path: Path, damage: str
) -> None:
    """An index that loads but is not a whole checkpoint's: warning, the run starts again."""
    *_, x, y = setting()
    ckpt = tmp_path / "path"
    first, _ = find(ckpt, x, y)
    torch.save(DAMAGES[damage](index(ckpt)), ckpt / "index.pt")
    with pytest.warns(UserWarning, match="path checkpoint"):
        again, ran = find(ckpt, x, y)
    assert ran == TICKS and same_path(first, again)


def _shift_one_value(file: Path) -> None:
    state = torch.load(file, weights_only=True)
    name = next(iter(state))
    state[name].view(-1)[0] += 0.5  # the same tensors, one value changed
    torch.save(state, file)


STATE_DAMAGES: dict[str, Callable[[Path], None]] = {
    "missing": lambda f: f.unlink(),
    "truncated": lambda f: f.write_bytes(f.read_bytes()[:40]),
    "other-tensors": lambda f: torch.save({"w": torch.zeros(2)}, f),
    "not-a-dict": lambda f: torch.save([torch.zeros(2)], f),
    "a-value-changed": _shift_one_value,
}


@pytest.mark.parametrize("damage", STATE_DAMAGES)
def test_damaged_state_file_is_run_again(tmp_path: Path, damage: str) -> None:
    *_, x, y = setting()
    ckpt = tmp_path / "path"
    first, _ = find(ckpt, x, y)
    STATE_DAMAGES[damage](ckpt / "state-000001.pt")
    with pytest.warns(UserWarning, match="path checkpoint .* (unreadable|checksum)"):
        again, ran = find(ckpt, x, y)
    assert ran == TICKS and same_path(first, again)


def test_a_consistent_checkpoint_of_other_tensors_is_run_again(tmp_path: Path) -> None:
    """A state of other tensors listed with its own checksum: the model check rejects it."""
    *_, x, y = setting()
    ckpt = tmp_path / "path"
    first, _ = find(ckpt, x, y)
    other = {"w": torch.zeros(2)}
    torch.save(other, ckpt / "state-000001.pt")
    saved = index(ckpt)
    saved["parts"]["state-000001.pt"] = checksum(other)
    torch.save(saved, ckpt / "index.pt")
    with pytest.warns(UserWarning, match="other tensors than the model"):
        again, ran = find(ckpt, x, y)
    assert ran == TICKS and same_path(first, again)


def test_a_file_that_is_not_a_checkpoint_is_kept(tmp_path: Path) -> None:
    *_, x, y = setting()
    ckpt = tmp_path / "notes.txt"
    ckpt.write_text("not a checkpoint")
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        find(ckpt, x, y)
    assert ckpt.read_text() == "not a checkpoint"


def count_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the store writes from now on."""
    import wslib.runs.store as store

    written: list[str] = []
    real = store.atomic_write

    def counting(path: Path, write: Callable[[Path], None]) -> Path:
        written.append(Path(path).name)
        return real(path, write)

    monkeypatch.setattr(store, "atomic_write", counting)
    return written


def test_saves_write_each_recorded_state_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incremental checkpoints: a save writes only the states recorded since the last."""
    written = count_writes(monkeypatch)
    model, start, dest, x, y = setting()
    ticks = 7
    path = m2m(
        model,
        start,
        dest,
        x,
        y,
        M2MSettings(ticks=ticks, refine=REFINE, record_every=2),
        persist=Persist(tmp_path / "path", checkpoint_every=1, progress=False),
    )
    states = sorted(n for n in written if n.startswith("state-"))
    assert states == [f"state-{k:06d}.pt" for k in range(len(path.states))]
    assert written.count("index.pt") == ticks
    # the current point is written at ticks that recorded no state (1, 3, 5)
    assert sum(n.startswith("current-") for n in written) == 3
    files = sorted(f.name for f in (tmp_path / "path").iterdir() if f.name != MARK)
    assert files == ["index.pt", *states]


class Interrupt(Exception):
    pass


def test_resume_from_a_point_between_records_writes_only_new_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after a checkpoint at an unrecorded tick: same path, nothing saved twice."""
    import warnings

    model, start, dest, x, y = setting()
    options = {"ticks": 7, "refine": REFINE, "record_every": 3}
    full = m2m(model, start, dest, x, y, M2MSettings(**options), persist=QUIET)

    def kill(tick: int, _: torch.nn.Module) -> None:
        if tick == 5:
            raise Interrupt

    ckpt = tmp_path / "path"
    with pytest.raises(Interrupt):
        m2m(
            model,
            start,
            dest,
            x,
            y,
            M2MSettings(**options),
            persist=Persist(ckpt, checkpoint_every=2, progress=False, on_tick=kill),
        )
    assert index(ckpt)["tick"] == 4 and index(ckpt)["current"] == "current-000004.pt"
    written = count_writes(monkeypatch)
    ticks: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*cap r_max")
        resumed = m2m(
            model,
            start,
            dest,
            x,
            y,
            M2MSettings(**options),
            persist=Persist(
                ckpt,
                checkpoint_every=2,
                progress=False,
                on_tick=lambda tick, _: ticks.append(tick),
            ),
        )
    assert ticks == [5, 6, 7]
    assert same_path(full, resumed) and resumed.grad_steps == full.grad_steps
    # states 0 (start) and 1 (tick 3) were saved before the kill
    assert sorted(n for n in written if n.startswith("state-")) == [
        "state-000002.pt",
        "state-000003.pt",
    ]
    assert not list(ckpt.glob("current-*.pt"))
