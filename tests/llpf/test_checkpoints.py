"""LLPF path checkpoints: keyed by the data's content, damaged files are run again.

``_Run.load`` is private, so every case goes through :func:`m2m` with
``checkpoint=`` a file that the test overwrites.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from wslib.core.models import build_model
from wslib.llpf.layerwise import Refine, m2m
from wslib.llpf.path import LLPFPath

TICKS = 3
REFINE = Refine(lr=0.05, batch_size=16, r_min=2, r_max=3, threshold=0.0)
MLP = {"name": "mlp", "in_shape": [1, 6], "n_classes": 3, "widths": [5]}


def setting() -> tuple[torch.nn.Module, dict, dict, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(MLP)
    torch.manual_seed(1)
    dest = build_model(MLP).state_dict()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(48, 1, 6, generator=gen)
    y = torch.randint(0, 3, (48,), generator=gen)
    return model, model.state_dict(), dest, x, y


def find(ckpt: Path, x: torch.Tensor, y: torch.Tensor) -> tuple[LLPFPath, int]:
    """The path from the checkpointed run and the number of ticks this call ran."""
    model, start, dest, _, _ = setting()
    ticks: list[int] = []
    path = m2m(
        model,
        start,
        dest,
        x,
        y,
        ticks=TICKS,
        refine=REFINE,
        checkpoint=ckpt,
        on_tick=lambda tick, _: ticks.append(tick),
        progress=False,
    )
    return path, len(ticks)


def same_path(p: LLPFPath, q: LLPFPath) -> bool:
    return p.ticks == q.ticks and all(
        torch.equal(s[k], t[k]) for s, t in zip(p.states, q.states) for k in s
    )


def test_finished_run_is_loaded_not_run_again(tmp_path: Path) -> None:
    *_, x, y = setting()
    ckpt = tmp_path / "path.pt"
    first, ran = find(ckpt, x, y)
    assert ran == TICKS
    again, ran = find(ckpt, x, y)
    assert ran == 0 and same_path(first, again)


def test_shuffled_labels_of_the_same_length_run_again(tmp_path: Path) -> None:
    """The key holds the data's content, not its length."""
    *_, x, y = setting()
    ckpt = tmp_path / "path.pt"
    find(ckpt, x, y)
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    assert not torch.equal(shuffled, y)
    with pytest.warns(UserWarning, match="another run"):
        _, ran = find(ckpt, x, shuffled)
    assert ran == TICKS


def _drop(field: str) -> Callable[[dict], dict]:
    return lambda saved: {k: v for k, v in saved.items() if k != field}


def _set(field: str, value: object) -> Callable[[dict], dict]:
    return lambda saved: {**saved, field: value}


DAMAGES: dict[str, Callable[[dict], object]] = {
    "list": lambda saved: list(saved.values()),
    "tensor": lambda saved: torch.zeros(2),
    "no-key": _drop("key"),
    "no-tick": _drop("tick"),
    "no-path": _drop("path"),
    "no-current": _drop("current"),
    "no-gen-state": _drop("gen_state"),
    "path-list": _set("path", [1, 2]),
    "path-missing-field": lambda saved: {
        **saved,
        "path": {k: v for k, v in saved["path"].items() if k != "states"},
    },
    "current-list": _set("current", [torch.zeros(2)]),
    "current-empty": _set("current", {}),
    "gen-state-list": _set("gen_state", [1, 2]),
    "gen-state-short": lambda saved: {**saved, "gen_state": saved["gen_state"][:8]},
    "tick-string": _set("tick", "3"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_checkpoint_of_the_wrong_shape_is_run_again(
    tmp_path: Path, damage: str
) -> None:
    """A file that loads but is not a whole checkpoint: warning, the run starts again."""
    *_, x, y = setting()
    ckpt = tmp_path / "path.pt"
    first, _ = find(ckpt, x, y)
    torch.save(DAMAGES[damage](torch.load(ckpt, weights_only=True)), ckpt)
    with pytest.warns(UserWarning, match="path checkpoint"):
        again, ran = find(ckpt, x, y)
    assert ran == TICKS and same_path(first, again)
