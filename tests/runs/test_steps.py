"""Cached steps (wslib.runs.steps): the key is every argument, by content.

A step computes once per key and reads its entry after; each kind of argument
(module, data set, tensor, settings, dataclass, mapping, sequence, number)
changes the key when its content changes; a declared argument does not; an
argument the key cannot hold, a step without ``run_cache`` and a
``not_keyed`` that names no argument are refused with their names. Every
option of every model config changes the key of the model it builds (an
option no parameter's shape shows is in the module's ``repr``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.kit import MLP, TRANSFORMER, seeded_model, toy_dataset
from wslib.core.configs import MODEL_NAMES, build_model, config_keys
from wslib.core.settings import Settings
from wslib.runs.steps import cached_step, content_key
from wslib.runs.units import CACHED_ONLY


@dataclasses.dataclass(frozen=True)
class Options:
    lr: float = 0.1
    steps: int = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knobs(Settings):
    depth: int = 2


CALLS: list[tuple[Any, ...]] = []


@cached_step(code=("wslib.runs",), not_keyed={"verbose": "prints only"})
def study(
    model: nn.Module,
    values: Any,
    seed: int = 0,
    *,
    verbose: bool = False,
    run_cache: str | Path | None = None,
) -> dict[str, Any]:
    CALLS.append((seed, verbose))
    return {
        "seed": seed,
        "pair": (1, 2),
        "first": float(next(model.parameters()).detach().sum()),
    }


@cached_step(code=("wslib.runs",))
def rows(n: int, *, run_cache: str | Path | None = None) -> list[dict[str, int]]:
    CALLS.append((n,))
    return [{"i": i} for i in range(n)]


@pytest.fixture(autouse=True)
def fresh_calls() -> None:
    CALLS.clear()


def test_a_step_computes_once_per_key_and_reads_its_entry_after(tmp_path: Path) -> None:
    model = seeded_model(MLP, 0)
    first = study(model, {"k": 1}, 4, run_cache=tmp_path)
    again = study(model, {"k": 1}, seed=4, run_cache=tmp_path)
    assert CALLS == [(4, False)]
    assert first == again == {"seed": 4, "pair": [1, 2], "first": first["first"]}
    study(model, {"k": 1}, 5, run_cache=tmp_path)
    assert CALLS == [(4, False), (5, False)]


def test_a_default_given_or_left_out_is_one_key(tmp_path: Path) -> None:
    model = seeded_model(MLP, 0)
    study(model, [1], run_cache=tmp_path)
    study(model, [1], 0, run_cache=tmp_path)
    assert CALLS == [(0, False)]


def test_a_declared_argument_stays_out_of_the_key(tmp_path: Path) -> None:
    model = seeded_model(MLP, 0)
    study(model, [1], verbose=False, run_cache=tmp_path)
    study(model, [1], verbose=True, run_cache=tmp_path)
    assert CALLS == [(0, False)]
    assert study.not_keyed == {"verbose": "prints only"}  # type: ignore[attr-defined]


def test_without_a_folder_a_step_computes_each_time(tmp_path: Path) -> None:
    model = seeded_model(MLP, 0)
    study(model, [1])
    assert study(model, [1]) == {
        "seed": 0,
        "pair": (1, 2),
        "first": pytest.approx(float(next(model.parameters()).detach().sum())),
    }
    assert CALLS == [(0, False), (0, False)]


def test_a_list_of_rows_is_stored_and_read_back(tmp_path: Path) -> None:
    assert rows(3, run_cache=tmp_path) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert rows(3, run_cache=tmp_path) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert CALLS == [(3,)]


def changed_dataset() -> list[Any]:
    ds = toy_dataset(24)
    return [
        dataclasses.replace(ds, name="other"),
        dataclasses.replace(ds, x_train=ds.x_train + 1),
        dataclasses.replace(ds, y_train=(ds.y_train + 1) % 3),
        dataclasses.replace(ds, x_test=ds.x_test * 2),
        dataclasses.replace(ds, y_test=(ds.y_test + 1) % 3),
        dataclasses.replace(ds, n_classes=ds.n_classes + 1),
    ]


@pytest.mark.parametrize(
    ("base", "others"),
    [
        (lambda: seeded_model(MLP, 0), lambda: [seeded_model(MLP, 1)]),
        (lambda: toy_dataset(24), changed_dataset),
        (
            lambda: torch.zeros(3),
            lambda: [
                torch.zeros(4),
                torch.ones(3),
                torch.zeros(3, dtype=torch.float64),
            ],
        ),
        (lambda: np.zeros(3), lambda: [np.ones(3), np.zeros(4)]),
        (lambda: Options(), lambda: [Options(lr=0.2), Options(steps=4)]),
        (lambda: Knobs(), lambda: [Knobs(depth=3)]),
        (
            lambda: {"a": 1, "b": [2, 3]},
            lambda: [{"a": 1, "b": [2, 4]}, {"a": 1}, {"a": 2, "b": [2, 3]}],
        ),
        (
            lambda: (1, 2.5, "x", None, True),
            lambda: [
                (1, 2.5, "y", None, True),
                (1, 2.5, "x", None, False),
                (1, 2.6, "x", None, True),
            ],
        ),
    ],
    ids=[
        "module",
        "dataset",
        "tensor",
        "array",
        "dataclass",
        "settings",
        "mapping",
        "sequence",
    ],
)
def test_each_kind_of_argument_is_keyed_by_its_content(base, others) -> None:
    key = content_key(base(), "x")
    assert content_key(base(), "x") == key  # the same content, another object
    for other in others():
        assert content_key(other, "x") != key, other


def test_settings_are_keyed_as_they_key_themselves() -> None:
    assert content_key(Knobs(depth=3), "x") == Knobs(depth=3).key() == {"depth": 3}


def test_numbers_are_plain_and_a_flag_stays_a_flag() -> None:
    assert content_key([np.int64(2), np.float32(0.5), True], "x") == [2, 0.5, True]
    assert type(content_key(np.int64(2), "x")) is int


def test_a_module_of_other_structure_and_the_same_state_has_another_key() -> None:
    relu = build_model({**MLP, "activation": "relu"})
    gelu = build_model({**MLP, "activation": "gelu"})
    gelu.load_state_dict(relu.state_dict())
    assert content_key(relu, "x") != content_key(gelu, "x")


def test_a_module_key_names_no_address() -> None:
    key = content_key(seeded_model(TRANSFORMER, 0), "x")
    assert "0x" not in key["structure"]
    assert key == content_key(seeded_model(TRANSFORMER, 0), "x")


# Another value of each model option whose alternative is not found by
# changing a number or a flag (a new text option must be given one here).
TEXT_ALTERNATIVES = {"activation": "gelu", "pool": "avg"}


def other_values(value: Any, option: str) -> list[Any]:
    """Candidates for another value of a model option, tried in order."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value * 2, value + 2]
    if isinstance(value, float):
        return [value * 2]
    if isinstance(value, tuple | list):
        return [[value[0] + 1, *value[1:]], [*value, value[-1]]]
    if isinstance(value, str):
        assert option in TEXT_ALTERNATIVES, f"give option {option!r} an alternative"
        return [TEXT_ALTERNATIVES[option]]
    return [None]


