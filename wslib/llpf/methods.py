"""Chapter 4's runs: one path of any method between two modes, and every method
at the gradient steps LLPF used.

- :func:`method_run`: one evaluated path of LLPF, a Bezier / PolyChain curve
  or simplified AutoNEB, the baselines with exactly a given number of
  gradient steps and checkpointed, so a killed run resumes;
- :func:`compare_at_equal_steps`: every method between the same modes, the
  baselines given exactly the gradient steps LLPF used.

Both are cached steps (:mod:`wslib.runs.steps`) keyed by
:data:`wslib.llpf.protocols.CODE`, which names this module too. The runs
themselves are :mod:`wslib.llpf.protocols`' (its refinement rule and
evaluation).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from wslib.llpf.autoneb import AutoNEBSettings, autoneb
from wslib.llpf.curves import CurveSettings, fit_curve
from wslib.llpf.protocols import CODE, Pair, PathSetup, m2m_path
from wslib.runs.resumable import Persist
from wslib.runs.steps import cached_step

# The methods of method_run (settings["method"]; the tuple lists them at run time).
MethodKind = Literal["llpf", "curve", "autoneb"]
METHOD_KINDS: tuple[MethodKind, ...] = get_args(MethodKind)


# An LLPF path's checkpoint is guarded by its own key: its name changes no result.
NOT_KEYED = {"name": "names the LLPF path's checkpoint, which its own key guards"}


@cached_step(code=CODE, not_keyed=NOT_KEYED)
def method_run(
    setup: PathSetup,
    pair: Pair,
    settings: Mapping[str, Any],
    seed: int,
    *,
    budget: int | None = None,
    name: str | None = None,
    run_cache: str | Path | None = None,
) -> dict[str, Any]:
    """One evaluated path from ``pair[0]`` to ``pair[1]`` (a cached step:
    :mod:`wslib.runs.steps`, in ``run_cache``).

    ``settings["method"]`` is ``"llpf"`` (the rest as in
    :func:`~wslib.llpf.protocols.m2m_path`, checkpointed under ``name``),
    ``"curve"`` (the rest are fields of
    :class:`~wslib.llpf.curves.CurveSettings`) or ``"autoneb"`` (of
    :class:`~wslib.llpf.autoneb.AutoNEBSettings`); the two baselines take exactly
    ``budget`` gradient steps and are checkpointed in the setup's checkpoint
    folder (:func:`baseline_checkpoint`), so a killed run resumes.
    """
    kind = settings.get("method")
    if kind not in METHOD_KINDS:
        raise ValueError(
            f"settings['method'] must be one of {METHOD_KINDS}, got {kind!r}"
        )
    rest = {k: v for k, v in settings.items() if k != "method"}
    if kind == "llpf":
        return setup.evaluate(pair[0], m2m_path(setup, pair, rest, seed, name=name))
    if budget is None:
        raise ValueError(f"a {kind} run needs a gradient-step budget (budget=...)")
    a, b = pair
    sa, sb, x, y = a.state_dict(), b.state_dict(), setup.ds.x_train, setup.ds.y_train
    checkpoint = baseline_checkpoint(setup, pair, settings, seed, budget)
    options = baseline_settings(kind, rest, budget, setup.batch_size, seed)
    persist = Persist(checkpoint, progress=False)  # each method's save interval
    if isinstance(options, CurveSettings):
        path = fit_curve(a, sa, sb, x, y, options, persist=persist)
    else:
        path = autoneb(a, sa, sb, x, y, options, persist=persist)
    return setup.evaluate(a, path)


def baseline_settings(
    kind: Literal["curve", "autoneb"],
    rest: Mapping[str, Any],
    budget: int,
    batch_size: int,
    seed: int,
) -> CurveSettings | AutoNEBSettings:
    """A baseline's settings: ``rest`` (a ``"curve"``'s or an ``"autoneb"``'s
    options) with exactly ``budget`` gradient steps, the setup's batch size
    and the path seed. ValueError naming the method and the field for an
    option ``rest`` may not set (those three) or that the method does not know."""
    steps = "steps" if kind == "curve" else "total_steps"
    fixed = {steps: budget, "batch_size": batch_size, "seed": seed}
    clash = sorted(set(rest) & set(fixed))
    if clash:
        raise ValueError(
            f"the {kind} settings set {', '.join(clash)}; leave them out: the "
            "budget, the setup's batch size and the path seed set them"
        )
    cls = CurveSettings if kind == "curve" else AutoNEBSettings
    return cls.of({**rest, **fixed}, f"the {kind} settings")


def baseline_checkpoint(
    setup: PathSetup,
    pair: Pair,
    settings: Mapping[str, Any],
    seed: int,
    budget: int,
) -> Path | None:
    """The checkpoint file of a baseline run of :func:`method_run` (None: no folder).

    Named (see :meth:`~wslib.llpf.protocols.PathSetup.checkpoint`) by the
    method, a digest of the two modes, the seed and a digest of the settings,
    budget and batch size:
    the same run in a tuning sweep and in a comparison shares its file, and
    no run overwrites another's. The file's key guards the rest.
    """
    if setup.checkpoint_dir is None:
        return None
    config = {**settings, "budget": budget, "batch_size": setup.batch_size}
    folder = setup.checkpoint(settings["method"], seed, settings=config, ends=pair)
    assert folder is not None  # checkpoint_dir is set
    return folder.with_name(f"{folder.name}.pt")


@cached_step(code=CODE, not_keyed=NOT_KEYED)
def compare_at_equal_steps(
    setup: PathSetup,
    pair: Pair,
    methods: Mapping[str, Mapping[str, Any]],
    seed: int,
    *,
    name: str | None = None,
    run_cache: str | Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Every method of ``methods`` (label -> settings) between the same modes (a
    cached step: :mod:`wslib.runs.steps`, in ``run_cache``).

    The first method must be LLPF (checkpointed under ``name``); every other
    one then gets exactly the gradient steps it used (:func:`method_run`).
    Returns label -> evaluated path.
    """
    labels = list(methods)
    if not labels or methods[labels[0]].get("method") != "llpf":
        raise ValueError(
            "the first method must be LLPF ({'method': 'llpf', ...}): its "
            "gradient steps are the budget of the others"
        )
    first = method_run(setup, pair, methods[labels[0]], seed, name=name)
    res = {labels[0]: first}
    for label in labels[1:]:
        res[label] = method_run(
            setup, pair, methods[label], seed, budget=first["grad_steps"]
        )
    return res
