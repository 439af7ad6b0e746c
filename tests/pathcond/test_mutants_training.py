"""What a PathCond training run is keyed by, reports, and where and how it trains.

The behaviour of :mod:`wslib.pathcond.training` that mutation testing found
unpinned: the run-cache key (each setting that reaches the computation is in
it, the others are not, and its layout is that of the runs already stored),
the solver's report, the settings of :func:`prepare_model`, the device a run is
prepared, trained and evaluated on (the stand-in GPU of :mod:`tests.devicecheck`),
the seconds it reports (read from a stand-in clock), its progress bars, and
how :func:`train_runs` groups runs into stacks. Models are tiny and nothing
trains for more than a few steps.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.devicecheck import DEVICE, HOST, DeviceDiscipline
from tests.kit import mlp, same_state, toy_dataset
from wslib.core.data import DataKey, Dataset
from wslib.core.files import tensor_digest
from wslib.core.train import Recipe, fit, model_device, predict
from wslib.pathcond import training
from wslib.pathcond.enorm import enorm_callback
from wslib.pathcond.solver import PAPER_SWEEPS, PathCondResult
from wslib.pathcond.training import (
    CODE,
    TrainSettings,
    _fit_group,
    _train_group,
    prepare_model,
    run_key,
    solver_report,
    stackable,
    train_run,
    train_runs,
)
from wslib.runs.units import CACHED_ONLY, NotCached

CONFIG = mlp([6, 5], in_shape=[1, 8], n_classes=3)
DEEP = mlp([6, 5, 4], in_shape=[1, 8], n_classes=3)
RECIPE = Recipe(epochs=2, batch_size=8, lr=0.05, momentum=0.0, schedule="constant")
RESULT_KEYS = {
    "loss",
    "acc",
    "test_loss",
    "test_acc",
    "rescale_seconds",
    "epoch_seconds",
    "rescale_converged",
    "rescale_sweeps",
    "rescale_last_drop",
}
"""What a run reports, trained alone or stacked."""


def data(name: str = "toy") -> Dataset:
    """24 training and 12 test inputs of one channel of 8 steps, 3 classes."""
    return toy_dataset(24, 12, [1, 8], 3, name=name)


SETTINGS = ("seed", "init_scale", "task", "stop_at", "give_up_after")


def as_call(args: dict[str, Any]) -> dict[str, Any]:
    """:func:`train_run`'s keyword arguments for the flat ``args`` (``config``,
    ``method``, ``recipe`` and the run's other settings, the data and the
    call's own options): the settings gathered into one :class:`TrainSettings`."""
    settings = TrainSettings(
        model=args["config"],
        method=args["method"],
        recipe=args["recipe"],
        **{k: args[k] for k in SETTINGS if k in args},
    )
    own = {
        k: v for k, v in args.items() if k in ("ds", "device", "progress", "cache_dir")
    }
    return {"settings": settings, **own}


def job(**changes: Any) -> dict[str, Any]:
    """:func:`train_run`'s arguments of a stackable run, with ``changes``."""
    flat = {
        "config": CONFIG,
        "method": "baseline",
        "ds": data(),
        "recipe": RECIPE,
        "seed": 0,
        "init_scale": 1.0,
        "cache_dir": None,
        **changes,
    }
    return as_call(flat)


class Clock:
    """A stand-in for the ``time`` module whose clock advances one second per reading."""

    def __init__(self, events: list[Any] | None = None) -> None:
        self.now = 100.0
        self.events = events

    def perf_counter(self) -> float:
        self.now += 1.0
        if self.events is not None:
            self.events.append("clock")
        return self.now


# --- the solver's report ----------------------------------------------------------------


def solver(objective: list[float], converged: bool = False) -> PathCondResult:
    return PathCondResult({}, objective, 0.0, "block", converged)


def test_solver_report_without_a_solver() -> None:
    assert solver_report(None) == {
        "rescale_converged": None,
        "rescale_sweeps": 0,
        "rescale_last_drop": None,
    }


