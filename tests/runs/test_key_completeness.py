"""Every keyed entry of the store: each setting that reaches a computation is in its key.

Results are cached under keys built by hand (:mod:`wslib.runs.store`) or
derived from every argument of a cached step (:mod:`wslib.runs.steps`). A key
that forgets a setting loads a stale result; a key that holds a setting which
cannot change the result only computes twice. For every keyed entry, this
test reads the settings *from the code* (``inspect.signature`` of the function
that computes the entry and of the function that keys it,
``dataclasses.fields`` of the settings objects they take) and checks each one
against the table of :data:`ENTRIES`:

- ``In()``: changing it alone changes the key;
- ``Out(why)``: changing it alone leaves the key as it is (a device, a
  progress bar, a checkpoint folder, ...).

A setting the code has and the table does not declare fails, naming the
entry and the setting; so does a declared setting the code no longer has.
``extra`` checks of an entry are not parameters (the data's content, the
code's version, two spellings of one setting). Keys are computed with tiny
models and toy data: nothing trains and no path is run (the computation is
replaced by a recorder, or the run is stopped where it builds its key).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import json
import shutil
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
import torch

import wslib.fusion.ch10_regimes as ch10
import wslib.fusion.ch11_beyond as ch11
import wslib.llpf.ch03_m2m as ch03
import wslib.llpf.ch04_baselines as ch04
import wslib.llpf.curves as curves
import wslib.llpf.layerwise as layerwise
import wslib.llpf.methods as methods
import wslib.pathcond.training as training
import wslib.runs.cache as cache
import wslib.runs.zoo as zoo_module
import wslib.synthesis.ch12_synthesis as ch12
from bookkit import sweep
from tests.kit import MLP, mlp, seeded_model, seeded_models, toy_dataset, toy_tensors
from wslib.core.data import Dataset
from wslib.core.train import Recipe
from wslib.fusion.retrofit import GradientConfig
from wslib.llpf.layerwise import movable_names
from wslib.llpf.path import LLPFPath
from wslib.llpf.protocols import PathSetup
from wslib.llpf.ticks import Refine, tensor_variances
from wslib.runs.resumable import Persist
from wslib.runs.zoo import CONFIG_KEYS, Zoo, normalise_config

# wslib.llpf exports the function autoneb under the module's name
autoneb = importlib.import_module("wslib.llpf.autoneb")
runner, profiles = sweep.runner, sweep.profiles

MISSING: Any = object()


# --- the declarations ---------------------------------------------------------------


@dataclass(frozen=True)
class In:
    """In the key: changing the setting alone changes it.

    ``to``: the changed value (a function of the base arguments, or a value;
    default: :func:`vary`); ``also``: settings that must change with it (a
    valid run needs them); ``path``: where it is in the arguments (default:
    its name); ``via``: how it enters the key, when not by its own value.
    """

    to: Any = MISSING
    also: Mapping[str, Any] = field(default_factory=dict)
    path: str | None = None
    via: str = ""


@dataclass(frozen=True)
class Out:
    """Not in the key, because ``why``: changing it alone leaves the key as it is."""

    why: str
    to: Any = MISSING
    path: str | None = None


Declared = In | Out


@dataclass(frozen=True)
class Keyed:
    """One keyed entry of the store.

    ``settings()`` reads its settings from the code (dotted names: a field of
    a settings object an argument holds); ``base(tmp)`` gives the arguments of
    one key; ``key(args)`` computes the key the store files the entry under.
    ``declared`` is the table; ``default`` (a prefix and a declaration)
    declares every setting of that prefix it does not name (an entry that
    compares a whole group of settings as one).
    """

    name: str
    source: str
    settings: Callable[[], list[str]]
    declared: Mapping[str, Declared]
    base: Callable[[Path], dict[str, Any]]
    key: Callable[[dict[str, Any]], Any]
    extra: Mapping[str, Declared] = field(default_factory=dict)
    default: tuple[str, Declared] | None = None


# --- reading settings from the code -----------------------------------------------------


def params(
    fn: Callable[..., Any], rename: Mapping[str, str] | None = None
) -> list[str]:
    """The parameters of ``fn`` (``self`` aside), some under another name."""
    names = [p for p in inspect.signature(fn).parameters if p != "self"]
    return [(rename or {}).get(n, n) for n in names]


def fields_of(cls: type, prefix: str = "") -> list[str]:
    """The fields of dataclass ``cls``, as ``prefix.field``."""
    return [prefix + f.name for f in dataclasses.fields(cls)]


def union(*groups: list[str]) -> list[str]:
    return list(dict.fromkeys(n for group in groups for n in group))


def expand(names: list[str], **classes: type) -> list[str]:
    """``names`` with each one named in ``classes`` (``__`` for ``.``) replaced by
    its dataclass's fields, in order (an outer one first)."""
    out = list(names)
    for dotted, cls in classes.items():
        name = dotted.replace("__", ".")
        if name in out:
            i = out.index(name)
            out[i : i + 1] = fields_of(cls, f"{name}.")
    return out


# --- changing one setting -------------------------------------------------------------


def lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
    return obj


