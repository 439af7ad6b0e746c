"""The paper's numbers stand beside this run's only where the settings match."""

from __future__ import annotations

import pandas as pd

from wslib.fusion.published import PUBLISHED, beside_paper


def _summary() -> pd.DataFrame:
    rows = [  # kf_linear on 2 non-IID models: conductance wins on validation
        ("noniid", 2, "kf_linear", "uniform", 0.80, 0.02, 0.70),
        ("noniid", 2, "kf_linear", "conductance", 0.75, 0.01, 0.90),
        ("noniid", 2, "otfusion", "uniform", 0.40, 0.05, 0.40),
    ]
    columns = ["regime", "n", "method", "importance", "mean", "std", "val"]
    return pd.DataFrame(rows, columns=columns)


def test_the_same_setting_gets_this_runs_validation_choice() -> None:
    table = beside_paper(_summary(), "cifar10", "vgg11")
    assert len(table) == len(PUBLISHED)
    kf2 = table[(table.method == "kf_linear") & table.setting.str.endswith(" 2 models")]
    assert kf2["this run's %"].item() == "75.0 ± 1.0"
    assert kf2["paper's %"].item() == 84.5
    assert kf2["same setting"].item() == "yes"
    kf4 = table[(table.method == "kf_linear") & table.setting.str.endswith(" 4 models")]
    assert kf4["this run's %"].item() == "—"
    assert "not run with 4 models" in kf4["same setting"].item()


def test_another_data_set_or_model_is_never_compared() -> None:
    table = beside_paper(_summary(), "cifar100", "vgg11")
    assert (table["this run's %"] == "—").all()
    assert table["same setting"].str.contains("data: cifar10 here cifar100").all()
    table = beside_paper(_summary(), "cifar10", "resnet18")
    assert (table["this run's %"] == "—").all()
    assert table["same setting"].str.contains("model: vgg11 here resnet18").all()
