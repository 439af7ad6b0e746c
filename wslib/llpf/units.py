"""The LLPF chapters (3-5) as independent units (see :mod:`wslib.runs.units`).

Each function takes a notebook's effective parameters and lists its units;
listing is cheap (no model, no data), every unit's work happens in its
``run``. A unit makes the same call as its notebook, through the same setup
(:func:`~wslib.llpf.setup.chapter_data`,
:func:`~wslib.llpf.setup.chapter_setup`, the derived seeds), so it fills
the cache entry the notebook reads:

- stage 0: the base models (the zoo);
- chapters 3 and 5, stage 1: every path, checkpointed (not evaluated: the
  notebook evaluates it), and chapter 3's peak anatomy (run cache);
- chapter 4: stage 1 the LLPF tuning runs (the first of them sets the
  baselines' budget), stage 2 the baselines' tuning runs, stage 3 the
  equal-budget comparison of one model on one path seed (one run-cache
  entry: LLPF at its tuned setting, then each baseline on its steps).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from wslib.core.connectivity import mode_config, train_modes
from wslib.core.data import Dataset
from wslib.llpf.ch03_m2m import peak_anatomy
from wslib.llpf.ch04_baselines import (
    compare_methods,
    methods_by_model,
    tuned_methods,
    tuning_budget,
    tuning_run,
    tuning_seed,
    tuning_sweep,
)
from wslib.llpf.ch05_spheres import M2O_VARIANTS, sphere_configs
from wslib.llpf.protocols import PathSetup, hybrid_path, m2m_path, m2o_path
from wslib.llpf.setup import (
    arch_path_seeds,
    chapter_data,
    chapter_setup,
    mode_seeds,
    path_seed_list,
)
from wslib.runs.units import Params, Unit
from wslib.runs.zoo import Zoo, normalise_config


class _Chapter:
    """The zoo, data and path setup of one chapter run, made on first use."""

    def __init__(self, params: Params) -> None:
        self.p = params
        self._made: tuple[Zoo, Dataset] | None = None

    def _data(self) -> tuple[Zoo, Dataset]:
        if self._made is None:
            self._made = chapter_data(self.p["data"])
        return self._made

    def zoo(self) -> Zoo:
        return self._data()[0]

    def setup(self) -> PathSetup:
        p = self.p
        return chapter_setup(
            self._data()[1],
            p["batch_size"],
            p["r_min"],
            p["threshold_margin"],
            p["dense"],
            p["checkpoint_dir"],
            p["profile"],
        )

    def modes(self, name: str) -> list[nn.Module]:
        """The two modes of model ``name`` (``models``/``recipes`` chapters)."""
        p = self.p
        one = {name: p["models"][name]}
        return train_modes(self.zoo(), p["data"], one, p["recipes"], self.seeds())[name]

    def seeds(self) -> list[int]:
        return mode_seeds(self.p["seed"])


def _need_checkpoints(params: Params, nb: str) -> None:
    if params.get("checkpoint_dir") is None:
        raise ValueError(
            f"{nb}: checkpoint_dir is None, so its paths are not cached and no unit "
            "can compute them for the notebook; set checkpoint_dir in the profile "
            "(the notebook's default is data/llpf)"
        )


def _mode_units(chapter: _Chapter) -> list[Unit]:
    """Stage 0: one unit per model and mode seed (``models``/``recipes`` chapters)."""
    p, units = chapter.p, []
    for name, model in p["models"].items():
        for s in chapter.seeds():
            config = mode_config(p["data"], model, p["recipes"][name], s)
            units.append(Unit(f"mode {name} seed {s}", 0, _get(chapter, config)))
    return units


def _get(chapter: _Chapter, config: Mapping[str, Any]) -> Callable[[], object]:
    return lambda: chapter.zoo().get(dict(config))


def m2m_units(params: Params) -> list[Unit]:
    """Chapter 3 (``03_llpf_m2m``): modes; every M2M path and the peak anatomy run."""
    _need_checkpoints(params, "03_llpf_m2m")
    p, chapter = params, _Chapter(params)
    seeds = path_seed_list(p["seed"], p["path_seeds"])

    def path(name: str, s: int, all_at_once: bool) -> Callable[[], object]:
        def run() -> object:
            pair = chapter.modes(name)
            llpf = p["llpf"][name]
            setup = chapter.setup()
            return m2m_path(setup, pair, llpf, s, name=name, all_at_once=all_at_once)

        return run

    def anatomy(name: str) -> object:
        settings = p["llpf"][name]
        args = (chapter.setup(), chapter.modes(name), settings, seeds[0])
        return peak_anatomy(*args, run_cache=p["run_cache"])

    units = _mode_units(chapter)
    for name in p["models"]:
        runs = arch_path_seeds(name, p["seed_archs"], seeds)
        units += [Unit(f"m2m {name} seed {s}", 1, path(name, s, False)) for s in runs]
    for name in p["ablation_archs"]:
        runs = arch_path_seeds(name, p["seed_archs"], seeds)
        units += [
            Unit(f"all-at-once {name} seed {s}", 1, path(name, s, True)) for s in runs
        ]
    first = next(iter(p["models"]))
    units.append(Unit(f"peak anatomy {first}", 1, lambda: anatomy(first)))
    return units


def _tuning_units(chapter: _Chapter) -> list[Unit]:
    """Chapter 4's stages 1 (LLPF settings, the budget run) and 2 (baselines)."""
    p = chapter.p
    methods = methods_by_model(p["models"], p["llpf"], p["baselines"])
    seed = tuning_seed(p["seed"])

    def args(name: str) -> tuple[PathSetup, list[nn.Module], Mapping[str, Any]]:
        return (chapter.setup(), chapter.modes(name), methods[name])

    def budget(name: str) -> Callable[[], object]:
        return lambda: tuning_budget(*args(name), seed, run_cache=p["run_cache"])

    def setting(
        name: str, label: str, override: Mapping[str, Any], stage: int
    ) -> Callable[[], object]:
        def run() -> object:
            cache = p["run_cache"]
            steps = (
                None
                if stage == 1
                else tuning_budget(*args(name), seed, run_cache=cache)
            )
            return tuning_run(
                *args(name), label, override, seed, steps, run_cache=cache
            )

        return run

    units = []
    for name, base in methods.items():
        first = next(iter(base))
        units.append(Unit(f"tuning {name} {first} base settings", 1, budget(name)))
        for label, options in p["tuning"].items():
            llpf = base[label]["method"] == "llpf"
            for override in options:
                if llpf and {**base[label], **override} == base[label]:
                    continue  # the budget run itself
                text = json.dumps(dict(override), sort_keys=True)
                unit_name = f"tuning {name} {label} {text}"
                run = setting(name, label, override, 1 if llpf else 2)
                units.append(Unit(unit_name, 1 if llpf else 2, run))
    return units


