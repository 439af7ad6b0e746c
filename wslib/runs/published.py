"""Numbers the three papers report, to print beside the book's own, labelled as the papers'.

Each :class:`Published` number carries its setting (data set, model and
its width; training recipes and the like are not compared).
:func:`beside_paper` gives one row per number: the paper's value, and this
run's measurement of the same quantity only where the run has the same
setting; otherwise the row says what differs, so a page never sets side by
side numbers of different experiments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class Published:
    """A reported number: where, in which setting, of what, and its value as printed.

    ``key`` names this run's measurement of the same quantity (the keys of
    :func:`beside_paper`'s ``measured``).
    """

    source: str
    setting: Mapping[str, str]
    quantity: str
    value: str
    key: str


def _reported(
    source: str, setting: Mapping[str, str], *numbers: tuple[str, str, str]
) -> tuple[Published, ...]:
    """Numbers of one setting, each ``(quantity, value, key)``."""
    return tuple(Published(source, setting, *number) for number in numbers)


def _fusion_table1() -> tuple[Published, ...]:
    """HF/KF paper, Table 1: VGG-11, CIFAR-10, non-IID, zero-shot test accuracy (%)."""
    reported = {
        "kf_linear": {2: "84.5", 4: "78.9", 8: "69.6"},
        "otfusion": {2: "43.4", 4: "20.4", 8: "12.9"},
        "averaging": {2: "11.2", 4: "10.0", 8: "10.0"},
        "rebasin_wm": {2: "71.8"},
    }
    return _reported(
        "Table 1",
        {"data": "cifar10", "model": "vgg11", "width": "1.0"},
        *(
            (
                f"{method}, non-IID, {n} models: zero-shot test accuracy (%)",
                value,
                f"{method}/noniid/{n}",
            )
            for method, by_n in reported.items()
            for n, value in by_n.items()
        ),
    )


FUSION = _fusion_table1()
"""The fusion paper's Table 1 (chapter 10)."""

PATHCOND = _reported(
    "fully convolutional net",
    {"data": "cifar10", "model": "cifar_nv", "width": "1.0"},
    ("PathCond: test accuracy (%)", "80", "pathcond/test_acc"),
    ("standard init: test accuracy (%)", "77", "baseline/test_acc"),
)
"""The PathCond paper's fully convolutional net on CIFAR-10 (chapter 8)."""

LLPF = _reported(
    "AutoNEB comparison",
    {"data": "cifar10", "model": "resnet18", "width": "1.0"},
    (
        "AutoNEB (here: the book's simplified AutoNEB): peak training loss on the path",
        "0.5-1.5",
        "AutoNEB (simplified)/peak loss",
    ),
    ("LLPF: peak training loss on the path", "< 0.05", "LLPF/peak loss"),
)
"""The LLPF paper's ResNet-18 paths on CIFAR-10 (chapter 4)."""


def run_setting(data: str, config: Mapping[str, Any]) -> dict[str, str]:
    """The setting of one model of this run, in :class:`Published`'s terms."""
    return {
        "data": data,
        "model": str(config["name"]),
        "width": str(float(config.get("width", 1.0))),
    }


def beside_paper(
    published: Sequence[Published],
    runs: Sequence[Mapping[str, str]],
    measured: Mapping[str, str],
) -> pd.DataFrame:
    """One row per published number, with this run's where one of ``runs`` has its setting.

    ``runs``: the settings this run has (one per model it trains, see
    :func:`run_setting`); ``measured``: this run's value (as printed) of
    each key it measured.
    """
    rows = []
    for p in published:
        differs = _differences(p.setting, runs)
        if not differs and p.key not in measured:
            differs.append("not run here")
        rows.append(
            {
                "paper": p.source,
                "setting": ", ".join(f"{k} {v}" for k, v in p.setting.items()),
                "quantity": p.quantity,
                "paper's value": p.value,
                "this run": "—" if differs else measured[p.key],
                "same setting": "no (" + "; ".join(differs) + ")" if differs else "yes",
            }
        )
    return pd.DataFrame(rows)


def _differences(
    setting: Mapping[str, str], runs: Sequence[Mapping[str, str]]
) -> list[str]:
    """What no run of ``runs`` shares with ``setting`` (empty when one run has all of it)."""
    if any(all(run.get(k) == v for k, v in setting.items()) for run in runs):
        return []
    differs = []
    for what, theirs in setting.items():
        ours = sorted({run.get(what, "none") for run in runs})
        if theirs not in ours:
            differs.append(f"{what}: {theirs} here {', '.join(ours)}")
    return differs or ["no single model here has all of it"]
