"""The mutation-testing driver (``make mutation``) and its lists of equivalent mutants.

mutmut itself is not run here (a package takes many minutes); its output is.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests import mutation
from tests.mutation import (
    LINE,
    MODULES,
    ROOT,
    Row,
    equivalents,
    module_name,
    table,
)

PACKAGES = sorted({m.split("/")[0] for m in MODULES})
NAME = re.compile(r"^wslib\.(?P<module>\w+\.\w+)\.x\S*__mutmut_\d+$")


def test_every_listed_module_exists() -> None:
    for module in MODULES:
        assert (ROOT / "wslib" / f"{module}.py").is_file(), module


@pytest.mark.parametrize("package", PACKAGES)
def test_each_equivalent_names_a_listed_module_and_a_reason(package: str) -> None:
    for name, reason in equivalents(package).items():
        match = NAME.match(name)
        assert match, f"not a mutmut name: {name}"
        assert match["module"].replace(".", "/") in MODULES, name
        assert match["module"].startswith(package + "."), name
        assert isinstance(reason, str) and len(reason.split()) >= 4, name


def test_module_names_are_read_either_way() -> None:
    assert module_name("wslib/runs/verdicts.py") == "runs/verdicts"
    assert module_name("runs/verdicts") == "runs/verdicts"
    with pytest.raises(SystemExit, match="no module wslib/runs/nothing.py"):
        module_name("runs/nothing")


def test_results_lines_are_parsed() -> None:
    out = (
        "    wslib.runs.verdicts.x_decide__mutmut_1: killed\n"
        "    wslib.runs.verdicts.xǁDecisionǁword__mutmut_4: survived\n"
        "    wslib.runs.verdicts.x_decide__mutmut_9: no tests\n"
    )
    found = {m["name"]: m["status"] for m in map(LINE.match, out.splitlines()) if m}
    assert found == {
        "wslib.runs.verdicts.x_decide__mutmut_1": "killed",
        "wslib.runs.verdicts.xǁDecisionǁword__mutmut_4": "survived",
        "wslib.runs.verdicts.x_decide__mutmut_9": "no tests",
    }


def test_the_score_leaves_out_equivalents_and_counts_the_untested() -> None:
    status = {f"m{i}": "killed" for i in range(7)}
    status |= {"s1": "survived", "s2": "survived", "t": "timeout", "n": "no tests"}
    row = Row("runs/verdicts", status, equivalent={"s2": "same floats"})
    assert row.survivors == ["s1", "n"]
    assert row.score == pytest.approx(8 / 10)
    assert row.cells() == ["wslib/runs/verdicts.py", "11", "7", "2", "1", "1", "80.0%"]
    text = table([row, Row("core/seeds", {"a": "killed"})])
    assert "9 of 11 non-equivalent mutants detected (81.8%)" in text
    assert text.count("\n| wslib/") == 2


def test_mutmut_runs_on_one_thread(monkeypatch) -> None:
    """A CPU-time timeout means a hung mutant only when the tests run on one thread."""
    seen = {}

    def fake_run(args, cwd, env, **kwargs):  # noqa: ANN001
        seen.update(env)
        return subprocess.CompletedProcess(args, 0, "out", "")

    monkeypatch.setattr(mutation.subprocess, "run", fake_run)
    assert mutation.mutmut(Path("."), "results") == "out"
    assert seen["OMP_NUM_THREADS"] == "1" and seen["MKL_NUM_THREADS"] == "1"


def test_the_table_keeps_the_rows_of_earlier_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(mutation, "OUT", tmp_path)
    first = Row("runs/verdicts", {"a": "killed", "b": "survived"}, {"b": "same"})
    mutation.save(first)
    mutation.save(Row("core/seeds", {"c": "survived"}))
    mutation.save(Row("runs/verdicts", {"a": "killed"}))  # mutated again: replaces
    rows = mutation.saved()
    assert [r.module for r in rows] == ["core/seeds", "runs/verdicts"]  # MODULES' order
    assert rows[1].status == {"a": "killed"} and rows[1].equivalent == {}
    assert rows[0].survivors == ["c"]


def test_the_scripts_environment_is_taken_when_each_session_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """mutmut runs several pytest sessions in one process, each with the mutant
    to test in ``MUTANT_UNDER_TEST``: the scripts a session's tests start
    (:func:`tests.conftest.script_env`) must see that session's mutant, not
    the one of the session that imported the conftest first."""
    from tests import conftest

    taken = dict(conftest.SESSION_ENV)
    try:
        for mutant in ("wslib.core.seeds.x_derive_seed__mutmut_1", "another"):
            monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
            conftest.pytest_sessionstart(pytest.Session.__new__(pytest.Session))
            assert conftest.script_env(tmp_path)["MUTANT_UNDER_TEST"] == mutant
    finally:
        conftest.SESSION_ENV.clear()
        conftest.SESSION_ENV.update(taken)
