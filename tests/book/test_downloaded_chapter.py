"""A chapter downloaded from the book (or opened in Colab) runs outside a checkout.

Its setup cell installs ``wslib[notebook]`` (here from a wheel of the tests'
checkout copy, through ``WSLIB_SOURCE``) into a Python that has neither
``wslib`` nor what the chapter imports besides it (``myst_nb``, which pip
then takes from the package index), and the chapter writes its results in the
folder it runs in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import SMOKE, load_script

CHAPTER = "06_pathlifting"  # a short chapter in the smoke profile
HIDDEN = ("wslib", "myst_nb")  # installed by the setup cell, not seen before


def site_packages(python: Path) -> Path:
    """The ``site-packages`` folder of the Python environment of ``python``."""
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def environment_without_wslib(folder: Path) -> Path:
    """A virtual environment that sees this one's packages but not :data:`HIDDEN`; its python.

    A ``.pth`` file adds a folder of links to every package of the running
    environment except those (their files, metadata, editable hooks).
    """
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    shared = folder / "shared"
    shared.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        hidden = any(name in entry.name.lower() for name in HIDDEN)
        if not hidden and entry.suffix != ".pth":
            (shared / entry.name).symlink_to(entry)
    (site_packages(python) / "shared.pth").write_text(f"{shared}\n")
    return python


def test_downloaded_chapter_installs_wslib_and_runs(
    workspace: Path, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"]
        + ["--no-build-isolation", "-w", str(wheels), str(workspace)],
        check=True,
    )
    (wheel,) = wheels.glob("wslib-*.whl")
    python = environment_without_wslib(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name in HIDDEN:
        missing = subprocess.run(
            [str(python), "-c", f"import {name}"], cwd=tmp_path, env=env, check=False
        )
        assert missing.returncode != 0, f"the test environment must lack {name}"

    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / f"{CHAPTER}.ipynb").write_bytes(
        (workspace / "notebooks" / f"{CHAPTER}.ipynb").read_bytes()
    )
    run = load_script("notebooks/run.py")
    params = run.notebook_parameters(CHAPTER, SMOKE, None)
    (folder / "params.json").write_text(json.dumps(params))
    script = (
        "import json, papermill\n"
        f"papermill.execute_notebook('{CHAPTER}.ipynb', 'out.ipynb', "
        "parameters=json.load(open('params.json')), progress_bar=False)\n"
    )
    done = subprocess.run(
        [str(python), "-c", script],
        cwd=folder,
        env={**env, "WSLIB_SOURCE": wheel.as_uri()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((folder / params["results_path"]).read_text())
    assert results["metrics"], "the chapter wrote no metric"
    assert results["env"]["commit"] == "unknown"  # it ran outside any checkout
    installed = site_packages(python) / "wslib"
    assert installed.is_dir(), "the setup cell did not install wslib"