def baseline_units(params: Params) -> list[Unit]:
    """Chapter 4 (``04_llpf_baselines``): modes; tuning runs; the comparison per
    model and path seed (the tuned settings recomputed from the cached sweep)."""
    p, chapter = params, _Chapter(params)
    methods = methods_by_model(p["models"], p["llpf"], p["baselines"])

    def compare(name: str, s: int) -> Callable[[], object]:
        def run() -> object:
            setup, one = chapter.setup(), {name: p["models"][name]}
            modes = {name: chapter.modes(name)}
            seed = tuning_seed(p["seed"])
            args = (setup, one, modes, methods, p["tuning"], seed)
            sweep = tuning_sweep(*args, run_cache=p["run_cache"])
            tuned = tuned_methods({name: methods[name]}, sweep)
            return compare_methods(
                setup, one, modes, tuned, [s], run_cache=p["run_cache"]
            )

        return run

    units = _mode_units(chapter) + _tuning_units(chapter)
    for name in p["models"]:
        units += [
            Unit(f"compare {name} seed {s}", 3, compare(name, s))
            for s in path_seed_list(p["seed"], p["n_seeds"])
        ]
    return units


def sphere_units(params: Params) -> list[Unit]:
    """Chapter 5 (``05_llpf_spheres``): its base models; M2O with and without
    compliance (two models), the hybrid and the sharp-minima M2M path."""
    _need_checkpoints(params, "05_llpf_spheres")
    p, chapter = params, _Chapter(params)
    configs = sphere_configs(
        p["data"],
        p["arch"],
        p["recipe"],
        p["norm_arch"],
        p["norm_recipe"],
        p["wd_source"],
        p["wd_dest"],
        p["sharp_recipe"],
        p["seed"],
    )
    seed = path_seed_list(p["seed"], 1)[0]

    def model(key: str) -> nn.Module:
        return chapter.zoo().get(configs[key])

    def m2o(key: str, name: str, compliance: bool) -> Callable[[], object]:
        return lambda: m2o_path(
            chapter.setup(),
            model(key),
            p["m2o_settings"],
            seed,
            compliance=compliance,
            name=name,
        )

    def hybrid() -> object:
        args = (chapter.setup(), model("source"), model("dest"), p["hybrid_m2o"])
        return hybrid_path(*args, p["m2m_settings"], seed, name="spheres-hybrid")

    def sharp() -> object:
        pair = [model("sharp a"), model("sharp b")]
        settings = p["m2m_settings"]
        return m2m_path(chapter.setup(), pair, settings, seed, name="spheres-sharp")

    units, seen = [], set()
    for key, config in configs.items():
        text = json.dumps(normalise_config(config), sort_keys=True)
        if text not in seen:  # two keys naming one model: one unit trains it
            seen.add(text)
            units.append(Unit(f"model {key}", 0, _get(chapter, config)))
    for key, name in (("base", "spheres-m2o"), ("normed", "spheres-norm")):
        for label, compliance in M2O_VARIANTS.items():
            units.append(Unit(f"m2o {key} {label}", 1, m2o(key, name, compliance)))
    units.append(Unit("hybrid", 1, hybrid))
    units.append(Unit("sharp minima m2m", 1, sharp))
    return units
