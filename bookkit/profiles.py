"""A chapter's parameters: its parameters cell, the cpu profile, another profile.

Every parameter of a chapter other than its profile, seed and results path
is written once, in its section of ``notebooks/params/cpu.yaml``; another
profile's file (``notebooks/params/<profile>.yaml``) sets only what differs.
:func:`notebook_parameters` is what a run injects: the defaults
(:func:`default_parameters`), overridden by the profile's section, checked
against the chapter's defaults (:func:`section_parameters`), plus the
profile, results path and seed. Model configs without ``in_shape`` or
``n_classes`` get them from their data set. ``bookkit run``, ``sweep``,
``part``, ``plan`` and ``gpu-check --params`` read profiles through here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import nbformat
import yaml

from bookkit import chapters, profile_values
from wslib.core.configs import complete_model_configs

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: every path of the tooling is relative to it."""
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"


class UnknownParameter(ValueError):
    """A profile sets a parameter that the notebook does not have."""


def available_profiles() -> list[str]:
    """Profiles are the YAML files in ``notebooks/params``."""
    return sorted(p.stem for p in PARAMS.glob("*.yaml"))


def available_notebooks() -> list[str]:
    """Notebooks are the stems of the chapters ``notebooks/*.md``."""
    return sorted(p.stem for p in NOTEBOOKS.glob(f"*{chapters.SUFFIX}"))


def chapter_path(nb: str) -> Path:
    """The source of chapter ``nb``: ``notebooks/<nb>.md``."""
    return NOTEBOOKS / f"{nb}{chapters.SUFFIX}"


def code_cells(nb: str) -> list[nbformat.NotebookNode]:
    """The code cells of chapter ``nb``."""
    cells = chapters.read(chapter_path(nb)).cells
    return [c for c in cells if c.cell_type == "code"]


def run_dir(top: str, profile: str, seed: int | None) -> Path:
    """``<top>/<profile>`` or, for a given seed, ``<top>/<profile>/seed-<seed>``."""
    path = Path(top) / profile
    return path if seed is None else path / f"seed-{seed}"


def default_parameters(nb: str) -> dict[str, Any]:
    """The notebook's defaults: its ``parameters`` cell (the profile, seed and
    results path) and its section of the cpu profile (every other parameter,
    written once there; each model config completed by its data set's shape).

    Without ``notebooks/params/cpu.yaml`` (a test's repository of toy
    notebooks), the parameters cell alone.
    """
    cell = cell_parameters(nb)
    cpu = PARAMS / "cpu.yaml"
    section = copy.deepcopy(load_profile("cpu").get(nb) or {}) if cpu.exists() else {}
    data = section.get("data", cell.get("data"))
    return {**cell, **complete_model_configs(section, data)}


def cell_parameters(nb: str) -> dict[str, Any]:
    """The values of the notebook's ``parameters`` cell."""
    notebook = chapters.read(chapter_path(nb))
    cell = next(
        (c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])), None
    )
    if cell is None:
        raise UnknownParameter(f"notebook {nb} has no cell tagged 'parameters'")
    namespace: dict[str, Any] = {}
    exec(cell.source, namespace)  # the notebook's own first cell: plain assignments
    return {k: v for k, v in namespace.items() if not k.startswith("__")}


YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader, in C where PyYAML was built with libyaml: a run reads
its profiles once per chapter, and the Python loader took about 0.05 s a read."""


def read_yaml(text: str) -> Any:
    """The value of a YAML document, read safely (:data:`YAML_LOADER`)."""
    return yaml.load(text, Loader=YAML_LOADER)


def load_profile(profile: str, file: Path | None = None) -> dict[str, Any]:
    """``notebooks/params/<profile>.yaml`` (or ``file``): one section per notebook.

    Raises :class:`UnknownParameter` naming the file for a YAML error, a file
    that is empty or not a mapping, and a section that names no notebook.
    """
    file = file or PARAMS / f"{profile}.yaml"
    path = f"notebooks/params/{profile}.yaml" if file.parent == PARAMS else str(file)
    try:
        sections = read_yaml(file.read_text())
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        problem = getattr(error, "problem", None) or "not valid YAML"
        raise UnknownParameter(f"{path}{line}: {problem}") from None
    if not isinstance(sections, dict):  # an empty file too: '{}' means every default
        got = "an empty file" if sections is None else type(sections).__name__
        raise UnknownParameter(
            f"{path} must map notebook names to their parameters "
            f"(e.g. '01_symmetries: {{n_points: 5}}'; '{{}}' for every default), "
            f"got {got}"
        )
    unknown = sorted(set(sections) - set(available_notebooks()))
    if unknown:
        raise UnknownParameter(
            f"{path} has a section for {', '.join(map(str, unknown))}, which is no "
            f"notebook; valid: {' '.join(available_notebooks())}"
        )
    return sections


def same_kind(value: Any, default: Any) -> bool:
    """Whether a profile's ``value`` may replace the notebook's ``default``: the
    same type or an int for a float; None for any default, anything for a
    None default."""
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, dict | list | str | int):
        return isinstance(value, type(default))
    return True


def section_parameters(nb: str, sections: dict[str, Any], where: str) -> dict[str, Any]:
    """The parameters a profile's ``sections`` set for ``nb``, checked against the notebook.

    Every model config without ``in_shape`` or ``n_classes`` gets them from
    its data set (the profile's ``data``, else the notebook's). Raises
    :class:`UnknownParameter` (naming ``where``, the profile's file) when the
    profile names a parameter the notebook does not define (papermill would
    only warn and ignore it), gives one a value of another kind, or holds a
    model config that cannot be completed, or a value out of its range
    (:mod:`profile_values`: a recipe that trains nothing, a count of zero, a
    negative rate). ``bookkit run``, ``sweep``, ``part``, ``plan`` and
    ``gpu-check --params`` all read profiles through here.
    """
    section = sections.get(nb) or {}
    valid = default_parameters(nb)
    try:
        params = complete_model_configs(section, valid.get("data"))
    except ValueError as error:
        raise UnknownParameter(f"{where}, section {nb}: {error}") from None
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise UnknownParameter(
            f"{where} sets {', '.join(unknown)} for {nb}, "
            f"which has no such parameter; valid: {' '.join(valid)}"
        )
    for name, value in params.items():
        if not same_kind(value, valid[name]):
            raise UnknownParameter(
                f"{where} sets {name} of {nb} to {value!r} "
                f"({type(value).__name__}); the notebook's default is "
                f"{valid[name]!r} ({type(valid[name]).__name__}): give a value of that kind"
            )
    try:
        profile_values.check_values(params, valid)
    except ValueError as error:
        raise UnknownParameter(f"{where}, section {nb}: {error}") from None
    return params


def notebook_parameters(nb: str, profile: str, seed: int | None) -> dict[str, Any]:
    """Every parameter of ``nb`` in ``profile``: its defaults overridden by the
    profile's section (:func:`section_parameters`), then those set by this
    script: the profile, the results path and the seed (the default's when None).

    All are injected: a chapter's parameters cell holds only the profile, the
    seed and the results path, so its executed copy carries every value it ran
    with and runs alone (in Colab, downloaded)."""
    where = f"notebooks/params/{profile}.yaml"
    section = section_parameters(nb, load_profile(profile), where)
    params = {**default_parameters(nb), **section}  # the cells hold none of them
    params["profile"] = profile
    params["results_path"] = str(run_dir("results", profile, seed) / f"{nb}.json")
    if seed is not None:
        params["seed"] = seed
    return params


def missing_sections(profile: str, notebooks: list[str]) -> list[str]:
    """The notebooks the profile has no section for (they run with their defaults)."""
    sections = load_profile(profile)
    return [nb for nb in notebooks if nb not in sections]


def effective_parameters(nb: str, injected: dict[str, Any]) -> dict[str, Any]:
    """The parameters a run used: the notebook's defaults overridden by the injected ones."""
    return {**default_parameters(nb), **injected}
