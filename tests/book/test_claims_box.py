"""A swept book's chapters agree with its ledger: each chapter's claims box holds
exactly the ledger's rows of that chapter (verdict, interval, n, margin).

The book is the smoke book over three seeds: the executed chapters of seed 0
and the results of seeds 0-2 that the session's smoke runs left (seed 0 in
the tests' workspace, seeds 1 and 2 in the background runs' one), glued as
``bookkit/build.py`` glues them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from bookkit import ledger as book_ledger
from tests.conftest import SMOKE
from wslib.runs.claim_list import CLAIMS
from wslib.runs.claims import ledger

SEEDS = (0, 1, 2)


def three_seed_results(workspace: Path, seeds: Path, dest: Path) -> Path:
    """``results/smoke`` of seeds 0-2: seed 0's (the default run) from the
    workspace, seeds 1 and 2 from ``seeds`` (the background runs' results)."""
    results = dest / "results" / SMOKE
    results.mkdir(parents=True)
    for file in (workspace / "results" / SMOKE).glob("*.json"):
        shutil.copy2(file, results / file.name)
    for seed in SEEDS[1:]:
        shutil.copytree(seeds / f"seed-{seed}", results / f"seed-{seed}")
    return results


def table_rows(markdown: str) -> list[str]:
    """The body rows of the markdown tables in ``markdown``."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [line for line in lines if not line.startswith("| claim |")]


def without_link(row: str) -> str:
    """A ledger row with its chapter link written as the box writes it."""
    return row.replace("{doc}`", "").split(" <chapters/")[0] + row.split(">`", 1)[-1]


@pytest.mark.slow
def test_every_chapter_box_equals_its_ledger_rows(
    smoke_book: Path, seed_results: Path, workspace: Path, tmp_path: Path
) -> None:
    results = three_seed_results(workspace, seed_results, tmp_path)
    rows = ledger(results, CLAIMS)
    assert max(r["stats"]["n"] for r in rows if r["stats"]) == len(SEEDS)
    book = tmp_path / "book"
    ledger_md = book_ledger.write_ledger(rows, results, book).read_text()
    ledger_rows = [without_link(r) for r in table_rows(ledger_md)]
    assert len(ledger_rows) == len(CLAIMS)
    boxed = []
    for executed in sorted((workspace / "build" / SMOKE).glob("*.ipynb")):
        chapter = shutil.copy2(executed, tmp_path / executed.name)
        book_ledger.append_claims(Path(chapter), rows)
        last = nbformat.read(chapter, as_version=4).cells[-1]
        mine = [r for r in ledger_rows if f"| ch. {int(executed.stem[:2])} |" in r]
        if not mine:
            assert "Claims tested in this chapter" not in last.source
            continue
        assert last.source.startswith("## Claims tested in this chapter")
        assert table_rows(last.source) == mine, executed.stem
        boxed += mine
    assert sorted(boxed) == sorted(ledger_rows)  # every claim is in one box


def test_without_link_keeps_the_rest_of_the_row() -> None:
    row = "| c | {doc}`ch. 3 <chapters/03_llpf_m2m>` | 1 [0, 2] (n = 3) | r | – | ✓ holds |"
    assert without_link(row) == "| c | ch. 3 | 1 [0, 2] (n = 3) | r | – | ✓ holds |"


def test_a_timed_claim_names_the_devices_that_timed_it(tmp_path: Path) -> None:
    """``pathcond-cost`` divides two times: its row says where they were taken."""
    import json

    seeds = tmp_path / "seed-1"
    seeds.mkdir()
    for folder, seed, devices in ((tmp_path, 0, ["cpu"]), (seeds, 1, ["cuda"])):
        (folder / "07_pathcond_mlp.json").write_text(
            json.dumps(
                {
                    "params": {"seed": seed},
                    "metrics": {"const": {"rescale_over_epoch": 0.5 + seed}},
                    "env": {"devices_used": devices},
                }
            )
        )
    claims = tuple(c for c in CLAIMS if c.id in ("pathcond-cost", "pathcond-function"))
    timed, untimed = (
        book_ledger.row_markdown(row, link=False) for row in ledger(tmp_path, claims)
    )
    assert "(n = 2); timed on cpu, cuda |" in timed
    assert "timed on" not in untimed


def test_a_row_names_the_seeds_left_out(tmp_path: Path) -> None:
    import json
    import warnings

    for seed, code, finished in ((0, "new", 2.0), (1, "old", 1.0)):
        folder = tmp_path if seed == 0 else tmp_path / f"seed-{seed}"
        folder.mkdir(exist_ok=True)
        (folder / "06_pathlifting.json").write_text(
            json.dumps(
                {
                    "params": {"seed": seed},
                    "code": code,
                    "finished": finished,
                    "metrics": {"function_change_max_rel": 1e-7},
                }
            )
        )
    claims = tuple(c for c in CLAIMS if c.id == "pathcond-function")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        (row,) = ledger(tmp_path, claims)
    text = book_ledger.row_markdown(row, link=False)
    assert "(n = 1; left out: seed 1 (other code))" in text
