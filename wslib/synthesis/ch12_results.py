"""Chapter 12's results: the verdicts of its four questions in words, its
tables and the metrics of its results file, from the runs of
:mod:`wslib.synthesis.ch12_synthesis`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from wslib.runs.verdicts import LOSS_MARGIN
from wslib.synthesis.ch12_synthesis import KF_VARIANTS, PATHS, WORDS, compare

RESCALING_STEPS = ("PathCond gauge + WM", "ENorm gauge + WM", "WM + scale matching")


def alignment_verdicts(alignment: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``[arch][step]``: each rescaling step's barriers against weight matching's (:func:`~wslib.synthesis.ch12_synthesis.compare`)."""
    return {
        arch: {
            step: compare(
                steps[step]["barriers"],
                steps["weight matching"]["barriers"],
                LOSS_MARGIN,
            )
            for step in RESCALING_STEPS
        }
        for arch, steps in alignment.items()
    }


def count_words(
    verdicts: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> dict[str, int]:
    """How many verdicts of a two-level table say each word of :data:`~wslib.synthesis.ch12_synthesis.WORDS`."""
    words = [v["word"] for row in verdicts.values() for v in row.values()]
    return {w: words.count(w) for w in WORDS}


def alignment_sentence(verdicts: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """Question 1's verdict in words."""
    n = count_words(verdicts)
    total = sum(n.values())
    if n["lower"] > total / 2:
        head = "Removing both symmetries helps"
    elif n["lower"] == 0:
        head = "Removing the rescaling symmetry too does not help"
    else:
        head = "Removing the rescaling symmetry too helps only sometimes"
    return (
        f"{head}: of the {total} rescaling steps (three steps, each architecture), "
        f"{n['lower']} lowered the barrier of weight matching (the 95% interval of "
        f"the paired difference over pairs below zero), {n['higher']} raised it, "
        f"{n['same']} left it within 0.01 and {n['none']} are undecided."
    )


BASIN_TEXT = {
    "lower": "lower than between the aligned parents: it lands in their basin",
    "higher": "higher than between the aligned parents: it does not land in their "
    "shared basin",
    "same": "no different in practice from that between the aligned parents "
    "(within 0.01)",
    "none": "undecided against that between the aligned parents (the 95% interval "
    "over pairs reaches zero)",
}


def basin_sentence(basin: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """Question 2's verdict in words, per KF variant, from the straight-line barrier."""
    parts = [
        f"with the {v} retrofit, the barrier from the fused model to a parent is "
        f"{BASIN_TEXT[basin[v]['barrier']['word']]} (LLPF peak excess: "
        f"{WORDS[basin[v]['llpf_peak_excess']['word']]})"
        for v in basin
    ]
    return "; ".join(parts)[0].upper() + "; ".join(parts)[1:] + "."


def conditioning_sentence(summary: Mapping[str, Any], *, tol: float = 1e-4) -> str:
    """Question 3's verdict in words: AM/GM of the low-loss paths against the line."""
    v = summary["conditioning_verdict"]
    text = {
        "lower": "better conditioned (lower mean AM/GM of diag G)",
        "higher": "worse conditioned (higher mean AM/GM of diag G)",
        "same": "no differently conditioned in practice",
        "none": "undecided (the 95% interval over pairs reaches zero)",
    }
    same = summary["gauge_loss_change_max"] <= tol
    return (
        f"Compared with the straight line, the points of the LLPF path are "
        f"{text[v['LLPF']['word']]} and those of the Bezier curve "
        f"{text[v['Bezier']['word']]}; "
        + (
            "the PathCond gauge left the loss at every point unchanged."
            if same
            else "the PathCond gauge changed the loss at some point: a bug."
        )
    )


def gauge_sentence(gauge: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """Question 4's verdict in words."""
    table = {r: {m: c["verdict"] for m, c in row.items()} for r, row in gauge.items()}
    n = count_words(table)
    total = sum(n.values())
    if n["same"] == total:
        head = "The gauge makes no difference to fusion in practice"
    elif n["higher"] + n["lower"]:
        head = "The gauge changes fusion in some cases"
    else:
        head = "The runs do not decide whether the gauge changes fusion"
    return (
        f"{head}: of {total} (regime, method) cases, the fused accuracy with the "
        f"PathCond gauge is higher than without in {n['higher']}, lower in "
        f"{n['lower']}, within 1 point in {n['same']} and undecided in {n['none']} "
        "(95% intervals of the paired difference over seeds)."
    )


def alignment_table(
    alignment: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, Any]
) -> pd.DataFrame:
    """One row per (architecture, step): barrier, spread, distances, verdict."""
    rows = []
    for arch, steps in alignment.items():
        for step, r in steps.items():
            word = verdicts[arch][step]["word"] if step in verdicts[arch] else ""
            rows.append(
                {
                    "model": arch,
                    "step": step,
                    "barrier": r["barrier_mean"],
                    "± std": r["barrier_std"],
                    "distance": r["distance_mean"],
                    "lifting distance": r["lifting_distance_mean"],
                    "output change": r["function_change_max"],
                    "vs WM": WORDS.get(word, ""),
                }
            )
    return pd.DataFrame(rows).set_index(["model", "step"])


def basin_table(pairs: Mapping[str, Any]) -> pd.DataFrame:
    """Barrier and LLPF peak excess (mean ± std over pairs): fused-parent and parent-parent."""
    rows = {
        **{f"fused (KF {v}) - parent": pairs["fused_parent"][v] for v in KF_VARIANTS},
        **{
            f"parents, {k}": pairs["parent_parent"][k] for k in ("unaligned", "aligned")
        },
    }
    return pd.DataFrame(
        {
            name: {
                "barrier": r["barrier"]["mean"],
                "barrier std": r["barrier"]["std"],
                "LLPF peak excess": r["llpf_peak_excess"]["mean"],
                "peak std": r["llpf_peak_excess"]["std"],
            }
            for name, r in rows.items()
        }
    ).T


def conditioning_table(pairs: Mapping[str, Any]) -> pd.DataFrame:
    """Per path (mean over points, then over pairs): peak loss, AM/GM as given and in the gauge."""
    cond = pairs["conditioning"]
    return pd.DataFrame(
        {
            path: {
                "peak loss": cond[path]["peak_loss"]["mean"],
                "AM/GM": cond[path]["amgm_mean"]["mean"],
                "AM/GM std": cond[path]["amgm_mean"]["std"],
                "AM/GM, gauge": cond[path]["amgm_gauge_mean"]["mean"],
                "vs line": WORDS[pairs["conditioning_verdict"][path]["word"]]
                if path in pairs["conditioning_verdict"]
                else "",
            }
            for path in PATHS
        }
    ).T


def gauge_table(gauge: Mapping[str, Any], base: Mapping[str, Any]) -> pd.DataFrame:
    """Fused test accuracy with and without the gauge (mean ± std over seeds), per regime and method."""
    rows = []
    for regime, methods in gauge.items():
        for method, r in methods.items():
            rows.append(
                {
                    "regime": regime,
                    "method": method,
                    "base models": base[regime]["mean"],
                    "without": r["without"]["mean"],
                    "without std": r["without"]["std"],
                    "with gauge": r["with"]["mean"],
                    "with std": r["with"]["std"],
                    "gauge effect": WORDS[r["verdict"]["word"]],
                }
            )
    return pd.DataFrame(rows).set_index(["regime", "method"])


def chapter_metrics(
    alignment: Mapping[str, Any],
    align_verdicts: Mapping[str, Any],
    pairs: Mapping[str, Any],
    gauge: Mapping[str, Any],
    base: Mapping[str, Any],
) -> dict[str, Any]:
    """The chapter's results: the four questions' numbers and verdicts."""
    return {
        "alignment": alignment,
        "alignment_verdict": align_verdicts,
        "fused_parent": pairs["fused_parent"],
        "parent_parent": pairs["parent_parent"],
        "basin": pairs["basin"],
        "conditioning": pairs["conditioning"],
        "conditioning_verdict": pairs["conditioning_verdict"],
        "loss_amgm_correlation": pairs["loss_amgm_correlation"],
        "gauge_loss_change_max": pairs["gauge_loss_change_max"],
        "gauge_fusion": gauge,
        "base_accuracy": base,
        "verdicts": {
            "alignment": alignment_sentence(align_verdicts),
            "basin": basin_sentence(pairs["basin"]),
            "conditioning": conditioning_sentence(pairs),
            "gauge_fusion": gauge_sentence(gauge),
        },
    }


def verdict_table(metrics: Mapping[str, Any]) -> pd.DataFrame:
    """The four verdict sentences, one row per question."""
    questions = {
        "alignment": "1. Alignment needs both symmetries?",
        "basin": "2. Fusion lands in its parents' basin?",
        "conditioning": "3. Low-loss path well conditioned?",
        "gauge_fusion": "4. The gauge matters for fusion?",
    }
    return pd.DataFrame(
        {"verdict": {q: metrics["verdicts"][k] for k, q in questions.items()}}
    )
