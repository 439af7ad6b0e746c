"""Issue 20: resume after a kill, the refinement cap, BatchNorm thresholds, host syncs."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import wslib.llpf.ticks as ticks
from tests.kit import QUIET
from wslib.core.configs import build_model
from wslib.core.data import Dataset
from wslib.llpf.layerwise import ComplianceSGD, LLPFPath, M2MSettings, m2m
from wslib.llpf.protocols import (
    PathRun,
    PathSetup,
    batch_mode_loss,
    endpoint_loss,
    hybrid_run,
    threshold_loss,
)
from wslib.llpf.ticks import Refine, refine_point

ROOT = Path(__file__).resolve().parents[2]
IN = [1, 8]
MLP = {"name": "mlp", "in_shape": IN, "n_classes": 3, "widths": [6, 5]}
RESNET = {
    "name": "resnet1d",
    "in_shape": IN,
    "n_classes": 3,
    "widths": [4],
    "blocks_per_stage": 1,
}
HYBRID_M2O = {"ticks": 12, "shrink": 0.2}
HYBRID_M2M = {"ticks": 6, "lr": 0.05, "r_max": 3, "record_every": 2}


def dataset(n: int = 60) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * n, *IN, generator=g)
    y = torch.randint(0, 3, (2 * n,), generator=g)
    return Dataset("toy", x[:n], y[:n], x[n:], y[n:], 3)


def models(config: dict = MLP, scale: float = 0.5) -> list[nn.Module]:
    """Two models; the second's weights scaled by ``scale`` (a smaller sphere)."""
    out = []
    for s in (0, 1):
        torch.manual_seed(s)
        out.append(build_model(config).eval())
    with torch.no_grad():
        for p in out[1].parameters():
            p.mul_(scale)
    return out


def run_hybrid(folder: Path) -> dict:
    """Chapter 5's hybrid protocol at smoke size, checkpointed in ``folder``."""
    setup = PathSetup(dataset(), 8, 2, 0.1, checkpoint_dir=folder)
    source, dest = models()
    return hybrid_run(setup, source, dest, HYBRID_M2O, HYBRID_M2M, 0, name="hyb")


# The killed process: count its refinements, die (SIGKILL) right after the
# first checkpoint of the M2M phase.
KILLED = """
import os, signal, sys
from pathlib import Path
import wslib.llpf.ticks as L
import wslib.runs.store as S
from tests.llpf.test_resume import run_hybrid

folder, log = Path(sys.argv[1]), Path(sys.argv[2])
refine, write = L.refine_point, S.atomic_write

def counted(*args, **kwargs):
    with log.open("a") as f:
        f.write("x")
    return refine(*args, **kwargs)

def dying(path, writer):
    out = write(path, writer)
    if Path(path).name == "index.pt" and Path(path).parent.name.endswith("-m2m"):
        os.kill(os.getpid(), signal.SIGKILL)
    return out

L.refine_point, S.atomic_write = counted, dying
run_hybrid(folder)
"""


def counting_refinements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = ticks.refine_point

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ticks, "refine_point", counted)
    return calls


