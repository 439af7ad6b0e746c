"""The JSON run cache: hit, miss, unreadable and mismatched files."""

import numpy as np
import pytest

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
