"""Chapter 6's protocol: the explicit lifting of tiny networks, brute-force checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.kit import cnn1d
from tests.pathcond.tiny import LIFTED, TINY
from tests.pathcond.toy import BASE, RECIPE, toy_data
from wslib.core.configs import build_model
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


def test_tiny_lifting_counts_paths_and_keeps_phi(lifted):
    d, (h1, h2), o = 3, LIFTED["widths"], LIFTED["n_classes"]
    # input paths, paths from the biases of layers 1, 2 and the output layer
    assert lifted.n_paths == d * h1 * h2 * o + h1 * h2 * o + h2 * o + o
    assert lifted.n_params == sum(p.numel() for p in build_model(LIFTED).parameters())
    assert lifted.n_neurons == h1 + h2
    assert lifted.sweeps >= 1
    assert lifted.phi_change < 1e-10
    # the badly scaled network: PathCond did change the parameters
    assert not torch.allclose(lifted.before.jacobian, lifted.after.jacobian)


def test_path_rows_are_evenly_spaced_labelled_paths(lifted):
    rows = path_rows(lifted, LIFTED, n_rows=5)
    labels = mlp_path_labels([3, 4, 2, 2])
    step = lifted.n_paths // 5
    assert [r["path"] for r in rows] == labels[::step]
    assert rows[1]["Phi (before)"] == pytest.approx(float(lifted.before.phi[step]))
    assert rows[1]["Phi (after)"] == pytest.approx(rows[1]["Phi (before)"])


def test_lifting_spectra_of_p_and_g_agree_and_pathcond_evens_g(lifted):
    s = lifting_spectra(lifted)
    assert len(s["ev_before"]) == lifted.n_params - lifted.n_neurons
    assert np.all(np.diff(s["ev_before"]) <= 0)  # decreasing
    assert s["p_vs_g"] < 1e-8
    assert s["cond_before"] == pytest.approx(s["ev_before"][0] / s["ev_before"][-1])
    assert s["cond_after"] == pytest.approx(s["ev_after"][0] / s["ev_after"][-1])
    assert s["amgm_before"] == pytest.approx(am_over_gm(s["g_before"]))
    assert 1.0 <= s["amgm_after"] < s["amgm_before"]


def test_diag_g_check_reports_brute_force_agreement():
    archs = {"mlp": TINY["mlp"], "cnn": TINY["conv_avg"]}
    rows = diag_g_check(archs)
    assert [r["architecture"] for r in rows] == ["mlp", "cnn"]
    assert (
        rows[0]["paths (incl. structural zeros)"]
        == 5 * 4 * 3 * 3 + 4 * 3 * 3 + 3 * 3 + 3
    )
    assert rows[0]["parameters"] == 5 * 4 + 4 + 4 * 3 + 3 + 3 * 3 + 3
    assert all(r["max rel. error"] < 1e-10 for r in rows)


def test_function_check_finds_outputs_unchanged_in_both_modes():
    archs = {"bn": cnn1d([4, 4], in_shape=[1, 16], n_classes=4, bn=True)}
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
        got = tiny_lifting(LIFTED, spread=1.0, seed=seed)
        seed_everything(seed)
        net = build_model(LIFTED).double()
        structure = net.neuron_structure()
        scales = random_scales(
            structure, spread=1.0, generator=torch.Generator().manual_seed(seed)
        )
        net.load_state_dict(rescale_state(net.state_dict(), structure, scales))
        ref = explicit_path_lifting(net, LIFTED["in_shape"])
        torch.testing.assert_close(got.before.jacobian, ref.jacobian)
