"""Layer-wise LLPF (M2M, M2O, hybrid) pinned against plain references and exact messages.

The M2M paths are compared step by step with a plain loop that follows the
module's rule (move the started stages towards ``D`` by the schedule, put
each tensor back on its start variance, one SGD step, project again, the
last tick on ``D``); the checkpoint keys with the settings they are made
of; the warnings and errors with their whole text and the caller's line.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.kit import MLP, QUIET, pair_states, same_state, toy_tensors, warning_sites
from wslib.core.files import stable_hash, tensor_digest
from wslib.llpf import layerwise, ticks
from wslib.llpf.layerwise import (
    ComplianceSGD,
    M2MSettings,
    M2OSettings,
    hybrid,
    m2m,
    m2o,
    sphere_variance_ratio,
)
from wslib.llpf.path import LLPFPath
from wslib.llpf.stages import stage_starts
from wslib.llpf.ticks import Refine, refine_point, tensor_variances
from wslib.runs.resumable import Persist
from wslib.runs.units import CACHED_ONLY, NotCached

ONE_STEP = Refine(lr=0.1, batch_size=8, r_min=1, r_max=1, threshold=1e9)
"""One SGD step per tick, never above the threshold (no cap warning)."""
FROZEN = Refine(lr=1e-12, batch_size=8, r_min=1, r_max=1, threshold=1e9)
"""A refinement that leaves the weights as they are."""
NAMES = [f"linears.{i}.{k}" for i in range(3) for k in ("weight", "bias")]
HERE = str(Path(__file__))


# --- a plain reference of M2M -----------------------------------------------------------------


def _project(model: nn.Module, target: dict[str, float], eps: float) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            mean = p.mean()
            p.copy_((p - mean) * ((target[name] + eps) / (p.var() + eps)) ** 0.5 + mean)


def reference_m2m(
    model: nn.Module,
    start: dict,
    dest: dict,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    ticks: int,
    begin: list[int],
    step: float,
    schedule: str,
    lr: float,
    batch_size: int,
    seed: int,
    record_every: int,
    eps: float,
) -> tuple[list[dict], list[int]]:
    """The M2M path of the docstring, one SGD step a tick: (recorded states, their ticks).

    ``begin`` is the start tick of each stage of the MLP (one stage per Linear).
    """
    work = copy.deepcopy(model)
    work.load_state_dict(start)
    target = {n: float(start[n].float().var()) for n in NAMES}
    gen = torch.Generator().manual_seed(seed)
    states, recorded = [copy.deepcopy(start)], [0]
    for t in range(ticks):
        if t == ticks - 1:
            work.load_state_dict(dest)
        else:
            with torch.no_grad():
                for name, p in work.named_parameters():
                    if t >= begin[int(name.split(".")[1])]:
                        frac = step if schedule == "geometric" else 1 / (ticks - t)
                        p.add_((dest[name] - p) * frac)
            _project(work, target, eps)
            work.train()
            idx = torch.randint(len(x), (batch_size,), generator=gen)
            loss = nn.functional.cross_entropy(work(x[idx]), y[idx])
            grads = torch.autograd.grad(loss, list(work.parameters()))
            with torch.no_grad():
                for p, g in zip(work.parameters(), grads):
                    p.sub_(lr * g)
            _project(work, target, eps)
        if t + 1 == ticks or (t + 1) % record_every == 0:
            states.append({k: v.detach().clone() for k, v in work.state_dict().items()})
            recorded.append(t + 1)
    return states, recorded


M2M_CASES = {
    # step None: 1 - final_gap ** (1 / (ticks - 1 - last start)), stages one tick apart
    "geometric-chosen-step": (
        {"ticks": 6, "stage_ticks": 1, "final_gap": 0.05, "record_every": 2},
        {"begin": [0, 1, 2], "step": 1 - 0.05 ** (1 / 3), "schedule": "geometric"},
    ),
    # the last stage starts one tick before the last: the fraction moves it there in one
    "geometric-last-stage-late": (
        {"ticks": 4, "stage_ticks": 1, "final_gap": 0.3, "record_every": 1},
        {"begin": [0, 1, 2], "step": 1 - 0.3, "schedule": "geometric"},
    ),
    "geometric-given-gaps": (
        {"ticks": 7, "stage_ticks": [2, 1], "step": 0.4, "record_every": 3},
        {"begin": [0, 2, 3], "step": 0.4, "schedule": "geometric"},
    ),
    # all at once wins over stage_ticks; a large eps changes the projection
    "linear-all-at-once": (
        {
            "ticks": 5,
            "stage_ticks": 2,
            "all_at_once": True,
            "schedule": "linear",
            "eps": 1e-2,
            "record_every": 1,
        },
        {"begin": [0, 0, 0], "step": 0.0, "schedule": "linear", "eps": 1e-2},
    ),
}


@pytest.mark.filterwarnings("ignore:M2M's last tick")
@pytest.mark.parametrize("case", list(M2M_CASES))
def test_m2m_follows_the_plain_reference_tick_by_tick(case: str) -> None:
    options, ref = M2M_CASES[case]
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(32)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(refine=ONE_STEP, seed=3, **options),
        persist=QUIET,
    )
    states, ticks = reference_m2m(
        model,
        a,
        b,
        x,
        y,
        ticks=options["ticks"],
        begin=ref["begin"],
        step=ref["step"],
        schedule=ref["schedule"],
        lr=ONE_STEP.lr,
        batch_size=ONE_STEP.batch_size,
        seed=3,
        record_every=options["record_every"],
        eps=ref.get("eps", 1e-12),
    )
    assert path.ticks == ticks
    assert path.phase == ["m2m"] * len(ticks)
    assert path.grad_steps == [min(t, options["ticks"] - 1) for t in ticks]
    assert path.grad_steps[0] == 0 and path.seconds[0] == 0.0
    assert len(path.refine_loss) == options["ticks"]
    assert math.isnan(path.refine_loss[-1])
    for got, want in zip(path.states, states):
        for n in NAMES:
            torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6)
    assert same_state(path.states[-1], b)


def test_m2m_of_one_tick_jumps_to_the_destination_without_a_warning(
    recwarn: pytest.WarningsRecorder,
) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(32)
    path = m2m(model, a, b, x, y, M2MSettings(ticks=1, refine=ONE_STEP), persist=QUIET)
    assert path.ticks == [0, 1] and path.grad_steps == [0, 0]
    assert same_state(path.states[-1], b)
    assert not recwarn.list


def _distance(s: dict, t: dict) -> float:
    return math.sqrt(sum(float(((s[n] - t[n]) ** 2).sum()) for n in NAMES))


def test_m2m_long_jump_warning_says_how_far_and_points_at_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two ticks with a small step: the jump of the last tick is measured before it."""
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(32)
    seen: list[dict] = []

    def before_last(tick: int, work: nn.Module) -> None:
        seen.append({k: v.detach().clone() for k, v in work.state_dict().items()})

    sites = warning_sites(monkeypatch)
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=2, step=0.1, refine=FROZEN, record_every=1),
        persist=Persist(progress=False, on_tick=before_last),
    )
    share = _distance(seen[0], b) / _distance(a, b)
    ((category, message, filename),) = [s for s in sites if "M2M" in s[1]]
    assert category is UserWarning and message == (
        f"M2M's last tick is a straight jump over {share:.0%} of the start's distance "
        "to the destination, with no refinement on it; use more ticks, a larger step "
        "or a smaller final_gap"
    )
    assert filename == HERE


