"""The book's tooling: run, sweep and split the chapters, build and check the book.

``bookkit COMMAND [ARGS]`` (the console script, or ``python -m bookkit COMMAND``
in a checkout: that checkout's code runs) calls one module's ``main``:

=================  ==============================================================
``run``            execute chapters with papermill in one profile (:mod:`.run`)
``sweep``          one job per (chapter, seed), locally or on Slurm (:mod:`.sweep`)
``part``           a long chapter's units of work outside its notebook (:mod:`.part`)
``plan``           the CI stages' job matrix and the merge of their files (:mod:`.plan`)
``affected``       the chapters a change touches (:mod:`.affected`)
``build``          the Jupyter Book from executed chapters (:mod:`.build`)
``lint``           ruff and mypy over the chapters' code cells (:mod:`.lint`)
``download``       the gpu profile's image data sets (:mod:`.download`)
``gpu-check``      the check for a CUDA machine (:mod:`.gpu_check`)
``synthetic-data`` small files in the real formats of those data sets (:mod:`.synthetic_data`)
=================  ==============================================================

The other modules serve these: :mod:`.profiles` (a chapter's parameters in a
profile, and the repository's folders), :mod:`.chapters` (a chapter's source
as a notebook), :mod:`.kernels` (forked kernels), :mod:`.engine`
(papermill's engine, saving a running chapter's copy less often),
:mod:`.speed` (the CPU's speed beside each wall time), :mod:`.profile_values`,
:mod:`.apilinks`, :mod:`.course` and :mod:`.ledger` (pages of the build),
:mod:`.device_checks`, :mod:`.gpu_work`, :mod:`.gpu_estimate` and
:mod:`.gpu_timings` (the gpu check). Every path is relative to the repository
root, the folder above this package; ``wslib`` never imports ``bookkit`` (an
import-linter contract).
"""
