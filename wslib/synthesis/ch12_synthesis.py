"""Chapter 12's protocols: the four questions, their runs and their verdicts.

- :func:`alignment_run`: question 1 (:func:`~wslib.synthesis.alignment.alignment_study`
  over every pair of modes of each architecture);
- :func:`pair_study`: questions 2 and 3 for one pair of parents: KF fusion
  (both retrofits) fine-tuned, the straight line and the LLPF path from the
  fused model to each parent and between the parents; PathCond's criterion
  along the LLPF path, the straight line and a Bezier curve between them;
- :func:`gauge_fusion`: question 4, HF / KF with and without the PathCond
  gauge on the base models;
- each of the three is a cached step (:mod:`wslib.runs.steps`): its key is
  the content of its arguments, the modes' weights and the data included;
- :func:`compare`: the verdict rule shared by the four questions: a paired
  difference over seeds is an effect only when its mean is larger than its
  standard deviation.

The verdicts in words, the tables and the metrics are in
:mod:`wslib.synthesis.ch12_results`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from wslib.core.data import Dataset
from wslib.core.interpolation import PathTs, lerp_state, linear_path
from wslib.core.matching import align
from wslib.core.neurons import neuron_structure
from wslib.core.seeds import derive_seed
from wslib.core.train import Recipe, evaluate, fit
from wslib.fusion import GradientConfig, fuse, fuse_by
from wslib.fusion.baselines import MethodName
from wslib.fusion.levels import RetrofitName
from wslib.llpf import CurveSettings, M2MSettings, evaluate_path, fit_curve, m2m
from wslib.llpf.protocols import PathRun, PathSetup
from wslib.runs.resumable import Persist
from wslib.runs.steps import cached_step
from wslib.runs.verdicts import LOSS_MARGIN, Verdict, decide_paired
from wslib.runs.zoo import Zoo
from wslib.synthesis.alignment import alignment_study, pathcond_gauge, with_state
from wslib.synthesis.conditioning import path_conditioning

KF_VARIANTS: tuple[RetrofitName, ...] = ("linear", "gradient")
PATHS = ("LLPF", "straight line", "Bezier")
WORDS = {
    "lower": "lower",
    "higher": "higher",
    "same": "no different in practice",
    "none": "undecided",
}
"""The verdict words of :func:`compare` (keys) and how the chapter writes them."""
ACCURACY_MARGIN = 0.01
"""1 point of test accuracy (accuracies here are fractions)."""


# Groups of models to fuse, by regime name (each group: the models of one fusion);
# a comment, not a docstring: the API page would show the alias's parts as names
Regimes = Mapping[str, Sequence[Sequence[nn.Module]]]


def random_subset(ds: Dataset, n_train: int, n_test: int, seed: int) -> Dataset:
    """``ds`` with ``n_train`` training and ``n_test`` test examples drawn at random."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"need n_train, n_test >= 1, got {n_train}, {n_test}")
    gen = torch.Generator().manual_seed(seed)
    tr = torch.randperm(len(ds.y_train), generator=gen)[:n_train]
    te = torch.randperm(len(ds.y_test), generator=gen)[:n_test]
    return Dataset(
        ds.name,
        ds.x_train[tr],
        ds.y_train[tr],
        ds.x_test[te],
        ds.y_test[te],
        ds.n_classes,
    )