@pytest.mark.parametrize(
    ("objective", "drop"),
    [
        ([0.9], 0.0),  # no sweep: nothing dropped
        ([0.9, 0.4], 0.5 / 0.4),
        ([0.9, 0.5, 0.4], 0.1 / 0.4),  # the last sweep's drop, relative to the last F
        ([3.0, 1.0, 0.0], 1.0 / 1e-300),  # F reached 0: no division by zero
    ],
)
def test_solver_report_gives_the_last_relative_drop_of_f(
    objective: list[float], drop: float
) -> None:
    report = solver_report(solver(objective, converged=True))
    assert report == {
        "rescale_converged": True,
        "rescale_sweeps": len(objective) - 1,
        "rescale_last_drop": pytest.approx(drop, rel=1e-12),
    }


# --- prepare_model ------------------------------------------------------------------------


def test_prepare_model_defaults_to_seed_0_at_scale_1() -> None:
    default = prepare_model(CONFIG, "baseline")
    explicit = prepare_model(CONFIG, "baseline", seed=0, init_scale=1.0)
    assert same_state(default.model.state_dict(), explicit.model.state_dict())
    assert default.seconds == 0.0 and default.solver is None


@pytest.mark.parametrize("scale", [0, 0.0, -1.0])
def test_prepare_model_refuses_a_scale_that_is_not_positive(scale: float) -> None:
    with pytest.raises(
        ValueError, match=rf"^init_scale must be positive, got {scale}$"
    ):
        prepare_model(CONFIG, "baseline", init_scale=scale)


@pytest.mark.parametrize("method", ["baseline", "kaiming", "enorm"])
def test_methods_that_do_not_rescale_take_no_rescaling_time(method: str) -> None:
    prepared = prepare_model(CONFIG, method)
    assert prepared.seconds == 0.0 and prepared.solver is None


def test_the_solver_runs_to_convergence_or_for_the_paper_s_sweeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pathcond``: up to 1000 sweeps, until F drops by at most 1e-12 of itself;
    ``pathcond_10``: the paper's PAPER_SWEEPS sweeps, whatever F does."""
    calls: list[tuple[Any, Any]] = []
    real = training.pathcond_rescale

    def recorded(*args: Any, **kwargs: Any) -> PathCondResult:
        calls.append((kwargs.get("max_sweeps"), kwargs.get("rtol")))
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "pathcond_rescale", recorded)
    full = prepare_model(DEEP, "pathcond", init_scale=0.3, seed=1)
    paper = prepare_model(DEEP, "pathcond_10", init_scale=0.3, seed=1)
    assert calls == [(1000, 1e-12), (PAPER_SWEEPS, 0.0)]
    assert full.solver is not None and full.solver.converged
    assert paper.solver is not None and paper.solver.sweeps == PAPER_SWEEPS


def test_prepare_model_hides_only_the_solver_s_user_warnings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A solver stopped before converging is reported in the run's result, not
    warned about; any other warning still reaches the user."""
    real = training.pathcond_rescale

    def noisy(*args: Any, **kwargs: Any) -> PathCondResult:
        warnings.warn("the solver stopped early", UserWarning, stacklevel=1)
        warnings.warn("something else went wrong", RuntimeWarning, stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "pathcond_rescale", noisy)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        prepare_model(CONFIG, "pathcond")
    messages = [str(w.message) for w in seen]
    assert "something else went wrong" in messages
    assert "the solver stopped early" not in messages


def test_the_rescale_is_timed_by_the_clock_around_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(training, "time", Clock())
    prepared = prepare_model(CONFIG, "pathcond")
    assert prepared.seconds == 1.0  # one tick of the stand-in clock


def test_on_cuda_the_rescale_is_timed_to_the_end_of_its_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA runs kernels asynchronously: the device is synchronised after the
    rescale and before the clock is read (on a CPU there is nothing to wait for)."""
    events: list[Any] = []
    cuda = torch.device("cuda")
    real_to, real_rescale = nn.Module.to, training.pathcond_rescale

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        return self if cuda in args else real_to(self, *args, **kwargs)

    def rescale(*args: Any, **kwargs: Any) -> PathCondResult:
        events.append("rescale")
        return real_rescale(*args, **kwargs)

    monkeypatch.setattr(training, "time", Clock(events))
    monkeypatch.setattr(training, "pathcond_rescale", rescale)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: events.append(d))
    monkeypatch.setattr(nn.Module, "to", to)
    monkeypatch.setattr(training, "pick_device", lambda device=None: cuda)
    prepare_model(CONFIG, "pathcond")
    assert events == ["clock", "rescale", cuda, "clock"]
    events.clear()
    monkeypatch.setattr(training, "pick_device", lambda device=None: HOST)
    prepare_model(CONFIG, "pathcond")
    assert events == ["clock", "rescale", "clock"]


