"""Weight matching recovers hidden permutations and keeps the function."""

import torch

from wslib.core.matching import align, weight_matching
from wslib.core.models import build_model
from wslib.core.neurons import permute_state, random_permutations

MLP = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10, "widths": [24, 16]}
RESNET = {
    "name": "resnet1d",
    "in_shape": [1, 40],
    "n_classes": 10,
    "widths": [8, 16],
    "blocks_per_stage": 1,
}


def test_recovers_a_hidden_permutation() -> None:
    torch.manual_seed(0)
    for config in (MLP, RESNET):
        model = build_model(config)
        structure = model.neuron_structure()
        a = model.state_dict()
        b = permute_state(
            a,
            structure,
            random_permutations(structure, torch.Generator().manual_seed(1)),
        )
        aligned = align(a, b, structure)
        for k in a:
            assert torch.allclose(aligned[k].float(), a[k].float()), k


def test_alignment_keeps_the_function_and_moves_towards_a() -> None:
    torch.manual_seed(0)
    ma, mb = build_model(MLP), build_model(MLP)
    structure = ma.neuron_structure()
    a = {k: v.clone() for k, v in ma.state_dict().items()}
    b = {k: v.clone() for k, v in mb.state_dict().items()}
    aligned = align(a, b, structure)
    x = torch.randn(32, 1, 40)
    mb.eval()
    before = mb(x)
    mb.load_state_dict(aligned)
    assert torch.allclose(mb(x), before, atol=1e-5)

    def dist(s):
        return sum(((s[k] - a[k]) ** 2).sum() for k in a if a[k].is_floating_point())

    assert dist(aligned) < dist(b)


def test_identity_when_models_are_equal() -> None:
    model = build_model(MLP)
    structure = model.neuron_structure()
    perms = weight_matching(model.state_dict(), model.state_dict(), structure)
    for g in structure.groups:
        assert torch.equal(perms[g.name], torch.arange(g.size))
