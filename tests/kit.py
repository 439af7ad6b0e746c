"""Tiny models, toy data and a fake zoo for the library's tests.

Every factory takes the sizes, seeds and shapes a test relies on as arguments,
so a test states them where they matter and the random draws stay the same:

- model configs for :func:`wslib.core.configs.build_model`: :func:`mlp`,
  :func:`cnn1d`, :func:`cnn2d`, :func:`resnet1d`, :func:`transformer1d`
  (default: ``in_shape`` :data:`IN`, 3 classes; ``**SIGNAL`` for the 40-step,
  10-class signals of the core and fusion tests), and :data:`MLP`,
  :data:`RESNET`, :data:`TRANSFORMER`, the LLPF tests' models;
- seeded models: :func:`seeded_model`, :func:`seeded_models` (a seed each),
  :func:`drawn_models` (one seed, drawn in turn), :func:`pair`,
  :func:`pair_states`, and :func:`trained_model` (fitted with a recipe);
  :func:`same_state` compares two state dicts;
- toy data: :func:`toy_tensors` and :func:`toy_dataset` (Gaussian inputs,
  random or cyclic labels), :func:`class_blocks` (labels in blocks of a class),
  :func:`balanced_dataset` (10 classes in turn, test inputs drawn after the
  training inputs), :func:`readable_dataset` (the label written in the first
  input);
- :class:`FakeZoo`, a stand-in for :class:`wslib.runs.zoo.Zoo`: untrained
  models seeded by the request, every request recorded;
- :data:`QUIET`, the ``persist`` of a path finder run without a checkpoint or
  a progress bar.

What one package's tests alone use stays in that package's folder, built on
these: PathCond's tiny liftable networks and toy grid (``tests/pathcond/tiny.py``,
``toy.py``), its planted results and independent reference solver, the fusion
chapters' toy studies, the LLPF chapters' fake path results and the resumable
runs' kit. Here they would make one module of every package's fixtures.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
import torch
from torch import nn

from wslib.core.configs import build_model
from wslib.core.data import Dataset
from wslib.core.train import Recipe, fit
from wslib.runs.resumable import Persist

IN = [1, 8]
"""The default input shape: one channel of 8 steps."""
SIGNAL = {"in_shape": [1, 40], "n_classes": 10}
"""One channel of 40 steps in 10 classes (``mlp([24, 16], **SIGNAL)``)."""
QUIET = Persist(progress=False)
"""A path finder's run without a checkpoint or a progress bar (``persist=QUIET``)."""


def config(name: str, in_shape: Sequence[int], n_classes: int, **options) -> dict:
    """``{"name": name, "in_shape": [...], "n_classes": n_classes, **options}``."""
    lists = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
    return {"name": name, "in_shape": list(in_shape), "n_classes": n_classes, **lists}


def mlp(
    widths: Sequence[int] = (6, 5),
    in_shape: Sequence[int] = IN,
    n_classes: int = 3,
    **options,
) -> dict:
    """An MLP config with hidden ``widths``."""
    return config("mlp", in_shape, n_classes, widths=list(widths), **options)


def cnn1d(
    channels: Sequence[int],
    in_shape: Sequence[int] = IN,
    n_classes: int = 3,
    **options,
) -> dict:
    """A 1-D CNN config with ``channels``."""
    return config("cnn1d", in_shape, n_classes, channels=list(channels), **options)


def cnn2d(
    channels: Sequence[int],
    in_shape: Sequence[int] = (3, 8, 8),
    n_classes: int = 3,
    **options,
) -> dict:
    """A 2-D CNN config with ``channels`` on 8x8 RGB images."""
    return config("cnn2d", in_shape, n_classes, channels=list(channels), **options)


def resnet1d(
    widths: Sequence[int],
    in_shape: Sequence[int] = IN,
    n_classes: int = 3,
    **options,
) -> dict:
    """A 1-D ResNet config with stage ``widths`` (pass ``blocks_per_stage``)."""
    return config("resnet1d", in_shape, n_classes, widths=list(widths), **options)


