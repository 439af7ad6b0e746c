"""bookkit/run.py: parameter checks, effective parameters, the executed copy.

The end-to-end tests run a two-cell notebook in a temporary repository root
(``ROOT``, ``NOTEBOOKS`` and ``PARAMS`` of the script point there), so they do
not depend on the book's chapters.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
import torch
import yaml
from papermill.engines import papermill_engines

import bookkit.engine
import bookkit.profiles
import bookkit.run
from tests.conftest import (
    NOTEBOOKS,
    PROFILES,
    ROOT,
    chapters,
    write_notebook,
)

TINY = "00_tiny"
DEFAULTS = {
    "profile": "cpu",
    "results_path": "results/cpu/00_tiny.json",
    "width": 3,
    "name": "default",
}


@pytest.fixture()
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bookkit.run with its repository root in ``tmp_path`` holding one tiny notebook."""
    module = bookkit.run
    notebooks = tmp_path / "notebooks"
    (notebooks / "params").mkdir(parents=True)
    parameters = "\n".join(f"{k} = {v!r}" for k, v in DEFAULTS.items())
    body = (
        "from wslib.runs.results import write_results\n\n"
        'write_results(results_path, {"double": 2 * width, "name": name}, {})'
    )
    write_notebook(notebooks / f"{TINY}.md", parameters, body)
    for each in (module, bookkit.profiles):
        monkeypatch.setattr(each, "ROOT", tmp_path)
        monkeypatch.setattr(each, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(bookkit.profiles, "PARAMS", notebooks / "params")
    return module


@pytest.fixture()
def profiles(run: ModuleType) -> ModuleType:
    """bookkit.profiles, reading the ``run`` fixture's repository root."""
    return bookkit.profiles


def write_profile(profile: str, params: dict) -> None:
    (bookkit.profiles.PARAMS / f"{profile}.yaml").write_text(
        yaml.safe_dump({TINY: params})
    )


def test_default_parameters_are_the_parameters_cell(
    run: ModuleType, profiles: ModuleType
) -> None:
    assert profiles.default_parameters(TINY) == DEFAULTS


def test_a_cpu_model_config_gets_the_shape_of_its_data_set(
    run: ModuleType, profiles: ModuleType
) -> None:
    model = {"name": "mlp", "widths": [4]}
    write_profile("cpu", {"data": {"name": "mnist1d"}, "model": model})
    assert profiles.default_parameters(TINY)["model"] == {
        "name": "mlp",
        "in_shape": [1, 40],
        "n_classes": 10,
        "widths": [4],
    }


def test_defaults_are_the_cell_and_the_cpu_section_and_all_are_injected(
    run: ModuleType, profiles: ModuleType
) -> None:
    write_profile("cpu", {"width": 5, "depth": 2})
    write_profile("smoke", {"width": 1})
    assert profiles.default_parameters(TINY) == {**DEFAULTS, "width": 5, "depth": 2}
    injected = profiles.notebook_parameters(TINY, "smoke", None)
    assert injected == {
        **DEFAULTS,
        "profile": "smoke",
        "results_path": "results/smoke/00_tiny.json",
        "width": 1,
        "depth": 2,
    }


def test_unknown_profile_key_stops_before_running(
    run: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    """One line names the key, the notebook and its valid parameters; status 2."""
    write_profile("smoke", {"widht": 5})
    assert run.main(["--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    assert "widht" in err and TINY in err
    assert "valid: profile results_path width name" in err
    assert not (run.ROOT / "build").exists()  # nothing ran


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("00_tiny: {width: [1,\n", "smoke.yaml at line 2"),  # a YAML syntax error
        ("- 00_tiny\n", "must map notebook names to their parameters"),
        ("", "must map notebook names to their parameters"),  # an empty file
        ("00_tinny: {width: 5}\n", "a section for 00_tinny, which is no notebook"),
        ('00_tiny: {width: "3, 4"}\n', "sets width of 00_tiny to '3, 4' (str)"),
        ("00_tiny: {name: 7}\n", "the notebook's default is 'default' (str)"),
    ],
)
def test_a_bad_profile_file_is_named_in_one_line(
    run: ModuleType,
    capsys: pytest.CaptureFixture,
    text: str,
    message: str,
    profiles: ModuleType,
) -> None:
    (profiles.PARAMS / "smoke.yaml").write_text(text)
    assert run.main(["--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "notebooks/params/smoke.yaml" in err and message in err
    assert not (run.ROOT / "build").exists()  # nothing ran


def test_profile_values_of_a_compatible_kind_are_accepted(
    run: ModuleType, profiles: ModuleType
) -> None:
    assert (
        profiles.same_kind(2, 0.5)
        and profiles.same_kind(None, [1])
        and profiles.same_kind(3, None)
    )
    assert not profiles.same_kind(0.5, 2) and not profiles.same_kind(True, 1)
    assert not profiles.same_kind({"a": 1}, [1])


def test_unknown_key_of_a_later_notebook_stops_the_first(
    run: ModuleType, capsys: pytest.CaptureFixture, profiles: ModuleType
) -> None:
    """All requested notebooks are checked before the first one runs."""
    first = run.NOTEBOOKS / "00_first.md"
    first.write_bytes((run.NOTEBOOKS / f"{TINY}.md").read_bytes())
    (profiles.PARAMS / "smoke.yaml").write_text(
        yaml.safe_dump({"00_first": {}, TINY: {"bogus": 1}})
    )
    assert run.main(["--profile", "smoke"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert not (run.ROOT / "build").exists()


def test_run_records_effective_parameters_and_collapses_injected_cell(
    run: ModuleType,
) -> None:
    write_profile("smoke", {"width": 5})
    assert run.main(["--profile", "smoke"]) == 0
    results = json.loads((run.ROOT / "results/smoke/00_tiny.json").read_text())
    assert results["notebook"] == TINY and results["profile"] == "smoke"
    # defaults, overridden by the profile (width) and by run.py (profile, results_path)
    assert results["params"] == {
        **DEFAULTS,
        "width": 5,
        "profile": "smoke",
        "results_path": "results/smoke/00_tiny.json",
    }
    assert results["metrics"] == {"double": 10, "name": "default"}
    executed = nbformat.read(run.ROOT / "build/smoke/00_tiny.ipynb", as_version=4)
    tags = [cell.metadata.get("tags", []) for cell in executed.cells]
    assert tags[1] == ["run-info"]  # right under the title
    injected = [t for t in tags if "injected-parameters" in t]
    assert injected == [["injected-parameters", "hide-input"]]
    assert ["parameters"] in tags  # the defaults cell keeps its tag
    (cell,) = [c for c in executed.cells if "injected-parameters" in c.metadata.tags]
    namespace: dict = {}
    exec(cell.source, namespace)
    assert (namespace["width"], namespace["profile"]) == (5, "smoke")
    times = json.loads((run.ROOT / "build/smoke/run_times.json").read_text())
    assert set(times) == {TINY}
    assert executed.metadata.papermill.input_path == "notebooks/00_tiny.md"


def test_parameters_from_the_profile_are_not_called_unknown(
    run: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    """A parameter the cpu profile declares is injected without papermill's
    warning (it reads only the parameters cell); its other messages stay."""
    write_profile("cpu", {"depth": 2})
    with caplog.at_level(logging.INFO, logger="papermill"):
        assert run.main(["--profile", "cpu"]) == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "papermill"]
    assert not [m for m in messages if "unknown parameter" in m]
    assert any(m.startswith("Executing notebook with kernel") for m in messages)


def test_fingerprint_follows_the_chapter_source(run: ModuleType) -> None:
    before = run.code_fingerprint(TINY)
    path = run.NOTEBOOKS / f"{TINY}.md"
    path.write_text(path.read_text().replace("A tiny chapter", "A small chapter"))
    assert run.code_fingerprint(TINY) != before


def write_model_chapter(run: ModuleType, profile: dict) -> None:
    """A chapter ``00_model`` with a data set and a model config, and a smoke profile."""
    parameters = (
        'data = {"name": "mnist1d"}\n'
        'model = {"name": "mlp", "in_shape": [1, 40], "n_classes": 10, "widths": [4]}'
    )
    write_notebook(run.NOTEBOOKS / "00_model.md", parameters, "x = 1")
    (bookkit.profiles.PARAMS / "smoke.yaml").write_text(
        yaml.safe_dump({"00_model": profile})
    )


def test_profile_model_configs_take_the_shape_of_their_data_set(
    run: ModuleType, profiles: ModuleType
) -> None:
    write_model_chapter(run, {"model": {"name": "mlp", "widths": [8]}})
    params = profiles.notebook_parameters("00_model", "smoke", None)
    assert list(params["model"].items()) == [
        ("name", "mlp"),
        ("in_shape", [1, 40]),
        ("n_classes", 10),
        ("widths", [8]),
    ]
    profile = {"data": {"name": "cifar100"}, "model": {"name": "vgg11"}}
    write_model_chapter(run, profile)
    params = profiles.notebook_parameters("00_model", "smoke", None)
    assert params["model"] == {
        "name": "vgg11",
        "in_shape": [3, 32, 32],
        "n_classes": 100,
    }


def test_a_model_config_without_a_known_data_set_stops_before_running(
    run: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    write_model_chapter(run, {"data": {"name": "svhn"}, "model": {"name": "mlp"}})
    assert run.main(["--profile", "smoke", "00_model"]) == 2
    err = capsys.readouterr().err
    assert "notebooks/params/smoke.yaml, section 00_model" in err and "svhn" in err


def test_seed_is_recorded_as_a_parameter(run: ModuleType) -> None:
    write_profile("smoke", {})
    assert run.main(["--profile", "smoke", "--seed", "7"]) == 0
    results = json.loads((run.ROOT / "results/smoke/seed-7/00_tiny.json").read_text())
    assert results["params"]["seed"] == 7
    assert results["params"]["width"] == DEFAULTS["width"]
    assert (run.ROOT / "build/smoke/seed-7/00_tiny.ipynb").exists()


def test_notebook_without_results_file_fails(
    run: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    path = run.NOTEBOOKS / f"{TINY}.md"
    notebook = chapters.read(path)
    notebook.cells[2].source = "x = 1"
    chapters.write(notebook, path)
    write_profile("smoke", {})
    assert run.main(["--profile", "smoke"]) == 1
    assert "did not write results/smoke/00_tiny.json" in capsys.readouterr().err


def test_injected_parameters_are_wrapped_to_the_page(run: ModuleType) -> None:
    params = {
        "models": {
            f"m{i}": {"name": "mlp", "widths": [256, 256, 256]} for i in range(4)
        },
        "n": 3,
        "a_very_long_parameter_name_indeed_for_a_notebook_parameter": list(range(30)),
    }
    source = run.injected_source(params)
    assert source.startswith("# Parameters\n")
    assert max(map(len, source.splitlines())) <= run.PAGE_WIDTH + 10
    namespace: dict = {}
    exec(source, namespace)
    assert {name: namespace[name] for name in params} == params


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_key_is_a_parameter_of_its_notebook(profile: str) -> None:
    """The book's own profiles pass the check that run.py makes before running."""
    for nb in NOTEBOOKS:
        bookkit.profiles.notebook_parameters(nb, profile, None)


def copy_tiny(run: ModuleType, name: str, body: str | None = None) -> None:
    """Another notebook like the tiny one, optionally with another last cell."""
    notebook = chapters.read(run.NOTEBOOKS / f"{TINY}.md")
    if body is not None:
        notebook.cells[2].source = body
    chapters.write(notebook, run.NOTEBOOKS / f"{name}.md")


def test_notebooks_side_by_side_compute_on_one_thread_each(
    run: ModuleType, profiles: ModuleType
) -> None:
    body = (
        "import os\nimport torch\nfrom wslib.runs.results import write_results\n"
        "write_results(results_path, "
        '{"threads": torch.get_num_threads(), "folder": os.getcwd()}, {})'
    )
    copy_tiny(run, "00_threads", body)
    (profiles.PARAMS / "cpu.yaml").write_text("{}")
    folder = Path.cwd()
    assert run.main(["--profile", "cpu", "--jobs", "2"]) == 0
    assert Path.cwd() == folder  # two notebooks' chdirs did not cross
    for nb in ("00_threads", TINY):
        assert (run.ROOT / f"results/cpu/{nb}.json").exists()
    results = json.loads((run.ROOT / "results/cpu/00_threads.json").read_text())
    assert results["metrics"] == {"threads": 1, "folder": str(run.ROOT)}
    times = json.loads((run.ROOT / "build/cpu/run_times.json").read_text())
    assert set(times) == {"00_threads", TINY}


def test_a_failed_notebook_is_named_and_the_others_go_on(
    run: ModuleType, capsys: pytest.CaptureFixture, profiles: ModuleType
) -> None:
    copy_tiny(run, "00_broken", "raise ValueError('planted failure')")
    (profiles.PARAMS / "cpu.yaml").write_text("{}")
    assert run.main(["--profile", "cpu", "--jobs", "2"]) == 1
    err = capsys.readouterr().err
    assert "notebook 00_broken failed" in err and "planted failure" in err
    assert "failed: 00_broken" in err
    assert (run.ROOT / "results/cpu/00_tiny.json").exists()


def test_a_chapter_whose_kernel_dies_is_named_and_the_others_go_on(
    run: ModuleType, capsys: pytest.CaptureFixture, profiles: ModuleType
) -> None:
    """A kernel that dies (here it exits; out of memory kills it the same way)
    fails its own chapter, in a few lines, not the whole run with a traceback."""
    copy_tiny(run, "00_dies", "import os\nos._exit(3)")
    (profiles.PARAMS / "cpu.yaml").write_text("{}")
    assert run.main(["--profile", "cpu", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "error: notebook 00_dies failed outside its cells" in err
    assert "DeadKernelError" in err and "Traceback" not in err
    assert "failed: 00_dies" in err
    assert (run.ROOT / "results/cpu/00_tiny.json").exists()
    copy = nbformat.read(run.ROOT / "build/cpu/00_dies.ipynb", as_version=4)
    assert copy.metadata.papermill["end_time"]  # its last write was made


def test_jobs_must_be_positive(run: ModuleType) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--jobs", "0"])


def test_gpu_profile_refuses_to_start_without_cuda(
    run: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """No silent fallback to days of CPU time: one line naming CUDA and the way out."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    write_profile("gpu", {})
    assert run.main(["--profile", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err and "--allow-cpu" in err
    assert not (run.ROOT / "build").exists()
    assert run.missing_cuda("gpu", allow_cpu=True) is None
    assert run.missing_cuda("cpu", allow_cpu=False) is None


def test_longest_notebooks_start_first(
    run: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = tmp_path / "reference_times.json"
    reference.write_text(json.dumps({"a": 10, "b": 300, "c": 50}))
    monkeypatch.setattr(run, "REFERENCE_TIMES", reference)
    assert run.longest_first(["a", "b", "c", "new"], "cpu") == ["new", "b", "c", "a"]
    assert run.longest_first(["a", "b", "c"], "smoke") == ["a", "b", "c"]
    last = tmp_path / "build" / "cpu" / "run_times.json"
    last.parent.mkdir(parents=True)
    last.write_text(json.dumps({"a": 900}))
    assert run.longest_first(["a", "b", "c"], "cpu") == ["a", "b", "c"]


def test_reference_times_name_every_chapter() -> None:
    times = json.loads((ROOT / "notebooks" / "reference_times.json").read_text())
    assert set(times) <= set(NOTEBOOKS)


def test_kernels_share_the_cores_without_overriding_the_cuda_rule(
    run: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.py's share of the cores is WSLIB_CPU_WORKERS, never WSLIB_WORKERS."""
    for name in ("WSLIB_WORKERS", "WSLIB_CPU_WORKERS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(run, "cores", lambda: 16)
    run.one_thread_kernels(2)
    assert os.environ["WSLIB_CPU_WORKERS"] == "8" and "WSLIB_WORKERS" not in os.environ


def test_chapters_run_with_the_engine_that_saves_less_often(
    run: ModuleType, profiles: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """papermill gets bookkit's engine (bookkit/engine.py), not its own."""
    (profiles.PARAMS / "cpu.yaml").write_text("{}")
    calls: list[dict] = []

    def record(*args: object, **kwargs: object) -> None:
        calls.append(kwargs)
        raise KeyboardInterrupt  # stop before any kernel starts

    monkeypatch.setattr(run.papermill, "execute_notebook", record)
    with pytest.raises(KeyboardInterrupt):
        run.run_notebook(TINY, "cpu", None, progress_bar=False)
    (kwargs,) = calls
    engine = papermill_engines.get_engine(kwargs["engine_name"])
    assert engine is bookkit.engine.ChapterEngine


def test_the_run_line_names_the_cpu_speed(
    run: ModuleType, capsys: pytest.CaptureFixture, profiles: ModuleType
) -> None:
    (profiles.PARAMS / "cpu.yaml").write_text("{}")
    assert run.main(["--profile", "cpu"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    speed = float(line.split("this CPU: ")[1].split(" GFLOPS")[0])
    assert line.startswith("1 notebook(s) in ") and speed > 0


def test_a_profile_without_a_section_says_the_defaults_run(
    run: ModuleType, capsys: pytest.CaptureFixture, profiles: ModuleType
) -> None:
    (profiles.PARAMS / "smoke.yaml").write_text("{}")
    assert run.main(["--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert (
        f"notebooks/params/smoke.yaml has no section for {TINY}: they run with" in out
    )
    (profiles.PARAMS / "smoke.yaml").write_text(f"{TINY}: {{}}")
    assert run.main(["--profile", "smoke"]) == 0
    assert "has no section" not in capsys.readouterr().out
