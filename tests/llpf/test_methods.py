"""wslib/llpf/methods.py: chapter 4's runs of every method between two modes."""

from __future__ import annotations

import re

import pytest

from tests.kit import pair
from tests.llpf.test_protocols import CURVE, FAST, NEB, setup
from wslib.llpf.autoneb import AutoNEBSettings
from wslib.llpf.curves import CurveSettings
from wslib.llpf.methods import baseline_settings, compare_at_equal_steps, method_run


def test_the_three_methods_get_the_budget_llpf_used() -> None:
    s = setup()
    methods = {
        "LLPF": {"method": "llpf", **FAST},
        "bezier": {"method": "curve", **CURVE},
        "AutoNEB": {"method": "autoneb", **NEB},
    }
    res = compare_at_equal_steps(s, pair(), methods, seed=0)
    assert list(res) == ["LLPF", "bezier", "AutoNEB"]
    budget = res["LLPF"]["grad_steps"]
    assert budget > 0 and res["bezier"]["grad_steps"] == budget
    assert res["AutoNEB"]["grad_steps"] == budget
    assert len(res["bezier"]["train_loss"]) == CURVE["n_eval"]


def test_method_run_refuses_unknown_methods_and_missing_budgets() -> None:
    s = setup()
    with pytest.raises(ValueError, match="settings\\['method'\\]"):
        method_run(s, pair(), {"method": "spline"}, seed=0)
    with pytest.raises(ValueError, match="budget"):
        method_run(s, pair(), {"method": "curve", **CURVE}, seed=0)
    with pytest.raises(ValueError, match="first method must be LLPF"):
        compare_at_equal_steps(s, pair(), {"b": {"method": "curve"}}, seed=0)


def test_a_baseline_gets_the_budget_the_batch_size_and_the_seed() -> None:
    curve = baseline_settings("curve", CURVE, 30, 8, 5)
    assert curve == CurveSettings(steps=30, batch_size=8, seed=5, **CURVE)
    neb = baseline_settings("autoneb", NEB, 30, 8, 5)
    assert neb == AutoNEBSettings(total_steps=30, batch_size=8, seed=5, **NEB)


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("curve", {**CURVE, "momentun": 0.9}, "the curve settings: unknown setting momentun; valid: "),
        ("autoneb", {**NEB, "steps": 3}, "the autoneb settings: unknown setting steps; valid: "),
        ("curve", {**CURVE, "steps": 3}, "the curve settings set steps; leave them out"),
        ("autoneb", {**NEB, "seed": 1, "total_steps": 3}, "the autoneb settings set seed, total_steps; leave them out"),
    ],
)  # fmt: skip
def test_a_wrong_baseline_option_is_named_with_its_method(
    kind: str, options: dict, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        method_run(setup(), pair(), {"method": kind, **options}, seed=0, budget=4)


def test_an_option_the_run_sets_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError) as refused:
        baseline_settings("curve", {**CURVE, "seed": 1}, 30, 8, 5)
    assert str(refused.value) == (
        "the curve settings set seed; leave them out: the budget, the setup's "
        "batch size and the path seed set them"
    )