def test_m2m_warns_of_a_long_jump_between_modes_less_than_one_apart() -> None:
    model, a, _ = pair_states(MLP)
    near = {k: v + 0.01 for k, v in a.items()}
    assert _distance(a, near) < 1
    x, y = toy_tensors(32)
    with pytest.warns(UserWarning, match="straight jump"):
        m2m(
            model,
            a,
            near,
            x,
            y,
            M2MSettings(ticks=2, step=0.1, refine=FROZEN),
            persist=QUIET,
        )


def test_m2m_does_not_warn_when_the_point_before_the_last_tick_is_near(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """Three ticks of step 0.7: 30% of the way is left after one tick, 9% after two."""
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(32)
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=3, step=0.7, all_at_once=True, refine=FROZEN),
        persist=QUIET,
    )
    assert not [w for w in recwarn.list if "M2M" in str(w.message)]


# --- m2m's refusals ---------------------------------------------------------------------------


def test_m2m_refuses_a_stage_list_naming_what_is_missing_and_repeated() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    stages = [["linears.0.weight", "linears.0.weight", "zz", "linears.1.weight"]]
    message = (
        "stages must list every parameter exactly once; missing ['linears.0.bias', "
        "'linears.1.bias', 'linears.2.bias'], unknown or repeated "
        "['linears.0.weight', 'zz']"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        m2m(model, a, b, x, y, M2MSettings(ticks=2, stages=stages), persist=QUIET)


def test_m2m_lists_three_unknown_stage_names_at_most() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    stages = [NAMES[:2], NAMES[2:], ["u1", "u2", "u3", "u4"]]
    message = (
        "stages must list every parameter exactly once; missing [], unknown or "
        "repeated ['u1', 'u2', 'u3']"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        m2m(model, a, b, x, y, M2MSettings(ticks=2, stages=stages), persist=QUIET)


@pytest.mark.parametrize("final_gap", [0.0, 1.0, 1.5])
def test_m2m_refuses_a_final_gap_outside_zero_one(final_gap: float) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with pytest.raises(
        ValueError, match=re.escape(f"final_gap must be in (0, 1), got {final_gap}")
    ):
        m2m(model, a, b, x, y, M2MSettings(ticks=3, final_gap=final_gap), persist=QUIET)


@pytest.mark.parametrize("step", [0.0, 1.5])
def test_m2m_refuses_a_step_outside_zero_one(step: float) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with pytest.raises(
        ValueError, match=re.escape(f"step must be in (0, 1], got {step}")
    ):
        m2m(model, a, b, x, y, M2MSettings(ticks=3, step=step), persist=QUIET)


def test_m2m_step_one_jumps_each_started_stage_onto_the_destination() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=3, step=1.0, refine=ONE_STEP),
        persist=QUIET,
    )
    assert same_state(path.states[-1], b)