def transformer1d(
    in_shape: Sequence[int] = IN, n_classes: int = 3, **options: Any
) -> dict:
    """A 1-D transformer config; ``options`` in the order given (``embed_dim``, ...)."""
    return config("transformer1d", in_shape, n_classes, **options)


MLP = mlp()
"""The LLPF tests' MLP: widths 6-5 on :data:`IN`, 3 classes."""
RESNET = resnet1d([4, 6], blocks_per_stage=1)
"""The LLPF and chapter 1 tests' ResNet: stages 4 and 6, one block each."""
TRANSFORMER = transformer1d(patch_size=2, embed_dim=8, depth=1, heads=2, mlp_dim=8)
"""The LLPF tests' transformer: one layer of 2 heads on patches of 2."""


# --- seeded untrained models ------------------------------------------------------


def seeded_model(config: dict, seed: int, train: bool = False) -> nn.Module:
    """``build_model(config)`` right after ``torch.manual_seed(seed)``, in eval mode
    (``train``: as built, in train mode)."""
    torch.manual_seed(seed)
    model = build_model(config)
    return model if train else model.eval()


def seeded_models(
    config: dict, seeds: Iterable[int], train: bool = False
) -> list[nn.Module]:
    """One :func:`seeded_model` per seed."""
    return [seeded_model(config, s, train) for s in seeds]


def drawn_models(
    config: dict, n: int, seed: int = 0, train: bool = False
) -> list[nn.Module]:
    """``n`` models built one after another after a single ``torch.manual_seed``."""
    torch.manual_seed(seed)
    models = [build_model(config) for _ in range(n)]
    return models if train else [m.eval() for m in models]


def pair(config: dict = MLP, train: bool = False) -> list[nn.Module]:
    """Two models, seeded 0 and 1 (eval mode unless ``train``)."""
    return seeded_models(config, (0, 1), train)


def trained_model(
    config: dict, seed: int, ds: Dataset, recipe: Recipe, device=None
) -> nn.Module:
    """A :func:`seeded_model` (train mode) fitted on ``ds``'s training set with
    ``recipe`` and ``seed``, on ``device``."""
    model = seeded_model(config, seed, train=True)
    fit(model, ds.x_train, ds.y_train, recipe, seed=seed, device=device, progress=False)
    return model


def pair_states(config: dict = MLP) -> tuple[nn.Module, dict, dict]:
    """Model A (seed 0, train mode) and the state dicts of A and B (seed 1)."""
    a, b = pair(config, train=True)
    return a, a.state_dict(), b.state_dict()


def same_state(s: dict, t: dict) -> bool:
    """Whether every tensor of state dict ``s`` equals ``t``'s of the same name."""
    return all(torch.equal(s[k], t[k]) for k in s)


# --- toy data ---------------------------------------------------------------------


