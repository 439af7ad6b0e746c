"""Property tests: the verdict rule and the store's checksum against references.

Each property draws small random inputs with Hypothesis and checks a library
function against a reference written here: scipy's paired and Welch t-tests,
two one-sided t-tests (TOST) from scipy, and a flat re-serialisation of a
payload's tensors hashed with hashlib. The docstring of each test names its
reference.
"""

from __future__ import annotations

import hashlib
import math
import struct
import tempfile
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from scipy import stats

from wslib.runs.store import CHECKSUM, Entry, checksum
from wslib.runs.verdicts import (
    LEDGER_ALPHA,
    Decision,
    Verdict,
    decide,
    decide_independent,
    decide_paired,
    decide_summary,
)


def quick(examples: int) -> settings:
    """``examples`` draws, no deadline, no example database written to the checkout."""
    return settings(max_examples=examples, deadline=None, database=None)


VALUE = st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False)
ALPHAS = st.sampled_from([0.05, LEDGER_ALPHA, 0.1, 0.2])
# A margin rule: none, a fixed margin, or ("se", k): the sample's distance from the
# reference plus k standard errors, which puts TOST near the edge where a test at
# the wrong level or with the wrong variance decides otherwise.
MarginRule = float | tuple[str, float] | None
SE_MARGINS = st.tuples(st.just("se"), st.floats(0.3, 3.0))
MARGINS = st.one_of(st.none(), st.floats(0.01, 2.0), SE_MARGINS)
TOL = 1e-9


def sample(low: int, high: int) -> st.SearchStrategy[list[float]]:
    """Lists of ``low`` to ``high`` values from :data:`VALUE`."""
    return st.lists(VALUE, min_size=low, max_size=high)


def close(x: float, y: float, scale: float) -> bool:
    """``x`` and ``y`` agree to :data:`TOL` relative to ``scale``."""
    return abs(x - y) <= TOL * (1 + scale)


def clear_of(x: float, boundary: float, scale: float) -> bool:
    """``x`` lies further than rounding from ``boundary`` (no knife-edge case)."""
    return not close(x, boundary, scale)


def margin_of(rule: MarginRule, distance: float, se: float) -> float | None:
    """The margin a :data:`MARGINS` rule gives a sample ``distance`` from the reference."""
    if rule is None or isinstance(rule, float):
        return rule
    return max(abs(distance) + rule[1] * se, 1e-3)


def tost_p(d: np.ndarray, low: float, high: float) -> float:
    """Two one-sided t-tests that the mean of ``d`` lies in ``(low, high)``: the larger p."""
    p_low = stats.ttest_1samp(d, low, alternative="greater").pvalue
    p_high = stats.ttest_1samp(d, high, alternative="less").pvalue
    return float(max(p_low, p_high))


def expected_verdict(
    interval: tuple[float, float], reference: float, equivalent: bool
) -> Verdict:
    """The rule's classes written out: above, below, else equivalent or undecided."""
    low, high = interval
    if low > reference:
        return Verdict.ABOVE
    if high < reference:
        return Verdict.BELOW
    return Verdict.EQUIVALENT if equivalent else Verdict.UNDECIDED


def assert_interval(d: Decision, low: float, high: float, scale: float) -> None:
    """``d``'s interval is ``(low, high)`` to :data:`TOL` relative to ``scale``."""
    assert d.interval is not None
    assert close(d.interval[0], low, scale), (d.interval, (low, high))
    assert close(d.interval[1], high, scale), (d.interval, (low, high))


# --- the verdict rule ------------------------------------------------------------------