def test_m2m_names_an_unknown_schedule() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with pytest.raises(
        ValueError, match="schedule must be 'geometric' or 'linear', got 'cosine'"
    ):
        m2m(model, a, b, x, y, M2MSettings(ticks=3, schedule="cosine"), persist=QUIET)


def test_m2m_checks_the_start_state() -> None:
    model, a, b = pair_states(MLP)
    bad = {**a, "linears.1.weight": torch.full_like(a["linears.1.weight"], math.nan)}
    x, y = toy_tensors(16)
    with pytest.raises(ValueError, match="state 0: tensor linears.1.weight"):
        m2m(model, bad, b, x, y, M2MSettings(ticks=2), persist=QUIET)


@pytest.mark.parametrize("ticks", [0, -1])
def test_path_finders_refuse_fewer_than_one_tick(ticks: int) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    message = f"ticks must be >= 1, got {ticks}$"
    with pytest.raises(ValueError, match=message):
        m2m(model, a, b, x, y, M2MSettings(ticks=ticks), persist=QUIET)
    with pytest.raises(ValueError, match=message):
        m2o(model, a, x, y, M2OSettings(ticks=ticks), persist=QUIET)


def test_a_record_interval_below_one_is_refused() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with pytest.raises(ValueError, match="record_every must be >= 1, got 0$"):
        m2m(model, a, b, x, y, M2MSettings(ticks=2, record_every=0), persist=QUIET)


# --- stage starts, variances, the refinement's stop rule ----------------------------------------


def test_stage_starts_spread_evenly_over_the_first_half_by_default() -> None:
    assert stage_starts(3, 12, None) == [0, 2, 4]
    assert stage_starts(4, 10, None) == [0, 1, 2, 4]