# --- where a run is prepared, trained and evaluated ---------------------------------------


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[torch.device]]:
    """The device of the model when PathCond rescales it and when it is evaluated."""
    seen: dict[str, list[torch.device]] = {"rescale": [], "evaluate": []}
    rescale, evaluate = training.pathcond_rescale, training.evaluate

    def rescaled(model: nn.Module, *args: Any, **kwargs: Any) -> PathCondResult:
        seen["rescale"].append(model_device(model))
        return rescale(model, *args, **kwargs)

    def evaluated(model: nn.Module, *args: Any, **kwargs: Any) -> tuple[float, float]:
        seen["evaluate"].append(model_device(model))
        return evaluate(model, *args, **kwargs)

    monkeypatch.setattr(training, "pathcond_rescale", rescaled)
    monkeypatch.setattr(training, "evaluate", evaluated)
    return seen


def test_prepare_model_builds_on_the_host_and_moves_to_the_device() -> None:
    with DeviceDiscipline():
        prepared = prepare_model(CONFIG, "pathcond", device=DEVICE)
        assert model_device(prepared.model) == DEVICE
        assert prepared.solver is not None and prepared.solver.converged


def test_a_run_is_rescaled_trained_and_evaluated_on_its_device(
    devices: dict[str, list[torch.device]],
) -> None:
    with DeviceDiscipline():
        run = train_run(
            TrainSettings(model=CONFIG, method="pathcond", recipe=RECIPE),
            data(),
            device=DEVICE,
        )
    assert devices == {"rescale": [DEVICE], "evaluate": [DEVICE]}
    assert len(run["loss"]) == RECIPE.epochs


def test_stacked_runs_are_rescaled_trained_and_evaluated_on_their_device(
    devices: dict[str, list[torch.device]],
) -> None:
    jobs = [
        job(method="pathcond", device=DEVICE),
        job(method="baseline", seed=1, device=DEVICE),
    ]
    with DeviceDiscipline():
        runs = _fit_group(jobs, data())
    assert devices == {"rescale": [DEVICE], "evaluate": [DEVICE, DEVICE]}
    assert [len(r["loss"]) for r in runs] == [RECIPE.epochs] * 2


# --- what a run reports -------------------------------------------------------------------


