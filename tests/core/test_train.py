"""Training: determinism per seed, learning, clear errors."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.kit import SIGNAL, cnn2d, mlp
from wslib.core.configs import build_model
from wslib.core.train import (
    Recipe,
    all_nan,
    evaluate,
    fit,
    make_optimizer,
    model_device,
    optimizer_step,
    pick_device,
    seed_everything,
)

MLP = mlp([32], **SIGNAL)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 40, generator=g)
    return x, (x[:, 0, :10].sum(1) > 0).long()


def _train(seed: int) -> tuple[dict, dict]:
    x, y = _data()
    seed_everything(seed)
    model = build_model(MLP)
    hist = fit(
        model, x, y, Recipe(epochs=3, batch_size=32, lr=0.05), seed=seed, progress=False
    )
    return hist, model.state_dict()


def test_same_seed_same_result() -> None:
    (h1, s1), (h2, s2) = _train(3), _train(3)
    assert h1 == h2
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_other_seed_other_result() -> None:
    (h1, _), (h2, _) = _train(3), _train(4)
    assert h1 != h2


def test_fit_learns() -> None:
    x, y = _data()
    seed_everything(0)
    model = build_model(MLP)
    before = evaluate(model, x, y)[0]
    fit(model, x, y, Recipe(epochs=20, batch_size=32, lr=0.05), progress=False)
    assert evaluate(model, x, y)[0] < 0.5 * before


def test_augment_needs_images() -> None:
    x, y = _data()
    with pytest.raises(ValueError, match="augment"):
        fit(build_model(MLP), x, y, Recipe(epochs=1, augment=True), progress=False)


def test_pick_device() -> None:
    assert pick_device("cpu").type == "cpu"
    assert pick_device().type in ("cpu", "cuda")


def test_fit_reads_the_device_once_per_epoch_not_per_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Host synchronisations (``Tensor.item``) per epoch, whatever the step count."""
    calls = []
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: calls.append(1) or item(t))
    x, y = torch.randn(256, 1, 12), torch.randint(0, 3, (256,))
    model = build_model(mlp([8], [1, 12]))
    fit(model, x, y, Recipe(epochs=2, batch_size=16), progress=False)  # 16 steps/epoch
    assert len(calls) == 2 * 2  # loss and accuracy, once per epoch


def test_data_meets_the_model_on_its_device() -> None:
    model = build_model(mlp([8], [1, 12]))
    assert model_device(model) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters


def test_bf16_recipe_trains_under_autocast_and_unknown_precision_is_named() -> None:
    x, y = torch.randn(64, 1, 12), torch.randint(0, 3, (64,))
    config = mlp([8], [1, 12])
    histories = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_model(config)
        recipe = Recipe(epochs=2, precision=precision)
        histories[precision] = fit(model, x, y, recipe, progress=False)["loss"]
    assert all(torch.isfinite(torch.tensor(histories["bf16"])))
    assert histories["bf16"] != histories["fp32"]  # autocast did run
    assert next(model.parameters()).dtype == torch.float32  # weights stay float32
    with pytest.raises(ValueError, match="unknown precision 'fp16'; valid"):
        Recipe(precision="fp16")