@st.composite
def paired(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    """Two equally long samples (2 to 12 values) whose differences are not all equal."""
    n = draw(st.integers(2, 12))
    values = draw(sample(n, n))
    reference = draw(sample(n, n))
    d = np.subtract(values, reference)
    assume(not np.all(d == d[0]))
    return values, reference


@quick(150)
@given(paired(), ALPHAS, MARGINS)
def test_decide_paired_is_the_paired_t_test(
    pair: tuple[list[float], list[float]], alpha: float, rule: MarginRule
) -> None:
    """``decide_paired``. Reference: ``scipy.stats.ttest_rel(values, reference)``'s
    ``1 - alpha`` interval; the verdict from its position relative to 0, and
    EQUIVALENT from scipy's two one-sided t-tests at ``±margin`` (TOST)."""
    values, reference = pair
    d = np.subtract(values, reference)
    scale = float(np.abs(d).max())
    margin = margin_of(rule, d.mean(), d.std(ddof=1) / math.sqrt(d.size))
    ci = stats.ttest_rel(values, reference).confidence_interval(1 - alpha)
    low, high = float(ci.low), float(ci.high)
    assume(clear_of(low, 0.0, scale) and clear_of(high, 0.0, scale))
    equivalent = False
    if margin is not None:
        p = tost_p(d, -margin, margin)
        assume(clear_of(p, alpha, 0.0))
        equivalent = p < alpha
    got = decide_paired(values, reference, margin=margin, alpha=alpha)
    assert_interval(got, low, high, scale)
    assert close(got.mean, float(d.mean()), scale)
    assert got.n == len(values) and got.alpha == alpha and got.margin == margin
    assert got.verdict is expected_verdict((low, high), 0.0, equivalent)
    event(f"verdict {got.verdict.name}")


@st.composite
def independent(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    """Two samples of 2 to 12 values each, not both without spread: each scaled (its
    spread 0, 1/10 or 1: unequal variances are where Welch differs), the second shifted."""
    spread = st.sampled_from([0.0, 0.1, 1.0])
    scale_a, scale_b, shift = draw(spread), draw(spread), draw(st.floats(-2.0, 2.0))
    a = [x * scale_a for x in draw(sample(2, 12))]
    b = [x * scale_b + shift for x in draw(sample(2, 12))]
    assume(len(set(a)) > 1 or len(set(b)) > 1)
    return a, b


def welch_tost_p(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """Two one-sided Welch t-tests that ``mean(a) - mean(b)`` lies in ``±margin``: the larger p."""
    x, y = np.asarray(a), np.asarray(b)
    p_low = stats.ttest_ind(x + margin, y, equal_var=False, alternative="greater")
    p_high = stats.ttest_ind(x - margin, y, equal_var=False, alternative="less")
    return float(max(p_low.pvalue, p_high.pvalue))


@quick(300)
@given(independent(), ALPHAS, st.one_of(MARGINS, SE_MARGINS))
def test_decide_independent_is_welchs_t_test(
    pair: tuple[list[float], list[float]], alpha: float, rule: MarginRule
) -> None:
    """``decide_independent``. Reference:
    ``scipy.stats.ttest_ind(values, reference, equal_var=False)``'s ``1 - alpha``
    interval (Welch), the verdict from its position relative to 0, and EQUIVALENT
    from two one-sided Welch t-tests in scipy at ``±margin``."""
    a, b = pair
    scale = float(np.abs(np.concatenate([a, b])).max())
    se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    margin = margin_of(rule, float(np.mean(a) - np.mean(b)), se)
    equivalent = False
    with warnings.catch_warnings():  # one side without spread: Welch copes
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(1 - alpha)
        if margin is not None:
            p = welch_tost_p(a, b, margin)
            assume(clear_of(p, alpha, 0.0))
            equivalent = p < alpha
    low, high = float(ci.low), float(ci.high)
    assume(clear_of(low, 0.0, scale) and clear_of(high, 0.0, scale))
    got = decide_independent(a, b, margin=margin, alpha=alpha)
    assert_interval(got, low, high, scale)
    assert close(got.mean, float(np.mean(a) - np.mean(b)), scale)
    assert got.n == min(len(a), len(b))
    assert got.verdict is expected_verdict((low, high), 0.0, equivalent)
    event(f"verdict {got.verdict.name}")


# A spread that underflows to 0 (values near 1e-200) makes statsmodels divide by zero.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@quick(300)
@given(sample(1, 12), VALUE, ALPHAS, MARGINS)
def test_decide_summary_agrees_with_decide(
    values: list[float], reference: float, alpha: float, rule: MarginRule
) -> None:
    """``decide_summary(mean, std (ddof 1), n)``. Reference: ``decide(values)`` on the
    sample the summary describes: the same verdict and interval. Samples whose
    interval ends, or whose TOST p-value, sit within rounding of the boundary are
    skipped (the two see the mean through different roundings)."""
    v = np.asarray(values)
    scale = float(np.abs(v).max()) + abs(reference)
    std = float(v.std(ddof=1)) if v.size > 1 else 0.0
    margin = margin_of(rule, float(v.mean()) - reference, std / math.sqrt(v.size))
    full = decide(values, reference=reference, margin=margin, alpha=alpha)
    if full.interval is not None:
        for end in full.interval:
            assume(clear_of(end, reference, scale))
        if margin is not None and len(set(values)) > 1:
            p = tost_p(v, reference - margin, reference + margin)
            assume(clear_of(p, alpha, 0.0))
        if margin is not None and len(set(values)) == 1:
            assume(clear_of(abs(values[0] - reference), margin, scale))
    short = decide_summary(
        float(v.mean()), std, v.size, reference=reference, margin=margin, alpha=alpha
    )
    assert short.verdict is full.verdict
    event(f"verdict {full.verdict.name}")
    assert short.n == full.n and close(short.mean, full.mean, scale)
    if full.interval is None:
        assert short.interval is None
    else:
        assert_interval(short, *full.interval, scale)


# --- the store's checksum ---------------------------------------------------------------

# How each tensor type is written by the reference: numpy's dtype name and a
# struct code for one little-endian element.
FORMATS = {
    torch.float64: ("float64", "d"),
    torch.float32: ("float32", "f"),
    torch.int64: ("int64", "q"),
    torch.int32: ("int32", "i"),
    torch.uint8: ("uint8", "B"),
    torch.bool: ("bool", "?"),
}


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """A small tensor of one of :data:`FORMATS`' types, sometimes a transposed view."""
    dtype = draw(st.sampled_from(list(FORMATS)))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    n = math.prod(shape)
    if dtype.is_floating_point:
        element = st.floats(-1e6, 1e6, allow_nan=False, width=32)
    elif dtype == torch.bool:
        element = st.booleans()
    elif dtype == torch.uint8:
        element = st.integers(0, 255)
    else:
        element = st.integers(-(2**31), 2**31 - 1)
    t = torch.tensor(draw(st.lists(element, min_size=n, max_size=n)), dtype=dtype)
    t = t.reshape(shape)
    if t.dim() == 2 and draw(st.booleans()):
        t = t.T  # not contiguous: the checksum reads it in its own row-major order
    return t


LEAF = st.one_of(
    tensors(),
    st.integers(-5, 5),
    st.text("xyz", max_size=3),
    st.none(),
)
KEY = st.text("abcxyz_", min_size=1, max_size=4)
PAYLOAD = st.dictionaries(
    KEY,
    st.recursive(
        LEAF,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(KEY, inner, max_size=3),
        ),
        max_leaves=8,
    ),
    max_size=4,
)


def flat(item: object, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``item`` with its path: ``/key`` per dict, ``/index`` per list or tuple."""
    if isinstance(item, torch.Tensor):
        yield name, item
    elif isinstance(item, dict):
        for key, value in item.items():
            yield from flat(value, f"{name}/{key}")
    elif isinstance(item, list | tuple):
        for index, value in enumerate(item):
            yield from flat(value, f"{name}/{index}")


def reference_checksum(payload: object) -> str:
    """SHA-256 over the tensors sorted by path: ``path:dtype:shape``, then the values
    element by element in row-major order, packed little-endian with ``struct``;
    the first 16 hex digits."""
    h = hashlib.sha256()
    for name, t in sorted(flat(payload, ""), key=lambda item: item[0]):
        dtype, code = FORMATS[t.dtype]
        h.update(f"{name}:{dtype}:{tuple(t.shape)}".encode())
        values = t.reshape(-1).tolist()
        h.update(struct.pack(f"<{len(values)}{code}", *values))
    return h.hexdigest()[:16]


@quick(150)
@given(PAYLOAD)
def test_checksum_is_the_flat_digest_of_the_tensors(payload: dict) -> None:
    """``checksum(payload)``. Reference: :func:`reference_checksum`, hashlib over a
    flat re-serialisation of every tensor in the nested dicts, lists and tuples
    (other leaves ignored)."""
    assert checksum(payload) == reference_checksum(payload)


@quick(20)
@given(PAYLOAD, st.dictionaries(KEY, PAYLOAD, max_size=2))
def test_a_saved_entry_stores_the_reference_checksums(
    payload: dict, parts: dict
) -> None:
    """``Entry.save`` of a payload with parts. Reference: :func:`reference_checksum`
    of the payload without its parts, and of each part, equal the checksums the
    index file holds; the entry reads back."""
    with tempfile.TemporaryDirectory() as folder:
        entry = Entry.folder(folder, {"case": 1}, "property entry")
        entry.save({**payload, "parts": parts})
        stored = torch.load(entry.path, weights_only=True)
        assert stored[CHECKSUM] == reference_checksum(payload)
        assert stored["parts"] == {n: reference_checksum(p) for n, p in parts.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            back = Entry.folder(folder, {"case": 1}, "property entry").load()
        assert back is not None and set(back) == set(payload) | {"parts"}
