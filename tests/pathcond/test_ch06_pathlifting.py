"""Chapter 6's protocol: the explicit lifting of tiny networks, brute-force checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.pathcond.toy import BASE, RECIPE, toy_data
from wslib.core.models import build_model
from wslib.core.neurons import random_scales, rescale_state
from wslib.core.train import Recipe, seed_everything
from wslib.pathcond.ch06_pathlifting import (
    diag_g_check,
    function_check,
    lifting_spectra,
    path_rows,
    tiny_lifting,
    trajectories,
)
from wslib.pathcond.grid import mlp_config
from wslib.pathcond.lifting import explicit_path_lifting, mlp_path_labels
from wslib.pathcond.rescaling import am_over_gm

TINY = {"name": "mlp", "in_shape": [1, 3], "n_classes": 2, "widths": [4, 2]}


@pytest.fixture(scope="module")
def tiny():
    return tiny_lifting(TINY, spread=1.0, seed=0)


def test_tiny_lifting_counts_paths_and_keeps_phi(tiny):
    d, (h1, h2), o = 3, TINY["widths"], TINY["n_classes"]
    # input paths, paths from the biases of layers 1, 2 and the output layer
    assert tiny.n_paths == d * h1 * h2 * o + h1 * h2 * o + h2 * o + o
    assert tiny.n_params == sum(p.numel() for p in build_model(TINY).parameters())
    assert tiny.n_neurons == h1 + h2
    assert tiny.sweeps >= 1
    assert tiny.phi_change < 1e-10
    # the badly scaled network: PathCond did change the parameters
    assert not torch.allclose(tiny.before.jacobian, tiny.after.jacobian)


def test_path_rows_are_evenly_spaced_labelled_paths(tiny):
    rows = path_rows(tiny, TINY, n_rows=5)
    labels = mlp_path_labels([3, 4, 2, 2])
    step = tiny.n_paths // 5
    assert [r["path"] for r in rows] == labels[::step]
    assert rows[1]["Phi (before)"] == pytest.approx(float(tiny.before.phi[step]))
    assert rows[1]["Phi (after)"] == pytest.approx(rows[1]["Phi (before)"])


def test_lifting_spectra_of_p_and_g_agree_and_pathcond_evens_g(tiny):
    s = lifting_spectra(tiny)
    assert len(s["ev_before"]) == tiny.n_params - tiny.n_neurons
    assert np.all(np.diff(s["ev_before"]) <= 0)  # decreasing
    assert s["p_vs_g"] < 1e-8
    assert s["cond_before"] == pytest.approx(s["ev_before"][0] / s["ev_before"][-1])
    assert s["cond_after"] == pytest.approx(s["ev_after"][0] / s["ev_after"][-1])
    assert s["amgm_before"] == pytest.approx(am_over_gm(s["g_before"]))
    assert 1.0 <= s["amgm_after"] < s["amgm_before"]


def test_diag_g_check_reports_brute_force_agreement():
    archs = {
        "mlp": {"name": "mlp", "in_shape": [1, 5], "n_classes": 3, "widths": [4, 3]},
        "cnn": {
            "name": "cnn1d",
            "in_shape": [1, 8],
            "n_classes": 3,
            "channels": [2, 3],
            "kernel_size": 3,
            "pool": "avg",
        },
    }
    rows = diag_g_check(archs)
    assert [r["architecture"] for r in rows] == ["mlp", "cnn"]
    assert (
        rows[0]["paths (incl. structural zeros)"]
        == 5 * 4 * 3 * 3 + 4 * 3 * 3 + 3 * 3 + 3
    )
    assert rows[0]["parameters"] == 5 * 4 + 4 + 4 * 3 + 3 + 3 * 3 + 3
    assert all(r["max rel. error"] < 1e-10 for r in rows)


def test_function_check_finds_outputs_unchanged_in_both_modes():
    archs = {
        "bn": {
            "name": "cnn1d",
            "in_shape": [1, 16],
            "n_classes": 4,
            "channels": [4, 4],
            "bn": True,
        }
    }
    (row,) = function_check(archs)
    assert row["architecture"] == "bn" and row["sweeps"] >= 1
    assert row["rel. change (train)"] < 1e-5 and row["rel. change (eval)"] < 1e-5


def test_trajectories_start_from_the_same_loss():
    ds = toy_data()
    config = mlp_config(BASE, [16, 16])
    runs = trajectories(config, ["baseline", "pathcond"], ds, Recipe(**RECIPE))
    assert list(runs) == ["baseline", "pathcond"]
    first = runs["baseline"]["initial_loss"]
    assert runs["pathcond"]["initial_loss"] == pytest.approx(first, rel=1e-5)
    assert math.log(3) * 0.5 < first < math.log(3) * 2  # a fresh 3-class classifier
    assert all(len(r["loss"]) == RECIPE["epochs"] for r in runs.values())
    assert runs["baseline"]["loss"] != runs["pathcond"]["loss"]


def test_tiny_lifting_scales_its_seed_s_model_by_its_seed_s_scales():
    for seed in (1, 2):
        got = tiny_lifting(TINY, spread=1.0, seed=seed)
        seed_everything(seed)
        net = build_model(TINY).double()
        structure = net.neuron_structure()
        scales = random_scales(
            structure, spread=1.0, generator=torch.Generator().manual_seed(seed)
        )
        net.load_state_dict(rescale_state(net.state_dict(), structure, scales))
        ref = explicit_path_lifting(net, TINY["in_shape"])
        torch.testing.assert_close(got.before.jacobian, ref.jacobian)
