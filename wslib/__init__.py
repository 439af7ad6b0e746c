"""wslib: the library behind the study book on the geometry of weight space.

The package is layered; a package imports only those listed before it::

    wslib.core       what every chapter builds on: neurons (the neuron structure,
                     permutations, rescalings), models, configs (in_shape and
                     n_classes of a model config from its data set), pooling
                     (max pooling over pairs, faster to train), data and
                     splits, recipes (how a model is trained, checked
                     without torch), train,
                     stacked (same-shaped runs trained as one model), norms (BatchNorm / LayerNorm helpers), interpolation,
                     matching (Git Re-Basin), files (hashes, atomic writes),
                     seeds (every random choice from a chapter's seed),
                     connectivity (modes and the line between them, chapters
                     1-2), describe (names of models and data for the text),
                     workspace (the absolute folders every chapter reads and
                     writes: data, zoo, run caches, checkpoints, results),
                     settings (a run's options: checked once, its key)
    wslib.runs       reproducibility machinery, no algorithm: store (the one
                     keyed store of every cache and checkpoint), resumable
                     (the one resumable-run helper: generator, ticks,
                     checkpoints), zoo (trained-model
                     cache), cache (run cache), steps (cached steps, keyed by
                     their arguments), results (results files), workers
                     (process pools), stats (epochs to a threshold, summaries,
                     speed-ups, learning-rate choice), sweeps (metrics over
                     seeds), claims (the claims ledger: a claim, its
                     metric, its verdict rule), claim_list (the book's
                     claims, written before any run), units (a chapter's work as
                     independent cached pieces, for sweeps over machines),
                     published (the papers' reported numbers and their
                     settings, shown beside the book's where they match),
                     verdicts (the one rule that turns differences into words),
                     stages (the seeds make book SEEDS=auto adds where a claim
                     is undecided)
    wslib.plotting   one style and one colour per method for the whole book
    wslib.llpf       Low-Loss Path Finding: layerwise (M2M, M2O, hybrid), ticks
                     (the tick loop they share), stages (their layer order), path
                     (the result type of every path finder), curves (Bezier),
                     autoneb, evaluation; protocols (the chapters' runs),
                     methods (chapter 4's runs of every method), setup
                     (what the chapters share), ch02_layerwise, ch03_m2m,
                     ch04_baselines, ch05_spheres (each chapter's tables and
                     metrics), figures, units (chapters 3-5 as independent
                     cached pieces)
    wslib.pathcond   PathCond: rescaling (diag G), solver, lifting (explicit
                     path-lifting), enorm, training (cached runs, stacked
                     on a GPU), grid (cached runs of MLP configurations),
                     protocols (what the chapters share); one module per
                     chapter with its protocol, tables, text and verdicts
                     (ch06_pathlifting, ch07_mlp with ch07_results, ch08_conv);
                     figures, units
                     (chapters 7-8 as independent cached pieces)
    wslib.fusion     HF / KF fusion: levels (a chain net's levels, their inputs
                     and outputs), checks (what every fusion refuses),
                     grouping (on the models' device), retrofit (the fused
                     weights), hfkf, residual, taps (what a residual fusion
                     reads and fits, in which order), importance,
                     baselines; protocols (what the chapters share),
                     ch09_cost, ch10_regimes, ch11_beyond (each chapter's
                     protocol and tables; chapter 10's summaries and tables
                     in ch10_results), published (this run's numbers for
                     the paper's Table 1)

    wslib.synthesis  across the papers (chapter 12): alignment (both
                     symmetries), conditioning (PathCond's criterion along
                     a path), ch12_synthesis (the four questions' protocols),
                     ch12_results (their verdicts in words, tables, metrics)

The three paper packages never import each other (``tests/test_layers.py``).
"""

__version__ = "0.3.0"
