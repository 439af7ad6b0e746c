"""bookkit/profile_values.py: a profile's values out of range are refused
before any notebook runs, naming the file, the chapter, the field and the range."""

from __future__ import annotations

from typing import Any

import pytest

from bookkit import profiles
from tests.conftest import PROFILES

WHERE = "notebooks/params/mine.yaml"

REFUSED = [
    ("01_symmetries", {"recipes": {"mlp": {"epochs": 0}}}, "recipes.mlp: recipe epochs = 0 trains nothing; give epochs >= 1"),
    ("01_symmetries", {"recipes": {"cnn": {"epoch": 3}}}, r"recipes.cnn: unknown recipe keys \['epoch'\]"),
    ("01_symmetries", {"width_recipe": {"lr": -0.1}}, r"width_recipe: recipe lr = -0.1 is outside \(0, inf\)"),
    ("05_llpf_spheres", {"recipe": {"momentum": 1.5}}, r"recipe: recipe momentum = 1.5 is outside \[0, 1\)"),
    ("01_symmetries", {"n_points": 0}, "n_points = 0 is a count .* give a value >= 1"),
    ("04_llpf_baselines", {"n_seeds": -2}, "n_seeds = -2 is a count"),
    ("03_llpf_m2m", {"llpf": {"mlp": {"ticks": 0}}}, "llpf.mlp.ticks = 0 counts LLPF ticks; give a value > 0"),
    ("03_llpf_m2m", {"llpf": {"mlp": {"lr": -0.05}}}, "llpf.mlp.lr = -0.05 counts a learning rate"),
    ("04_llpf_baselines", {"baselines": {"AutoNEB": {"lrs": [0.1, 0.0]}}}, r"baselines.AutoNEB.lrs\[1\] = 0.0 counts learning rates"),
    ("03_llpf_m2m", {"threshold_margin": -0.1}, "threshold_margin = -0.1 cannot be negative"),
    ("10_fusion_regimes", {"ridge": float("nan")}, "ridge = nan is nan; give a finite number"),
    ("07_pathcond_mlp", {"threshold": float("inf")}, "threshold = inf is inf; give a finite number"),
    ("01_symmetries", {"models": {"mlp": {"name": "mlp", "widths": [8, 0]}}}, r"models.mlp: model 'mlp' has widths \[8, 0\]; give positive integers"),
    ("03_llpf_m2m", {"models": {"t": {"name": "transformer1d", "depth": 0}}}, "models.t: model 'transformer1d' has depth 0"),
]  # fmt: skip


@pytest.mark.parametrize(("nb", "section", "message"), REFUSED)
def test_a_value_out_of_range_is_refused_by_name(
    nb: str, section: dict[str, Any], message: str
) -> None:
    with pytest.raises(profiles.UnknownParameter, match=message) as refused:
        profiles.section_parameters(nb, {nb: section}, WHERE)
    assert str(refused.value).startswith(f"{WHERE}, section {nb}: ")


ACCEPTED = [
    ("01_symmetries", {"recipes": {"mlp": {"epochs": 1, "weight_decay": 0.0}}}),
    ("03_llpf_m2m", {"threshold_margin": 0.0, "seed": 0}),
    ("01_symmetries", {"models": {"mlp": {"name": "mlp", "widths": []}}}),
    ("11_fusion_beyond", {"finetune_recipe": {"lr": 0.01}}),
]


@pytest.mark.parametrize(("nb", "section"), ACCEPTED)
def test_values_at_the_edge_of_their_range_are_accepted(
    nb: str, section: dict[str, Any]
) -> None:
    assert profiles.section_parameters(nb, {nb: section}, WHERE)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_book_s_profiles_are_in_range(profile: str) -> None:
    sections = profiles.load_profile(profile)
    for nb in profiles.available_notebooks():
        profiles.section_parameters(nb, sections, profile)