def toy_tensors(
    n: int,
    in_shape: Sequence[int] = IN,
    n_classes: int = 3,
    seed: int = 0,
    labels: str = "random",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` standard normal inputs (a generator seeded ``seed``) and their labels:
    ``"random"`` (drawn after the inputs, from the same generator) or ``"cyclic"``
    (``0, 1, ..., n_classes - 1, 0, ...``)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *in_shape, generator=gen)
    if labels == "random":
        return x, torch.randint(0, n_classes, (n,), generator=gen)
    if labels == "cyclic":
        return x, torch.arange(n) % n_classes
    raise ValueError(f"labels must be 'random' or 'cyclic', not {labels!r}")


def toy_dataset(
    n_train: int = 48,
    n_test: int | None = None,
    in_shape: Sequence[int] = IN,
    n_classes: int = 3,
    seed: int = 0,
    labels: str = "random",
    name: str = "toy",
    test_from_train: bool = False,
) -> Dataset:
    """A :class:`Dataset` of :func:`toy_tensors`: the first ``n_train`` rows train,
    the next ``n_test`` (default ``n_train``) test. With ``test_from_train`` only
    ``n_train`` rows are drawn and the test set is the first ``n_test`` of them."""
    n_test = n_train if n_test is None else n_test
    n = n_train if test_from_train else n_train + n_test
    x, y = toy_tensors(n, in_shape, n_classes, seed, labels)
    if test_from_train:
        return Dataset(name, x, y, x[:n_test], y[:n_test], n_classes)
    return Dataset(name, x[:n_train], y[:n_train], x[n_train:], y[n_train:], n_classes)


def class_blocks(
    per_class: int,
    seed: int = 0,
    n_classes: int = 10,
    in_shape: Sequence[int] = (1, 40),
    scale: float = 1.0,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels ``0`` x ``per_class``, then ``1`` x ``per_class``, ...; ``scale`` times
    standard normal inputs (a generator seeded ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n_classes).repeat_interleave(per_class)
    x = torch.randn(len(y), *in_shape, generator=gen, dtype=dtype)
    return (x if scale == 1.0 else scale * x), y


def balanced_dataset(per_class: int = 12, n_test: int = 50, seed: int = 0) -> Dataset:
    """10 classes in turn on :data:`SIGNAL` inputs: ``per_class`` training inputs of
    each, then ``n_test`` test inputs, drawn in that order from one generator."""
    gen = torch.Generator().manual_seed(seed)
    y_train = torch.arange(10).repeat(per_class)
    y_test = torch.arange(n_test) % 10
    return Dataset(
        name="toy",
        x_train=torch.randn(len(y_train), 1, 40, generator=gen),
        y_train=y_train,
        x_test=torch.randn(n_test, 1, 40, generator=gen),
        y_test=y_test,
        n_classes=10,
    )


def readable_dataset(
    n: int = 60, seed: int = 0, in_shape: Sequence[int] = (1, 10)
) -> Dataset:
    """Cyclic labels over 3 classes written into the first input feature (a model
    can learn them); the test set is a copy of the first half of the training set."""
    x, y = toy_tensors(n, in_shape, 3, seed, labels="cyclic")
    x[:, 0, 0] = y.float()
    return Dataset("tiny", x, y, x[: n // 2].clone(), y[: n // 2].clone(), 3)


# --- a fake zoo ---------------------------------------------------------------------


class FakeZoo:
    """A zoo that builds untrained models, seeded by the request's ``seed``.

    ``requests`` lists every config asked for; each model carries the config that
    made it as ``model.config``; ``dataset(...)`` returns ``ds``. Models come in
    eval mode (``train``: in train mode, as built).
    """

    def __init__(self, ds: Dataset | None = None, train: bool = False) -> None:
        self.ds = ds
        self.train = train
        self.requests: list[dict[str, Any]] = []

    def dataset(self, data: dict) -> Dataset:
        assert self.ds is not None, "this FakeZoo was made without a data set"
        return self.ds

    def get(self, config: dict[str, Any]) -> nn.Module:
        self.requests.append(config)
        model = seeded_model(config["model"], config["seed"], self.train)
        model.config = config  # which config made it
        return model


def warning_sites(monkeypatch: pytest.MonkeyPatch) -> list[tuple[type, str, str]]:
    """Record each ``warnings.warn`` as (category, message, the file of the frame its
    ``stacklevel`` names). mutmut's trampolines (frames of its own modules) are
    skipped, so the frame is the one a plain run names."""
    sites: list[tuple[type, str, str]] = []

    def warn(
        message: Warning | str,
        category: type[Warning] | None = None,
        stacklevel: int = 1,
        source: object = None,
    ) -> None:
        frame = sys._getframe(1)
        for _ in range(stacklevel - 1):
            frame = frame.f_back  # type: ignore[assignment]
            while frame.f_globals.get("__name__", "").startswith("mutmut"):
                frame = frame.f_back  # type: ignore[assignment]
        sites.append((category or UserWarning, str(message), frame.f_code.co_filename))

    monkeypatch.setattr(warnings, "warn", warn)
    return sites