def test_a_run_reports_its_history_test_and_solver_alone_and_stacked() -> None:
    jobs = [job(method="pathcond"), job(method="kaiming", seed=1)]
    alone = [train_run(**j) for j in jobs]
    stacked = _fit_group(jobs, data())
    for a, s in zip(alone, stacked, strict=True):
        assert set(a) == set(s) == RESULT_KEYS
        assert s["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert s["acc"] == pytest.approx(a["acc"], abs=1 / 24)
        assert s["test_loss"] == pytest.approx(a["test_loss"], rel=1e-5)
        assert s["test_acc"] == pytest.approx(a["test_acc"], abs=1 / 12)
        for name in ("rescale_converged", "rescale_sweeps", "rescale_last_drop"):
            assert s[name] == a[name]
    assert alone[0]["rescale_converged"] is True and alone[0]["rescale_sweeps"] >= 1
    assert alone[1]["rescale_seconds"] == 0.0 and alone[1]["rescale_sweeps"] == 0


@pytest.mark.parametrize("epochs", [1, 3])
def test_a_run_reports_its_rescale_and_epoch_seconds(
    monkeypatch: pytest.MonkeyPatch, epochs: int
) -> None:
    """Each reading of the stand-in clock is a second later: the rescale took
    one, the whole training one, so an epoch took 1/epochs."""
    monkeypatch.setattr(training, "time", Clock())
    run = train_run(
        TrainSettings(
            model=CONFIG,
            method="pathcond",
            recipe=dataclasses.replace(RECIPE, epochs=epochs),
        ),
        data(),
    )
    assert len(run["loss"]) == epochs
    assert run["rescale_seconds"] == 1.0
    assert run["epoch_seconds"] == pytest.approx(1.0 / epochs, rel=1e-12)


@pytest.mark.parametrize("epochs", [1, 3])
def test_a_stacked_run_reports_its_share_of_a_stacked_epoch(
    monkeypatch: pytest.MonkeyPatch, epochs: int
) -> None:
    """Two runs trained together in one tick of the stand-in clock: each took
    half of it, 1/(2 epochs) per epoch; the rescale took one tick."""
    monkeypatch.setattr(training, "time", Clock())
    recipe = dataclasses.replace(RECIPE, epochs=epochs)
    runs = _fit_group(
        [job(method="pathcond", recipe=recipe), job(seed=1, recipe=recipe)], data()
    )
    assert [r["epoch_seconds"] for r in runs] == [pytest.approx(0.5 / epochs)] * 2
    assert [r["rescale_seconds"] for r in runs] == [1.0, 0.0]


def test_enorm_rescales_after_every_step_of_its_run() -> None:
    ds = data()
    run = train_run(
        TrainSettings(model=CONFIG, method="enorm", recipe=RECIPE, seed=0), ds
    )
    model = prepare_model(CONFIG, "enorm", seed=0).model
    hist = fit(
        model,
        ds.x_train,
        ds.y_train,
        RECIPE,
        seed=0,
        progress=False,
        on_step=enorm_callback(),
    )
    assert run["loss"] == hist["loss"]
    assert (
        run["loss"]
        != train_run(
            TrainSettings(model=CONFIG, method="baseline", recipe=RECIPE, seed=0), ds
        )["loss"]
    )


def test_the_autoencoder_reconstructs_the_flattened_input() -> None:
    ds = data()
    config = mlp([4], in_shape=[1, 8], n_classes=8)
    run = train_run(
        TrainSettings(
            model=config, method="baseline", recipe=RECIPE, seed=0, task="autoencoder"
        ),
        ds,
    )
    model = prepare_model(config, "baseline", seed=0).model
    hist = fit(
        model,
        ds.x_train,
        ds.x_train.flatten(1),
        RECIPE,
        seed=0,
        progress=False,
        loss_fn=F.mse_loss,
    )
    assert run["loss"] == hist["loss"]
    out = predict(model, ds.x_test)
    assert run["test_loss"] == float(F.mse_loss(out, ds.x_test.flatten(1)))
    assert run["test_acc"] != run["test_acc"]  # NaN: no classes to be right about


# --- errors a user reads ------------------------------------------------------------------


def test_an_unknown_task_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("unknown task 'regress'; valid: ('classify', 'autoencoder')"),
    ):
        train_run(
            TrainSettings(
                model=CONFIG, method="baseline", recipe=RECIPE, task="regress"
            ),
            data(),
        )  # type: ignore[arg-type]


def test_a_model_that_does_not_fit_is_refused_naming_the_data_set() -> None:
    wrong = mlp([4], in_shape=[1, 8], n_classes=5)
    with pytest.raises(ValueError, match="the data set 'signals' has 3 classes"):
        train_run(
            TrainSettings(model=wrong, method="baseline", recipe=RECIPE),
            data("signals"),
        )


def test_stacked_runs_the_cache_lacks_are_refused_when_computing_is_forbidden(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHED_ONLY, "1")
    jobs = [job(cache_dir=tmp_path), job(seed=1, cache_dir=tmp_path)]
    with pytest.raises(NotCached, match="^2 stacked runs is not cached"):
        _train_group(jobs)


# --- progress bars ------------------------------------------------------------------------


def test_a_run_shows_its_progress_bar_only_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    train_run(TrainSettings(model=CONFIG, method="baseline", recipe=RECIPE), data())
    _fit_group([job(), job(seed=1)], data())
    assert capsys.readouterr().err == ""
    train_run(
        TrainSettings(model=CONFIG, method="baseline", recipe=RECIPE),
        data(),
        progress=True,
    )
    assert "train:" in capsys.readouterr().err