def fusion_set(
    ds: Dataset, per_class: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` training examples of every class, drawn with ``seed``."""
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    gen = torch.Generator().manual_seed(seed)
    idx = [
        i[torch.randperm(len(i), generator=gen)[:per_class]]
        for i in (torch.nonzero(ds.y_train == c).flatten() for c in range(ds.n_classes))
    ]
    chosen = torch.cat(idx)
    return ds.x_train[chosen], ds.y_train[chosen]


# The packages whose source keys the chapter's cached steps (wslib.runs.steps).
CODE = (
    "wslib.core",
    "wslib.fusion",
    "wslib.llpf",
    "wslib.pathcond",
    "wslib.synthesis",
)


_T = TypeVar("_T")


def all_pairs(models: Sequence[_T]) -> list[tuple[_T, _T]]:
    """Every pair ``(models[i], models[j])`` with ``i < j``."""
    if len(models) < 2:
        raise ValueError(f"need at least two models for a pair, got {len(models)}")
    return list(itertools.combinations(models, 2))


def compare(
    values: Sequence[float], reference: Sequence[float], margin: float | None
) -> dict[str, Any]:
    """Paired difference ``values - reference`` over seeds and its verdict word.

    The book's rule (:func:`wslib.runs.verdicts.decide_paired`, a 95% interval
    of the mean per-seed difference): ``word`` is ``"lower"`` or ``"higher"``
    when the interval lies on one side of zero, ``"same"`` when the
    equivalence test puts it within ± ``margin`` (None: no such class),
    ``"none"`` otherwise (always with a single seed, whose spread is unknown).
    """
    d = decide_paired(values, reference, margin=margin)
    word = {
        Verdict.ABOVE: "higher",
        Verdict.BELOW: "lower",
        Verdict.EQUIVALENT: "same",
    }.get(d.verdict, "none")
    interval = list(d.interval) if d.interval else None
    return {"diff_mean": d.difference, "interval": interval, "n": d.n, "word": word}


def sample_mean_std(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "std", "values"}`` (std with ddof 1, the sample standard deviation; 0 for one value)."""
    v = np.asarray(values, dtype=float)
    std = float(v.std(ddof=1)) if v.size > 1 else 0.0
    return {"mean": float(v.mean()), "std": std, "values": [float(x) for x in v]}


@cached_step(code=CODE)
def alignment_run(
    modes: Mapping[str, Sequence[nn.Module]],
    ds: Dataset,
    ts: PathTs,
    seed: int,
    *,
    run_cache: str | Path | None = None,
) -> dict[str, Any]:
    """Question 1: ``result[arch][step]`` over every pair of the modes of each
    architecture (a cached step in ``run_cache``)."""
    pairs = {arch: all_pairs(list(models)) for arch, models in modes.items()}
    return alignment_study(pairs, ds, ts, seed)


SETUP_KEYS = ("batch_size", "r_min", "margin")
"""The keys of chapter 12's ``llpf`` settings that make its
:class:`~wslib.llpf.protocols.PathSetup`; the rest make its
:class:`~wslib.llpf.protocols.PathRun`."""


def llpf_path(
    a: nn.Module, b: nn.Module, ds: Dataset, llpf: Mapping[str, Any], seed: int
) -> tuple[list[dict[str, torch.Tensor]], float]:
    """The M2M path from ``a`` to ``b`` (its recorded states) and its peak excess.

    Refined by the book's rule (:meth:`wslib.llpf.protocols.PathSetup.refine`).
    """
    setup = PathSetup(ds, llpf["batch_size"], llpf["r_min"], llpf["margin"])
    path_run = {k: v for k, v in llpf.items() if k not in SETUP_KEYS}
    run = PathRun.of(path_run, "chapter 12's llpf settings")
    path = m2m(
        a,
        a.state_dict(),
        b.state_dict(),
        ds.x_train,
        ds.y_train,
        M2MSettings(
            ticks=run.ticks,
            refine=setup.refine([a, b], run),
            seed=seed,
            record_every=run.record_every,
        ),
        persist=Persist(progress=False),
    )
    res = evaluate_path(
        a, path, ds.x_train, ds.y_train, ds.x_test, ds.y_test, dense=1, progress=False
    )
    return path.states, float(res["peak_excess"])


def connection(
    a: nn.Module,
    b_state: dict[str, torch.Tensor],
    ds: Dataset,
    ts: PathTs,
    llpf: Mapping[str, Any],
    seed: int,
) -> dict[str, Any]:
    """Straight-line barrier and LLPF peak excess from ``a`` to ``a`` holding ``b_state``."""
    b = with_state(a, b_state)
    line = linear_path(
        a, a.state_dict(), b_state, ts, ds.x_train, ds.y_train, progress=False
    )
    states, peak = llpf_path(a, b, ds, llpf, seed)
    return {
        "barrier": float(line["barrier"]),
        "llpf_peak_excess": peak,
        "states": states,
    }


def fused_model(
    a: nn.Module,
    b: nn.Module,
    fusion: tuple[torch.Tensor, torch.Tensor],
    variant: RetrofitName,
    settings: Mapping[str, Any],
    ds: Dataset,
    seed: int,
    train: Dataset,
) -> tuple[nn.Module, dict[str, float]]:
    """KF fusion of ``a`` and ``b`` (retrofit ``variant``), then a short fine-tune.

    ``settings["gradient"]``: the gradient retrofit's settings;
    ``settings["finetune"]``: the fine-tune's recipe, on ``train``'s training
    set. Returns the fine-tuned model and its accuracy on ``ds``'s test set
    before and after the fine-tune.
    """
    if variant not in KF_VARIANTS:
        raise ValueError(f"unknown KF variant {variant!r}; valid: {KF_VARIANTS}")
    out = fuse(
        [a, b],
        *fusion,
        "kf",
        variant,
        gradient=GradientConfig(**settings["gradient"]),
        seed=seed,
        progress=False,
    ).model
    acc = {"fused_acc": evaluate(out, ds.x_test, ds.y_test)[1]}
    recipe = Recipe.from_dict(dict(settings["finetune"]))
    fit(out, train.x_train, train.y_train, recipe, seed=seed, progress=False)
    acc["finetuned_acc"] = evaluate(out, ds.x_test, ds.y_test)[1]
    return out.eval(), acc


@cached_step(code=CODE)
def pair_study(
    a: nn.Module,
    b: nn.Module,
    ds: Dataset,
    fusion: tuple[torch.Tensor, torch.Tensor],
    settings: Mapping[str, Any],
    seed: int,
    *,
    train: Dataset | None = None,
    run_cache: str | Path | None = None,
) -> dict[str, Any]:
    """Questions 2 and 3 for one pair of parents ``a``, ``b`` (a cached step in
    ``run_cache``).

    Paths are refined and evaluated on ``ds``; the fused models are
    fine-tuned on ``train``'s training set (default ``ds``).

    ``settings``: ``ts`` (straight-line points), ``llpf`` (ticks, record_every,
    lr, r_max, r_min, batch_size, margin), ``finetune`` (a training recipe),
    ``gradient`` (:class:`~wslib.fusion.retrofit.GradientConfig` fields), ``bezier``
    (steps, lr). Returns ``fused_parent[variant]`` (barrier and LLPF peak
    excess to each parent aligned to the fused model by weight matching,
    averaged over the two parents; accuracies),
    ``parent_parent[unaligned | aligned]`` and ``conditioning[path]``
    (:func:`~wslib.synthesis.conditioning.path_conditioning` per point).
    """
    ts, llpf = settings["ts"], settings["llpf"]
    structure = neuron_structure(a)
    out: dict[str, Any] = {"fused_parent": {}, "parent_parent": {}}
    for variant in KF_VARIANTS:
        fused, acc = fused_model(a, b, fusion, variant, settings, ds, seed, train or ds)
        # Each parent permuted to the fused model first, as B is to A for the
        # aligned parents: KF orders its neurons by its own grouping.
        to_parents = [
            connection(fused, align(fused.state_dict(), p.state_dict(), structure, seed=seed), ds, ts, llpf, seed)
            for p in (a, b)
        ]  # fmt: skip
        out["fused_parent"][variant] = {
            "barrier": float(np.mean([c["barrier"] for c in to_parents])),
            "llpf_peak_excess": float(
                np.mean([c["llpf_peak_excess"] for c in to_parents])
            ),
            **acc,
        }
    matched = align(a.state_dict(), b.state_dict(), structure, seed=seed)
    ends = {"unaligned": b.state_dict(), "aligned": matched}
    links = {k: connection(a, s, ds, ts, llpf, seed) for k, s in ends.items()}
    out["parent_parent"] = {
        k: {m: c[m] for m in ("barrier", "llpf_peak_excess")} for k, c in links.items()
    }
    sa, sb = a.state_dict(), b.state_dict()
    bez = settings["bezier"]
    curve_settings = CurveSettings(
        kind="bezier", steps=bez["steps"], lr=bez["lr"], n_eval=len(ts), seed=seed
    )
    curve = fit_curve(
        a,
        sa,
        sb,
        ds.x_train,
        ds.y_train,
        curve_settings,
        persist=Persist(progress=False),
    )
    paths = {
        "LLPF": links["unaligned"]["states"],
        "straight line": [lerp_state(sa, sb, float(t)) for t in ts],
        "Bezier": curve.states,
    }
    in_shape = list(ds.x_train.shape[1:])
    out["conditioning"] = {
        name: path_conditioning(a, states, in_shape, ds.x_train, ds.y_train)
        for name, states in paths.items()
    }
    return out


def summarise_pairs(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Questions 2 and 3 over pairs: mean/std per metric, per-point curves, verdicts.

    Verdicts (:func:`compare`, paired over the pairs of parents):
    ``basin[variant][metric]`` compares fused-to-parent with parent-to-parent
    (aligned); ``conditioning_verdict[path]`` compares the path's mean AM/GM
    with the straight line's; ``loss_amgm_correlation`` is the correlation of
    loss and AM/GM over every point of every path; ``gauge_loss_change_max`` is the largest change
    of the loss that the PathCond gauge made at any point of any path.
    """
    metrics = ("barrier", "llpf_peak_excess")
    fused = {
        v: {
            m: sample_mean_std([r["fused_parent"][v][m] for r in runs])
            for m in (*metrics, "fused_acc", "finetuned_acc")
        }
        for v in KF_VARIANTS
    }
    parents = {
        k: {
            m: sample_mean_std([r["parent_parent"][k][m] for r in runs])
            for m in metrics
        }
        for k in ("unaligned", "aligned")
    }
    basin = {
        v: {
            m: compare(
                fused[v][m]["values"], parents["aligned"][m]["values"], LOSS_MARGIN
            )
            for m in metrics
        }
        for v in KF_VARIANTS
    }
    cond: dict[str, Any] = {}
    for path in PATHS:
        per = [r["conditioning"][path] for r in runs]
        first = per[0]
        cond[path] = {
            **{k: first[k] for k in first},  # per point, first pair of parents
            "amgm_mean": sample_mean_std([float(np.mean(p["amgm"])) for p in per]),
            "amgm_gauge_mean": sample_mean_std(
                [float(np.mean(p["amgm_gauge"])) for p in per]
            ),
            "peak_loss": sample_mean_std([float(np.max(p["loss"])) for p in per]),
        }
    line = cond["straight line"]["amgm_mean"]["values"]
    verdicts = {
        # AM/GM has no convention of a practical size: no "same" class
        p: compare(cond[p]["amgm_mean"]["values"], line, None)
        for p in ("LLPF", "Bezier")
    }
    change = max(
        abs(a - b)
        for r in runs
        for p in PATHS
        for a, b in zip(
            r["conditioning"][p]["loss"], r["conditioning"][p]["loss_gauge"]
        )
    )
    points = [
        (lo, am)
        for r in runs
        for p in PATHS
        for lo, am in zip(r["conditioning"][p]["loss"], r["conditioning"][p]["amgm"])
    ]
    loss, amgm = np.array(points).T
    return {
        "loss_amgm_correlation": float(np.corrcoef(loss, amgm)[0, 1]),
        "fused_parent": fused,
        "parent_parent": parents,
        "basin": basin,
        "conditioning": cond,
        "conditioning_verdict": verdicts,
        "gauge_loss_change_max": float(change),
    }


def shard_models(
    zoo: Zoo,
    data: dict[str, Any],
    arch: dict[str, Any],
    recipe: dict[str, Any],
    n_seeds: int,
    seed: int,
) -> list[list[nn.Module]]:
    """``n_seeds`` groups of two models, each trained on one of two class shards.

    Model ``i`` of group ``k`` has part ``i`` of the shard split drawn with
    ``derive_seed(seed, "split", k)`` and model seed
    ``derive_seed(seed, "model", 2 k + i)``, so no two models of the chapter
    (or of two sweep seeds) share an initialisation.
    """
    groups = []
    for k in range(n_seeds):
        split = {"kind": "shards", "n_parts": 2, "seed": derive_seed(seed, "split", k)}
        groups.append(
            [
                zoo.get(
                    {
                        "data": data,
                        "model": arch,
                        "recipe": recipe,
                        "seed": derive_seed(seed, "model", 2 * k + i),
                        "split": {**split, "part": i},
                    }
                )
                for i in range(2)
            ]
        )
    return groups


def base_accuracy(regimes: Regimes, ds: Dataset) -> dict[str, Any]:
    """``[regime]``: mean/std test accuracy of the base models over seeds."""
    return {
        regime: sample_mean_std(
            [evaluate(m, ds.x_test, ds.y_test)[1] for group in groups for m in group]
        )
        for regime, groups in regimes.items()
    }


def gauged(model: nn.Module, in_shape: Sequence[int]) -> nn.Module:
    """A copy of ``model`` in its PathCond gauge (same function)."""
    return with_state(model, pathcond_gauge(model, in_shape))


@cached_step(code=CODE)
def gauge_fusion(
    regimes: Regimes,
    ds: Dataset,
    fusion: tuple[torch.Tensor, torch.Tensor],
    methods: Sequence[MethodName],
    seed: int,
    *,
    run_cache: str | Path | None = None,
) -> dict[str, Any]:
    """Question 4: ``result[regime][method]{with, without, verdict}`` over seeds
    (a cached step in ``run_cache``).

    ``regimes[regime]`` lists one group of base models per seed. Each method
    (HF / KF names of :func:`~wslib.fusion.baselines.fuse_by`) fuses the base models as
    trained (``without``) and in their PathCond gauge (``with``); values are
    test accuracies, the verdict compares with and without (:func:`compare`).
    """
    in_shape = list(ds.x_train.shape[1:])
    result: dict[str, Any] = {}
    for regime, groups in regimes.items():
        acc: dict[str, dict[str, list[float]]] = {
            m: {"with": [], "without": []} for m in methods
        }
        for s, models in enumerate(groups):
            bases = {
                "without": list(models),
                "with": [gauged(m, in_shape) for m in models],
            }
            for method in methods:
                for key, group in bases.items():
                    fused = fuse_by(
                        method, group, *fusion, seed=derive_seed(seed, "fusion", s)
                    )
                    acc[method][key].append(evaluate(fused, ds.x_test, ds.y_test)[1])
        result[regime] = {
            m: {
                "with": sample_mean_std(v["with"]),
                "without": sample_mean_std(v["without"]),
                "verdict": compare(v["with"], v["without"], ACCURACY_MARGIN),
            }
            for m, v in acc.items()
        }
    return result


def pair_studies(
    models: Sequence[nn.Module],
    ds: Dataset,
    fusion: tuple[torch.Tensor, torch.Tensor],
    settings: Mapping[str, Any],
    seed: int,
    *,
    train: Dataset | None = None,
    run_cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """:func:`pair_study` of every pair of ``models`` (each cached in
    ``run_cache``); pair ``k`` with seed ``derive_seed(seed, "pair", k)``."""
    return [
        pair_study(
            a,
            b,
            ds,
            fusion,
            settings,
            derive_seed(seed, "pair", k),
            train=train,
            run_cache=run_cache,
        )
        for k, (a, b) in enumerate(all_pairs(list(models)))
    ]
