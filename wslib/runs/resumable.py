"""One helper for every resumable run: LLPF paths, Bezier / PolyChain curves, AutoNEB.

A run counts *ticks* (an LLPF tick, a curve's SGD step, an AutoNEB cycle).
A :class:`Resumable` holds what every such run shares: its random generator
(seeded with the run's seed), the tick counter, the seconds spent, whether
the run finished, the progress bar, and its checkpoint, an entry of
:mod:`wslib.runs.store` saved every ``checkpoint_every`` ticks and at the end
with the algorithm's own state. Started again with a checkpoint of the same
key, the run continues at the saved tick with the saved generator, so a
killed run ends bit-identical to an uninterrupted one (on the CPU); a
finished one returns without another tick. A run with ticks left refuses to
start under ``WSLIB_CACHED_ONLY=1`` (:mod:`wslib.runs.units`).

A run's loop::

    run = Resumable(persist, "Bezier curve", key, seed, steps)
    saved = run.resume(check)          # the algorithm's saved state, or None
    run.begin("bezier curve")
    while not run.done:
        ...                            # one tick, drawing from run.gen
        run.count()                    # its seconds; finished at the last tick
        run.settle(snapshot)           # saved when due, then on_tick
    run.end(snapshot)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from wslib.runs.store import Check, Entry, Payload
from wslib.runs.units import refuse_compute

# What every checkpoint holds besides the algorithm's state, and its kind.
RUN_FIELDS = {
    "tick": int,
    "generator": torch.Tensor,
    "seconds": float,
    "finished": bool,
}


@dataclass(frozen=True)
class Persist:
    """Where a resumable run saves itself, how often, and what it reports.

    ``checkpoint`` is the checkpoint's path (None: none); the run is saved
    every ``checkpoint_every`` ticks (None: the run's own default, see
    :class:`Resumable`) and at the end. ``progress`` shows a progress bar;
    ``on_tick(tick, *extra)`` is called after each tick (and its save), with
    the run's extra arguments (an LLPF run: its model). ``Persist()`` is a
    run without a checkpoint, with a progress bar.
    """

    checkpoint: str | Path | None = None
    checkpoint_every: int | None = None
    progress: bool = True
    on_tick: Callable[..., None] | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError(
                f"checkpoint_every must be >= 1, got {self.checkpoint_every}"
            )


class Resumable:
    """The shared state of one resumable run of ``ticks`` ticks (see the module docstring).

    ``what`` names the run in messages; ``key`` (a hash of everything that
    determines the run, its code included; None without a checkpoint) guards
    its checkpoint, a file or, with ``folder``, a folder of parts
    (:meth:`wslib.runs.store.Entry.folder`). The checkpoint is saved every
    ``persist.checkpoint_every`` ticks, or every ``every`` ticks (the
    algorithm's default) when that is None.
    """

    def __init__(
        self,
        persist: Persist,
        what: str,
        key: str | None,
        seed: int,
        ticks: int,
        *,
        folder: bool = False,
        every: int = 10,
    ) -> None:
        self.persist, self.what, self.ticks = persist, what, ticks
        self.every = (
            every if persist.checkpoint_every is None else persist.checkpoint_every
        )
        self.entry = None
        if persist.checkpoint is not None:
            if Path(persist.checkpoint).suffix == ".json":
                raise ValueError(
                    f"{what} checkpoint {persist.checkpoint}: a run's checkpoint holds "
                    "tensors; name it with .pt (or no suffix), not .json"
                )
            make = Entry.folder if folder else Entry
            self.entry = make(persist.checkpoint, key, f"{what} checkpoint")
        self.gen = torch.Generator().manual_seed(seed)
        self.tick, self.seconds, self.finished = 0, 0.0, False
        self._bar: tqdm | None = None
        self._t0 = 0.0
        self._saved = False  # a checkpoint of this run is on disk

    @property
    def done(self) -> bool:
        """Whether the run is finished (no tick left)."""
        return self.finished or self.tick >= self.ticks

    @property
    def stored_parts(self) -> set[str]:
        """The parts the checkpoint on disk lists (written, not to be written again)."""
        return set() if self.entry is None else set(self.entry.parts)

    def resume(self, check: Check | None = None) -> Payload | None:
        """The algorithm's saved state (None: start afresh), the run's own restored.

        ``check(saved)`` names what keeps a loaded checkpoint from being the
        algorithm's (None if nothing): such a checkpoint is ignored with a
        warning, like an unreadable one or another run's.
        """
        if self.entry is None:
            return None
        saved = self.entry.load(lambda s: _run_problem(s) or (check and check(s)))
        if saved is not None:
            self._saved = True
            self.tick, self.finished = saved["tick"], saved["finished"]
            self.gen.set_state(saved["generator"])
            self.seconds = float(saved["seconds"])
        return saved

    def begin(self, desc: str) -> None:
        """Refuse under cached-only when ticks are left; open the progress bar ``desc``."""
        if not self.done:
            refuse_compute(
                f"{self.what} {self.entry.shown if self.entry else ''}".rstrip()
            )
        self._bar = tqdm(
            total=self.ticks,
            initial=self.tick,
            desc=desc,
            disable=not self.persist.progress,
            leave=False,
        )
        self._t0 = time.perf_counter()

    def count(self, last: bool = False) -> None:
        """One more tick done and its seconds counted; ``last``: the run is finished."""
        self.tick += 1
        self.finished = last or self.tick >= self.ticks
        self.seconds += time.perf_counter() - self._t0
        assert self._bar is not None, "begin() opens the run"
        self._bar.update(1)

    def settle(self, snapshot: Callable[[], Payload], *extra: object) -> None:
        """Save ``snapshot()`` when due (every ``every`` ticks, at the end), then ``on_tick``."""
        if self.entry is not None and (self.done or self.tick % self.every == 0):
            self.save(snapshot())
        if self.persist.on_tick is not None:
            self.persist.on_tick(self.tick, *extra)
        self._t0 = time.perf_counter()

    def save(self, state: Payload) -> None:
        """Save the algorithm's ``state`` with the run's own (tick, generator, seconds, finished)."""
        assert self.entry is not None, "a run without a checkpoint saves nothing"
        run = {
            "tick": self.tick,
            "generator": self.gen.get_state(),
            "seconds": self.seconds,
            "finished": self.finished,
        }
        self.entry.save({**state, **run})
        self._saved = True

    def end(self, snapshot: Callable[[], Payload]) -> None:
        """Close the progress bar; save a run that had no tick to take and no checkpoint yet."""
        assert self._bar is not None, "begin() opens the run"
        self._bar.close()
        if self.entry is not None and not self._saved:
            self.save(snapshot())


def _run_problem(saved: Payload) -> str | None:
    """What keeps ``saved`` from holding a run's own state; None if nothing."""
    for name, kind in RUN_FIELDS.items():
        value = saved.get(name)
        if kind is float and isinstance(value, int | float):
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{name} is a {type(value).__name__}"
    state = saved["generator"]
    if state.dtype != torch.uint8 or state.shape != torch.Generator().get_state().shape:
        return "generator is not a generator state"
    return None
