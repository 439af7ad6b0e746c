"""The trained-model cache ("zoo").

A model is identified by the hash of its full config::

    {"data": {"name": "mnist1d", ...},        # wslib.core.data.load_dataset arguments
     "split": {"kind": "full"}                 # or iid / dirichlet / shards + n_parts, part, ...
     "model": {"name": "mlp", ...},            # wslib.core.configs.build_model config
     "recipe": {"epochs": 30, ...},            # wslib.core.recipes.Recipe fields
     "seed": 0}

A trained model is an entry of the store (:mod:`wslib.runs.store`) whose key
is the config, the version of the modules that determine a trained model
(:data:`TRAINING_CODE`: models, neurons, training and data code) and the
training data's content, so an edit of that code or regenerated data trains
anew. The first request trains the model and writes ``<root>/<hash>.pt``;
later requests load it with ``torch.load(weights_only=True)``. A checkpoint
that cannot be read, was written for another key, does not fit the model or
fails the checksum of its tensors is never used: it is retrained with a
warning that names the file.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from wslib.core import data as wdata
from wslib.core.configs import build_model, check_fits_data
from wslib.core.files import code_version, tensor_digest
from wslib.core.train import Recipe, evaluate, fit, pick_device, seed_everything
from wslib.core.workspace import workspace
from wslib.runs.store import Entry, Payload, cached, keyed

SPLITS = {  # split kind -> required keys
    "full": (),
    "iid": ("n_parts", "part"),
    "dirichlet": ("n_parts", "part", "alpha"),
    "shards": ("n_parts", "part"),
}
CONFIG_KEYS = ("data", "split", "model", "recipe", "seed")
#: The modules whose source keys a trained model.
TRAINING_CODE = (
    "wslib.core.configs",
    "wslib.core.data",
    "wslib.core.models",
    "wslib.core.pooling",
    "wslib.core.neurons",
    "wslib.core.seeds",
    "wslib.core.train",
    "wslib.core.recipes",
    "wslib.runs.zoo",
)


def split_indices(y: torch.Tensor, split: dict[str, Any]) -> np.ndarray | None:
    """Training indices of one part of a split (``None`` for the full training set)."""
    kind = split["kind"]
    if kind == "full":
        return None
    y_np, n_parts, seed = y.numpy(), split["n_parts"], split.get("seed", 0)
    if kind == "iid":
        parts = wdata.iid_split(y_np, n_parts, seed)
    elif kind == "dirichlet":
        parts = wdata.dirichlet_split(y_np, n_parts, split["alpha"], seed)
    else:
        parts = wdata.shard_split(y_np, n_parts, seed)
    return parts[split["part"]]


def check_split(split: dict[str, Any]) -> None:
    """Raise a clear error for an unknown split kind or missing split keys."""
    kind = split.get("kind")
    if kind not in SPLITS:
        raise ValueError(f"unknown split kind {kind!r}; valid: {list(SPLITS)}")
    missing = [k for k in SPLITS[kind] if k not in split]
    if missing:
        raise ValueError(f"split {kind!r} needs keys {missing} (and optionally 'seed')")
    if kind != "full" and not 0 <= split["part"] < split["n_parts"]:
        raise ValueError(
            f"split part {split['part']} is not in range(n_parts={split['n_parts']})"
        )


class Zoo:
    """Load-or-train cache of models under ``root`` (default: the workspace's
    ``data/zoo``), data sets read from ``data_root`` (default: its ``data``)."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        data_root: str | Path | None = None,
        device: str | None = None,
        progress: bool = True,
    ) -> None:
        ws = workspace()
        self.root = ws.zoo if root is None else ws.path(root)
        self.data_root = ws.data if data_root is None else ws.path(data_root)
        self.device = pick_device(device)
        self.progress = progress
        self._datasets: dict[str, wdata.Dataset] = {}
        self._digests: dict[str, str] = {}
        self.trained = 0
        self.loaded = 0

    def dataset(self, data_config: dict[str, Any]) -> wdata.Dataset:
        """The data set a config names, loaded once per zoo."""
        key = json.dumps(data_config, sort_keys=True)
        if key not in self._datasets:
            options = {k: v for k, v in data_config.items() if k != "name"}
            self._datasets[key] = wdata.load_dataset(
                data_config["name"], root=self.data_root, **options
            )
        return self._datasets[key]

    def data_digest(self, data_config: dict[str, Any]) -> str:
        """Hash of the training data's content (computed once per zoo)."""
        key = json.dumps(data_config, sort_keys=True)
        if key not in self._digests:
            ds = self.dataset(data_config)
            self._digests[key] = tensor_digest(ds.x_train, ds.y_train)
        return self._digests[key]

    def entry(self, config: dict[str, Any]) -> Entry:
        """The store's entry of ``config``: config, training code and data content."""
        key = {
            "config": config,
            "code": code_version(*TRAINING_CODE),
            "data": self.data_digest(config["data"]),
        }
        return keyed(self.root, key, "model")

    def path(self, config: dict[str, Any]) -> Path:
        """Checkpoint file of ``config`` (see :meth:`entry`): the file :meth:`get` writes."""
        return self.entry(normalise_config(config)).path

    def get(self, config: dict[str, Any]) -> nn.Module:
        """The trained model for ``config`` (eval mode, on the zoo's device)."""
        config = normalise_config(config)
        ds = self.dataset(config["data"])
        check_fits_data(
            config["model"], tuple(ds.x_train.shape[1:]), ds.n_classes, ds.name
        )
        model = build_model(config["model"]).to(self.device)
        trained = []

        def train() -> Payload:
            trained.append(1)
            return self._train(config)

        # A stored checkpoint is loaded into the model by its check (_fits);
        # only a model trained here still needs its weights.
        stored = cached(self.entry(config), train, lambda s: _fits(model, s))
        if trained:
            model.load_state_dict(stored["state_dict"])
        self.trained += len(trained)
        self.loaded += 1 - len(trained)
        return model.eval()

    def _train(self, config: dict[str, Any]) -> Payload:
        """Train the model of ``config``; what the zoo stores of it."""
        ds = self.dataset(config["data"])
        idx = split_indices(ds.y_train, config["split"])
        x, y = (
            (ds.x_train, ds.y_train)
            if idx is None
            else (ds.x_train[idx], ds.y_train[idx])
        )
        seed_everything(config["seed"])
        model = build_model(config["model"]).to(self.device)
        recipe = Recipe.from_dict(config["recipe"])
        history = fit(
            model,
            x,
            y,
            recipe,
            seed=config["seed"],
            device=self.device,
            progress=self.progress,
        )
        test_loss, test_acc = evaluate(model, ds.x_test, ds.y_test)
        return {
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "history": history,
            "test": {"loss": test_loss, "acc": test_acc},
        }


def _fits(model: nn.Module, stored: Payload) -> str | None:
    """Load the stored weights into ``model``; what keeps them from fitting, if anything."""
    try:
        model.load_state_dict(stored["state_dict"])
    except (RuntimeError, KeyError, TypeError, AttributeError) as err:
        return f"does not fit the model: {str(err).splitlines()[0]}"
    return None


def normalise_config(config: dict[str, Any]) -> dict[str, Any]:
    """Check a zoo config and fill the defaults that belong to a model's identity."""
    missing = [k for k in ("data", "model", "seed") if k not in config]
    unknown = [k for k in config if k not in CONFIG_KEYS]
    if missing or unknown:
        raise ValueError(
            f"zoo config: missing keys {missing}, unknown keys {unknown}; "
            f"expected {list(CONFIG_KEYS)} (split and recipe have defaults)"
        )
    out = copy.deepcopy(config)
    out.setdefault("split", {"kind": "full"})
    check_split(out["split"])
    out["recipe"] = Recipe.from_dict(out.get("recipe", {})).to_dict()
    return out