def base_config(name: str) -> dict[str, Any]:
    image = name not in ("mlp", "cnn1d", "resnet1d", "transformer1d")
    config = {
        "name": name,
        "in_shape": [3, 32, 32] if image else [1, 40],
        "n_classes": 4,
    }
    _, optional = config_keys(name)
    small = {"widths": [4, 6], "channels": [4, 6], "width": 0.125, "embed_dim": 8}
    small |= {"mlp_dim": 8, "depth": 1, "heads": 2, "patch_size": 8}
    return config | {k: v for k, v in small.items() if k in optional}


def option_cases() -> list[Any]:
    return [
        pytest.param(name, option, id=f"{name}-{option}")
        for name in MODEL_NAMES
        for option in config_keys(name)[1]
    ]


@pytest.mark.parametrize(("name", "option"), option_cases())
def test_every_model_option_changes_the_key_of_the_model_it_builds(
    name: str, option: str
) -> None:
    config = base_config(name)
    value = config.get(option, config_keys(name)[1][option])
    torch.manual_seed(0)
    key = content_key(build_model(config), "model")
    for other in other_values(value, option):
        torch.manual_seed(0)
        try:
            model = build_model({**config, option: other})
        except ValueError:
            continue  # an invalid combination: try the next value
        assert content_key(model, "model") != key, (
            f"{name}: {option}={other!r} builds a model with the key of {value!r}"
        )
        return
    pytest.fail(f"{name}: no other value of {option} builds a model")