def changed(obj: Any, path: str, value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``path`` (dicts and dataclasses, nested)."""
    head, _, rest = path.partition(".")
    if rest:
        value = changed(lookup(obj, head), rest, value)
    if isinstance(obj, Mapping):
        return {**obj, head: value}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{head: value})
    raise TypeError(f"cannot set {head} of a {type(obj).__name__}")


def vary(value: Any) -> Any:
    """Another value of the same kind (numbers, flags, text, tensors)."""
    if isinstance(value, str):
        return value + " (changed)"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):  # a fraction stays one (momentum must be below 1)
        return value / 2 if 0 < value < 1 else value * 2 + 0.5
    if torch.is_tensor(value):
        if value.is_floating_point():
            return value + 0.5
        return (value + 1) % (int(value.max()) + 2)
    raise TypeError(f"no default change of a {type(value).__name__}: declare `to=`")


def variant(declared: Declared, args: dict[str, Any], path: str) -> Any:
    to = declared.to
    if to is MISSING:
        return vary(lookup(args, path))
    return to(args) if isinstance(to, types.FunctionType) else to


# --- recording instead of computing ---------------------------------------------------


class Recorder:
    """Stands in for ``cached_run``: records each key, computes nothing."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[Any, dict[str, Any], Any, tuple[str, ...]]] = []
        self.answer = answer or {"rows": []}

    def __call__(self, root, key, compute, *, code=("wslib",)) -> dict[str, Any]:
        self.calls.append((root, key, compute, tuple(code)))
        return dict(self.answer)

    def names(self) -> list[str]:
        """The file name of every recorded entry (the hash of key and code version)."""
        return [cache._entry(r or ".", k, c).path.name for r, k, _, c in self.calls]


def run_cache_key(module: types.ModuleType, call: Callable[[], Any]) -> list[str]:
    """The run-cache entries ``call()`` would read: ``module.cached_run`` recorded."""
    recorder = Recorder()
    with patch.object(module, "cached_run", recorder):
        call()
    assert recorder.calls, "no run-cache entry was keyed"
    return recorder.names()


def code_edit(module: types.ModuleType, edit: str | None):
    """``module.code_version`` as if the code had been edited (None: as it is)."""
    if edit is None:
        return nullcontext()
    return patch.object(module, "code_version", lambda *names: f"edited: {edit}")


class _Keyed(Exception):
    def __init__(self, key: str | None) -> None:
        self.key = key


def _stop(persist: Persist, what: str, key: str | None, *args, **kwargs) -> None:
    """A ``Resumable`` that ends the run where it receives its key."""
    raise _Keyed(key)


def own(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the call: the test's own entries (``(name)``) aside."""
    return {k: v for k, v in args.items() if not k.startswith("(")}


def checkpoint_key(module: types.ModuleType, fn: Callable[..., Any], args) -> str:
    """The checkpoint key a resumable run (curve, AutoNEB) builds; stops it there."""
    with patch.object(module, "Resumable", _stop), code_edit(module, args["(code)"]):
        with pytest.raises(_Keyed) as keyed:
            fn(**own(args))
    assert keyed.value.key is not None, "no checkpoint, no key"
    return keyed.value.key


def path_keys(fn: Callable[..., Any], args: dict[str, Any]) -> list[str]:
    """The checkpoint keys of an LLPF run (one per phase); no tick is run."""
    keys: list[str] = []

    def loop(model, start, x, y, *, phase: str, key: str, **_: Any) -> LLPFPath:
        keys.append(key)
        state = {k: v.clone() for k, v in start.items()}
        return LLPFPath([state], [0], [0], [0.0], [], [phase])

    call = own(args)
    options = call.pop("m2m_options", {})
    with (
        patch.object(layerwise, "run_loop", loop),
        code_edit(layerwise, args["(code)"]),
    ):
        fn(**call, **options)
    return keys


# --- shared tables ------------------------------------------------------------------------

RECIPE = {  # wslib.core.recipes.Recipe
    "epochs": In(),
    "batch_size": In(),
    "lr": In(),
    "optimizer": In(to="adam"),
    "momentum": In(),
    "weight_decay": In(),
    "schedule": In(to="constant"),
    "augment": In(),
    "precision": In(to="bf16"),
}
DATASET_BY_CONTENT = {  # wslib.core.data.Dataset, keyed by the digest of its tensors
    "x_train": In(),
    "y_train": In(),
    "x_test": In(),
    "y_test": In(),
    "n_classes": Out("never read by the run: the model's head sets the classes"),
}
REFINE = {  # wslib.llpf.ticks.Refine
    "lr": In(),
    "batch_size": In(),
    "r_min": In(),
    "r_max": In(),
    "threshold": In(),
    "precision": In(to="bf16"),
}
PERSIST = {  # wslib.runs.resumable.Persist
    "checkpoint": Out(
        "where the checkpoint is saved; the key in it guards what it holds",
        to=lambda a: Path(a["persist"].checkpoint).with_name("elsewhere"),
    ),
    "checkpoint_every": Out(
        "how often it is saved: a resumed run ends bit-identical", to=3
    ),
    "progress": Out("a progress bar only"),
    "on_tick": Out("an observer called after each tick", to=lambda a: lambda *_: None),
}
SETUP = {  # wslib.llpf.protocols.PathSetup
    **{f"ds.{k}": v for k, v in DATASET_BY_CONTENT.items()},
    "ds.name": Out("never read by a run: the key holds the content of the tensors"),
    "batch_size": In(),
    "r_min": In(),
    "margin": In(),
    "dense": In(),
    "checkpoint_dir": Out(
        "where path checkpoints are written; each is guarded by its own key",
        to=lambda a: Path("elsewhere"),
    ),
}


def prefixed(prefix: str, table: Mapping[str, Declared]) -> dict[str, Declared]:
    return {f"{prefix}.{k}": v for k, v in table.items()}


def gelu_twin(args: dict[str, Any]) -> torch.nn.Module:
    """A model of the same parameter names and shapes as ``MLP``, another activation."""
    return seeded_model(mlp(activation="gelu"), 0, train=True)


# --- the model zoo ----------------------------------------------------------------------


def zoo_base(tmp: Path) -> dict[str, Any]:
    return {
        "config": {
            "data": {"name": "toy", "seed": 0},
            "split": {"kind": "full"},
            "model": MLP,
            "recipe": Recipe(epochs=2, batch_size=8).to_dict(),
            "seed": 0,
        },
        "zoo": {
            "root": tmp / "zoo",
            "data_root": tmp / "data",
            "device": "cpu",
            "progress": False,
        },
        "(data content)": toy_dataset(24),
        "(code)": None,
    }


def zoo_key(args: dict[str, Any]) -> str:
    zoo = Zoo(**args["zoo"])
    zoo.dataset = lambda data: args["(data content)"]  # type: ignore[method-assign]
    with code_edit(zoo_module, args["(code)"]):
        return zoo.entry(normalise_config(args["config"])).path.name


ZOO = Keyed(
    name="zoo",
    source="wslib/runs/zoo.py Zoo.entry (config, TRAINING_CODE, data digest)",
    settings=lambda: union(
        expand(
            [f"config.{k}" for k in CONFIG_KEYS], config__recipe=Recipe
        ),  # what Zoo._train reads
        params(Zoo.__init__, {p: f"zoo.{p}" for p in params(Zoo.__init__)}),
    ),
    declared={
        "config.data": In(to={"name": "toy", "seed": 1}),
        "config.split": In(to={"kind": "iid", "n_parts": 2, "part": 0}),
        "config.model": In(to=mlp([7, 5])),
        "config.seed": In(),
        **prefixed("config.recipe", RECIPE),
        "zoo.root": Out(
            "where the zoo's files are: the key names the file in it",
            to=lambda a: a["zoo"]["root"].with_name("zoo2"),
        ),
        "zoo.data_root": Out(
            "where data sets are read; their content enters the key",
            to=lambda a: a["zoo"]["data_root"].with_name("data2"),
        ),
        "zoo.device": Out(
            "CPU and CUDA train the same model up to the rounding of reductions "
            "(wslib.core.train.seed_everything): the book keys a model by its config",
            to="meta",
        ),
        "zoo.progress": Out("a progress bar only"),
    },
    extra={
        "(data content)": In(to=lambda a: toy_dataset(24, seed=7), via="data digest"),
        "(code)": In(to="models.py", via="code_version(*TRAINING_CODE)"),
        "(a recipe's defaults left out)": Out(
            "normalise_config fills them: one model, one key",
            path="config.recipe",
            to={"epochs": 2, "batch_size": 8},
        ),
    },
    base=zoo_base,
    key=zoo_key,
)


# --- the run cache of PathCond's training runs ----------------------------------------


def train_base(tmp: Path) -> dict[str, Any]:
    return {
        "settings": training.TrainSettings(
            model=MLP,
            method="baseline",
            recipe=Recipe(epochs=2, batch_size=8),
            seed=0,
            init_scale=1.0,
            task="classify",
            stop_at=0.9,
            give_up_after=None,
        ),
        "ds": toy_dataset(16),
        "device": "cpu",
        "progress": False,
        "cache_dir": tmp / "runs",
    }


def train_run_key(args: dict[str, Any]) -> list[str]:
    recorder = Recorder()
    with patch.object(training, "cached_run", recorder):
        training.train_run(**args)
    ((_, _, run, _),) = recorder.calls
    # what _train_run receives is train_run's own argument of the same name
    bound = inspect.signature(training._train_run).bind(*run.args, **run.keywords)
    for name, value in bound.arguments.items():
        assert value is args[name], f"_train_run gets another {name} than train_run's"
    return recorder.names()


def stacked_key(args: dict[str, Any]) -> list[str]:
    """The keys of a stacked group of one run (``train_runs`` on CUDA)."""
    recorder = Recorder({"loss": []})
    with patch.object(
        training, "stored_run", lambda r, k, *, code: recorder(r, k, None, code=code)
    ):
        training._train_group([args])
    return recorder.names()


TRAIN_RUN = {
    **prefixed(
        "settings",
        {
            "model": In(to=mlp([7, 5])),
            "method": In(to="kaiming"),
            **prefixed("recipe", RECIPE),
            "seed": In(),
            "init_scale": In(),
            "task": In(to="autoencoder"),
            "stop_at": In(),
            "give_up_after": In(to=3),
        },
    ),
    "ds.name": In(via="the data set's name, beside its content"),
    **prefixed("ds", DATASET_BY_CONTENT),
    # a run refuses a model whose head does not fit the data set's classes, so
    # the classes change with the model's, which is in the key
    "ds.n_classes": In(
        to=4, also={"settings.model.n_classes": 4}, via="settings.model.n_classes"
    ),
    "device": Out(
        "CPU and CUDA agree to the rounding of reductions "
        "(wslib.core.train.seed_everything): one run, one key",
        to="meta",
    ),
    "progress": Out("a progress bar only"),
    "cache_dir": Out(
        "where the entry is stored, not what it holds",
        to=lambda a: a["cache_dir"].with_name("runs2"),
    ),
}
TRAIN_SETTINGS = {
    "settings": training.TrainSettings,
    "settings__recipe": Recipe,
    "ds": Dataset,
}

RUN_CACHE = Keyed(
    name="run cache: pathcond train_run",
    source="wslib/pathcond/training.py run_key; computation _train_run",
    settings=lambda: expand(
        union(params(training._train_run), params(training.train_run)),
        **TRAIN_SETTINGS,
    ),
    declared=TRAIN_RUN,
    base=train_base,
    key=train_run_key,
)
STACKED = Keyed(
    name="run cache: pathcond stacked group",
    source="wslib/pathcond/training.py _train_group (run_key + stacked); jobs of train_run",
    settings=lambda: expand(params(training.train_run), **TRAIN_SETTINGS),
    declared={
        **TRAIN_RUN,
        "settings.task": Out(
            "stacked runs are classifiers: stackable() sends any other task to "
            "train_run, whose key holds it",
            to="autoencoder",
        ),
    },
    base=train_base,
    key=stacked_key,
)


# --- cached steps (wslib.runs.steps): the key is every argument, by content ----------

STEP_MODULE = importlib.import_module("wslib.runs.steps")
DATASET_FIELDS = {  # a Dataset argument of a cached step: every field, by content
    "name": In(),
    "x_train": In(),
    "y_train": In(),
    "x_test": In(),
    "y_test": In(),
    "n_classes": In(),
}


def step_key(fn: Callable[..., Any], args: dict[str, Any]) -> list[str]:
    """The run-cache entry a cached step would read, called with its arguments of ``args``."""
    return run_cache_key(STEP_MODULE, lambda: call_with(fn, args))


def step_entry(
    fn: Callable[..., Any],
    declared: Mapping[str, Declared],
    base: Callable[[Path], dict[str, Any]],
    key: Callable[[dict[str, Any]], Any] | None = None,
    **classes: type,
) -> Keyed:
    """The entry of cached step ``fn``: its parameters, dataclass arguments expanded."""
    return Keyed(
        name=f"run cache: step {fn.__module__}.{fn.__qualname__}",
        source=f"{fn.__module__}.{fn.__qualname__} (a cached step)",
        settings=lambda: expand(params(fn), **classes),
        declared={**declared, "run_cache": RUN_CACHE_FOLDER},
        base=base,
        key=key or (lambda a: step_key(fn, a)),
    )


RUN_CACHE_FOLDER = Out(
    "where the entry is stored", to=lambda a: a["run_cache"].with_name("runs2")
)


# --- the LLPF chapters' steps -----------------------------------------------------------


def llpf_base(tmp: Path) -> dict[str, Any]:
    return {
        "setup": PathSetup(toy_dataset(24), 8, 2, 0.1, 1, None),
        "pair": seeded_models(MLP, (0, 1)),
        "settings": {"method": "curve", "lr": 0.05, "momentum": 0.9},
        "seed": 3,
        "budget": 5,
        "name": None,
        "run_cache": tmp / "runs",
    }


def call_with(fn: Callable[..., Any], args: dict[str, Any]) -> Any:
    """``fn`` called with the arguments it takes from ``args``."""
    return fn(**{p: args[p] for p in params(fn)})


LLPF_RUN = {
    **prefixed("setup", SETUP),
    "pair": In(to=lambda a: seeded_models(MLP, (2, 3)), via="digests of the modes"),
    "settings": In(to={"method": "curve", "lr": 0.1, "momentum": 0.9}),
    "seed": In(),
}
LLPF_SETTINGS = {"setup": PathSetup, "setup__ds": Dataset}
CHECKPOINT_NAME = Out(methods.NOT_KEYED["name"], to="other")

METHOD_RUN = step_entry(
    methods.method_run,
    {**LLPF_RUN, "budget": In(), "name": CHECKPOINT_NAME},
    llpf_base,
    **LLPF_SETTINGS,
)


def compare_key(args: dict[str, Any]) -> list[str]:
    """compare_at_equal_steps' entry, reached as chapter 4 reaches it (compare_methods)."""
    name = args["name"]
    return run_cache_key(
        STEP_MODULE,
        lambda: ch04.compare_methods(
            args["setup"],
            {name: MLP},
            {name: args["pair"]},
            {name: args["methods"]},
            [args["seed"]],
            run_cache=args["run_cache"],
        ),
    )


COMPARISON = step_entry(
    methods.compare_at_equal_steps,
    {
        **{k: v for k, v in LLPF_RUN.items() if k != "settings"},
        "methods": In(
            to={"LLPF": {"method": "llpf", "lr": 0.1}, "Bezier": {"method": "curve"}}
        ),
        "name": Out(
            "the model's name in the chapter; " + CHECKPOINT_NAME.why, to="renamed"
        ),
    },
    lambda tmp: {
        **llpf_base(tmp),
        "methods": {
            "LLPF": {"method": "llpf", "lr": 0.05},
            "Bezier": {"method": "curve"},
        },
        "name": "mlp",
    },
    compare_key,
    **LLPF_SETTINGS,
)
PEAK_ANATOMY = step_entry(
    ch03.peak_anatomy,
    {
        **LLPF_RUN,
        "settings": In(to={"ticks": 6, "record_every": 2, "lr": 0.1, "r_max": 5}),
    },
    lambda tmp: {
        **llpf_base(tmp),
        "settings": {"ticks": 6, "record_every": 2, "lr": 0.05, "r_max": 5},
    },
    **LLPF_SETTINGS,
)


# --- the fusion chapters' run cache -----------------------------------------------------


class DataZoo:
    """A zoo whose data set follows its config; it trains nothing."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def dataset(self, data: dict[str, Any]) -> Dataset:
        return toy_dataset(24, seed=data.get("seed", 0) + self.offset)

    def get(self, config: dict[str, Any]) -> torch.nn.Module:
        raise AssertionError("computing a key trains no model")


ZOO_DATA = In(to=lambda a: DataZoo(offset=1), via="the data set it loads (digest)")
DATA_CONFIG = In(to={"name": "toy", "seed": 1}, via="the digest of the data it names")


def regime_base(tmp: Path) -> dict[str, Any]:
    return {
        "zoo": DataZoo(),
        "data": {"name": "toy", "seed": 0},
        "arch": MLP,
        "recipe": {"epochs": 1},
        "regimes": {
            "iid": {"kind": "iid"},
            "shards": {"kind": "shards"},
            "twin": {"kind": "iid"},
        },
        "fusion_per_class": 2,
        "methods": ["averaging", "kf_linear"],
        "importances": ["uniform", "conductance"],
        "ridge": 0.1,
        "gradient": {"max_epochs": 5},
        "run_cache": tmp / "runs",
        "val_per_class": 2,
        "regime": "iid",
        "n": 2,
        "s": 0,
    }


def regime_key(args: dict[str, Any]) -> list[str]:
    study = ch10.RegimeStudy(**{f: args[f] for f in fields_of(ch10.RegimeStudy)})
    return run_cache_key(
        ch10, lambda: study.cached_setting(args["regime"], args["n"], args["s"])
    )


REGIMES = Keyed(
    name="run cache: fusion RegimeStudy setting",
    source="wslib/fusion/ch10_regimes.py RegimeStudy.setting_key; "
    "computation RegimeStudy.fuse_setting",
    settings=lambda: union(
        fields_of(ch10.RegimeStudy),
        params(ch10.RegimeStudy.fuse_setting),
        params(ch10.RegimeStudy.cached_setting),
    ),
    declared={
        "zoo": ZOO_DATA,
        "data": DATA_CONFIG,
        "arch": In(to=mlp([7, 5])),
        "recipe": In(to={"epochs": 2}),
        "regimes": In(
            to=lambda a: {**a["regimes"], "iid": {"kind": "dirichlet", "alpha": 0.5}},
            via="the spec of the setting's regime",
        ),
        "fusion_per_class": In(),
        "methods": In(to=["averaging"]),
        "importances": In(to=["uniform"]),
        "ridge": In(),
        "gradient": In(to={"max_epochs": 6}),
        "run_cache": RUN_CACHE_FOLDER,
        "val_per_class": In(),
        "regime": In(to="shards", via="its spec"),
        "n": In(),
        "s": In(),
    },
    extra={
        "(another regime's spec)": Out(
            "only the setting's own regime reaches it",
            path="regimes",
            to=lambda a: {**a["regimes"], "shards": {"kind": "dirichlet", "alpha": 1}},
        ),
        "(another regime name, the same spec)": Out(
            "a regime reaches the run by its spec alone", path="regime", to="twin"
        ),
    },
    base=regime_base,
    key=regime_key,
)
GRADIENT = {  # wslib.fusion.retrofit.GradientConfig, by its fields
    "lr": In(),
    "max_epochs": In(),
    "patience": In(),
    "val_fraction": In(),
    "optimizer": In(to="adam"),
    "blocks": In(),
}
SIZE_SWEEP = step_entry(
    ch11.size_sweep,
    {
        "models": In(to=lambda a: seeded_models(MLP, (2, 3))),
        "share": In(to=lambda a: a["share"] * 0.5),
        **prefixed("ds", DATASET_FIELDS),
        "sizes": In(to=[2, 5]),
        "copies": In(),
        **prefixed("gradient", GRADIENT),
        "seed": In(),
        "progress": Out("a progress bar"),
    },
    lambda tmp: {
        "models": seeded_models(MLP, (0, 1)),
        "share": np.full((2, 10), 0.5),
        "ds": toy_dataset(24),
        "sizes": [2, 4],
        "copies": 1,
        "gradient": GradientConfig(max_epochs=5),
        "seed": 0,
        "progress": False,
        "run_cache": tmp / "runs",
    },
    ds=Dataset,
    gradient=GradientConfig,
)


# --- the synthesis chapter's steps ------------------------------------------------------


def synthesis_base(tmp: Path) -> dict[str, Any]:
    ds = toy_dataset(24)
    a, b = seeded_models(MLP, (0, 1))
    return {
        "run_cache": tmp / "runs",
        "ds": ds,
        "seed": 0,
        "modes": {"mlp": [a, b]},
        "ts": [0.0, 0.5, 1.0],
        "a": a,
        "b": b,
        "fusion": (ds.x_train[:6], ds.y_train[:6]),
        "settings": {"llpf": {"ticks": 6}},
        "train": None,
        "regimes": {"full": [[a, b]]},
        "methods": ["averaging"],
    }


SYNTHESIS = {
    **prefixed("ds", DATASET_FIELDS),
    "seed": In(),
    "modes": In(to=lambda a: {"mlp": seeded_models(MLP, (2, 3))}),
    "ts": In(to=[0.0, 0.25, 1.0]),
    "a": In(to=lambda a: seeded_model(MLP, 2)),
    "b": In(to=lambda a: seeded_model(MLP, 3)),
    "fusion": In(to=lambda a: (a["fusion"][0] + 1, a["fusion"][1])),
    "settings": In(to={"llpf": {"ticks": 7}}),
    "train": In(to=lambda a: toy_dataset(24, seed=9)),
    "regimes": In(to=lambda a: {"full": [seeded_models(MLP, (2, 3))]}),
    "methods": In(to=["averaging", "kf_linear"]),
}


def synthesis_entry(fn: Callable[..., Any]) -> Keyed:
    names = [n for n in params(fn) if n != "run_cache"]
    declared = {k: v for k, v in SYNTHESIS.items() if k.split(".")[0] in names}
    return step_entry(fn, declared, synthesis_base, ds=Dataset)


# --- checkpoints of resumable runs --------------------------------------------------------


def path_base(tmp: Path) -> dict[str, Any]:
    model = seeded_model(MLP, 0, train=True)
    x, y = toy_tensors(24)
    return {
        "model": model,
        "start": model.state_dict(),
        "dest": seeded_model(MLP, 1).state_dict(),
        "a": model.state_dict(),
        "b": seeded_model(MLP, 1).state_dict(),
        "x": x,
        "y": y,
        "persist": Persist(tmp / "checkpoint", progress=False),
        "(code)": None,
    }


def pick(base: Callable[[Path], dict[str, Any]], *names: str, **more: Any):
    """Arguments ``names`` of ``base`` (and the test's own), with ``more``."""

    def make(tmp: Path) -> dict[str, Any]:
        args = base(tmp)
        keep = {k: v for k, v in args.items() if k in names or k.startswith("(")}
        return {**keep, **{k: v(args) if callable(v) else v for k, v in more.items()}}

    return make


ENDS = {
    "model": In(to=gelu_twin, via="model_signature: structure, shapes, buffers"),
    "a": In(to=lambda args: seeded_model(MLP, 5).state_dict()),
    "b": In(to=lambda args: seeded_model(MLP, 5).state_dict()),
    "x": In(),
    "y": In(),
    **prefixed("persist", PERSIST),
}
CODE_EDIT = {"(code)": In(to="edited", via="code_version(*CODE)")}

CURVE = Keyed(
    name="checkpoint: fit_curve",
    source="wslib/llpf/curves.py fit_curve -> CurveSettings.key -> checkpoint_key",
    settings=lambda: expand(
        params(curves.fit_curve), persist=Persist, settings=curves.CurveSettings
    ),
    declared={
        **ENDS,
        **prefixed(
            "settings",
            {
                "kind": In(to="polychain"),
                "steps": In(),
                "lr": In(),
                "momentum": In(),
                "batch_size": In(),
                "n_eval": In(),
                "seed": In(),
                "weight_decay": In(),
                "schedule": In(to="garipov"),
                "precision": In(to="bf16"),
            },
        ),
    },
    extra=CODE_EDIT,
    base=pick(
        path_base,
        *("model", "a", "b", "x", "y", "persist"),
        settings=curves.CurveSettings(
            kind="bezier",
            steps=3,
            lr=0.05,
            momentum=0.9,
            batch_size=8,
            n_eval=3,
            seed=0,
            weight_decay=0.0,
            schedule="constant",
            precision="fp32",
        ),
    ),
    key=lambda a: checkpoint_key(curves, curves.fit_curve, a),
)
AUTONEB = Keyed(
    name="checkpoint: autoneb",
    source="wslib/llpf/autoneb.py autoneb -> AutoNEBSettings.key -> checkpoint_key",
    settings=lambda: expand(
        params(autoneb.autoneb), persist=Persist, settings=autoneb.AutoNEBSettings
    ),
    declared={
        **ENDS,
        **prefixed(
            "settings",
            {
                "n_init": In(),
                "cycles": In(  # with one learning rate more: a valid run
                    to=lambda args: dataclasses.replace(
                        args["settings"], cycles=3, lrs=(0.1, 0.05, 0.02)
                    ),
                    path="settings",
                ),
                "steps_per_cycle": In(),
                "lrs": In(to=(0.2, 0.05)),
                "spring": In(),
                "batch_size": In(),
                "insert_tol": In(),
                "check_points": In(),
                "check_examples": In(),
                "max_pivots": In(),
                "seed": In(),
                "total_steps": In(to=7),
                "precision": In(to="bf16"),
            },
        ),
    },
    extra=CODE_EDIT,
    base=pick(
        path_base,
        *("model", "a", "b", "x", "y", "persist"),
        settings=autoneb.AutoNEBSettings(
            n_init=1,
            cycles=2,
            steps_per_cycle=3,
            lrs=(0.1, 0.05),
            spring=1.0,
            batch_size=8,
            insert_tol=0.05,
            check_points=2,
            check_examples=16,
            max_pivots=5,
            seed=0,
            total_steps=None,
            precision="fp32",
        ),
    ),
    key=lambda a: checkpoint_key(autoneb, autoneb.autoneb, a),
)

REFINED = Refine(lr=0.05, batch_size=8, r_min=2, r_max=5, threshold=0.5)
PATH_ENDS = {
    "model": In(to=gelu_twin),  # its structure: repr(model)
    "start": In(to=lambda args: seeded_model(MLP, 5).state_dict()),
    "x": In(),
    "y": In(),
    **prefixed("refine", REFINE),
    "seed": In(),
    "record_every": In(),
    **prefixed("persist", PERSIST),
}

PATH_DATA = {
    "model": In(to=gelu_twin),  # its structure: repr(model)
    "start": In(to=lambda args: seeded_model(MLP, 5).state_dict()),
    "x": In(),
    "y": In(),
    **prefixed("persist", PERSIST),
}
PATH_SETTINGS = {  # the fields M2MSettings and M2OSettings share
    **prefixed("refine", REFINE),
    "ticks": In(),
    "seed": In(),
    "record_every": In(),
}

M2M = Keyed(
    name="checkpoint: m2m",
    source="wslib/llpf/layerwise.py m2m -> M2MSettings.key -> _fingerprint",
    settings=lambda: expand(
        params(layerwise.m2m),
        persist=Persist,
        settings=layerwise.M2MSettings,
        settings__refine=Refine,
    ),
    declared={
        **PATH_DATA,
        "dest": In(to=lambda args: seeded_model(MLP, 5).state_dict()),
        **prefixed(
            "settings",
            {
                **PATH_SETTINGS,
                "stages": In(
                    to=lambda a: [[n for n, _ in a["model"].named_parameters()]]
                ),
                "stage_ticks": In(to=3),
                "all_at_once": In(),
                "step": In(to=0.5),
                "final_gap": In(to=0.05),
                "schedule": In(to="linear"),
                "eps": In(),
                "jump_warn": Out("only whether a warning is shown"),
            },
        ),
        "on_refined": Out(
            "an observer called with the refined model", to=lambda a: lambda *_: None
        ),
    },
    extra=CODE_EDIT,
    base=pick(
        path_base,
        *("model", "start", "dest", "x", "y", "persist"),
        settings=layerwise.M2MSettings(
            ticks=10,
            refine=REFINED,
            stages=None,
            stage_ticks=None,
            all_at_once=False,
            step=None,
            final_gap=0.01,
            schedule="geometric",
            seed=0,
            record_every=2,
            eps=1e-12,
            jump_warn=0.2,
        ),
        on_refined=None,
    ),
    key=lambda a: path_keys(layerwise.m2m, a),
)


def half_variances(args: dict[str, Any]) -> dict[str, float]:
    names = movable_names(args["model"])
    return {n: 0.5 * v for n, v in tensor_variances(args["start"], names).items()}


M2O = Keyed(
    name="checkpoint: m2o",
    source="wslib/llpf/layerwise.py m2o -> M2OSettings.key -> _fingerprint",
    settings=lambda: expand(
        params(layerwise.m2o),
        persist=Persist,
        settings=layerwise.M2OSettings,
        settings__refine=Refine,
    ),
    declared={
        **PATH_DATA,
        **prefixed(
            "settings",
            {
                **PATH_SETTINGS,
                "shrink": In(),
                "compliance": In(),
                "target_variance": In(to=half_variances),
                "target_tol": In(),
                "grow": In(),
            },
        ),
    },
    extra=CODE_EDIT,
    base=pick(
        path_base,
        *("model", "start", "x", "y", "persist"),
        settings=layerwise.M2OSettings(
            ticks=6,
            shrink=0.02,
            refine=REFINED,
            compliance=True,
            target_variance=None,
            target_tol=0.01,
            grow=False,
            seed=0,
            record_every=2,
        ),
    ),
    key=lambda a: path_keys(layerwise.m2o, a),
)
HYBRID = Keyed(
    name="checkpoint: hybrid",
    source="wslib/llpf/layerwise.py hybrid -> the keys of its m2o and m2m phases",
    settings=lambda: expand(params(layerwise.hybrid), refine=Refine, persist=Persist),
    declared={
        **PATH_ENDS,
        "dest": In(
            to=lambda args: seeded_model(MLP, 5).state_dict(),
            via="M2O's target variances and M2M's destination",
        ),
        "m2o_ticks": In(),
        "shrink": In(),
        "m2m_ticks": In(),
        "compliance": In(),
        "target_tol": In(),
        "m2m_options": In(to={"schedule": "linear"}, via="the M2M phase's key"),
    },
    extra=CODE_EDIT,
    base=pick(
        path_base,
        *("model", "start", "dest", "x", "y", "persist"),
        m2o_ticks=4,
        shrink=0.02,
        m2m_ticks=6,
        refine=REFINED,
        compliance=True,
        seed=0,
        record_every=2,
        target_tol=0.01,
        m2m_options={},
    ),
    key=lambda a: path_keys(layerwise.hybrid, a),
)


# --- the sweep's jobs: is_current -----------------------------------------------------------

SWEEP_NB, SWEEP_PROFILE, SWEEP_SEED = "07_pathcond_mlp", "smoke", 3


def read_once(fn: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    """``fn`` (a file read and parsed), read once per argument; a copy each call."""
    once = functools.cache(fn)
    return lambda name: copy.deepcopy(once(name))


# the chapter's parameters cell and the profile's YAML, parsed once
READ_ONCE = {
    "default_parameters": read_once(profiles.default_parameters),
    "load_profile": read_once(profiles.load_profile),
}


def reading_once():
    return patch.multiple(profiles, **READ_ONCE)


def job_parameters(job: Any) -> dict[str, Any]:
    """The effective parameters ``is_current`` compares for ``job`` (as JSON reads them)."""
    with reading_once():
        injected = profiles.notebook_parameters(job.nb, job.profile, job.seed)
        return json.loads(json.dumps(profiles.effective_parameters(job.nb, injected)))


def sweep_base(tmp: Path) -> dict[str, Any]:
    job = sweep.Job(SWEEP_NB, SWEEP_SEED, SWEEP_PROFILE)
    params = job_parameters(job)
    return {
        "job": job,
        "record": {"params": params, "code": runner.code_fingerprint(job.nb)},
        "(root)": tmp / "checkout",
        "(record at)": "own",  # the job's results file, or make book's ("default")
        "(own)": params["results_path"],
        "(default)": f"results/{job.profile}/{job.nb}.json",
    }


def sweep_key(args: dict[str, Any]) -> bool:
    """Whether the job is current, its results recorded as ``args["record"]``."""
    root = args["(root)"]
    shutil.rmtree(root, ignore_errors=True)
    recorded = root / args[f"({args['(record at)']})"]
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps(args["record"]))
    with (
        patch.object(profiles, "ROOT", root),
        reading_once(),
    ):
        return sweep.is_current(args["job"])


SWEEP = Keyed(
    name="sweep: is_current",
    source="bookkit/sweep.py is_current / same_run",
    settings=lambda: [
        *fields_of(sweep.Job, "job."),
        "record.code",
        *(
            f"record.params.{k}"
            for k in job_parameters(sweep.Job(SWEEP_NB, SWEEP_SEED, SWEEP_PROFILE))
        ),
    ],
    declared={
        "job.nb": In(to="08_pathcond_conv"),
        "job.seed": In(),
        "job.profile": In(to="cpu"),
        "job.unit": Out(
            "a unit's work is found in the run cache: only notebook jobs are judged",
            to="a unit",
        ),
        "record.code": In(to="another fingerprint"),
        "record.params.results_path": Out(
            "the record's own place: the job reads its own file, whatever it says",
            to="results/elsewhere.json",
        ),
    },
    default=("record.params.", In(to=lambda a: ["a changed value"])),
    extra={
        "(a parameter the record lacks)": In(
            path="record.params",
            to=lambda a: {
                k: v for k, v in a["record"]["params"].items() if k != "seed"
            },
        ),
        "(make book's own run of the same parameters)": Out(
            "adopted as the job's own (results/<profile>/<nb>.json)",
            path="(record at)",
            to="default",
        ),
    },
    base=sweep_base,
    key=sweep_key,
)

ENTRIES = [
    ZOO,
    RUN_CACHE,
    STACKED,
    METHOD_RUN,
    COMPARISON,
    PEAK_ANATOMY,
    REGIMES,
    SIZE_SWEEP,
    synthesis_entry(ch12.alignment_run),
    synthesis_entry(ch12.pair_study),
    synthesis_entry(ch12.gauge_fusion),
    CURVE,
    AUTONEB,
    M2M,
    M2O,
    HYBRID,
    SWEEP,
]
BY_NAME = {entry.name: entry for entry in ENTRIES}
SETTINGS = {entry.name: entry.settings() for entry in ENTRIES}  # read once


# --- the test ---------------------------------------------------------------------------------


def declaration(entry: Keyed, setting: str) -> Declared | None:
    found = entry.extra.get(setting) or entry.declared.get(setting)
    if found is None and entry.default and setting.startswith(entry.default[0]):
        return entry.default[1]
    return found


def cases() -> Iterator[Any]:
    for entry in ENTRIES:
        names = [*SETTINGS[entry.name], *entry.declared, *entry.extra]
        for setting in union(names):
            yield pytest.param(entry.name, setting, id=f"{entry.name}: {setting}")


@pytest.mark.parametrize(("entry_name", "setting"), list(cases()))
def test_key_completeness(entry_name: str, setting: str, tmp_path: Path) -> None:
    entry = BY_NAME[entry_name]
    from_code = SETTINGS[entry.name]
    declared = declaration(entry, setting)
    if setting not in from_code and setting not in entry.extra:
        pytest.fail(
            f"{entry.name}: the table declares `{setting}`, which {entry.source} no "
            "longer has; remove it from the table"
        )
    if declared is None:
        pytest.fail(
            f"{entry.name}: `{setting}` is a setting of {entry.source} (read from the "
            "code) that the table of tests/runs/test_key_completeness.py declares "
            "neither in the key nor out of it: put it in the key and declare In(), "
            "or declare Out(why) if it cannot change the result"
        )
    args = entry.base(tmp_path)
    key = entry.key(args)
    assert entry.key(entry.base(tmp_path)) == key, (
        f"{entry.name}: the same arguments give another key"
    )
    path = declared.path or setting
    other = changed(args, path, variant(declared, args, path))
    also = declared.also if isinstance(declared, In) else {}
    for name, value in also.items():
        other = changed(other, name, value)
    new = entry.key(other)
    if isinstance(declared, Out):
        assert new == key, (
            f"{entry.name}: changing `{setting}` changed the key, but the table "
            f"declares it out of the key ({declared.why})"
        )
    else:
        assert new != key, (
            f"{entry.name}: changing `{setting}` leaves the key unchanged, though it "
            f"reaches the computation ({entry.source}): a stale result would load"
        )
