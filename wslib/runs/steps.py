"""Cached steps: a deterministic function stored in the run cache under a key
derived from its arguments.

A chapter's long computations (a path method's run, a fusion study of one
pair of models) are functions of models, data sets, settings and plain
values. :func:`cached_step` turns one into a step of the run cache
(:func:`wslib.runs.cache.cached_run`): the key is the function's name and
every argument it is called with, defaults included, by content:

- a module by its class, its structure (``repr``, which shows every layer and
  its sizes) and a digest of its state;
- a tensor or array by a digest (a data set, a dataclass, by its name, its
  four tensors and its number of classes);
- settings (:class:`~wslib.core.settings.Settings`, or a dataclass with a
  ``key()`` such as :class:`~wslib.llpf.protocols.PathSetup`) by their key,
  another dataclass by its fields;
- mappings and sequences item by item, numbers and text as they are.

The code enters through ``code`` (the packages whose source computes the
result). An argument that cannot change the result (a progress bar) is
declared in ``not_keyed`` with the reason. An argument of a kind the key
cannot hold raises a ``TypeError`` naming it, so nothing leaves the key by
accident; the hand-built keys this replaces could forget a setting.

The step declares a keyword ``run_cache`` (the cache's folder; None: the
plain function) that its body does not read: the decorator takes it, and mypy
still sees the step's whole signature at every call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import numpy as np
import torch
from torch import nn

from wslib.core.files import tensor_digest
from wslib.core.settings import plain
from wslib.runs.cache import cached_run

P = ParamSpec("P")
R = TypeVar("R")

CACHE_ARGUMENT = "run_cache"


def content_key(value: Any, where: str) -> Any:
    """``value`` as key data, by content (see the module docstring).

    Raises TypeError naming ``where`` (the argument, and the item inside it)
    for a value of a kind the key cannot hold.
    """
    if value is None or isinstance(value, str | numbers.Real):
        return plain(value)  # a flag stays a flag, numbers are Python's
    if isinstance(value, nn.Module):
        return {
            "module": f"{type(value).__module__}.{type(value).__qualname__}",
            "structure": repr(value),
            "state": tensor_digest(value.state_dict()),
        }
    if isinstance(value, torch.Tensor | np.ndarray):
        return {"tensor": tensor_digest(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        key = getattr(value, "key", None)
        if callable(key):  # settings (wslib.core.settings), a PathSetup
            return key()
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return content_key(fields, where)
    if isinstance(value, Mapping):
        return {str(k): content_key(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, Sequence | range):
        return [content_key(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"{where} is a {type(value).__name__}, which cannot enter a cache key: "
        "pass its content (a module, data set, tensor, settings or plain data), "
        "or declare it in not_keyed with the reason it cannot change the result"
    )


def cached_step(
    *, code: Sequence[str], not_keyed: Mapping[str, str] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function a step of the run cache, keyed by its arguments.

    ``code``: the packages whose source computes the result (it enters the
    key); ``not_keyed``: argument -> why it cannot change the result. The
    function must declare a keyword-only ``run_cache`` (see the module
    docstring) and return a dict or a list of plain data. Called with
    ``run_cache=None`` it is the plain function: it computes and keeps nothing
    (a checkpoint it writes itself still resumes it).
    """
    skipped = dict(not_keyed or {})

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(fn)
        cache = signature.parameters.get(CACHE_ARGUMENT)
        if cache is None or cache.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(
                f"{fn.__qualname__}: a cached step declares a keyword-only "
                f"'{CACHE_ARGUMENT}' (its body does not read it)"
            )
        unknown = sorted(set(skipped) - set(signature.parameters))
        if unknown:
            raise TypeError(
                f"{fn.__qualname__}: not_keyed names {', '.join(unknown)}, "
                "which it has no argument of"
            )
        name = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def step(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            root: str | Path | None = bound.arguments[CACHE_ARGUMENT]
            if root is None:  # the plain function: its own checkpoints still apply
                return fn(*bound.args, **bound.kwargs)
            key = {
                "step": name,
                "arguments": {
                    arg: content_key(value, f"{name}: argument {arg!r}")
                    for arg, value in bound.arguments.items()
                    if arg != CACHE_ARGUMENT and arg not in skipped
                },
            }
            compute: Callable[[], Any] = functools.partial(
                fn, *bound.args, **bound.kwargs
            )
            return cast(R, cached_run(root, key, compute, code=code))

        step.not_keyed = skipped  # type: ignore[attr-defined]
        return step

    return decorate