def test_an_argument_the_key_cannot_hold_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match=r"study: argument 'values'\['k'\]\[1\] is a object"
    ):
        study(seeded_model(MLP, 0), {"k": [1, object()]}, run_cache=tmp_path)
    assert CALLS == []


def test_a_step_must_declare_its_cache_folder_as_a_keyword() -> None:
    with pytest.raises(TypeError, match="keyword-only 'run_cache'"):

        @cached_step(code=("wslib",))
        def positional(x: int, run_cache: str | None = None) -> dict[str, int]:
            return {}

    with pytest.raises(TypeError, match="keyword-only 'run_cache'"):

        @cached_step(code=("wslib",))
        def missing(x: int) -> dict[str, int]:
            return {}


def test_not_keyed_must_name_an_argument() -> None:
    with pytest.raises(TypeError, match="not_keyed names seeds, which"):

        @cached_step(code=("wslib",), not_keyed={"seeds": "a typo"})
        def step(seed: int, *, run_cache: str | None = None) -> dict[str, int]:
            return {}


def test_without_a_folder_a_step_is_the_plain_function_even_when_caches_only_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHED_ONLY, "1")  # a run cache would refuse to compute
    assert rows(2) == [{"i": 0}, {"i": 1}]
    assert CALLS == [(2,)]


# --- found by mutation testing (make mutation MODULE=runs/steps) -------------------
# Steps decorated inside a test body: mutmut runs, for each mutant of
# cached_step, the tests that call it, and a decoration at import calls it
# before any test.


def test_two_steps_called_alike_do_not_share_an_entry(tmp_path: Path) -> None:
    @cached_step(code=("wslib.runs",))
    def first(n: int, *, run_cache: str | Path | None = None) -> dict[str, int]:
        return {"first": n}

    @cached_step(code=("wslib.runs",))
    def second(n: int, *, run_cache: str | Path | None = None) -> dict[str, int]:
        return {"second": n}

    assert first(1, run_cache=tmp_path) == {"first": 1}
    assert second(1, run_cache=tmp_path) == {"second": 1}


def test_a_step_lists_what_it_leaves_out_of_its_key() -> None:
    @cached_step(code=("wslib.runs",), not_keyed={"n": "a test"})
    def step(n: int, *, run_cache: str | Path | None = None) -> dict[str, int]:
        return {"n": n}

    assert step.not_keyed == {"n": "a test"}  # type: ignore[attr-defined]


def twin_classes() -> tuple[nn.Module, nn.Module]:
    """Two modules of one class name and repr, defined in two modules."""
    made = []
    for module in ("one.place", "another.place"):
        cls = type("Net", (nn.Linear,), {"__module__": module})
        torch.manual_seed(0)
        made.append(cls(2, 2))
    return made[0], made[1]


def test_a_module_key_holds_its_class_s_module_and_state() -> None:
    a, b = twin_classes()
    assert repr(a) == repr(b)
    assert content_key(a, "x") != content_key(b, "x")
    key = content_key(a, "x")
    assert key["module"] == "one.place.Net"
    with torch.no_grad():
        b.weight.copy_(a.weight)
        b.bias.copy_(a.bias)
    assert content_key(b, "x")["state"] == key["state"]


def test_a_tensor_key_is_labelled_as_one() -> None:
    assert content_key(torch.zeros(2), "x").keys() == {"tensor"}


def test_an_unkeyable_field_of_a_dataclass_is_named_with_its_path() -> None:
    @dataclasses.dataclass
    class Holder:
        inner: Any

    message = (
        r"x\['inner'\] is a object, which cannot enter a cache key: pass its "
        r"content \(a module, data set, tensor, settings or plain data\), or "
        r"declare it in not_keyed with the reason it cannot change the result"
    )
    with pytest.raises(TypeError, match=message):
        content_key(Holder(object()), "x")


def test_not_keyed_names_every_unknown_argument() -> None:
    with pytest.raises(TypeError, match="not_keyed names seeds, steps, which"):

        @cached_step(code=("wslib",), not_keyed={"steps": "a", "seeds": "b"})
        def step(seed: int, *, run_cache: str | None = None) -> dict[str, int]:
            return {}
