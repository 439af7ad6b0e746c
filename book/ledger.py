"""The claims ledger page and the claims box at the end of each chapter.

``book/build.py`` calls :func:`write_ledger` (``book/ledger.md`` and one dot
plot per paper in ``book/_static/ledger/``) and :func:`append_claims` (a
markdown cell at the end of each chapter copy listing the claims it tests),
both from one :func:`wslib.runs.claims.ledger` of every results file present
under ``results/<profile>/``: the default run and any sweep (``make sweep``).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402

from wslib.plotting import label_axes, set_style  # noqa: E402
from wslib.runs.claims import (  # noqa: E402
    CENSORED,
    HOLDS,
    MAX_SEEDS,
    MIXED,
    NOT_RUN,
    PAPERS,
)

MARKS = {
    HOLDS: "✓",
    MIXED: "≈",
    CENSORED: "∅",
    NOT_RUN: "–",
}  # anything else: does not hold
PANELS_PER_ROW = 4


def value_text(stats: dict[str, Any] | None) -> str:
    """``mean [low, high] (n = k)``, or the single value for one seed; the seeds
    whose run gave no value are named."""
    if stats is None:
        return "–"
    missing = stats.get("missing")
    lacking = f"; no value at seed {', '.join(map(str, missing))}" if missing else ""
    if stats["n"] == 1:
        return f"{stats['mean']:.3g} (n = 1{lacking})"
    low, high = stats["ci95"]
    return f"{stats['mean']:.3g} [{low:.3g}, {high:.3g}] (n = {stats['n']}{lacking})"


def breakable(text: str) -> str:
    """``text`` with a zero-width space after each ``/`` and ``_``, so a table cell wraps."""
    return text.replace("/", "/\u200b").replace("_", "\\_\u200b")


def row_markdown(row: dict[str, Any], link: bool) -> str:
    """One table row: claim, chapter, measured value, rule, verdict."""
    claim = row["claim"]
    short = f"ch. {int(claim.chapter[:2])}"  # the full title would crowd the table
    chapter = f"{{doc}}`{short} <chapters/{claim.chapter}>`" if link else short
    mark = MARKS.get(row["verdict"], "✗")
    return (
        f"| {claim.text} | {chapter} | {value_text(row['stats'])} | "
        f"{breakable(claim.rule)} | {mark} {row['verdict']}{needed_text(row)} |"
    )


def needed_text(row: dict[str, Any]) -> str:
    """For a mixed claim, the seeds a rough power estimate says would decide it."""
    if row["verdict"] != MIXED:
        return ""
    n = row.get("seeds_needed")
    if n is None:
        return f" (power estimate: more than {MAX_SEEDS} seeds, or no number, would decide it)"
    return f" (power estimate: about {n} seeds would decide it)"


HEADER = "| claim | chapter | mean [95% interval] (seeds) | rule | verdict |\n|---|---|---|---|---|"


def draw_paper(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    """Per claim, the per-seed values (dots) against the rule's bound (line)."""
    set_style()
    n_rows = math.ceil(len(rows) / PANELS_PER_ROW)
    fig, axes = plt.subplots(
        n_rows, PANELS_PER_ROW, figsize=(12, 1.9 * n_rows), squeeze=False
    )
    for ax, row in zip(axes.flat, rows):
        claim, stats = row["claim"], row["stats"]
        values = list((stats or {}).get("values", {}).values())
        ax.axvline(claim.bound, color="0.3", linestyle="--", linewidth=1)
        ax.plot(values, [0] * len(values), "o", alpha=0.7, label="one seed")
        if stats and stats["ci95"]:
            ax.plot(stats["ci95"], [-0.5, -0.5], color="0.2", label="95% interval")
        ax.set_ylim(-1, 1)
        points = [*values, claim.bound]
        if min(points) > 0 and max(points) / min(points) > 10:
            ax.set_xscale("log")
        ax.set_yticks([])
        label_axes(ax, claim.quantity, "", f"{claim.id}: {row['verdict']}")
        ax.title.set_fontsize(9)
    for ax in list(axes.flat)[len(rows) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_ledger(rows: list[dict[str, Any]], results_dir: Path, book: Path) -> Path:
    """Write ``<book>/ledger.md`` and its figures from the ledger ``rows`` of ``results_dir``."""
    n_seeds = max((r["stats"]["n"] for r in rows if r["stats"]), default=0)
    counts = Counter(r["verdict"] for r in rows)
    lines = [
        "# Claims ledger",
        "",
        "Every headline claim of the three papers (and of chapter 1), the metric "
        "of the book that tests it and a rule written down before any run. "
        "A claim **holds** when the whole 95% interval of the mean over seeds "
        "satisfies its rule, **does not hold** when none of it does, and is "
        "**mixed** when the interval straddles the rule. With one seed the "
        "verdict is that seed's alone. For a mixed claim, a *power estimate* "
        "gives the number of seeds whose interval would clear the bound if the "
        "observed mean and standard deviation stayed as they are: a rough "
        "guide, since both move as seeds are added.",
        "",
        f"This build read up to {n_seeds} seed(s) per claim from "
        f"`results/{results_dir.name}`. Verdicts: "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + ".",
        "",
    ]
    if n_seeds < 3:
        lines += [
            "```{tip}",
            "One seed cannot tell a result from luck. Strengthen every verdict "
            'with `make sweep SEEDS="0 1 2 3 4"` and `make book`: this page then '
            "reads all seeds.",
            "```",
            "",
        ]
    for paper, title in PAPERS.items():
        mine = [r for r in rows if r["claim"].paper == paper]
        if not mine:
            continue
        figure = Path("_static") / "ledger" / f"{paper}.png"
        draw_paper(mine, title, book / figure)
        lines += [f"## {title}", "", HEADER]
        lines += [row_markdown(r, link=True) for r in mine]
        lines += [
            "",
            f"![Per-seed values of each claim of {title}]({figure.as_posix()})",
            "",
        ]
    path = book / "ledger.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def append_claims(chapter: Path, rows: list[dict[str, Any]]) -> None:
    """End the chapter copy with the ledger rows of the claims it tests."""
    rows = [r for r in rows if r["claim"].chapter == chapter.stem]
    if not rows:
        return
    text = "\n".join(
        [
            "## Claims tested in this chapter",
            "",
            "From the {doc}`claims ledger <../ledger>`, over every seed run so far:",
            "",
            HEADER,
            *(row_markdown(r, link=False) for r in rows),
        ]
    )
    notebook = nbformat.read(chapter, as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell(text))
    nbformat.write(notebook, chapter)