def test_the_run_seed_reaches_the_shuffling_and_the_augmentation() -> None:
    """Same initial weights, another ``fit`` seed: other batches, other crops and flips."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(64, 3, 8, 8, generator=g), torch.arange(64) % 4
    cnn = cnn2d([4], [3, 8, 8], 4)
    results = {}
    for seed, augment in ((0, False), (1, False), (0, True), (1, True)):
        torch.manual_seed(5)  # the same initial weights every time
        model = build_model(cnn)
        recipe = Recipe(epochs=1, batch_size=16, lr=0.1, augment=augment)
        results[seed, augment] = fit(model, x, y, recipe, seed=seed, progress=False)[
            "loss"
        ]
    assert results[0, False] != results[1, False]
    assert results[0, True] != results[1, True] != results[1, False]
    torch.manual_seed(5)
    model = build_model(cnn)
    torch.manual_seed(123)  # the global stream must not matter: the run's seed decides
    recipe = Recipe(epochs=1, batch_size=16, lr=0.1, augment=True)
    assert fit(model, x, y, recipe, seed=1, progress=False)["loss"] == results[1, True]


def test_stop_at_ends_after_the_first_epoch_that_reaches_it() -> None:
    x, y = _data()
    recipe = Recipe(epochs=12, batch_size=32, lr=0.1)
    seed_everything(0)
    full = fit(build_model(MLP), x, y, recipe, seed=0, progress=False)
    hit = next(i for i, a in enumerate(full["acc"]) if a >= 0.8)
    assert hit + 1 < recipe.epochs, "the threshold must be reached early to test"
    seed_everything(0)
    short = fit(build_model(MLP), x, y, recipe, seed=0, progress=False, stop_at=0.8)
    assert short["acc"] == full["acc"][: hit + 1]  # same run, cut after the hit
    seed_everything(0)
    never = fit(build_model(MLP), x, y, recipe, seed=0, progress=False, stop_at=1.1)
    assert never == full


def test_give_up_after_ends_an_unfinished_run_as_the_start_of_the_full_one() -> None:
    x, y = _data()
    recipe = Recipe(epochs=8, batch_size=32, lr=0.1, schedule="cosine")
    seed_everything(0)
    full = fit(build_model(MLP), x, y, recipe, seed=0, progress=False)
    seed_everything(0)
    cut = fit(
        build_model(MLP),
        x,
        y,
        recipe,
        seed=0,
        progress=False,
        stop_at=1.1,
        give_up_after=3,
    )
    assert cut["loss"] == full["loss"][:3]  # the schedule still spans 8 epochs
    seed_everything(0)
    first = fit(
        build_model(MLP),
        x,
        y,
        recipe,
        seed=0,
        progress=False,
        stop_at=0.0,
        give_up_after=3,
    )
    assert len(first["acc"]) == 1  # reaching the threshold still ends it first


def _diverging(give_up_after: int | None, *, every_epoch: bool) -> tuple[dict, int]:
    """A run at a rate that turns every weight NaN: its history and forward passes."""
    x, y = _data()
    seed_everything(0)
    model = build_model(MLP)
    steps = []
    model.register_forward_hook(lambda *_: steps.append(1))
    hist = fit(
        model,
        x,
        y,
        Recipe(epochs=12, batch_size=32, lr=1e4),
        progress=False,
        on_epoch=(lambda *_: None) if every_epoch else None,
        stop_at=None if give_up_after is None else 0.99,
        give_up_after=give_up_after,
    )
    assert all_nan(model)
    return hist, len(steps)


@pytest.mark.parametrize("give_up_after", [None, 7])
def test_a_diverged_run_repeats_its_first_nan_epoch_without_training_it(
    give_up_after: int | None,
) -> None:
    quick, quick_steps = _diverging(give_up_after, every_epoch=False)
    full, full_steps = _diverging(give_up_after, every_epoch=True)
    assert len(full["acc"]) == (give_up_after or 12)
    assert quick["acc"] == full["acc"]
    assert math.isnan(full["loss"][-1])
    np.testing.assert_array_equal(quick["loss"], full["loss"])  # NaN == NaN here
    assert quick_steps <= 2 * full_steps / len(full["acc"])  # the rest not computed


def test_all_nan_needs_every_weight_nan() -> None:
    model = build_model(MLP)
    assert not all_nan(model)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
        assert all_nan(model)
        next(model.parameters()).view(-1)[0] = 0.0
    assert not all_nan(model)


@pytest.mark.parametrize(
    ("stop_at", "give_up_after", "words"),
    [(None, 3, "needs stop_at"), (0.9, 0, "epoch >= 1")],
)
def test_give_up_after_is_refused_without_stop_at_or_below_one(
    stop_at, give_up_after, words
) -> None:
    x, y = _data()
    with pytest.raises(ValueError, match=words):
        fit(
            build_model(MLP),
            x,
            y,
            Recipe(epochs=2, batch_size=32),
            progress=False,
            stop_at=stop_at,
            give_up_after=give_up_after,
        )


@pytest.mark.parametrize(
    "recipe",
    [
        Recipe(epochs=3, lr=0.1, momentum=0.0, weight_decay=0.0),
        Recipe(epochs=3, lr=0.05, momentum=0.9, weight_decay=5e-3, schedule="cosine"),
    ],
)
def test_the_cpu_sgd_step_is_bit_identical_to_torch_sgd(recipe: Recipe) -> None:
    x, y = _data()
    models = [build_model(MLP) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [make_optimizer(m, recipe) for m in models]
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 3) for o in opts]
    zero_grad, step = optimizer_step(opts[1], torch.device("cpu"))
    for _ in range(3):
        for start in range(0, 64, 16):
            for model, zero, move in zip(
                models,
                (lambda: opts[0].zero_grad(set_to_none=True), zero_grad),
                (opts[0].step, step),
                strict=True,
            ):
                loss = torch.nn.functional.cross_entropy(
                    model(x[start : start + 16]), y[start : start + 16]
                )
                zero()
                loss.backward()
                move()
        if recipe.schedule == "cosine":
            for sched in scheds:
                sched.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    torch_state, our_state = (o.state_dict()["state"] for o in opts)
    assert torch_state.keys() == our_state.keys()  # momentum buffers, saved alike
    for k, v in torch_state.items():
        assert v.keys() == our_state[k].keys()
        if v.get("momentum_buffer") is not None:
            assert torch.equal(v["momentum_buffer"], our_state[k]["momentum_buffer"])


def test_other_optimizers_keep_their_own_step() -> None:
    model = build_model(MLP)
    adam = make_optimizer(model, Recipe(optimizer="adam"))
    assert optimizer_step(adam, torch.device("cpu"))[1] == adam.step
    nesterov = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    assert optimizer_step(nesterov, torch.device("cpu"))[1] == nesterov.step
    sgd = make_optimizer(model, Recipe())
    assert optimizer_step(sgd, torch.device("meta"))[1] == sgd.step


def test_fit_records_the_device_it_ran_on(monkeypatch) -> None:
    """``devices_used`` lists where fits really ran (a results file stores it)."""
    from wslib.core import train as train_module
    from wslib.runs.results import environment

    monkeypatch.setattr(train_module, "_DEVICES_USED", set())
    assert train_module.devices_used() == [] == environment()["devices_used"]
    model = nn.Linear(3, 2)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    train_module.fit(model, x, y, Recipe(epochs=1, batch_size=4), progress=False)
    assert train_module.devices_used() == ["cpu"] == environment()["devices_used"]


@pytest.mark.parametrize("labels", [[0, 1, 7], [-1, 0, 1]])
def test_labels_the_model_cannot_score_are_named(labels) -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 4))
    x, y = torch.randn(3, 3), torch.tensor(labels)
    with pytest.raises(
        ValueError, match="but the model has 4 outputs; give it n_classes"
    ):
        fit(model, x, y, Recipe(epochs=1, batch_size=3), progress=False)
    assert model.training  # the probe restored its mode


def _reference_augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Image by image: the same draws (flips, then the two shifts), a flip of the
    width axis, a zero border of 4 pixels, an h x w window at the shift."""
    n, c, h, w = x.shape
    flips = torch.rand(n, generator=generator) < 0.5
    shifts = torch.randint(0, 9, (2, n), generator=generator)
    out = torch.empty_like(x)
    for i in range(n):
        image = x[i].flip(2) if flips[i] else x[i]
        padded = torch.zeros(c, h + 8, w + 8, dtype=x.dtype)
        padded[:, 4 : 4 + h, 4 : 4 + w] = image
        dy, dx = int(shifts[0, i]), int(shifts[1, i])
        out[i] = padded[:, dy : dy + h, dx : dx + w]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_augmentation_is_a_flip_and_a_crop_of_each_image(seed: int) -> None:
    """Against a loop over the images with the same random draws."""
    from wslib.core.train import augment_images

    x = torch.randn(7, 2, 5, 6, generator=torch.Generator().manual_seed(100 + seed))
    got = augment_images(x, torch.Generator().manual_seed(seed))
    expected = _reference_augment(x, torch.Generator().manual_seed(seed))
    assert torch.equal(got, expected)