def test_stage_starts_name_the_number_of_gaps_they_need() -> None:
    message = (
        "stage_ticks must be one int or 3 non-negative ints (gaps between the starts "
        "of 4 stages), got [1, 2]"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        stage_starts(4, 100, [1, 2])
    with pytest.raises(ValueError, match="got \\[1, -1\\]"):
        stage_starts(3, 100, [1, -1])


@pytest.mark.parametrize("gaps", [5, [0, 10], [5, 5]])
def test_a_last_stage_starting_at_or_after_the_end_is_refused(gaps) -> None:
    last = 10
    message = (
        f"the last stage would start at tick {last} >= ticks=10; "
        "use fewer stage ticks or more ticks"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        stage_starts(3, 10, gaps)
    assert stage_starts(3, 11, gaps)[-1] == last


def test_tensor_variances_are_zero_for_single_elements_only() -> None:
    state = {
        "one": torch.tensor([3.0]),
        "two": torch.tensor([1.0, 3.0]),
        "three": torch.tensor([1.0, 2.0, 3.0]),
    }
    assert tensor_variances(state, ["one", "two", "three"]) == {
        "one": 0.0,
        "two": 2.0,
        "three": 1.0,
    }


def test_sphere_variance_ratio_skips_tensors_without_variance() -> None:
    source = {"flat": torch.ones(4), "w": torch.tensor([0.0, 2.0])}
    dest = {"flat": torch.tensor([0.0, 4.0, 0.0, 4.0]), "w": torch.tensor([0.0, 4.0])}
    assert sphere_variance_ratio(source, dest, ["flat", "w"]) == 4.0
    with pytest.raises(
        ValueError,
        match="^no named tensor has a positive variance in the source state$",
    ):
        sphere_variance_ratio(source, dest, ["flat"])


def test_refinement_stops_when_the_moving_average_equals_the_threshold() -> None:
    """The stop rule is ``average <= threshold``: a first loss exactly on it stops at once."""
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(32)
    first = copy.deepcopy(model)
    opt = torch.optim.SGD(first.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    _, loss = refine_point(first, opt, x, y, ONE_STEP, gen)
    again = copy.deepcopy(model)
    opt = torch.optim.SGD(again.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    refine = Refine(lr=0.1, batch_size=8, r_min=1, r_max=5, threshold=loss)
    assert refine_point(again, opt, x, y, refine, gen) == (1, loss)


def test_refine_accepts_a_batch_of_one_and_refuses_a_zero_rate() -> None:
    assert Refine(batch_size=1).batch_size == 1
    with pytest.raises(ValueError, match="lr must be finite and > 0"):
        Refine(lr=0.0)


def test_refine_explains_a_threshold_that_is_not_a_finite_loss() -> None:
    message = (
        "threshold must be a finite loss >= 0, got nan (NaN or infinity would run "
        "every tick to r_max, or stop at once)"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        Refine(threshold=math.nan)


def test_compliance_sgd_zeroes_gradients_in_place_when_asked() -> None:
    model, _, _ = pair_states(MLP)
    opt = ComplianceSGD(model, 0.1, {}, compliance=False)
    opt.zero_grad(set_to_none=False)  # no gradient yet: nothing to zero
    assert all(p.grad is None for p in model.parameters())
    x, y = toy_tensors(8)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


# --- the refinement cap's warning ---------------------------------------------------------------


def test_capped_ticks_warn_how_many_and_how_far_above_from_the_callers_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(32)
    capped = Refine(lr=0.1, batch_size=8, r_min=1, r_max=1, threshold=0.01)
    sites = warning_sites(monkeypatch)
    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=4, step=0.5, refine=capped, jump_warn=1.0),
        persist=QUIET,
    )
    over = max(path.refine_loss[:-1]) - 0.01
    ((category, message, filename),) = [s for s in sites if "r_max" in s[1]]
    assert category is UserWarning and message == (
        "LLPF m2m: refinement stopped at its cap r_max=1 above the threshold 0.01 in 3 "
        f"of 4 ticks (moving-average loss up to {over:.3g} above it); those points "
        "are less refined than the rule asks: raise r_max or the learning rate, or "
        "use more ticks"
    )
    assert filename == HERE


def test_a_loss_exactly_on_the_threshold_is_not_capped(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """Same seed, one step a tick: the threshold set to the worst tick's loss."""
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(32)
    options = {"ticks": 3, "shrink": 0.1, "seed": 2}
    first = m2o(model, a, x, y, M2OSettings(refine=ONE_STEP, **options), persist=QUIET)
    worst = max(first.refine_loss)
    again = Refine(lr=0.1, batch_size=8, r_min=1, r_max=1, threshold=worst)
    second = m2o(model, a, x, y, M2OSettings(refine=again, **options), persist=QUIET)
    assert second.refine_loss == first.refine_loss
    assert not [w for w in recwarn.list if "r_max" in str(w.message)]


# --- m2o: refusals, targets and the out-of-ticks warning --------------------------------------------


@pytest.mark.parametrize("shrink", [0.0, 1.0, 1.5])
def test_m2o_refuses_a_shrink_outside_zero_one(shrink: float) -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    with pytest.raises(
        ValueError, match=re.escape(f"shrink must be in (0, 1), got {shrink}") + "$"
    ):
        m2o(model, a, x, y, M2OSettings(ticks=2, shrink=shrink), persist=QUIET)


def test_m2o_names_three_unknown_target_tensors_at_most() -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    targets = {name: 0.01 for name in ("u1", "u2", "u3", "u4", "linears.0.weight")}
    with pytest.raises(
        ValueError,
        match=re.escape("target_variance names unknown parameters ['u1', 'u2', 'u3']")
        + "$",
    ):
        m2o(
            model, a, x, y, M2OSettings(ticks=2, target_variance=targets), persist=QUIET
        )


def test_m2o_refuses_a_target_above_the_start_naming_it() -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    v = tensor_variances(a, ["linears.1.weight"])["linears.1.weight"]
    message = (
        "M2O only shrinks, but the target variance of 1 tensors is above the start's "
        f"(e.g. linears.1.weight: {2 * v:.3g} > {v:.3g}); give targets at most the "
        "start's variance, or grow=True"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        m2o(
            model,
            a,
            x,
            y,
            M2OSettings(ticks=2, target_variance={"linears.1.weight": 2 * v}),
            persist=QUIET,
        )


def test_m2o_accepts_targets_up_to_the_tolerance_above_the_start() -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    start = tensor_variances(a, NAMES)
    targets = {n: v * (1 + 0.01) for n, v in start.items()}
    path = m2o(
        model,
        a,
        x,
        y,
        M2OSettings(ticks=3, refine=FROZEN, target_variance=targets, target_tol=0.01),
        persist=QUIET,
    )
    assert path.ticks[0] == 0 and len(path.ticks) >= 2


def test_m2o_on_its_target_sphere_ends_after_one_tick(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """Targets equal to the start's variances, no tolerance: reached by the first move."""
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    targets = tensor_variances(a, NAMES)
    path = m2o(
        model,
        a,
        x,
        y,
        M2OSettings(ticks=5, refine=FROZEN, target_variance=targets, target_tol=0.0),
        persist=QUIET,
    )
    assert path.ticks == [0, 1]
    assert not recwarn.list


class Tiny(nn.Module):
    """A linear layer of two outputs, a LayerNorm and a single-number gain."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.norm = nn.LayerNorm(2)
        self.gain = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x.flatten(1))) * self.gain


def test_m2o_targets_only_movable_tensors_of_two_elements_or_more(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """The norm's and the scalar's targets are ignored; the two-element bias stops on its own."""
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.norm.weight.copy_(torch.tensor([0.5, 2.0]))
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    v = tensor_variances(start, ["lin.weight", "lin.bias", "norm.weight"])
    targets = {
        "lin.weight": 0.5 * v["lin.weight"],
        "lin.bias": 0.3 * v["lin.bias"],
        "norm.weight": 0.5 * v["norm.weight"],
        "gain": 0.5,
    }
    x, y = toy_tensors(16, in_shape=[4], n_classes=2)
    path = m2o(
        model,
        start,
        x,
        y,
        M2OSettings(ticks=30, shrink=0.1, refine=FROZEN, target_variance=targets),
        persist=QUIET,
    )
    end = path.states[-1]
    assert path.ticks[-1] < 30
    assert not recwarn.list
    for name in ("lin.weight", "lin.bias"):
        assert float(end[name].var()) == pytest.approx(targets[name], rel=0.011)
    assert torch.equal(end["norm.weight"], start["norm.weight"])
    assert float(end["gain"]) == pytest.approx(1.5 * 0.9 ** path.ticks[-1], rel=1e-5)


# (the target of H is below, of L above its start; both end one tick short of it)
OUT_OF_TICKS = {
    "worst-above": ("linears.0.weight", 1.8, "linears.1.weight", 0.5),
    "worst-below": ("linears.1.weight", 1.5, "linears.0.weight", 0.3),
}


@pytest.mark.parametrize("case", list(OUT_OF_TICKS))
def test_m2o_out_of_ticks_names_the_tensor_farthest_from_its_target(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    high, off_high, low, off_low = OUT_OF_TICKS[case]
    worst, ratio = (high, off_high) if off_high - 1 > 1 - off_low else (low, off_low)
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    v = tensor_variances(a, [high, low])
    targets = {high: v[high] * 0.81 / off_high, low: v[low] / 0.81 / off_low}
    sites = warning_sites(monkeypatch)
    m2o(
        model,
        a,
        x,
        y,
        M2OSettings(
            ticks=1, shrink=0.1, refine=FROZEN, target_variance=targets, grow=True
        ),
        persist=QUIET,
    )
    ((category, message, filename),) = [s for s in sites if "M2O" in s[1]]
    assert category is UserWarning and message == (
        "M2O ran out of ticks (1) before 2 tensors reached their target variance "
        f"(worst: {worst} at {ratio:.2f} x its target); the path ends off the target "
        "sphere: use more ticks or a larger shrink"
    )
    assert filename == HERE


# --- what m2m and m2o hand to the shared loop: defaults and checkpoint keys -----------------------


@pytest.fixture
def loop_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The keyword arguments of every ``run_loop`` call (which returns an empty path);
    the code's version reads ``"code"``."""
    calls: list[dict] = []

    def fake_loop(model, start, x, y, **options) -> LLPFPath:
        calls.append({"model": model, **options})
        return LLPFPath()

    monkeypatch.setattr(layerwise, "run_loop", fake_loop)
    monkeypatch.setattr(layerwise, "code_version", lambda *modules: "code")
    return calls


def test_m2m_defaults_reach_the_loop(loop_calls: list[dict]) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    m2m(model, a, b, x, y)
    (call,) = loop_calls
    assert (call["ticks"], call["seed"], call["record_every"]) == (100, 0, 5)
    assert call["refine"] == Refine() and call["phase"] == "m2m"
    assert call["final_state"] is b


def test_m2m_checkpoint_key_is_made_of_every_setting(loop_calls: list[dict]) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    refine = Refine(lr=0.2, batch_size=4, r_min=2, r_max=3, threshold=0.1)
    stages = [NAMES[2:4], NAMES[:2], NAMES[4:]]
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(
            ticks=7,
            refine=refine,
            stages=stages,
            stage_ticks=2,
            step=0.3,
            schedule="linear",
            seed=4,
            record_every=3,
            eps=1e-9,
        ),
    )
    settings = {  # every option but jump_warn, which only decides a warning
        "ticks": 7,
        "refine": asdict(refine),
        "stages": stages,
        "stage_ticks": 2,
        "all_at_once": False,
        "step": 0.3,
        "final_gap": 0.01,
        "schedule": "linear",
        "seed": 4,
        "record_every": 3,
        "eps": 1e-9,
    }
    items = [
        "m2m",
        repr(model),
        tensor_digest(a),
        tensor_digest(b),
        settings,
        tensor_digest(x, y),
        "code",
    ]
    assert loop_calls[0]["key"] == stable_hash(items, length=16)


def test_m2m_key_changes_with_the_ticks_and_the_data(loop_calls: list[dict]) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    fixed = {"all_at_once": True, "step": 0.5}
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=5, **fixed),
    )
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=6, **fixed),
    )
    m2m(
        model,
        a,
        b,
        x,
        y.flip(0),
        M2MSettings(ticks=5, **fixed),
    )
    m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=5, eps=1e-6, **fixed),
    )
    keys = [call["key"] for call in loop_calls]
    assert len(set(keys)) == 4 and all(len(k) == 16 for k in keys)


