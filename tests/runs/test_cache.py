"""The JSON run cache: hit, miss, unreadable, mismatched and outdated files."""

import json
import multiprocessing
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from wslib.core.files import code_version
from wslib.llpf.evaluation import dense_curve
from wslib.runs.cache import cached_run


def test_second_call_loads(tmp_path) -> None:
    calls = []

    def compute() -> dict:
        calls.append(1)
        return {"loss": [1.0, 0.5]}

    assert cached_run(tmp_path, {"seed": 0}, compute) == {"loss": [1.0, 0.5]}
    assert cached_run(tmp_path, {"seed": 0}, compute) == {"loss": [1.0, 0.5]}
    assert len(calls) == 1
    cached_run(tmp_path, {"seed": 1}, compute)
    assert len(calls) == 2


def test_bad_files_are_recomputed(tmp_path) -> None:
    cached_run(tmp_path, {"seed": 0}, lambda: {"v": 1})
    (path,) = tmp_path.glob("*.json")
    path.write_text("{broken")
    with pytest.warns(UserWarning, match="unreadable"):
        assert cached_run(tmp_path, {"seed": 0}, lambda: {"v": 2}) == {"v": 2}
    path.write_text('{"key": {"seed": 9}, "result": {"v": 3}}')
    with pytest.warns(UserWarning, match="another run"):
        assert cached_run(tmp_path, {"seed": 0}, lambda: {"v": 4}) == {"v": 4}


@pytest.mark.parametrize(
    "stored",
    [[1, 2], "text", None, {}, {"result": {"v": 1}}, {"key": "?", "result": [1]}],
    ids=["list", "string", "null", "empty", "no-key", "bad-key-list-result"],
)
def test_entries_of_the_wrong_shape_are_recomputed(tmp_path, stored) -> None:
    """Valid JSON that is not ``{"key": <this key>, "result": <dict>}`` is never used."""
    cached_run(tmp_path, {"seed": 0}, lambda: {"v": 1})
    (path,) = tmp_path.glob("*.json")
    path.write_text(json.dumps(stored))
    with pytest.warns(UserWarning, match=str(path)):
        assert cached_run(tmp_path, {"seed": 0}, lambda: {"v": 2}) == {"v": 2}
    assert json.loads(path.read_text())["result"] == {"v": 2}  # rewritten


@pytest.mark.parametrize("damage", ["drop", "number", "string"])
def test_entry_without_a_result_is_recomputed(tmp_path, damage) -> None:
    """The right key with a missing result, or one neither a dict nor a list:
    warning, never a KeyError."""
    cached_run(tmp_path, {"seed": 0}, lambda: {"v": 1})
    (path,) = tmp_path.glob("*.json")
    entry = json.loads(path.read_text())
    if damage == "drop":
        del entry["result"]
    else:
        entry["result"] = 1 if damage == "number" else "v"
    path.write_text(json.dumps(entry))
    with pytest.warns(UserWarning, match="incomplete"):
        assert cached_run(tmp_path, {"seed": 0}, lambda: {"v": 2}) == {"v": 2}


def test_editing_the_code_recomputes(tmp_path, monkeypatch) -> None:
    """An entry keyed with ``code=(package,)`` is recomputed once that package's source changes."""
    name = f"tmp_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / "src" / name).mkdir(parents=True)
    source = tmp_path / "src" / name / "__init__.py"
    source.write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    calls = []

    def compute() -> dict:
        calls.append(1)
        return {"v": len(calls)}

    cache = tmp_path / "cache"
    try:
        assert cached_run(cache, {"seed": 0}, compute, code=(name,)) == {"v": 1}
        assert cached_run(cache, {"seed": 0}, compute, code=(name,)) == {"v": 1}
        source.write_text("SCALE = 2\n")
        code_version.cache_clear()  # a new process sees the edited source
        assert cached_run(cache, {"seed": 0}, compute, code=(name,)) == {"v": 2}
        assert len(calls) == 2 and len(list(cache.glob("*.json"))) == 2
        # the new entry is used from now on
        assert cached_run(cache, {"seed": 0}, compute, code=(name,)) == {"v": 2}
    finally:
        sys.modules.pop(name, None)
        code_version.cache_clear()


def test_key_and_code_version_are_stored(tmp_path) -> None:
    cached_run(tmp_path, {"seed": 0}, lambda: {"v": 1}, code=("wslib.runs",))
    (path,) = tmp_path.glob("*.json")
    entry = json.loads(Path(path).read_text())
    assert entry["key"] == {"seed": 0, "code": code_version("wslib.runs")}


def test_no_root_means_no_cache(tmp_path) -> None:
    assert cached_run(None, {"seed": 0}, lambda: {"v": 1}) == {"v": 1}


def test_cached_path_metrics_give_the_same_curve(tmp_path) -> None:
    """Arrays of an evaluated path come back as lists; the dense curve is unchanged."""
    res = {
        "train_loss": np.array([0.1, 0.4, 0.2]),
        "dense_loss": np.array([[0.3], [0.5]]),
    }
    stored = cached_run(tmp_path, {"path": 0}, lambda: res)
    loaded = cached_run(tmp_path, {"path": 0}, dict)
    for got in (stored, loaded):
        pos, loss = dense_curve(got)
        ref_pos, ref_loss = dense_curve(res)
        assert np.array_equal(pos, ref_pos) and np.array_equal(loss, ref_loss)


def _count_and_compute(root: str, log: str) -> dict:
    def compute() -> dict:
        with open(log, "a") as handle:
            handle.write("computed\n")
        time.sleep(0.3)
        return {"value": 1}

    return cached_run(root, {"run": "shared"}, compute, code=("wslib.runs.cache",))


def test_processes_sharing_an_entry_compute_it_once(tmp_path: Path) -> None:
    """Jobs on several processes (or nodes) asking for one run: one computes, all get it."""
    log = tmp_path / "log.txt"
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        results = pool.starmap(_count_and_compute, [(str(tmp_path), str(log))] * 3)
    assert results == [{"value": 1}] * 3
    assert log.read_text().splitlines() == ["computed"]
