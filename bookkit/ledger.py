"""The claims ledger page and the claims box at the end of each chapter.

``bookkit/build.py`` calls :func:`write_ledger` (``book/ledger.md`` and one dot
plot per paper in ``book/_static/ledger/``) and :func:`append_claims` (a
markdown cell at the end of each chapter copy listing the claims it tests),
both from one :func:`wslib.runs.claims.ledger` of every results file present
under ``results/<profile>/``: the default run and any sweep (``make sweep``).
"""

from __future__ import annotations

import math
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402

from wslib.plotting import label_axes, set_style  # noqa: E402
from wslib.runs.claim_list import PAPERS  # noqa: E402
from wslib.runs.claims import (  # noqa: E402
    CENSORED,
    DECIDED,
    HOLDS,
    MAX_SEEDS,
    NO_EFFECT,
    NOT_RUN,
    UNDECIDED,
)
from wslib.runs.verdicts import ALPHA, LEDGER_ALPHA, LOOKS  # noqa: E402

MARKS = {
    HOLDS: "✓",
    NO_EFFECT: "=",
    UNDECIDED: "?",
    CENSORED: "∅",
    NOT_RUN: "–",
}  # anything else: does not hold
PANELS_PER_ROW = 4
LEVEL = f"{100 * (1 - LEDGER_ALPHA):.3g}%"


def value_text(row: dict[str, Any]) -> str:
    """``mean [low, high] (n = k)`` of the look that gave the verdict, or the
    single value for one seed; the seeds whose run gave no value, and those
    left out because they ran another setting, are named."""
    stats, d = row["stats"], row["decision"]
    if stats is None or d is None:
        return "–"
    missing = stats.get("missing")
    lacking = f"; no value at seed {', '.join(map(str, missing))}" if missing else ""
    left = row.get("left_out") or {}
    if left:
        lacking += "; left out: " + ", ".join(
            f"seed {seed} ({why})" for seed, why in left.items()
        )
    if d.interval is None:
        return f"{d.mean:.3g} (n = 1{lacking})"
    low, high = d.interval
    of = f" of {stats['n']}" if d.n < stats["n"] else ""
    return f"{d.mean:.3g} [{low:.3g}, {high:.3g}] (n = {d.n}{of}{lacking})"


def margin_text(row: dict[str, Any]) -> str:
    """The claim's margin and where it comes from."""
    claim = row["claim"]
    if claim.margin is None:
        return "–"
    return f"± {claim.margin:g} ({claim.margin_source})"


def breakable(text: str) -> str:
    """``text`` with a zero-width space after each ``/`` and ``_``, so a table cell wraps."""
    return text.replace("/", "/\u200b").replace("_", "\\_\u200b")


def row_markdown(row: dict[str, Any], link: bool) -> str:
    """One table row: claim, chapter, measured value, rule, margin, verdict."""
    claim = row["claim"]
    short = f"ch. {int(claim.chapter[:2])}"  # the full title would crowd the table
    chapter = f"{{doc}}`{short} <chapters/{claim.chapter}>`" if link else short
    mark = MARKS.get(row["verdict"], "✗")
    return (
        f"| {claim.text} | {chapter} | {value_text(row)}{timed_text(row)} | "
        f"{breakable(claim.rule)} | {margin_text(row)} | "
        f"{mark} {row['verdict']}{needed_text(row)} |"
    )


def timed_text(row: dict[str, Any]) -> str:
    """For a claim on measured times, the devices that timed it (until a GPU has, a CPU)."""
    if not row["claim"].timed or row["stats"] is None:
        return ""
    devices = ", ".join(row.get("devices") or []) or "a device the results do not name"
    return f"; timed on {devices}"


def needed_text(row: dict[str, Any]) -> str:
    """For an undecided claim, the seeds a rough power estimate says would decide it."""
    if row["verdict"] != UNDECIDED or row["stats"]["n"] < 2:
        return ""
    n = row.get("seeds_needed")
    if n is None:
        return f" (power estimate: more than {MAX_SEEDS} seeds, or no number, would decide it)"
    return f" (power estimate: about {n} seeds would decide it)"


