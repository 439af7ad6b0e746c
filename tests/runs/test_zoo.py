"""The model cache: hit, miss, corrupted and mismatched checkpoints."""

import shutil
import warnings

import numpy as np
import pytest
import torch

from tests.kit import SIGNAL, mlp, same_state
from wslib.runs.zoo import Zoo, normalise_config

CONFIG = {
    "data": {"name": "mnist1d"},
    "model": mlp([16], **SIGNAL),
    "recipe": {"epochs": 1, "batch_size": 256},
    "seed": 0,
}


@pytest.fixture(scope="module")
def mnist1d_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture()
def zoo(tmp_path, mnist1d_root) -> Zoo:
    return Zoo(tmp_path / "zoo", data_root=mnist1d_root, device="cpu", progress=False)


def _same(m1: torch.nn.Module, m2: torch.nn.Module) -> bool:
    return same_state(m1.state_dict(), m2.state_dict())


def test_miss_then_hit(zoo: Zoo) -> None:
    first = zoo.get(CONFIG)
    assert (zoo.trained, zoo.loaded) == (1, 0)
    second = zoo.get(CONFIG)
    assert (zoo.trained, zoo.loaded) == (1, 1)
    assert _same(first, second)


def test_checkpoint_loads_with_weights_only(zoo: Zoo) -> None:
    zoo.get(CONFIG)
    ckpt = torch.load(zoo.path(normalise_config(CONFIG)), weights_only=True)
    assert ckpt["key"]["config"]["seed"] == 0


def test_checkpoint_name_depends_on_every_part(zoo: Zoo) -> None:
    base = zoo.path(normalise_config(CONFIG))
    for key, value in [
        ("seed", 1),
        ("recipe", {"epochs": 2}),
        ("split", {"kind": "iid", "n_parts": 2, "part": 0}),
    ]:
        assert zoo.path(normalise_config({**CONFIG, key: value})) != base


def test_corrupted_checkpoint_is_retrained(zoo: Zoo) -> None:
    good = zoo.get(CONFIG)
    zoo.path(normalise_config(CONFIG)).write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable"):
        again = zoo.get(CONFIG)
    assert zoo.trained == 2 and _same(good, again)


def test_a_checkpoint_whose_weights_changed_fails_its_checksum(zoo: Zoo) -> None:
    good = zoo.get(CONFIG)
    path = zoo.path(normalise_config(CONFIG))
    ckpt = torch.load(path, weights_only=True)
    weight = next(k for k in ckpt["state_dict"] if k.endswith("weight"))
    ckpt["state_dict"][weight][0, 0] += 1.0  # same tensors, one value changed
    torch.save(ckpt, path)
    with pytest.warns(UserWarning, match="fails its checksum"):
        again = zoo.get(CONFIG)
    assert zoo.trained == 2 and _same(good, again)


def test_mismatched_checkpoint_is_retrained(zoo: Zoo) -> None:
    zoo.get(CONFIG)
    path = zoo.path(normalise_config(CONFIG))
    ckpt = torch.load(path, weights_only=True)
    ckpt["state_dict"] = {k: v[:1] for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, path)
    with pytest.warns(UserWarning, match="does not fit"):
        zoo.get(CONFIG)
    ckpt["key"] = {}
    torch.save(ckpt, path)
    with pytest.warns(UserWarning, match="another run"):
        zoo.get(CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zoo.get(CONFIG)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("list", "another run"),
        ("tensor", "another run"),
        ("no-key", "another run"),
        ("no-state-dict", "does not fit"),
        ("state-dict-list", "does not fit"),
        ("state-dict-missing-tensor", "does not fit"),
    ],
)
def test_checkpoint_of_the_wrong_shape_is_retrained(
    zoo: Zoo, damage: str, message: str
) -> None:
    """A file that loads but is not a checkpoint of this config: warning, retrain."""
    good = zoo.get(CONFIG)
    path = zoo.path(normalise_config(CONFIG))
    ckpt = torch.load(path, weights_only=True)
    if damage == "list":
        ckpt = [ckpt["key"], ckpt["state_dict"]]
    elif damage == "tensor":
        ckpt = torch.zeros(3)
    elif damage == "no-key":
        del ckpt["key"]
    elif damage == "no-state-dict":
        del ckpt["state_dict"]
    elif damage == "state-dict-list":
        ckpt["state_dict"] = list(ckpt["state_dict"].values())
    else:
        ckpt["state_dict"].popitem()
    torch.save(ckpt, path)
    with pytest.warns(UserWarning, match=message):
        again = zoo.get(CONFIG)
    assert zoo.trained == 2 and _same(good, again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zoo.get(CONFIG)  # the retrained checkpoint replaced the bad one
    assert zoo.loaded == 1


def test_checkpoint_is_keyed_by_training_data_content(tmp_path, mnist1d_root) -> None:
    """The same config on other data (here: shuffled labels, same size) trains anew."""
    config = normalise_config(CONFIG)
    zoo = Zoo(tmp_path / "zoo", data_root=mnist1d_root, device="cpu", progress=False)
    zoo.dataset(config["data"])  # generates the cached arrays
    other = tmp_path / "other"
    shutil.copytree(mnist1d_root, other)
    (cached,) = (other / "mnist1d").glob("*.npz")
    with np.load(cached) as f:
        arrays = dict(f)
    arrays["y"] = np.random.default_rng(0).permutation(arrays["y"])
    with open(cached, "wb") as f:
        np.savez(f, **arrays)
    shuffled = Zoo(tmp_path / "zoo", data_root=other, device="cpu", progress=False)
    assert shuffled.path(config) != zoo.path(config)


def test_bad_config_gets_a_clear_error(zoo: Zoo) -> None:
    with pytest.raises(ValueError, match="missing keys"):
        zoo.get({"model": CONFIG["model"]})
    with pytest.raises(ValueError, match="unknown split kind"):
        zoo.get({**CONFIG, "split": {"kind": "bogus"}})


def test_same_config_same_model_in_a_fresh_cache(tmp_path, mnist1d_root) -> None:
    first = Zoo(
        tmp_path / "a", data_root=mnist1d_root, device="cpu", progress=False
    ).get(CONFIG)
    second = Zoo(
        tmp_path / "b", data_root=mnist1d_root, device="cpu", progress=False
    ).get(CONFIG)
    assert _same(first, second)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"n_classes": 12},
            "has n_classes 12, but the data set 'mnist1d' has 10 classes",
        ),
        (
            {"n_classes": 6},
            "has n_classes 6, but the data set 'mnist1d' has 10 classes",
        ),
        (
            {"in_shape": [1, 28]},
            r"has in_shape \[1, 28\], but the data set 'mnist1d' has inputs of shape \[1, 40\]",
        ),
    ],
)
def test_a_model_that_does_not_fit_its_data_set_is_refused(
    zoo: Zoo, change, message
) -> None:
    """Before any training: nothing is cached for a model of the wrong shape."""
    with pytest.raises(ValueError, match=message):
        zoo.get({**CONFIG, "model": {**CONFIG["model"], **change}})
    assert not list(zoo.root.rglob("*.pt"))


def test_path_names_the_file_get_writes(zoo: Zoo) -> None:
    """``path`` of a config without its defaults (split, recipe) is ``get``'s file."""
    bare = {k: v for k, v in CONFIG.items() if k != "recipe"}
    zoo.get(bare)
    assert zoo.path(bare).is_file()
    assert zoo.path(bare) == zoo.path(normalise_config(bare))