def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """``train_run`` and ``_train_group`` replaced by fakes that train nothing and
    return each job's seed; the seeds of each stacked group, in order."""
    groups: list[list[int]] = []

    def group(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        groups.append([j["settings"].seed for j in jobs])
        return [{"seed": j["settings"].seed, "stacked": True} for j in jobs]

    monkeypatch.setattr(training, "_train_group", group)
    monkeypatch.setattr(training, "train_run", lambda **j: {"seed": j["settings"].seed})
    return groups


def test_train_runs_shows_a_bar_for_the_runs_apart_and_one_for_the_stacks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_runs(monkeypatch)
    mixed = [job(), job(method="enorm", seed=1)]
    train_runs(mixed, workers=1, desc="grid", stack=True)
    err = capsys.readouterr().err
    assert "grid: 100%" in err and "grid, stacked: 100%" in err
    train_runs(mixed[1:], workers=1, desc="grid", stack=True)  # nothing stacks
    err = capsys.readouterr().err
    assert "grid: 100%" in err and "stacked" not in err
    train_runs(mixed[1:], workers=1)
    assert re.search(r"(^|\r)runs: 100%", capsys.readouterr().err)


# --- which runs stack ---------------------------------------------------------------------


def test_stackable_runs_are_sgd_classifiers_of_an_mlp_not_trained_by_enorm() -> None:
    assert stackable(job()) and stackable(job(task="classify"))
    assert not stackable(job(task="autoencoder"))
    assert not stackable(job(method="enorm"))
    assert not stackable(job(recipe=dataclasses.replace(RECIPE, optimizer="adam")))


def test_runs_stack_by_default_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = fake_runs(monkeypatch)
    jobs = [job(), job(seed=1)]
    monkeypatch.setattr(training, "pick_device", lambda device=None: HOST)
    assert train_runs(jobs, workers=1) == [{"seed": 0}, {"seed": 1}]
    assert groups == []
    cuda = torch.device("cuda")
    monkeypatch.setattr(training, "pick_device", lambda device=None: cuda)
    stacked = train_runs(jobs, workers=1)
    assert groups == [[0, 1]] and all(r["stacked"] for r in stacked)


def test_runs_stack_by_model_recipe_and_stop_but_not_by_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = fake_runs(monkeypatch)
    reordered = dict(reversed(list(CONFIG.items())))  # the same model
    jobs = [
        job(seed=0),
        job(seed=1, stop_at=0.5),
        job(seed=2, stop_at=0.5, give_up_after=1),
        job(seed=3, config=reordered, recipe=dataclasses.replace(RECIPE, lr=0.2)),
        job(seed=4, recipe=dataclasses.replace(RECIPE, epochs=3)),
        job(seed=5, method="enorm"),
    ]
    runs = train_runs(jobs, workers=1, stack=True)
    assert [r["seed"] for r in runs] == [0, 1, 2, 3, 4, 5]
    assert sorted(groups) == [[0, 3], [1], [2], [4]]
    assert "stacked" not in runs[5]


# --- the run-cache key ----------------------------------------------------------------------


KEYED: dict[str, Any] = {
    "config": CONFIG,
    "method": "pathcond",
    "ds": data(),
    "recipe": RECIPE,
    "seed": 2,
    "init_scale": 0.5,
    "device": "cpu",
    "task": "classify",
    "progress": False,
    "stop_at": 0.9,
    "give_up_after": 3,
}
"""A run's arguments, each setting other than a default."""


def expected_key(args: dict[str, Any]) -> dict[str, Any]:
    """The layout of the key that the runs stored in the cache were filed under."""
    ds = args["ds"]
    return {
        "data": {
            "name": ds.name,
            "content": tensor_digest(ds.x_train, ds.y_train, ds.x_test, ds.y_test),
        },
        "model": args["config"],
        "method": args["method"],
        "recipe": args["recipe"].to_dict(),
        "seed": args["seed"],
        "init_scale": args["init_scale"],
        "task": args["task"],
        "stop_at": args["stop_at"],
        "give_up_after": args["give_up_after"],
    }


def run_cache_key(
    monkeypatch: pytest.MonkeyPatch, root: Path, args: dict[str, Any]
) -> dict[str, Any]:
    """The key ``train_run(**args)`` files its run under in ``root`` (nothing is trained)."""
    calls: list[tuple[Any, ...]] = []

    def recorded(root: Any, key: dict[str, Any], run: Callable, *, code: Any) -> Any:
        calls.append((root, key, tuple(code)))
        return {}

    monkeypatch.setattr(training, "cached_run", recorded)
    train_run(**as_call(args), cache_dir=root)
    ((stored_in, key, code),) = calls
    assert stored_in == root and code == CODE  # keyed by the source of CODE only
    return key


def stacked_key(tmp_path: Path, args: dict[str, Any]) -> dict[str, Any]:
    """The key a stacked group of the one run ``args`` files it under."""
    keys: list[dict[str, Any]] = []

    def stored(root: Any, key: dict[str, Any], *, code: Any) -> dict[str, Any]:
        assert root == tmp_path and tuple(code) == CODE
        keys.append(key)
        return {"loss": []}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "stored_run", stored)
        _train_group([{**as_call(args), "cache_dir": tmp_path}])
    (key,) = keys
    return key