def test_m2o_defaults_reach_the_loop(loop_calls: list[dict]) -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    m2o(model, a, x, y)
    (call,) = loop_calls
    assert (call["ticks"], call["seed"], call["record_every"]) == (100, 0, 5)
    assert call["phase"] == "m2o" and call["memo"] == set()
    opt = call["make_opt"](model)
    assert isinstance(opt, ComplianceSGD) and opt.compliance is True
    assert opt.lr == Refine().lr
    assert call["after_move"](model) is None


def test_m2o_hands_its_compliance_setting_to_the_optimiser(
    loop_calls: list[dict],
) -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    m2o(
        model,
        a,
        x,
        y,
        M2OSettings(compliance=False),
    )
    assert loop_calls[0]["make_opt"](model).compliance is False


def test_m2o_checkpoint_key_is_made_of_every_setting(loop_calls: list[dict]) -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(16)
    refine = Refine(lr=0.2, batch_size=4, r_min=2, r_max=3, threshold=0.1)
    targets = {"linears.0.weight": 0.001}
    m2o(
        model,
        a,
        x,
        y,
        M2OSettings(
            ticks=7,
            shrink=0.1,
            refine=refine,
            compliance=False,
            target_variance=targets,
            target_tol=0.05,
            grow=True,
            seed=4,
            record_every=3,
        ),
    )
    settings = {
        "ticks": 7,
        "shrink": 0.1,
        "refine": asdict(refine),
        "compliance": False,
        "target_variance": targets,
        "target_tol": 0.05,
        "grow": True,
        "seed": 4,
        "record_every": 3,
    }
    items = [
        "m2o",
        repr(model),
        tensor_digest(a),
        settings,
        tensor_digest(x, y),
        "code",
    ]
    assert loop_calls[0]["key"] == stable_hash(items, length=16)
    assert loop_calls[0]["memo"] == set()


