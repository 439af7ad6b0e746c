"""The papers' numbers stand beside this run's only where the settings match."""

from __future__ import annotations

import pandas as pd

from wslib.fusion.published import measured_accuracies, table1_beside
from wslib.llpf.ch04_baselines import paper_numbers_beside as llpf_beside
from wslib.pathcond.ch08_conv import paper_numbers_beside as pathcond_beside
from wslib.runs.published import FUSION, Published, beside_paper, run_setting

ROW = Published("T", {"data": "d", "model": "m", "width": "1.0"}, "q", "1.0", "k")
RUN = {"data": "d", "model": "m", "width": "1.0"}


def test_same_setting_gets_the_measurement_and_others_say_what_differs() -> None:
    other_model = {**RUN, "model": "x"}
    table = beside_paper([ROW], [RUN, other_model], {"k": "2.0"})
    assert table.loc[0, "this run"] == "2.0" and table.loc[0, "same setting"] == "yes"
    assert table.loc[0, "paper's value"] == "1.0"
    other = beside_paper([ROW], [{**RUN, "data": "e"}], {"k": "2.0"})
    assert other.loc[0, "this run"] == "—"
    assert other.loc[0, "same setting"] == "no (data: d here e)"
    missing = beside_paper([ROW], [RUN], {})
    assert missing.loc[0, "same setting"] == "no (not run here)"


def test_one_model_must_have_the_whole_setting() -> None:
    """Data, model and width each present, but on different models: no comparison."""
    narrow, wide_other = {**RUN, "width": "0.25"}, {**RUN, "model": "x"}
    table = beside_paper([ROW], [narrow, wide_other], {"k": "2.0"})
    assert table.loc[0, "this run"] == "—"
    assert "no single model" in table.loc[0, "same setting"]


def test_run_setting_reads_the_width_with_its_default() -> None:
    assert run_setting("d", {"name": "m"}) == RUN
    assert run_setting("d", {"name": "m", "width": 0.5})["width"] == "0.5"


def _fusion_summary() -> pd.DataFrame:
    rows = [  # kf_linear on 2 non-IID models: conductance wins on validation
        ("noniid", 2, "kf_linear", "uniform", 0.80, 0.02, 0.70),
        ("noniid", 2, "kf_linear", "conductance", 0.75, 0.01, 0.90),
        ("noniid", 2, "otfusion", "uniform", 0.40, 0.05, 0.40),
    ]
    columns = ["regime", "n", "method", "importance", "mean", "std", "val"]
    return pd.DataFrame(rows, columns=columns)


def test_fusion_table1_takes_the_validation_choice() -> None:
    assert measured_accuracies(_fusion_summary()) == {
        "kf_linear/noniid/2": "75.0 ± 1.0",
        "otfusion/noniid/2": "40.0 ± 5.0",
    }
    vgg = {"name": "vgg11", "width": 1.0}
    table = table1_beside(_fusion_summary(), "cifar10", vgg)
    assert len(table) == len(FUSION)
    by_quantity = table.set_index("quantity")
    kf2 = by_quantity.loc["kf_linear, non-IID, 2 models: zero-shot test accuracy (%)"]
    assert (kf2["paper's value"], kf2["this run"]) == ("84.5", "75.0 ± 1.0")
    assert (table1_beside(_fusion_summary(), "cifar100", vgg)["this run"] == "—").all()


def test_llpf_compares_only_its_resnet18() -> None:
    compare = pd.DataFrame(
        {
            "model": ["resnet", "resnet", "mlp"],
            "method": ["LLPF", "AutoNEB (simplified)", "LLPF"],
            "worst peak loss": [0.031, 0.9, 5.0],
        }
    )
    models = {"resnet": {"name": "resnet18", "width": 1.0}, "mlp": {"name": "mlp"}}
    table = llpf_beside(compare, models, "cifar10").set_index("quantity")
    assert table.loc["LLPF: peak training loss on the path", "this run"] == (
        "0.031 (worst seed)"
    )
    autoneb = (
        "AutoNEB (here: the book's simplified AutoNEB): peak training loss on the path"
    )
    assert table.loc[autoneb, "this run"] == ("0.9 (worst seed)")
    assert (llpf_beside(compare, models, "mnist1d")["this run"] == "—").all()
    narrow = {**models, "resnet": {"name": "resnet18", "width": 0.0625}}
    assert (llpf_beside(compare, narrow, "cifar10")["this run"] == "—").all()


def test_pathcond_compares_only_cifar_nv_on_the_chapters_data() -> None:
    archs = {
        "fully_conv": {"model": {"name": "cifar_nv"}},
        "autoencoder": {"model": {"name": "mlp"}, "data": {"name": "mnist"}},
    }
    metrics = {
        "fully_conv": {"test_acc": {"baseline": 0.7712, "pathcond": 0.8049}},
        "autoencoder": {"test_acc": {"baseline": None, "pathcond": None}},
    }
    table = pathcond_beside(metrics, archs, {"name": "cifar10"}).set_index("quantity")
    assert table.loc["PathCond: test accuracy (%)", "this run"] == "80.5"
    assert table.loc["standard init: test accuracy (%)", "this run"] == "77.1"
    other = pathcond_beside(metrics, archs, {"name": "mnist1d"})
    assert (other["this run"] == "—").all()
