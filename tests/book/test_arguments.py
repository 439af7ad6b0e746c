"""bookkit run and bookkit sweep refuse repeated or negative seeds and notebooks, naming them."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        (
            "run",
            ["01_symmetries", "01_symmetries"],
            "notebook 01_symmetries given twice",
        ),
        (
            "run",
            ["--seed", "-1"],
            "--seed must be a whole number from 0 to 9223372036854775807 (2**63 - 1), got -1",
        ),
        (
            "run",
            ["--seed", "99999999999999999999"],
            "--seed must be a whole number from 0 to",
        ),
        ("sweep", ["--seeds", "1", "1", "2"], "seed 1 given twice"),
        (
            "sweep",
            ["--seeds", "0", "-3"],
            "each of --seeds must be a whole number from 0 to 9223372036854775807 (2**63 - 1), got -3",
        ),
        (
            "sweep",
            ["--seeds", "99999999999999999999"],
            "each of --seeds must be a whole number from 0",
        ),
        (
            "sweep",
            ["02_layerwise", "02_layerwise", "--seeds", "0"],
            "notebook 02_layerwise given twice",
        ),
    ],
)
def test_bad_arguments_are_named(
    script: str, argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    module = importlib.import_module(f"bookkit.{script}")
    with pytest.raises(SystemExit) as stop:
        module.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
