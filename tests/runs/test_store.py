"""The one keyed store: entries named by their key, judged in one place, parts written once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from wslib.runs.store import MARK, Entry, cached, checksum, keyed
from wslib.runs.units import CACHED_ONLY, NotCached


def test_a_keyed_entry_is_named_by_its_key_and_read_back(tmp_path: Path) -> None:
    entry = keyed(tmp_path, {"seed": 0, "widths": (4, 2)}, "model")
    assert entry.path.parent == tmp_path and entry.path.suffix == ".pt"
    assert keyed(tmp_path, {"seed": 1}, "model").path != entry.path
    entry.save({"w": torch.arange(3.0), "note": "x"})
    saved = torch.load(entry.path, weights_only=True)
    assert saved["key"] == {"seed": 0, "widths": [4, 2]}  # as JSON reads it
    assert saved["checksum"] == checksum({"w": torch.arange(3.0), "note": "x"})
    again = keyed(tmp_path, {"seed": 0, "widths": [4, 2]}, "model").load()
    assert torch.equal(again["w"], torch.arange(3.0)) and again["note"] == "x"


def test_a_json_entry_holds_its_key_and_payload(tmp_path: Path) -> None:
    entry = keyed(tmp_path, {"run": 1}, "cached run", suffix=".json")
    entry.save({"result": {"v": [1.0, 2.0]}})
    assert json.loads(entry.path.read_text()) == {
        "result": {"v": [1.0, 2.0]},
        "key": {"run": 1},
    }
    assert entry.load() == {"result": {"v": [1.0, 2.0]}}


def damaged(entry: Entry, change) -> None:
    saved = torch.load(entry.path, weights_only=True)
    torch.save(change(saved), entry.path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: b"garbage", "is unreadable"),
        (lambda s: {**s, "key": "other"}, "was written for another run"),
        (lambda s: [s], "was written for another run"),
        (lambda s: {**s, "w": s["w"] + 1}, "fails its checksum"),
        (
            lambda s: {k: v for k, v in s.items() if k != "w"},
            "is incomplete \\(no w\\)",
        ),
    ],
    ids=["unreadable", "other-key", "not-a-dict", "changed", "incomplete"],
)
def test_an_unusable_file_warns_with_its_name(tmp_path: Path, change, message) -> None:
    entry = keyed(tmp_path, {"a": 1}, "thing")
    entry.save({"w": torch.ones(2)})
    if message == "is unreadable":
        entry.path.write_bytes(change(None))
    else:
        damaged(entry, change)

    def check(saved: dict) -> str | None:
        return None if "w" in saved else "no w"

    with pytest.warns(
        UserWarning, match=f"thing {re.escape(str(entry.path))} {message}"
    ):
        assert entry.load(check) is None
    assert entry.load(check, quiet=True) is None


def test_cached_computes_once_and_refuses_when_told(tmp_path, monkeypatch) -> None:
    calls: list[int] = []

    def compute() -> dict:
        calls.append(1)
        return {"v": torch.tensor([len(calls)])}

    entry = keyed(tmp_path, {"a": 1}, "thing")
    assert cached(entry, compute)["v"].item() == 1
    assert cached(keyed(tmp_path, {"a": 1}, "thing"), compute)["v"].item() == 1
    assert calls == [1]
    monkeypatch.setenv(CACHED_ONLY, "1")
    with pytest.raises(NotCached, match="thing .* is not cached"):
        cached(keyed(tmp_path, {"a": 2}, "thing"), compute)


def test_parts_are_written_once_and_unlisted_files_go(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    entry = Entry.folder(folder, "k", "run checkpoint")
    entry.save({"n": 1, "parts": {"a.pt": {"x": torch.zeros(2)}}})
    (folder / "a.pt").write_bytes(b"")  # a kept part is not written again
    entry.save({"n": 2, "parts": {"a.pt": None, "b.pt": {"x": torch.ones(2)}}})
    assert (folder / "a.pt").stat().st_size == 0
    (folder / "stray.pt").write_text("left by a killed save")
    entry.save({"n": 3, "parts": {"b.pt": None}})
    assert sorted(f.name for f in folder.iterdir()) == [MARK, "b.pt", "index.pt"]
    loaded = Entry.folder(folder, "k", "run checkpoint").load()
    assert loaded["n"] == 3 and torch.equal(loaded["parts"]["b.pt"]["x"], torch.ones(2))


def test_a_changed_part_fails_its_checksum(tmp_path: Path) -> None:
    entry = Entry.folder(tmp_path / "run", "k", "run checkpoint")
    entry.save({"parts": {"a.pt": {"x": torch.zeros(2)}}})
    torch.save({"x": torch.ones(2)}, tmp_path / "run" / "a.pt")
    with pytest.warns(UserWarning, match="part a.pt changed after it was written"):
        assert entry.load() is None


def test_a_file_or_folder_in_the_wrong_place_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileExistsError, match="is a folder, not a file"):
        Entry(tmp_path, "k", "curve checkpoint").load()
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        Entry.folder(tmp_path / "notes", "k", "path checkpoint").load()
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_folder_holding_other_files_is_refused_not_emptied(tmp_path: Path) -> None:
    """A checkpoint pointed at a folder of the reader's own files deletes nothing."""
    (tmp_path / "mine.pt").write_text("a reader's file")
    entry = Entry.folder(tmp_path, "k", "run checkpoint")
    with pytest.raises(FileExistsError, match="already holds other files"):
        entry.save({"parts": {"a.pt": {"x": torch.zeros(2)}}})
    assert sorted(f.name for f in tmp_path.iterdir()) == ["mine.pt"]


def test_a_folder_with_only_hidden_files_is_taken(tmp_path: Path) -> None:
    (tmp_path / ".DS_Store").write_text("")
    Entry.folder(tmp_path, "k", "run checkpoint").save({"parts": {}})
    assert (tmp_path / "index.pt").is_file() and (tmp_path / ".DS_Store").is_file()