# --- hybrid: what each phase is given ------------------------------------------------------------


@pytest.fixture
def phase_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict]:
    """The arguments of hybrid's M2O and M2M calls (each returns a short fake path)."""
    calls: dict[str, dict] = {}
    ends = [{"at": torch.tensor(float(k))} for k in range(3)]

    def given(settings: Any) -> dict[str, Any]:
        return {f.name: getattr(settings, f.name) for f in fields(settings)}

    def fake_m2o(model, start, x, y, settings, **options) -> LLPFPath:
        calls["m2o"] = {"start": start, **given(settings), **options}
        return LLPFPath(
            ends, [0, 2, 3], [0, 4, 6], [0.0, 1.0, 2.0], [0.1] * 3, ["m2o"] * 3
        )

    def fake_m2m(model, start, dest, x, y, settings, **options) -> LLPFPath:
        calls["m2m"] = {"start": start, "dest": dest, **given(settings), **options}
        return LLPFPath([start, dest], [0, 1], [0, 2], [0.0, 1.0], [0.2], ["m2m"] * 2)

    monkeypatch.setattr(layerwise, "m2o", fake_m2o)
    monkeypatch.setattr(layerwise, "m2m", fake_m2m)
    calls["ends"] = ends
    return calls


def test_hybrid_defaults_reach_both_phases(phase_calls: dict) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    path = hybrid(model, a, b, x, y)
    first, second = phase_calls["m2o"], phase_calls["m2m"]
    assert first["start"] is a and first["grow"] is True
    assert (first["ticks"], first["shrink"], first["compliance"]) == (100, 0.02, True)
    assert (first["seed"], first["record_every"], first["target_tol"]) == (0, 5, 0.01)
    assert first["refine"] == Refine()
    assert first["target_variance"] == tensor_variances(b, NAMES)
    assert second["start"] is phase_calls["ends"][-1] and second["dest"] is b
    assert (second["ticks"], second["seed"], second["record_every"]) == (100, 0, 5)
    assert second["refine"] is first["refine"]
    assert path.ticks == [0, 2, 3, 4] and path.states[-1] is b


def test_hybrid_passes_each_setting_to_its_phase(phase_calls: dict) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    refine = Refine(lr=0.2)
    hybrid(
        model,
        a,
        b,
        x,
        y,
        m2o_ticks=7,
        shrink=0.1,
        m2m_ticks=9,
        refine=refine,
        compliance=False,
        seed=3,
        record_every=2,
        target_tol=0.05,
        step=0.3,
    )
    first, second = phase_calls["m2o"], phase_calls["m2m"]
    assert (first["ticks"], first["shrink"], first["refine"]) == (7, 0.1, refine)
    assert (first["compliance"], first["seed"], first["record_every"]) == (False, 3, 2)
    assert first["target_tol"] == 0.05
    assert (second["ticks"], second["refine"], second["seed"]) == (9, refine, 3)
    assert (second["record_every"], second["step"]) == (2, 0.3)


def test_hybrid_checks_both_modes_before_any_tick() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    nan = {**b, "linears.0.bias": torch.full_like(b["linears.0.bias"], math.nan)}
    with pytest.raises(ValueError, match="^state 1: tensor linears.0.bias"):
        hybrid(model, a, nan, x, y, m2o_ticks=1, refine=FROZEN, persist=QUIET)
    short = {k: v for k, v in b.items() if k != "linears.2.bias"}
    with pytest.raises(ValueError, match="^state 1 does not fit MLP"):
        hybrid(model, a, short, x, y, m2o_ticks=1, refine=FROZEN, persist=QUIET)


# --- checkpoints: the reached tensors, the checks of a loaded checkpoint ------------------------------


class Interrupt(RuntimeError):
    """Raised by a tick callback to stand for a killed run."""