HEADER = (
    f"| claim | chapter | mean [{LEVEL} interval] (seeds) | rule | margin | verdict |\n"
    "|---|---|---|---|---|---|"
)


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
        if row["decision"] is not None and row["decision"].interval:
            interval = row["decision"].interval
            ax.plot(interval, [-0.5, -0.5], color="0.2", label=f"{LEVEL} interval")
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


def margins_commit() -> str:
    """The short hash of the last commit that changed a bound or a margin."""
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--", *MARGIN_FILES],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return out.stdout.strip() or "unknown (not committed)"


MARGIN_FILES = ("wslib/runs/claims.py", "wslib/runs/verdicts.py")


def write_ledger(rows: list[dict[str, Any]], results_dir: Path, book: Path) -> Path:
    """Write ``<book>/ledger.md`` and its figures from the ledger ``rows`` of ``results_dir``."""
    n_seeds = max((r["stats"]["n"] for r in rows if r["stats"]), default=0)
    counts = Counter(r["verdict"] for r in rows)
    decided = sum(r["verdict"] in DECIDED for r in rows)
    lines = [
        "# Claims ledger",
        "",
        "Every headline claim of the three papers (and of chapter 1), the metric "
        "of the book that tests it and a rule written down before any run: a "
        "bound and, for a comparison of two methods, a *margin*, the smallest "
        "effect of practical interest, with its source. One rule, the same one "
        "the chapters use, turns the per-seed values into a verdict, on the "
        f"two-sided {LEVEL} t-interval of the mean over independent seeds:",
        "",
        "- **holds**: the interval lies on the claimed side of the bound;",
        "- **does not hold**: it lies on the other side;",
        "- **no effect of practical size**: the equivalence test (TOST) puts the "
        "mean within bound ± margin: the claimed advantage, if any, is too small "
        "to matter;",
        "- **undecided**: none of these (always so with one seed).",
        "",
        f"The level is {LEVEL}, not 95%: `make book SEEDS=auto` looks at the "
        f"ledger up to {len(LOOKS)} times, at {', '.join(map(str, LOOKS))} "
        "seeds, and adds seeds only to the chapters that still hold an "
        f"undecided claim; Bonferroni's correction ({ALPHA:g} / {len(LOOKS)} per "
        "look) keeps the chance of a wrong verdict per claim below "
        f"{ALPHA:g} however many looks it takes. A claim's verdict is that of "
        "the first look that decides it; the seeds column says at which n "
        '("n = 5 of 10": decided at 5 seeds of the 10 present). For an '
        "undecided claim, a *power estimate* gives the number of seeds whose "
        "interval would clear the bound if the observed mean and standard "
        "deviation stayed as they are: a rough guide, since both move as seeds "
        "are added.",
        "",
        f"This build read up to {n_seeds} seed(s) per claim from "
        f"`results/{results_dir.name}`. Verdicts: "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + f". Of the {len(rows)} claims tested, {decided} are decided; at up to "
        f"{ALPHA:g} per claim, about {ALPHA * decided:.1f} of them may be wrong by "
        "chance alone (an upper bound on the expected number).",
        "",
        f"Bounds and margins are constants of `wslib/runs/claims.py` and "
        f"`wslib/runs/verdicts.py`, last changed in commit {margins_commit()}; "
        "the CHANGELOG gives the reason of every change.",
        "",
    ]
    if n_seeds < 3:
        lines += [
            "```{tip}",
            "One seed cannot tell a result from luck: every verdict is "
            "undecided. `make book SEEDS=auto` runs 5 seeds and adds more where "
            "a claim is still undecided; this page then reads all of them.",
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
            "From the {doc}`claims ledger <../ledger>`, over every seed run so "
            "far, by the book's one rule. The sentences of the chapter above "
            "rest on the one seed of this page; where they and this box "
            "differ, this box is the verdict.",
            "",
            HEADER,
            *(row_markdown(r, link=False) for r in rows),
        ]
    )
    notebook = nbformat.read(chapter, as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell(text))
    nbformat.write(notebook, chapter)
