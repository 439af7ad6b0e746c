"""Helpers shared by the tests of resumable LLPF baselines (curves, AutoNEB)."""

from __future__ import annotations

import torch
from torch import nn

from tests.kit import mlp, seeded_model
from wslib.core.files import stable_hash, tensor_digest

MLP = mlp([5], in_shape=[1, 6])


class Stop(Exception):
    """Ends a run once its key is known."""


class Kill(Exception):
    """Stands for a killed job."""


def endpoints(config: dict = MLP) -> tuple[nn.Module, dict, dict]:
    """Model A (seed 0, eval mode) and the states of A and B (seed 1)."""
    a, b = seeded_model(config, 0), seeded_model(config, 1)
    return a, a.state_dict(), b.state_dict()


def data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 1, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def same_states(p, q) -> None:
    assert len(p.states) == len(q.states)
    for s, r in zip(p.states, q.states):
        assert s.keys() == r.keys()
        for k in s:
            assert torch.equal(s[k], r[k]), k


def reference_key(model: nn.Module, a, b, x, y, **config) -> str:
    """The key written out: digests of the endpoints, data and model, and the config."""
    signature = {
        "structure": repr(model),
        "params": [[n, list(p.shape)] for n, p in model.named_parameters()],
        "buffers": tensor_digest(dict(model.named_buffers())),
    }
    return stable_hash(
        {
            "a": tensor_digest(a),
            "b": tensor_digest(b),
            "data": tensor_digest(x, y),
            "model": signature,
            **config,
        },
        length=16,
    )