def test_m2o_resumed_after_a_tensor_reached_its_target_keeps_it_reached(
    tmp_path: Path,
) -> None:
    model, a, _ = pair_states(MLP)
    x, y = toy_tensors(32)
    v = tensor_variances(a, ["linears.0.weight", "linears.1.weight"])
    options = {
        "ticks": 12,
        "shrink": 0.05,
        "refine": Refine(lr=0.05, batch_size=8, r_min=2, r_max=2, threshold=1e9),
        "target_variance": {
            "linears.0.weight": 0.8 * v["linears.0.weight"],
            "linears.1.weight": 0.5 * v["linears.1.weight"],
        },
        "record_every": 1,
    }
    full = m2o(model, a, x, y, M2OSettings(**options), persist=QUIET)
    assert 5 < len(full.ticks) - 1 < 12  # the second tensor arrives after the first

    def kill(tick: int, _: nn.Module) -> None:
        if tick == 4:
            raise Interrupt

    ckpt = tmp_path / "m2o"
    with pytest.raises(Interrupt):
        m2o(
            model,
            a,
            x,
            y,
            M2OSettings(**options),
            persist=Persist(ckpt, checkpoint_every=1, progress=False, on_tick=kill),
        )
    saved = torch.load(ckpt / "index.pt", weights_only=True)
    assert saved["memo"] == ["linears.0.weight"]
    resumed = m2o(
        model, a, x, y, M2OSettings(**options), persist=Persist(ckpt, progress=False)
    )
    assert resumed.ticks == full.ticks
    assert all(same_state(s, t) for s, t in zip(full.states, resumed.states))


def test_a_run_under_cached_only_names_the_llpf_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    monkeypatch.setenv(CACHED_ONLY, "1")
    with pytest.raises(NotCached, match="^LLPF path "):
        m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=2),
            persist=Persist(tmp_path / "p", progress=False),
        )


def test_the_progress_bar_names_the_phase(capsys: pytest.CaptureFixture) -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    m2o(model, a, x, y, M2OSettings(ticks=2, refine=ONE_STEP), persist=Persist())
    assert "LLPF m2o" in capsys.readouterr().err


def test_checkpoint_problems_name_the_field_and_its_type() -> None:
    model, a, _ = pair_states(MLP)
    path = {
        "ticks": [0],
        "grad_steps": [0],
        "seconds": [0.0],
        "refine_loss": [],
        "phase": ["m2m"],
    }
    good = {
        "steps": 0,
        "path": path,
        "current": None,
        "memo": [],
        "parts": {"state-000000.pt": a},
    }
    problem = ticks._checkpoint_problem
    assert problem(good, a) is None
    assert problem({**good, "steps": "3"}, a) == "steps is a str"
    assert problem({**good, "memo": {"x"}}, a) == "memo is a set"
    assert (
        problem({**good, "path": {**path, "phase": "m2m"}}, a)
        == "path does not hold the lists of a path"
    )
    wide = {**a, "linears.2.bias": torch.zeros(4)}
    assert (
        problem({**good, "parts": {"state-000000.pt": wide}}, a)
        == "part state-000000.pt has other tensors than the model"
    )


def test_shapes_of_a_state_are_none_for_what_is_no_tensor() -> None:
    state = {"w": torch.zeros(2, 3), "n": 5}
    assert ticks._shapes(state) == {"w": torch.Size([2, 3]), "n": None}
    assert ticks._shapes([1]) is None


# --- host and device ----------------------------------------------------------------------------


def test_m2m_and_refinement_keep_host_data_off_a_device_model() -> None:
    from tests.devicecheck import DEVICE, DeviceDiscipline

    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    host = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=3, step=0.5, refine=ONE_STEP, jump_warn=1.0),
        persist=QUIET,
    )
    with DeviceDiscipline():
        on_device = copy.deepcopy(model).to(DEVICE)
        path = m2m(
            on_device,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=3, step=0.5, refine=ONE_STEP, jump_warn=1.0),
            persist=QUIET,
        )
        opt = torch.optim.SGD(on_device.parameters(), lr=0.1)
        steps, _ = refine_point(
            on_device, opt, x, y, ONE_STEP, torch.Generator().manual_seed(0)
        )
    assert steps == 1
    for got, want in zip(path.states, host.states):
        for n in NAMES:
            torch.testing.assert_close(got[n].cpu(), want[n])


@pytest.mark.parametrize("jump_warn, warns", [(1.0, False), (0.99, True)])
def test_m2m_warns_only_of_a_jump_more_than_jump_warn_of_the_start_distance(
    monkeypatch: pytest.MonkeyPatch, jump_warn: float, warns: bool
) -> None:
    """Distances read 0.5 throughout: the jump is 100% of the start's distance (< 1)."""
    monkeypatch.setattr(layerwise, "state_distance", lambda *args: 0.5)
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m2m(
            model,
            a,
            b,
            x,
            y,
            M2MSettings(ticks=2, refine=FROZEN, jump_warn=jump_warn),
            persist=QUIET,
        )
    jumps = [w for w in caught if "straight jump over 100%" in str(w.message)]
    assert len(jumps) == int(warns)


def test_sphere_variance_ratio_is_the_mean_of_the_ratios() -> None:
    source = {"u": torch.tensor([0.0, 2.0]), "v": torch.tensor([0.0, 1.0, 2.0])}
    dest = {"u": torch.tensor([0.0, 4.0]), "v": torch.tensor([2.0, 3.0, 4.0])}
    # var(u): 2 -> 8 (ratio 4); var(v): 1 -> 1 (ratio 1)
    assert sphere_variance_ratio(source, dest, ["u", "v"]) == (4.0 + 1.0) / 2


# --- the refinement callback ----------------------------------------------------------------------