def test_augmentation_needs_images() -> None:
    from wslib.core.train import augment_images

    message = "^augment=True needs images of shape \\(N, C, H, W\\); turn it off for 1-D data$"
    with pytest.raises(ValueError, match=message):
        augment_images(torch.zeros(4, 1, 40), torch.Generator())


# --- found by mutation testing (make mutation MODULE=core/train) -------------------------------


def test_a_label_equal_to_the_number_of_outputs_is_refused_with_the_count_needed() -> (
    None
):
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 4))
    x, y = torch.randn(3, 3), torch.tensor([0, 2, 4])
    message = (
        "^labels run from 0 to 4, but the model has 4 outputs; give it n_classes = "
        r"the data set's number of classes \(at least 5\)$"
    )
    with pytest.raises(ValueError, match=message):
        fit(model, x, y, Recipe(epochs=1, batch_size=3), progress=False)


def test_give_up_after_one_epoch_is_allowed_and_the_messages_are_whole() -> None:
    from wslib.core.train import check_give_up

    check_give_up(0.5, 1)
    check_give_up(None, None)
    with pytest.raises(
        ValueError, match="^give_up_after must be an epoch >= 1, got 0$"
    ):
        check_give_up(0.5, 0)
    message = (
        "^give_up_after needs stop_at: a run gives up on reaching stop_at; "
        "pass stop_at, or leave give_up_after None$"
    )
    with pytest.raises(ValueError, match=message):
        check_give_up(None, 3)


