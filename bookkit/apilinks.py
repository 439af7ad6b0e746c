"""Link every ``wslib`` name in a chapter's text to its entry in the API reference.

A chapter's Markdown names the functions it calls in backticks
(`` `wslib.llpf.m2m` ``). :func:`link_api` turns each such name into a Sphinx
cross-reference to the object's own module (``wslib.llpf.layerwise.m2m``),
where the API pages (``book/api/``) document it, as d2l's "Defined in" does.
A name that does not exist stops the build: the text is stale.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

NAME = re.compile(r"(?<![\w{}])`(wslib(?:\.\w+)+)`")


_MISSING = object()


def resolve(name: str) -> Any:
    """The object a dotted ``wslib`` name stands for (a module, or an attribute path in one)."""
    parts = name.split(".")
    split = len(parts)
    while True:  # the longest importable prefix ("wslib" always is)
        module = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module)
            break
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if not f"{module}.".startswith(f"{missing}."):  # a dependency is missing
                raise
            split -= 1
    for attr in parts[split:]:
        obj = getattr(obj, attr, _MISSING)
        if obj is _MISSING:
            raise LookupError(f"{name}: {attr!r} is not in wslib")
    return obj


def reference(name: str) -> str:
    """The MyST role that links ``name`` to its API entry (plain code for data).

    A private or undocumented function or class has no entry to link to: a
    LookupError, like a name that does not exist.
    """
    obj = resolve(name)
    if inspect.ismodule(obj):
        return f"{{py:mod}}`{name}`"
    if inspect.isclass(obj) or inspect.isroutine(obj):
        if obj.__name__.startswith("_") or not inspect.getdoc(obj):
            raise LookupError(f"{name}: it has no entry in the API reference")
        target = f"{obj.__module__}.{obj.__qualname__}"
        return f"{{py:obj}}`{name} <{target}>`"
    return f"`{name}`"  # a constant: documented with its module, not linked


def link_text(text: str, where: str) -> str:
    """``text`` with each backticked ``wslib`` name replaced by :func:`reference`."""

    def sub(match: re.Match[str]) -> str:
        try:
            return reference(match.group(1))
        except LookupError as error:
            raise LookupError(f"{where} names {error}; fix the text") from None

    return NAME.sub(sub, text)


def link_api(notebook: Path) -> None:
    """Rewrite the Markdown cells of ``notebook`` (in place) with API links."""
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            cell["source"] = link_text(source, notebook.stem).splitlines(keepends=True)
    notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
