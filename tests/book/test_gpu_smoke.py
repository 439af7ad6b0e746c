"""The gpu-smoke profile: the gpu profile's shape, run on the CPU in every test run.

The gpu profile itself never runs here (it needs a GPU and days); the
gpu-smoke profile has its data sets (synthetic files in their real formats),
its architectures at tiny width, augmentation where it has it and bf16 in
one recipe per chapter, so the code paths the gpu profile takes (2-D inputs,
VGG-11, ResNet-18, the ViT, CIFAR-NV, the CIFAR and MNIST readers,
channels-last-free image batches, autocast) run in every ``make test``.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from bookkit import synthetic_data
from tests.conftest import NOTEBOOKS, ROOT, background_result

PARAMS = ROOT / "notebooks" / "params"
PATH_SETTINGS = ("llpf", "baselines", "m2o_settings", "m2m_settings")


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((PARAMS / f"{name}.yaml").read_text())


def _walk(tree: Any, key: str) -> set[Any]:
    """Every value of ``key`` anywhere in a nested parameter tree."""
    found: set[Any] = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == key and not isinstance(v, (dict, list)):
                found.add(v)
            found |= _walk(v, key)
    elif isinstance(tree, list):
        for v in tree:
            found |= _walk(v, key)
    return found


def test_every_architecture_and_data_set_of_the_gpu_profile_appears() -> None:
    gpu, smoke = _load("gpu"), _load("gpu-smoke")
    assert sorted(smoke) == NOTEBOOKS
    for nb, section in gpu.items():
        mine = smoke[nb]
        assert _walk(section, "name") <= _walk(mine, "name"), nb
        if True in _walk(section, "augment"):
            assert True in _walk(mine, "augment"), f"{nb}: no augmented recipe"
    for nb in NOTEBOOKS:
        assert "bf16" in _walk(smoke[nb], "precision") or nb not in gpu, nb
    for nb, section in gpu.items():  # bf16 paths: LLPF, the curve, AutoNEB, M2O
        for key in PATH_SETTINGS:
            used = _walk(section.get(key), "precision")
            assert used <= _walk(smoke[nb].get(key), "precision"), (nb, key)


def _data_sets(tree: Any) -> set[str]:
    """The data sets of a parameter tree: the values of ``data``, ``cost_data``, ..."""
    names = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == "data" or k.endswith("_data"):
                names.add(v["name"])
            names |= _data_sets(v)
    return names


def test_every_data_set_is_written_by_the_synthetic_writer() -> None:
    used = _data_sets(_load("gpu")) - {"mnist1d"}
    assert used <= set(synthetic_data.SIZES)


@pytest.fixture(scope="module")
def gpu_smoke_run() -> list[Any]:
    """Every chapter in the gpu-smoke profile, in a fresh checkout, each passing
    only if its work ran on the CPU it was sent to (the background job
    ``gpu-smoke`` of ``tests/conftest.py``, run beside the other tests)."""
    return background_result("gpu-smoke")


@pytest.mark.slow
def test_every_chapter_runs_in_the_gpu_smoke_profile(gpu_smoke_run) -> None:
    failed = [f"{st.notebook}: {st.error}" for st in gpu_smoke_run if not st.passed]
    assert not failed, "\n".join(failed)
    assert [st.notebook for st in gpu_smoke_run] == NOTEBOOKS
