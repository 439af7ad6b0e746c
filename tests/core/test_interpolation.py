"""Straight paths: endpoints are the modes, barrier arithmetic, BatchNorm statistics."""

import re

import numpy as np
import pytest
import torch

from tests.kit import SIGNAL, drawn_models, mlp, resnet1d, toy_tensors
from wslib.core.configs import build_model
from wslib.core.interpolation import (
    barrier,
    check_path_ts,
    evaluate_states,
    lerp_state,
    linear_path,
)
from wslib.core.norms import reset_bn_stats
from wslib.core.train import evaluate

RESNET = resnet1d([8, 16], **SIGNAL, blocks_per_stage=1)
MLP = mlp([8], **SIGNAL)


def test_endpoints_are_the_modes() -> None:
    ma, mb = drawn_models(RESNET, 2, train=True)
    a, b = ma.state_dict(), mb.state_dict()
    for k, v in lerp_state(a, b, 0.0).items():
        assert torch.equal(v, a[k])
    for k, v in lerp_state(a, b, 1.0).items():
        assert torch.equal(v, b[k]) or not v.is_floating_point()


def test_only_named_tensors_move() -> None:
    ma, mb = build_model(RESNET), build_model(RESNET)
    a, b = ma.state_dict(), mb.state_dict()
    first = [f"stem.{name}" for name, _ in ma.stem.named_parameters()]
    mid = lerp_state(a, b, 0.5, first)
    for k in a:
        if k in first:
            assert torch.allclose(mid[k], 0.5 * (a[k] + b[k]))
        else:
            assert torch.equal(mid[k], a[k])