def test_the_callbacks_receive_the_epoch_and_the_model() -> None:
    model = build_model(MLP)
    x, y = _data()
    epochs: list[tuple[int, nn.Module]] = []
    steps: list[nn.Module] = []
    fit(
        model,
        x,
        y,
        Recipe(epochs=3, batch_size=64),
        progress=False,
        on_epoch=lambda epoch, m: epochs.append((epoch, m)),
        on_step=steps.append,
    )
    assert [e for e, _ in epochs] == [0, 1, 2]
    assert (
        all(m is model for _, m in epochs) and steps and all(m is model for m in steps)
    )


def test_a_loss_function_gets_the_outputs_and_targets_and_accuracy_is_nan() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    target = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))
    seen = []

    def mse(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        seen.append((out.shape, t.shape))
        return ((out - t) ** 2).mean()

    history = fit(
        model, x, target, Recipe(epochs=2, batch_size=8), progress=False, loss_fn=mse
    )
    assert seen[0] == (torch.Size([8, 2]), torch.Size([8, 2]))
    assert all(math.isnan(a) for a in history["acc"])
    assert all(math.isfinite(v) for v in history["loss"])


def test_seed_everything_seeds_numpy_with_the_seed_modulo_2_to_the_32() -> None:
    big = 2**40 + 12345
    seed_everything(big)
    drawn = np.random.rand(3)
    np.random.seed(big % 2**32)
    np.testing.assert_array_equal(drawn, np.random.rand(3))
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic


def test_unshuffled_batches_run_in_order_on_the_cpu() -> None:
    from wslib.core.train import batches

    got = list(batches(7, 3))
    assert [b.tolist() for b in got] == [[0, 1, 2], [3, 4, 5], [6]]
    assert all(b.device.type == "cpu" for b in got)
    shuffled = torch.cat(
        list(batches(7, 3, generator=torch.Generator().manual_seed(0)))
    )
    assert sorted(shuffled.tolist()) == list(range(7))


def test_augmentation_on_a_device_uses_the_device_and_equals_the_host() -> None:
    """On the stand-in device (tests.devicecheck) every index lives where the
    images do; a host tensor mixed in is refused, as CUDA refuses it."""
    from tests.devicecheck import DEVICE, DeviceDiscipline
    from wslib.core.train import augment_images

    x = torch.randn(5, 2, 4, 4, generator=torch.Generator().manual_seed(3))
    host = augment_images(x, torch.Generator().manual_seed(7))
    with DeviceDiscipline():
        on_device = augment_images(x.to(DEVICE), torch.Generator().manual_seed(7))
        assert on_device.device == DEVICE
        got = on_device.cpu()
    assert torch.equal(got, host)