def test_a_run_is_filed_under_the_key_of_the_stored_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert run_cache_key(monkeypatch, tmp_path, KEYED) == expected_key(KEYED)
    assert run_key(as_call(KEYED)["settings"], KEYED["ds"]) == expected_key(KEYED)
    stacked = stacked_key(tmp_path, KEYED)
    assert stacked == {**expected_key(KEYED), "stacked": True}
    autoencoder = {**KEYED, "task": "autoencoder"}  # stacked: a classifier
    assert stacked_key(tmp_path, autoencoder) == stacked


def test_the_default_seed_and_scale_are_keyed_as_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    defaults = {k: v for k, v in KEYED.items() if k not in ("seed", "init_scale")}
    explicit = {**defaults, "seed": 0, "init_scale": 1.0}
    key = run_cache_key(monkeypatch, tmp_path, defaults)
    assert key == run_cache_key(monkeypatch, tmp_path, explicit)
    assert (key["seed"], key["init_scale"]) == (0, 1.0)


def other_tensor(t: torch.Tensor) -> torch.Tensor:
    """Another tensor of the same shape and dtype (labels stay among the 3 classes)."""
    return t + 0.5 if t.is_floating_point() else (t + 1) % 3


def with_other(tensor: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The run's arguments with another ``tensor`` of its data set."""

    def change(a: dict[str, Any]) -> dict[str, Any]:
        ds = dataclasses.replace(
            a["ds"], **{tensor: other_tensor(getattr(a["ds"], tensor))}
        )
        return {**a, "ds": ds}

    return change


IN_KEY: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "config": lambda a: {**a, "config": mlp([7, 5], in_shape=[1, 8], n_classes=3)},
    "method": lambda a: {**a, "method": "kaiming"},
    "ds.name": lambda a: {**a, "ds": dataclasses.replace(a["ds"], name="other")},
    **{f"ds.{t}": with_other(t) for t in ("x_train", "y_train", "x_test", "y_test")},
    "recipe": lambda a: {**a, "recipe": dataclasses.replace(RECIPE, epochs=3)},
    "recipe.lr": lambda a: {**a, "recipe": dataclasses.replace(RECIPE, lr=0.2)},
    "seed": lambda a: {**a, "seed": 3},
    "init_scale": lambda a: {**a, "init_scale": 0.25},
    "stop_at": lambda a: {**a, "stop_at": 0.8},
    "give_up_after": lambda a: {**a, "give_up_after": 2},
}
OUT_OF_KEY: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "device": lambda a: {**a, "device": "meta"},
    "progress": lambda a: {**a, "progress": True},
}


@pytest.mark.parametrize("setting", [*IN_KEY, "task", *OUT_OF_KEY])
def test_each_setting_that_reaches_a_run_is_in_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setting: str
) -> None:
    """Changing one setting of a run changes the key it is filed under, alone
    and stacked, unless it cannot change the result (the device, a progress
    bar, the cache folder; the task of a stacked run, which is always a
    classifier)."""
    other = {
        **IN_KEY,
        **OUT_OF_KEY,
        "task": lambda a: {**a, "task": "autoencoder"},
    }[setting](KEYED)
    alone = run_cache_key(monkeypatch, tmp_path, KEYED)
    if setting in OUT_OF_KEY:
        assert run_cache_key(monkeypatch, tmp_path, other) == alone
        assert run_cache_key(monkeypatch, tmp_path / "elsewhere", other) == alone
    else:
        assert run_cache_key(monkeypatch, tmp_path, other) != alone
    stacked = stacked_key(tmp_path, KEYED)
    if setting in IN_KEY:
        assert stacked_key(tmp_path, other) != stacked
    else:
        assert stacked_key(tmp_path, other) == stacked


def test_a_stacked_group_loads_a_data_set_named_by_its_key(tmp_path: Path) -> None:
    ds = data()
    named = DataKey.of({"name": "toy", "root": str(tmp_path)}, ds)
    assert stacked_key(tmp_path, {**KEYED, "ds": named}) == stacked_key(tmp_path, KEYED)