def test_mismatched_models_get_a_clear_error() -> None:
    small = build_model(mlp([8], **SIGNAL))
    big = build_model(mlp([16], **SIGNAL))
    with pytest.raises(ValueError, match="shape"):
        lerp_state(small.state_dict(), big.state_dict(), 0.5)
    a = {f"only_a{i}": torch.zeros(1) for i in range(5)} | {"both": torch.zeros(1)}
    b = {"both": torch.zeros(1), "only_b": torch.zeros(1)}
    message = (
        "the two models have different tensors (only in a: ['only_a0', 'only_a1', "
        "'only_a2'], only in b: ['only_b']); interpolate models of the same architecture"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        lerp_state(a, b, 0.5)


def test_barrier() -> None:
    assert barrier([1.0, 3.0, 2.0]) == pytest.approx(1.5)
    assert barrier([0.5, 0.2, 0.5]) == pytest.approx(0.0)


def test_bn_stats_are_recomputed_exactly() -> None:
    x, _ = toy_tensors(96, [1, 40], 10)
    model = build_model(RESNET)
    reset_bn_stats(model, x, batch_size=32)
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    stem_out = {}
    hook = bn.register_forward_hook(lambda m, i, o: stem_out.setdefault("in", i[0]))
    model.train()
    model(x)
    hook.remove()
    expected = stem_out["in"].mean(dim=(0, 2))
    assert torch.allclose(bn.running_mean, expected, atol=1e-5)


def test_path_ends_match_model_evaluation() -> None:
    x, y = toy_tensors(96, [1, 40], 10)
    ma, mb = drawn_models(RESNET, 2, train=True)
    res = linear_path(
        ma, ma.state_dict(), mb.state_dict(), np.linspace(0, 1, 3), x, y, progress=False
    )
    ref = build_model(RESNET)
    ref.load_state_dict(mb.state_dict())
    reset_bn_stats(ref, x)
    assert res["train_loss"][-1] == pytest.approx(evaluate(ref, x, y)[0], rel=1e-5)
    assert res["barrier"] == pytest.approx(barrier(res["train_loss"]))
    assert evaluate_states(ma, [ma.state_dict()], x, y, progress=False)[
        "train_acc"
    ].shape == (1,)


def test_bn_statistics_come_from_the_training_data_only() -> None:
    """Every evaluated point's BatchNorm statistics are the training set's, the
    test set's metrics included (a test set of another distribution shows it)."""
    x, y = toy_tensors(96, [1, 40], 10)
    xt, yt = 3.0 + 2.0 * x[:48], y[:48]
    torch.manual_seed(0)
    model = build_model(RESNET)
    res = evaluate_states(model, [model.state_dict()], x, y, xt, yt, progress=False)
    ref = build_model(RESNET)
    ref.load_state_dict(model.state_dict())
    reset_bn_stats(ref, x)
    assert res["train_loss"][0] == pytest.approx(evaluate(ref, x, y)[0], rel=1e-5)
    assert res["test_loss"][0] == pytest.approx(evaluate(ref, xt, yt)[0], rel=1e-5)


# --- a path is a path: its points lie between its ends, from 0 to 1 ---------------------------


@pytest.mark.parametrize("t", [-0.5, 1.5, float("nan"), float("inf")])
def test_a_point_outside_the_segment_is_refused(t: float) -> None:
    a, b = (m.state_dict() for m in drawn_models(MLP, 2))
    message = (
        rf"^interpolation parameter t = {re.escape(repr(t))} is not in \[0, 1\]; a "
        r"point between two models has 0 <= t <= 1 \(0: the first, 1: the second\)$"
    )
    with pytest.raises(ValueError, match=message):
        lerp_state(a, b, t)


@pytest.mark.parametrize("t", [0, 0.0, 1, 1.0, 0.25, np.float32(0.5)])
def test_points_of_the_segment_are_accepted(t) -> None:
    a, b = (m.state_dict() for m in drawn_models(MLP, 2))
    lerp_state(a, b, t)


@pytest.mark.parametrize(
    ("ts", "problem"),
    [
        ([-0.5, 0.0, 1.0, 2.0], "the first point must be 0 and the last 1"),
        ([0.0, 0.5], "the first point must be 0 and the last 1"),
        ([0.2, 1.0], "the first point must be 0 and the last 1"),
        ([0.0, 0.7, 0.3, 1.0], "the points must increase"),
        ([0.0, 0.5, 0.5, 1.0], "the points must increase"),
        ([0.0, float("nan"), 1.0], "the points must be finite"),
        ([0.0], "a path needs at least two points"),
        ([], "a path needs at least two points"),
        ([[0.0, 1.0]], "a path needs at least two points"),
    ],
)
def test_a_path_runs_from_0_to_1_increasing(ts, problem) -> None:
    full = rf"^ts = {re.escape(repr(np.asarray(ts).tolist()))}: {problem}.*; e\.g\. np\.linspace\(0, 1, 11\)$"
    with pytest.raises(ValueError, match=full):
        check_path_ts(ts)
    a, b = drawn_models(MLP, 2)
    x, y = toy_tensors(16, MLP["in_shape"], MLP["n_classes"])
    with pytest.raises(ValueError, match=problem):
        linear_path(a, a.state_dict(), b.state_dict(), ts, x, y, progress=False)


def test_a_path_s_points_are_returned_as_given() -> None:
    ts = np.linspace(0, 1, 5)
    np.testing.assert_array_equal(check_path_ts(list(ts)), ts)
    assert check_path_ts([0, 1]).dtype == np.float64  # whole numbers too


def test_linear_path_moves_only_the_named_tensors() -> None:
    ma, mb = build_model(RESNET), build_model(RESNET)
    a, b = ma.state_dict(), mb.state_dict()
    first = [f"stem.{name}" for name, _ in ma.stem.named_parameters()]
    x, y = toy_tensors(16, [1, 40], 10)
    res = linear_path(
        ma, a, b, [0.0, 0.5, 1.0], x, y, names=iter(first), progress=False
    )
    states = [lerp_state(a, b, t, first) for t in (0.0, 0.5, 1.0)]
    expected = evaluate_states(ma, states, x, y, progress=False)
    np.testing.assert_array_equal(res["train_loss"], expected["train_loss"])
    whole = linear_path(ma, a, b, [0.0, 0.5, 1.0], x, y, progress=False)
    assert not np.array_equal(res["train_loss"], whole["train_loss"])


def test_a_test_set_needs_its_labels() -> None:
    model = build_model(MLP)
    x, y = toy_tensors(8, MLP["in_shape"], MLP["n_classes"])
    message = "^x_test is given without y_test; give both or neither$"
    with pytest.raises(ValueError, match=message):
        evaluate_states(model, [model.state_dict()], x, y, x, None, progress=False)


def test_a_path_s_data_go_to_the_device_once() -> None:
    """Evaluating many states of a BatchNorm net copies each data tensor to the
    device once (not once for the BatchNorm reset and once for the loss, at every
    state); the numbers are the host's."""
    from tests.devicecheck import DeviceDiscipline, to_device

    class CountingUploads(DeviceDiscipline):
        def __init__(self) -> None:
            super().__init__()
            self.uploads: list[int] = []

        def move(self, func, args, kwargs, device):  # noqa: ANN001
            if device and not self.on_device(args[0]):
                self.uploads.append(id(args[0]))
            return super().move(func, args, kwargs, device)

    config = {
        "name": "cnn1d",
        "in_shape": [1, 12],
        "n_classes": 3,
        "channels": [4],
        "bn": True,
    }
    torch.manual_seed(0)
    model = build_model(config)
    x, y = toy_tensors(24, [1, 12], 3)
    xt, yt = toy_tensors(12, [1, 12], 3, seed=1)
    states = [model.state_dict()] * 4
    host = evaluate_states(model, states, x, y, xt, yt, progress=False)
    with CountingUploads() as mode:
        dev = evaluate_states(to_device(model), states, x, y, xt, yt, progress=False)
    for tensor in (x, y, xt, yt):
        assert mode.uploads.count(id(tensor)) == 1
    for key, values in host.items():
        np.testing.assert_array_equal(dev[key], values)


def test_a_point_between_a_device_model_and_a_host_model_lies_on_the_device() -> None:
    from tests.devicecheck import DEVICE, DeviceDiscipline

    a, b = (m.state_dict() for m in drawn_models(MLP, 2))
    with DeviceDiscipline():
        on_device = {k: v.to(DEVICE) for k, v in a.items()}
        mid = lerp_state(on_device, b, 0.5)
        assert all(v.device == DEVICE for v in mid.values())


@pytest.mark.parametrize("losses", [[], [0.3], np.zeros((2, 2))])
def test_a_barrier_needs_a_path(losses) -> None:
    with pytest.raises(ValueError, match="a barrier needs the losses along a path"):
        barrier(losses)


@pytest.mark.parametrize("t", ["0.5", True, None])
def test_a_point_that_is_no_number_is_refused(t) -> None:
    a, b = (m.state_dict() for m in drawn_models(MLP, 2))
    with pytest.raises(ValueError, match="is not a number in"):
        lerp_state(a, b, t)


def test_the_names_only_in_b_are_listed_three_at_most() -> None:
    a = {"both": torch.zeros(1)}
    b = {f"only_b{i}": torch.zeros(1) for i in range(5)} | {"both": torch.zeros(1)}
    message = (
        "the two models have different tensors (only in a: [], only in b: "
        "['only_b0', 'only_b1', 'only_b2']); interpolate models of the same architecture"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        lerp_state(a, b, 0.5)


@pytest.mark.parametrize("progress", [True, False])
def test_the_path_evaluation_shows_a_named_bar_that_it_clears(
    monkeypatch, progress
) -> None:
    """A bar labelled "evaluate path", hidden without ``progress``, not left behind."""
    import wslib.core.interpolation as interpolation

    bars = []

    def bar(iterable, **kwargs):
        bars.append(kwargs)
        return iterable

    monkeypatch.setattr(interpolation, "tqdm", bar)
    model = build_model(mlp([4], **SIGNAL))
    x, y = toy_tensors(8, [1, 40], 10)
    evaluate_states(model, [model.state_dict()], x, y, progress=progress)
    assert bars == [{"desc": "evaluate path", "disable": not progress, "leave": False}]
