"""Numbers the three papers report, to print beside the book's own, labelled as the papers'.

Each :class:`Published` number carries its setting (data set, model, ...).
:func:`beside_paper` gives one row per number: the paper's value, and this
run's measurement of the same quantity only where the run has the same
setting; otherwise the row says what differs, so a page never sets side by
side numbers of different experiments.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

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


def _fusion_table1() -> tuple[Published, ...]:
    """HF/KF paper, Table 1: VGG-11, CIFAR-10, non-IID, zero-shot test accuracy (%)."""
    reported = {
        "kf_linear": {2: "84.5", 4: "78.9", 8: "69.6"},
        "otfusion": {2: "43.4", 4: "20.4", 8: "12.9"},
        "averaging": {2: "11.2", 4: "10.0", 8: "10.0"},
        "rebasin_wm": {2: "71.8"},
    }
    setting = {"data": "cifar10", "model": "vgg11"}
    return tuple(
        Published(
            "Table 1",
            setting,
            f"{method}, non-IID, {n} models: zero-shot test accuracy (%)",
            value,
            f"{method}/noniid/{n}",
        )
        for method, by_n in reported.items()
        for n, value in by_n.items()
    )


FUSION = _fusion_table1()
"""The fusion paper's Table 1 (chapter 10)."""

PATHCOND = (
    Published(
        "fully convolutional net",
        {"data": "cifar10", "model": "cifar_nv"},
        "PathCond: test accuracy (%)",
        "80",
        "pathcond/test_acc",
    ),
    Published(
        "fully convolutional net",
        {"data": "cifar10", "model": "cifar_nv"},
        "standard init: test accuracy (%)",
        "77",
        "baseline/test_acc",
    ),
)
"""The PathCond paper's fully convolutional net on CIFAR-10 (chapter 8)."""

LLPF = (
    Published(
        "AutoNEB comparison",
        {"data": "cifar10", "model": "resnet18"},
        "AutoNEB: peak training loss on the path",
        "0.5-1.5",
        "AutoNEB (simplified)/peak loss",
    ),
    Published(
        "AutoNEB comparison",
        {"data": "cifar10", "model": "resnet18"},
        "LLPF: peak training loss on the path",
        "< 0.05",
        "LLPF/peak loss",
    ),
)
"""The LLPF paper's ResNet-18 paths on CIFAR-10 (chapter 4)."""


def beside_paper(
    published: Sequence[Published],
    here: Mapping[str, Collection[str]],
    measured: Mapping[str, str],
) -> pd.DataFrame:
    """One row per published number, with this run's where the setting is the same.

    ``here``: for each setting key, the values this run has (a chapter may
    run several models); ``measured``: this run's value (as printed) of each
    key it measured.
    """
    rows = []
    for p in published:
        differs = [
            f"{what}: {theirs} here {', '.join(sorted(here.get(what, []))) or 'none'}"
            for what, theirs in p.setting.items()
            if theirs not in here.get(what, ())
        ]
        if not differs and p.key not in measured:
            differs.append("not run here")
        rows.append(
            {
                "paper": p.source,
                "setting": ", ".join(p.setting.values()),
                "quantity": p.quantity,
                "paper's value": p.value,
                "this run": "—" if differs else measured[p.key],
                "same setting": "no (" + "; ".join(differs) + ")" if differs else "yes",
            }
        )
    return pd.DataFrame(rows)
