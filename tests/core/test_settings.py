"""The base of a run's settings (:mod:`wslib.core.settings`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from wslib.core.settings import Settings, not_in_key, plain


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Example(Settings):
    steps: int = 3
    lr: float = 0.5
    rates: tuple[float, ...] = (0.1, 0.2)
    name: str = "a"
    total: int | None = None
    flag: bool = False
    limit: float | None = None
    extra: Any = (1, 2)


def outer() -> type[Settings]:
    """Settings with nested parts and a field out of the key, declared when
    called (under mutation testing, a class made at import would not see a
    mutated :func:`not_in_key`)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Outer(Settings):
        inner: Example = dataclasses.field(default_factory=Example)
        plain_part: Point = dataclasses.field(default_factory=lambda: Point(1, 2.0))
        table: dict = dataclasses.field(default_factory=lambda: {1: (2, 3)})
        warn_at: float = not_in_key(0.5, "only decides a warning")

    return Outer


def test_the_key_holds_every_field_by_name():
    settings = Example()
    assert settings.key() == {
        "steps": 3,
        "lr": 0.5,
        "rates": [0.1, 0.2],
        "name": "a",
        "total": None,
        "flag": False,
        "limit": None,
        "extra": [1, 2],
    }


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Example)])
def test_changing_any_one_field_changes_the_key(field: str):
    other = {"steps": 4, "lr": 0.25, "rates": (0.1,), "name": "b", "total": 7}
    changed = dataclasses.replace(Example(), **{field: other.get(field, True)})
    assert changed.key() != Example().key()
    assert changed.key()[field] == plain(other.get(field, True))


def test_plain_turns_numpy_and_sequences_into_json_data():
    assert plain(np.int64(5)) == 5 and type(plain(np.int64(5))) is int
    assert plain(np.float32(0.5)) == 0.5 and type(plain(np.float32(0.5))) is float
    assert type(plain(3)) is int and type(plain(2.5)) is float
    assert plain(True) is True and plain(None) is None and plain("x") == "x"
    marker = object()
    assert plain(marker) is marker  # anything else as it is
    assert plain((np.int64(1), [2.0, (3,)])) == [1, [2.0, [3]]]


def test_settings_are_frozen_and_keyword_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Example().steps = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        Example(4)  # type: ignore[misc]


def test_a_field_declared_out_of_the_key_stays_out_and_cannot_change_it():
    kind = outer()
    settings = kind()
    assert settings.warn_at == 0.5 and "warn_at" not in settings.key()
    assert dataclasses.replace(settings, warn_at=0.9).key() == settings.key()
    (declared,) = [f for f in dataclasses.fields(kind) if f.name == "warn_at"]
    assert "warning" in declared.metadata["why_not_in_key"]


def test_nested_settings_dataclasses_and_mappings_enter_as_plain_data():
    kind = outer()
    key = kind().key()
    assert key["inner"] == Example().key()
    assert key["plain_part"] == {"x": 1, "y": 2.0}
    assert key["table"] == {"1": [2, 3]}
    changed = dataclasses.replace(kind(), inner=Example(steps=9))
    assert changed.key()["inner"]["steps"] == 9


def test_numbers_are_keyed_as_their_declared_type_and_arrays_as_lists():
    """An integer given for a float field is keyed as that float (one run, one
    key), a sequence of floats as floats; a numpy array as a list."""
    given = Example(lr=1, rates=[1, 2], total=3, limit=2)
    same = Example(lr=1.0, rates=(1.0, 2.0), total=3, limit=2.0)
    assert given.key() == same.key()
    assert type(given.key()["lr"]) is float and type(given.key()["total"]) is int
    assert type(given.key()["limit"]) is float and given.key()["extra"] == [1, 2]
    assert [type(r) for r in given.key()["rates"]] == [float, float]
    array = Example(rates=np.array([0.5, 1.0]))
    assert array.key()["rates"] == [0.5, 1.0]
    assert plain(np.arange(3)) == [0, 1, 2] and plain(range(2)) == [0, 1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Required(Settings):
    ticks: int
    rate: float
    factory: list = dataclasses.field(default_factory=list)
    cap: int = 5

    def __post_init__(self) -> None:
        if self.ticks < 1:
            raise ValueError(f"ticks must be >= 1, got {self.ticks}")


WHERE = "cpu profile, chapter 3, llpf.mlp"


def test_of_reads_a_mapping_and_keeps_settings_as_they_are():
    read = Required.of({"ticks": 2, "rate": 0.5}, WHERE)
    assert read == Required(ticks=2, rate=0.5)
    assert Required.of(read, WHERE) is read


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"ticks": 2, "rate": 0.5, "tick": 1, "capp": 2},
            f"{WHERE}: unknown setting capp, tick; valid: cap, factory, rate, ticks",
        ),
        ({"rate": 0.5}, f"{WHERE}: missing setting ticks"),
        ({"factory": []}, f"{WHERE}: missing setting ticks, rate"),
        ({"ticks": 0, "rate": 0.5}, f"{WHERE}: ticks must be >= 1, got 0"),
    ],
)
def test_of_names_the_place_and_the_field(values: dict, message: str):
    """An unknown name (every one, sorted, with the valid ones), a missing one
    (a field with a default or a default factory is never missing) and a value
    the checks refuse are named with where they were written."""
    with pytest.raises(ValueError) as error:
        Required.of(values, WHERE)
    assert str(error.value) == message


def test_of_refuses_what_is_neither_a_mapping_nor_its_settings():
    with pytest.raises(TypeError, match=f"{WHERE}: a mapping or Required, got 3"):
        Required.of(3, WHERE)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a mapping or Required, got Example"):
        Required.of(Example(), WHERE)  # type: ignore[arg-type]