def test_m2m_hands_each_refined_point_to_on_refined_before_its_projection() -> None:
    """``on_refined(tick, model)`` sees the refined point; projecting it gives the recorded one."""
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(32)
    seen: list[tuple[int, dict[str, torch.Tensor]]] = []

    def record(tick: int, work: nn.Module) -> None:
        seen.append(
            (tick, {k: v.detach().clone() for k, v in work.state_dict().items()})
        )

    path = m2m(
        model,
        a,
        b,
        x,
        y,
        M2MSettings(ticks=4, step=0.5, refine=ONE_STEP, record_every=1, jump_warn=1.0),
        persist=QUIET,
        on_refined=record,
    )
    assert [tick for tick, _ in seen] == [1, 2, 3]  # not on the last tick
    assert path.ticks == [0, 1, 2, 3, 4]
    target = {n: float(a[n].float().var()) for n in NAMES}
    for (_, refined), recorded in zip(seen, path.states[1:4]):
        assert not same_state(refined, recorded)  # the projection still moves it
        work = copy.deepcopy(model)
        work.load_state_dict(refined)
        _project(work, target, 1e-12)
        for n in NAMES:
            torch.testing.assert_close(
                work.state_dict()[n], recorded[n], rtol=1e-5, atol=1e-6
            )


def test_m2m_places_the_data_on_the_device_once_not_every_tick() -> None:
    """``run_loop`` moves ``x`` and ``y`` to the model's device once for all ticks."""
    from tests.devicecheck import DEVICE, DeviceDiscipline

    class CopyCount(DeviceDiscipline):
        def __init__(self, watched: dict[str, torch.Tensor]) -> None:
            super().__init__()
            self.watched = watched
            self.copies = dict.fromkeys(watched, 0)

        def move(self, func, args: tuple, kwargs: dict, device: bool):  # noqa: ANN001, ANN201
            for name, tensor in self.watched.items():
                if device and args[0] is tensor and not self.on_device(tensor):
                    self.copies[name] += 1
            return super().move(func, args, kwargs, device)

    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with CopyCount({"x": x, "y": y}) as mode:
        m2m(
            copy.deepcopy(model).to(DEVICE),
            a,
            b,
            x,
            y,
            M2MSettings(ticks=4, step=0.5, refine=ONE_STEP, jump_warn=1.0),
            persist=QUIET,
        )
    assert mode.copies == {"x": 1, "y": 1}


def test_refinement_takes_r_min_steps_even_below_the_threshold() -> None:
    """The first batch loss is far below the threshold, yet ``r_min`` steps come first;
    the loss returned is the mean of the last ``r_min`` batch losses (a plain SGD loop)."""
    model, _, _ = pair_states(MLP)
    x, y = toy_tensors(32)
    refine = Refine(lr=0.1, batch_size=8, r_min=3, r_max=6, threshold=1e9)
    work = copy.deepcopy(model)
    opt = torch.optim.SGD(work.parameters(), lr=refine.lr)
    steps, loss = refine_point(
        work, opt, x, y, refine, torch.Generator().manual_seed(4)
    )
    plain = copy.deepcopy(model)
    plain.train()
    gen = torch.Generator().manual_seed(4)
    losses = []
    for _ in range(3):
        idx = torch.randint(len(x), (refine.batch_size,), generator=gen)
        batch_loss = nn.functional.cross_entropy(plain(x[idx]), y[idx])
        grads = torch.autograd.grad(batch_loss, list(plain.parameters()))
        with torch.no_grad():
            for p, g in zip(plain.parameters(), grads):
                p.sub_(refine.lr * g)
        losses.append(float(batch_loss.detach()))
    assert steps == 3
    assert loss == pytest.approx(sum(losses) / 3, rel=1e-6)
    for n in NAMES:
        torch.testing.assert_close(work.state_dict()[n], plain.state_dict()[n])


# --- settings refused where they are written ----------------------------------------------


@pytest.mark.parametrize("kind", [M2MSettings, M2OSettings])
@pytest.mark.parametrize(
    ("given", "named"), [(None, "NoneType"), ({"lr": 0.1}, "dict")]
)
def test_settings_refuse_a_refine_that_is_not_one(kind, given, named) -> None:
    with pytest.raises(TypeError, match=f"refine must be a Refine.*got {named};"):
        kind(refine=given)


def test_a_final_gap_whose_step_rounds_to_zero_is_refused() -> None:
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    settings = M2MSettings(ticks=10, final_gap=0.9999999999999999)
    with pytest.raises(ValueError, match="gives a step of 0: no tick would move"):
        m2m(model, a, b, x, y, settings, persist=QUIET)


def test_hybrid_checks_the_m2m_phase_before_the_m2o_phase_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_m2o(*args: Any, **kwargs: Any) -> LLPFPath:
        raise AssertionError("the M2O phase ran before M2M's settings were checked")

    monkeypatch.setattr(layerwise, "m2o", no_m2o)
    model, a, b = pair_states(MLP)
    x, y = toy_tensors(16)
    with pytest.raises(ValueError, match="schedule must be"):
        hybrid(model, a, b, x, y, schedule="cubic", persist=QUIET)
