"""The JSON run cache and unit stages, found by mutation testing
(``make mutation MODULE=runs/cache`` and ``MODULE=runs/units``).

Pinned against independent references: :func:`stored_run` against entries
written by hand (the file named by the SHA-256 of the key with its code
version, written out with :mod:`hashlib`, holding ``{"key", "result"}``) and
against what :func:`cached_run` stored, found or not, silently; the exact
warning of :func:`cached_run` for an entry without a result (a dict or a list); and the
exact message of :func:`by_stage` for repeated unit names.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from wslib.core.files import code_version
from wslib.runs.cache import cached_run, stored_run
from wslib.runs.units import Unit, by_stage

CODE = ("wslib.runs.units",)  # a small package: its code version is quick


def entry_path(root: Path, key: dict[str, Any]) -> Path:
    """The file of ``key`` (with the code version of ``CODE``): its SHA-256, 20 digits."""
    full = {**key, "code": code_version(*CODE)}
    text = json.dumps(full, sort_keys=True, separators=(",", ":"))
    return root / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"


def hand_written(root: Path, key: dict[str, Any], stored: dict[str, Any]) -> Path:
    """The entry of ``key`` written by hand: its key (code version included) and ``stored``."""
    path = entry_path(root, key)
    path.write_text(json.dumps({"key": {**key, "code": code_version(*CODE)}, **stored}))
    return path


def quietly(call: Any) -> Any:
    """``call()``, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call()


# --- stored_run -----------------------------------------------------------------------


@pytest.mark.parametrize("result", [{"loss": [1.0, 0.5]}, [{"size": 2}, {"size": 4}]])
def test_stored_run_reads_an_entry_written_by_hand(
    tmp_path: Path, result: dict[str, Any] | list[Any]
) -> None:
    hand_written(tmp_path, {"seed": 0}, {"result": result})
    got = quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=CODE))
    assert got == result


def test_stored_run_finds_what_cached_run_stored_and_nothing_else(
    tmp_path: Path,
) -> None:
    assert quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=CODE)) is None
    cached_run(tmp_path, {"seed": 0}, lambda: {"v": 1}, code=CODE)
    assert quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=CODE)) == {"v": 1}
    assert quietly(lambda: stored_run(tmp_path, {"seed": 1}, code=CODE)) is None
    other = ("wslib.runs.cache",)
    assert quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=other)) is None


def test_stored_run_without_a_root_is_none(tmp_path: Path) -> None:
    assert stored_run(None, {"seed": 0}, code=CODE) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "stored",
    [{"result": 2}, {"result": "v"}, {"other": {"v": 1}}],
    ids=["number-result", "string-result", "no-result"],
)
def test_stored_run_ignores_an_entry_without_a_result_silently(
    tmp_path: Path, stored: dict[str, Any]
) -> None:
    hand_written(tmp_path, {"seed": 0}, stored)
    assert quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=CODE)) is None


def test_stored_run_ignores_an_unreadable_entry_silently(tmp_path: Path) -> None:
    entry_path(tmp_path, {"seed": 0}).write_text("{broken")
    assert quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=CODE)) is None


def test_stored_run_ignores_another_key_s_entry_without_a_warning(
    tmp_path: Path,
) -> None:
    path = entry_path(tmp_path, {"seed": 0})
    path.write_text(json.dumps({"key": {"seed": 9}, "result": {"v": 1}}))
    assert quietly(lambda: stored_run(tmp_path, {"seed": 0}, code=CODE)) is None


# --- _has_result's message ------------------------------------------------------------


def test_an_entry_without_a_result_is_recomputed_with_its_message(
    tmp_path: Path,
) -> None:
    path = hand_written(tmp_path, {"seed": 0}, {"result": 1})
    with pytest.warns(UserWarning) as caught:
        got = cached_run(tmp_path, {"seed": 0}, lambda: {"v": 2}, code=CODE)
    assert got == {"v": 2}
    assert [str(w.message) for w in caught] == [
        f"cached run {path} is incomplete (no result); computing it again"
    ]


# --- by_stage's message ---------------------------------------------------------------


def test_repeated_unit_names_are_listed_sorted_and_comma_separated() -> None:
    units = [
        Unit(n, s, lambda: None) for n, s in [("b", 0), ("a", 1), ("b", 2), ("a", 0)]
    ]
    with pytest.raises(ValueError) as err:
        by_stage([*units, Unit("c", 0, lambda: None)])
    assert str(err.value) == "unit names must be unique; repeated: a, b"
