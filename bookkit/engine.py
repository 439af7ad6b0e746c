"""The papermill engine the chapters run with: papermill's own, saving less often.

papermill writes the whole executed copy before and after every cell, so
that a running notebook can be watched. A smoke chapter has about 40 cells
and runs for seconds, and its 80 writes (each a JSON dump and a schema check
of the notebook, figures included) cost about 0.3 CPU-s of the few it runs.
:class:`ChapterEngine` writes the copy at most every :data:`SAVE_EVERY`
seconds while the notebook runs, so a long chapter's copy is still at most
that old, and when the notebook ends, however it ends (papermill also writes
the finished copy, and the copy of a notebook that failed in a cell, after
the engine returns). :meth:`ChapterEngine.execute_notebook` is papermill
2.7's ``Engine.execute_notebook`` with :class:`SparseSaves` as its record.
"""

from __future__ import annotations

from typing import Any

from papermill.engines import (
    NBClientEngine,
    NotebookExecutionManager,
    papermill_engines,
)

SAVE_EVERY = 10.0
"""Seconds between two writes of a running notebook's executed copy."""

NAME = "wslib"
"""The engine's name for ``papermill.execute_notebook(engine_name=...)``."""


class SparseSaves(NotebookExecutionManager):
    """papermill's record of a running notebook, written at most every
    :data:`SAVE_EVERY` seconds, and always when the notebook ends."""

    ended = False

    def save(self, **kwargs: Any) -> None:
        since = (self.now() - self.last_save_time).total_seconds()
        if self.ended or since >= SAVE_EVERY:
            super().save(**kwargs)

    def notebook_complete(self, **kwargs: Any) -> None:
        """papermill's, its last write made: a notebook whose kernel died
        (the engine raised) has no other."""
        self.ended = True
        super().notebook_complete(**kwargs)


class ChapterEngine(NBClientEngine):
    """papermill's nbclient engine with :class:`SparseSaves` as its record."""

    @classmethod
    def execute_notebook(
        cls,
        nb: Any,
        kernel_name: str,
        output_path: str | None = None,
        progress_bar: bool = True,
        log_output: bool = False,
        autosave_cell_every: int = 30,
        **kwargs: Any,
    ) -> Any:
        """papermill's ``Engine.execute_notebook`` with the record above."""
        record = SparseSaves(
            nb,
            output_path=output_path,
            progress_bar=progress_bar,
            log_output=log_output,
            autosave_cell_every=autosave_cell_every,
        )
        record.notebook_start()
        try:
            cls.execute_managed_notebook(
                record, kernel_name, log_output=log_output, **kwargs
            )
        finally:
            record.cleanup_pbar()
            record.notebook_complete()
        return record.nb


papermill_engines.register(NAME, ChapterEngine)