@pytest.mark.filterwarnings("ignore")
def test_killed_chapter5_run_resumes_without_redoing_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed after its first M2M checkpoint; the restart finishes the rest."""
    calls = counting_refinements(monkeypatch)
    full = run_hybrid(tmp_path / "full")
    n_full = len(calls)
    log = tmp_path / "log"
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path / "killed"), str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    n_killed = len(log.read_text())
    calls.clear()
    resumed = run_hybrid(tmp_path / "killed")
    assert 0 < len(calls) < n_full
    assert n_killed + len(calls) == n_full  # nothing done twice
    for key in ("train_loss", "test_acc", "variance"):
        np.testing.assert_array_equal(resumed[key], full[key])
    assert resumed["switch"] == full["switch"]
    calls.clear()
    again = run_hybrid(tmp_path / "killed")
    assert not calls  # finished: both phases read back
    np.testing.assert_array_equal(again["train_loss"], full["train_loss"])


# --- the refinement cap ------------------------------------------------------


def four_ticks(refine: Refine) -> LLPFPath:
    """An M2M path of 4 ticks between the two test models, refined by ``refine``."""
    source, dest = models()
    ds = dataset()
    return m2m(
        source,
        source.state_dict(),
        dest.state_dict(),
        ds.x_train,
        ds.y_train,
        M2MSettings(ticks=4, refine=refine),
        persist=QUIET,
    )


def test_ticks_stopped_at_the_cap_warn_how_far_above_the_threshold() -> None:
    refine = Refine(lr=0.05, batch_size=8, r_min=2, r_max=3, threshold=0.0)
    with pytest.warns(
        UserWarning, match=r"cap r_max=3 above the threshold 0 in 3 of 4 ticks"
    ) as record:
        path = four_ticks(refine)
    worst = max(path.refine_loss[:-1])
    capped = [str(w.message) for w in record if "cap r_max" in str(w.message)]
    assert len(capped) == 1 and f"up to {worst:.3g} above it" in capped[0]


def test_no_cap_warning_when_every_tick_reaches_the_threshold() -> None:
    import warnings

    refine = Refine(lr=0.05, batch_size=8, r_min=2, r_max=3, threshold=1e9)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        four_ticks(refine)
    assert record and not [w for w in record if "cap r_max" in str(w.message)]


# --- the threshold under BatchNorm ---------------------------------------------


def test_batchnorm_threshold_is_the_train_mode_batch_loss() -> None:
    ds = dataset()
    a, b = models(RESNET, scale=1.0)
    for m in (a, b):  # running statistics far from the data's
        for name, buf in m.named_buffers():
            if name.endswith("running_mean"):
                buf.fill_(3.0)
            if name.endswith("running_var"):
                buf.fill_(0.01)
    before = copy.deepcopy(a.state_dict())
    expected = []
    for m in (a, b):
        probe = copy.deepcopy(m).train()
        order = torch.randperm(60, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            losses = [
                nn.functional.cross_entropy(
                    probe(ds.x_train[order[k : k + 16]]), ds.y_train[order[k : k + 16]]
                ).item()
                for k in (0, 16, 32)
            ]
        expected.append(sum(losses) / 3)
    assert batch_mode_loss(a, ds, 16) == pytest.approx(expected[0], rel=1e-6)
    assert threshold_loss([a, b], ds, 16) == pytest.approx(max(expected), rel=1e-6)
    assert abs(batch_mode_loss(a, ds, 16) - endpoint_loss([a], ds)) > 0.02
    assert all(torch.equal(before[k], a.state_dict()[k]) for k in before)
    assert not a.training
    setup = PathSetup(ds, 16, 2, 0.25)
    refine = setup.refine([a, b], PathRun(lr=0.1, r_max=5, ticks=1, record_every=1))
    assert refine.threshold == pytest.approx(max(expected) + 0.25, rel=1e-6)


def test_threshold_without_batchnorm_is_the_full_set_loss() -> None:
    ds = dataset()
    a, b = models()
    assert threshold_loss([a, b], ds, 16) == endpoint_loss([a, b], ds)


# --- host syncs ------------------------------------------------------------------


def count_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every read of a tensor's value on the host."""
    reads: list[str] = []
    for name in ("item", "__float__", "__bool__", "__int__", "tolist"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_refinement_reads_one_number_per_step_from_r_min_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = models()[0]
    ds = dataset()
    refine = Refine(lr=0.05, batch_size=8, r_min=3, r_max=7, threshold=0.0)
    opt = ComplianceSGD(model, 0.05, {"linears.0.weight": 0.5}, True)
    reads = count_syncs(monkeypatch)
    steps, _ = refine_point(
        model, opt, ds.x_train, ds.y_train, refine, torch.Generator().manual_seed(0)
    )
    assert steps == 7
    assert len(reads) == (7 - 3 + 1) + 1  # stop decisions, then the returned loss


def test_compliance_step_matches_sgd_with_the_host_rate_exactly() -> None:
    """Same arithmetic as ``torch.optim.SGD`` with ``lr * float(var) / v0``, bit for bit."""
    source = models()[0]
    ds = dataset()
    factors = iter([1.37, 2.91, 0.83, 1.11, 3.7, 0.59])
    start_var = {
        n: next(factors) * float(p.var()) for n, p in source.named_parameters()
    }
    mine, ref = copy.deepcopy(source), copy.deepcopy(source)
    opt = ComplianceSGD(mine, 0.37, start_var, True)
    for _ in range(5):
        for m in (mine, ref):
            m.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(m(ds.x_train), ds.y_train).backward()
        opt.step()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                lr = 0.37 * float(p.var()) / start_var[name] if p.dim() > 1 else 0.37
                torch.optim.SGD([p], lr=lr).step()
        for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
            assert torch.equal(p, q), name
    opt.zero_grad()
    assert all(p.grad is None for p in mine.parameters())


def test_m2o_runs_with_and_without_compliance_have_their_own_checkpoints(
    tmp_path: Path,
) -> None:
    from wslib.llpf.protocols import m2o_run

    setup = PathSetup(dataset(), 8, 2, 0.1, checkpoint_dir=tmp_path)
    model = models()[0]
    settings = {"ticks": 3, "shrink": 0.2, "lr": 0.05, "r_max": 2, "record_every": 1}
    for compliance in (True, False):
        m2o_run(setup, model, settings, 0, compliance=compliance, name="m2o")
    assert len([f for f in tmp_path.iterdir() if (f / "index.pt").exists()]) == 2
