"""The claims ledger: each headline claim, the metric that tests it, a verdict rule.

Every claim names the chapter (notebook) and the metric (a ``/``-joined key
path of its results file) that test it, and a rule written down before any
run: the claim holds when the metric (or its ratio to another metric of the
same run, ``per``, or its difference from one, ``minus``) is below (``"<"``)
or above (``">"``) a bound. A comparative claim (a difference or ratio of two
methods) also has a ``margin``, the smallest effect of practical interest,
and every claim says where its margin comes from (``margin_source``): the
paper's own reported effect, or a convention of the book. The book's claims,
with their bounds and margins, are the constants of
:mod:`wslib.runs.claim_list`, never computed from results; the CHANGELOG
records every change of one.

The verdict is the book's one rule (:mod:`wslib.runs.verdicts`) on the
per-seed values at the ledger's level :data:`~wslib.runs.verdicts.LEDGER_ALPHA`
(Bonferroni over the looks of ``make book SEEDS=auto``):

- ``holds``: the interval of the mean lies on the claimed side of the bound;
- ``does not hold``: it lies on the other side;
- ``no effect of practical size``: a comparative claim whose equivalence test
  puts the mean within bound ± margin;
- ``undecided``: none of these (always with one seed);
- ``no value (censored)`` when the chapter ran but the metric has no value
  (e.g. a speed-up whose runs never reached their target: results store null);
- ``not run in this profile`` when the chapter has no results.

The ledger looks at the first 5, 10 and 20 seeds (:data:`~wslib.runs.verdicts.LOOKS`,
as many as are present, and all of them last): a claim's verdict is the one
of the first look that decides it, and ``decided_at`` says at which n. An
undecided claim also gets :func:`seeds_needed`, a rough power estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scipy import stats as scipy_stats

from wslib.runs.sweeps import summarise_seeds, summary
from wslib.runs.verdicts import (
    LEDGER_ALPHA,
    LOOKS,
    Decision,
    Verdict,
    decide,
)

HOLDS, FAILS, NO_EFFECT, UNDECIDED, CENSORED, NOT_RUN = (
    "holds",
    "does not hold",
    "no effect of practical size",
    "undecided",
    "no value (censored)",
    "not run in this profile",
)
DECIDED = (HOLDS, FAILS, NO_EFFECT)

THRESHOLD = "none: a threshold claim, whose bound is itself the line that matters"
BOOK_LOSS = "book convention: 0.01 of loss"
BOOK_POINTS = "book convention: 1 point of accuracy"
BOOK_RATIO = "book convention: 5% of the ratio"


@dataclass(frozen=True)
class Claim:
    """One claim and the rule that decides it (``margin`` None: a threshold claim).

    ``timed``: the quantity divides two measured times, so its value depends on
    the device; the ledger names the devices the chapter's runs used.
    """

    id: str
    paper: str
    text: str
    chapter: str
    metric: str
    op: Literal["<", ">"]
    bound: float
    per: str | None = None
    minus: str | None = None
    margin: float | None = None
    margin_source: str = THRESHOLD
    timed: bool = False

    @property
    def quantity(self) -> str:
        if self.per is not None:
            return f"{self.metric} / {self.per}"
        return self.metric if self.minus is None else f"{self.metric} - {self.minus}"

    @property
    def rule(self) -> str:
        return f"{self.quantity} {self.op} {self.bound:g}"

    def satisfied(self, value: float) -> bool:
        return value < self.bound if self.op == "<" else value > self.bound


def judge(claim: Claim, values: Sequence[float]) -> tuple[str, Decision]:
    """The claim's verdict on per-seed ``values`` by the book's rule, and the decision."""
    d = decide(values, reference=claim.bound, margin=claim.margin, alpha=LEDGER_ALPHA)
    above, below = (HOLDS, FAILS) if claim.op == ">" else (FAILS, HOLDS)
    word = {
        Verdict.ABOVE: above,
        Verdict.BELOW: below,
        Verdict.EQUIVALENT: NO_EFFECT,
        Verdict.UNDECIDED: UNDECIDED,
    }[d.verdict]
    return word, d


def looks(n: int) -> list[int]:
    """The numbers of seeds the ledger looks at when ``n`` are present."""
    return [k for k in LOOKS if k < n] + [n]


def sequential(claim: Claim, values: Sequence[float]) -> tuple[str, Decision, int]:
    """The verdict of the first look that decides the claim (the last look's when
    none does), its decision and its n. ``values`` are in seed order."""
    for n in looks(len(values)):
        word, d = judge(claim, values[:n])
        if word in DECIDED:
            break
    return word, d, n


MAX_SEEDS = 1000  #: beyond this a power estimate says "more than 1000"


def seeds_needed(claim: Claim, stats: dict[str, Any]) -> int | None:
    """The fewest seeds whose ledger interval would clear the claim's bound, if the
    mean and the standard deviation over seeds stayed as observed.

    A rough power estimate for an undecided claim: None when the mean sits on
    the bound or no spread is known (no number of seeds decides), or when more
    than :data:`MAX_SEEDS` would be needed.
    """
    gap, std = abs(stats["mean"] - claim.bound), stats["std"]
    if not std or gap == 0:
        return None
    for n in range(max(2, stats["n"]), MAX_SEEDS + 1):
        if scipy_stats.t.ppf(1 - LEDGER_ALPHA / 2, n - 1) * std / n**0.5 < gap:
            return n
    return None


def claim_stats(
    claim: Claim, metrics: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """Per-seed values of the claim's quantity and their summary (None: not run)."""
    values = metrics.get(claim.metric, {}).get("values", {})
    if claim.per is not None:
        per = metrics.get(claim.per, {}).get("values", {})
        values = {s: v / per[s] for s, v in values.items() if per.get(s)}
    if claim.minus is not None:
        other = metrics.get(claim.minus, {}).get("values", {})
        values = {s: v - other[s] for s, v in values.items() if s in other}
    if not values:
        return None
    values = dict(sorted(values.items(), key=lambda item: int(item[0])))
    return {"values": values} | summary(list(values.values()))


def ledger(results_dir: Path, claims: tuple[Claim, ...]) -> list[dict[str, Any]]:
    """One row per claim: the claim, its quantity over seeds, the verdict.

    ``stats["missing"]`` lists the seeds whose run gave no value of the
    quantity (NaN, or the metric absent): the summary is over the others.
    ``decision`` is the rule's decision at the look that gave the verdict and
    ``decided_at`` its number of seeds (None: not run or censored).
    """
    runs = {nb: summarise_seeds(results_dir, nb) for nb in {c.chapter for c in claims}}
    rows = []
    for claim in claims:
        stats = claim_stats(claim, runs[claim.chapter]["metrics"])
        seeds = runs[claim.chapter]["seeds"]
        row: dict[str, Any] = {
            "claim": claim,
            "stats": stats,
            "devices": runs[claim.chapter]["devices"],
            "left_out": runs[claim.chapter]["left_out"],
        }
        if stats is None:
            row |= {
                "verdict": CENSORED if seeds else NOT_RUN,
                "decision": None,
                "decided_at": None,
            }
        else:  # seeds that ran but gave no value (NaN, missing)
            stats["missing"] = [s for s in seeds if str(s) not in stats["values"]]
            word, d, n = sequential(claim, list(stats["values"].values()))
            row |= {"verdict": word, "decision": d, "decided_at": n}
            if word == UNDECIDED:
                row["seeds_needed"] = seeds_needed(claim, stats)
        rows.append(row)
    return rows
