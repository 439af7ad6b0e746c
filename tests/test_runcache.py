"""The JSON run cache: hit, miss, unreadable and mismatched files."""

import pytest

from wslib.runcache import cached_run


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


def test_no_root_means_no_cache(tmp_path) -> None:
    assert cached_run(None, {"seed": 0}, lambda: {"v": 1}) == {"v": 1}
