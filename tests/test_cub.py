"""``dev.cub()`` on the CPU backend against references written here in plain Python.

Every op, every dtype family, on random data: reductions and scans against
Python folds, sorts against ``sorted`` with a key that spells out CUB's order
(``-0.0 == +0.0``, a positive NaN after ``+inf``, a negative one before
``-inf``; stable), histograms against per-sample counting, select, unique and
run-length encoding against list comprehensions and ``itertools.groupby``,
segmented ops against per-segment loops. Edge cases: ``n = 0``, one element,
non-power-of-two lengths, NaN ordering, stability of pair sorts, empty
segments; bad input is a typed error before the device runs anything.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from atomr_accel import DType, InvalidArgument, System
from atomr_accel.cub import Cub

INTS = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]
FLOATS = ["f16", "f32", "f64"]
ARITHMETIC = INTS + FLOATS
LENGTHS = [1, 7, 1000, 4097]


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Any, Cub]]:
    with System.open("cub-cpu") as system:
        dev = system.spawn_device(mock=True)
        yield dev, dev.cub()


def np_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bf16" else DType(name).numpy


def random(name: str, n: int, seed: int = 0, duplicates: bool = False) -> np.ndarray[Any, Any]:
    """Random values of ``name`` over most of its range (few distinct ones if ``duplicates``)."""
    rng = np.random.default_rng(seed)
    dtype = np_dtype(name)
    if duplicates:
        return rng.integers(0, 5, n).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = max(info.min, -1000), min(info.max, 1000)
        if dtype.itemsize >= 4:
            low, high = info.min // 4, info.max // 4
        return rng.integers(low, high, n, dtype=np.int64 if dtype.kind == "i" else np.uint64,
                            endpoint=True).astype(dtype)
    return (rng.standard_normal(n) * 100).astype(dtype)


def put(dev: Any, values: np.ndarray[Any, Any], name: str | None = None) -> Any:
    dtype = DType(name) if name else DType.of(values.dtype)
    buf = dev.allocate(max(values.size, 1), dtype)
    if values.size:
        dev.copy_from_numpy(buf, values)
    return buf


def empty(dev: Any, n: int, name: str) -> Any:
    return dev.allocate(max(n, 1), DType(name))


def get(dev: Any, buf: Any) -> np.ndarray[Any, Any]:
    return np.asarray(dev.copy_to_numpy(buf))


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("name", ARITHMETIC)
@pytest.mark.parametrize("n", LENGTHS)
def test_reduce_sum_min_max_arg(env: tuple[Any, Cub], name: str, n: int) -> None:
    dev, cub = env
    x = random(name, n, seed=n)
    xb = put(dev, x)
    wide = "f64" if name in FLOATS else ("u64" if name.startswith("u") else "i64")
    total = empty(dev, 1, wide)
    cub.reduce_sum(xb, total)
    expected = sum(x.astype(np.float64).tolist()) if name in FLOATS else sum(int(v) for v in x)
    if name in FLOATS:
        assert get(dev, total)[0] == pytest.approx(expected, rel=1e-9, abs=1e-6)
    else:
        wrapped = expected % (1 << 64)  # the sum wraps in 64 bits, as in C
        if not name.startswith("u") and wrapped >= 1 << 63:
            wrapped -= 1 << 64
        assert int(get(dev, total)[0]) == wrapped
    low, high, at = empty(dev, 1, name), empty(dev, 1, name), empty(dev, 1, "i64")
    cub.reduce_min(xb, low)
    cub.reduce_max(xb, high)
    values = x.tolist()
    assert get(dev, low)[0] == min(values)
    assert get(dev, high)[0] == max(values)
    cub.argmin(xb, at)
    assert int(get(dev, at)[0]) == values.index(min(values))
    cub.argmax(xb, at)
    assert int(get(dev, at)[0]) == values.index(max(values))


def test_reduce_sum_f32_original_and_prefix(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    x = random("f32", 1000, seed=3)
    xb, out = put(dev, x), empty(dev, 1, "f32")
    cub.reduce_sum_f32(xb, out, 10.0)
    assert get(dev, out)[0] == pytest.approx(float(np.sum(x.astype(np.float64))), rel=1e-5)
    cub.reduce_sum(xb, out, 10)
    assert get(dev, out)[0] == pytest.approx(sum(x[:10].astype(np.float64).tolist()), rel=1e-5)
    with pytest.raises(InvalidArgument):
        cub.reduce_sum_f32(put(dev, random("f64", 4)), out)


def test_reduce_of_nothing_is_the_identity(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    for name in ("f32", "i16", "u8"):
        xb = put(dev, random(name, 5))
        dtype = np_dtype(name)
        out, at = empty(dev, 1, name), empty(dev, 1, "i64")
        cub.reduce_sum(xb, out, 0)
        assert get(dev, out)[0] == 0
        cub.reduce_min(xb, out, 0)
        high = np.inf if dtype.kind == "f" else np.iinfo(dtype).max
        assert get(dev, out)[0] == high
        cub.reduce_max(xb, out, 0)
        low = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
        assert get(dev, out)[0] == low
        cub.argmax(xb, at, 0)
        assert get(dev, at)[0] == -1
        cub.reduce_custom(xb, out, "a + b", 7, n=0)
        assert get(dev, out)[0] == 7


def test_min_max_and_arg_with_nan_follow_numpy(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    x = np.array([3.0, -1.0, np.nan, -5.0, np.nan], dtype=np.float32)
    xb, out, at = put(dev, x), empty(dev, 1, "f32"), empty(dev, 1, "i64")
    cub.reduce_min(xb, out)
    assert np.isnan(get(dev, out)[0])
    cub.argmin(xb, at)
    assert get(dev, at)[0] == 2
    cub.argmax(xb, at, 2)
    assert get(dev, at)[0] == 0


CUSTOM = [
    ("a > b ? a : b", -1e300, max),
    ("min(a, b)", 1e300, min),
    ("a * b", 1, lambda a, b: a * b),
    ("(a & ~b) | (~a & b)", 0, None),
]


@pytest.mark.parametrize(("expr", "init", "fold"), CUSTOM, ids=[c[0] for c in CUSTOM])
@pytest.mark.parametrize("name", ["i32", "u16", "f64"])
def test_reduce_custom(env: tuple[Any, Cub], expr: str, init: float, fold: Any,
                       name: str) -> None:
    dev, cub = env
    dtype = np_dtype(name)
    if fold is None and dtype.kind == "f":
        return  # bitwise operators take integers only
    x = random(name, 999, seed=5)
    if expr == "a * b":  # signs only: the product stays exact
        x = np.random.default_rng(1).choice([-1, 1], 999).astype(dtype) if dtype.kind != "u" \
            else np.ones(999, dtype=dtype)
    xb, out = put(dev, x), empty(dev, 1, name)
    start = np.asarray(init).astype(dtype).item() if abs(init) < 1e30 or dtype.kind == "f" else (
        np.iinfo(dtype).min if init < 0 else np.iinfo(dtype).max)
    cub.reduce_custom(xb, out, expr, float(start))
    if fold is None:
        fold = lambda a, b: a ^ b  # noqa: E731
    expected = functools.reduce(fold, x.tolist(), start)
    assert get(dev, out)[0] == pytest.approx(expected)


def test_custom_keeps_operand_order(env: tuple[Any, Cub]) -> None:
    """A non-commutative associative operator (keep the left operand) gives the first item."""
    dev, cub = env
    x = random("i32", 1001, seed=9)
    out = empty(dev, 1, "i32")
    cub.reduce_custom(put(dev, x), out, "a == -7 ? b : a", -7)
    assert get(dev, out)[0] == x[0]


# --------------------------------------------------------------------- scans


def scan_reference(values: list[Any], kind: str, exclusive: bool, identity: Any) -> list[Any]:
    fold = {"sum": lambda a, b: a + b, "min": min, "max": max}[kind]
    running = list(itertools.accumulate(values, fold))
    return [identity, *running[:-1]] if exclusive else running


@pytest.mark.parametrize("name", ARITHMETIC)
@pytest.mark.parametrize("kind", ["sum", "min", "max"])
@pytest.mark.parametrize("exclusive", [False, True])
def test_scans(env: tuple[Any, Cub], name: str, kind: str, exclusive: bool) -> None:
    dev, cub = env
    x = random(name, 1000, seed=11)
    dtype = np_dtype(name)
    out_name = name if kind != "sum" else "f64" if name in FLOATS else name[0] + "64"
    xb, out = put(dev, x), empty(dev, 1000, out_name)
    (cub.exclusive_scan if exclusive else cub.inclusive_scan)(xb, out, kind=kind)
    values = x.astype(np.float64).tolist() if name in FLOATS else [int(v) for v in x]
    identity = {"sum": 0, "min": np.inf if dtype.kind == "f" else np.iinfo(dtype).max,
                "max": -np.inf if dtype.kind == "f" else np.iinfo(dtype).min}[kind]
    expected = scan_reference(values, kind, exclusive, identity)
    if name in INTS and kind == "sum":  # sums wrap in 64 bits, as in C
        signed = name.startswith("i")
        expected = [(v + (1 << 63 if signed else 0)) % (1 << 64) - (1 << 63 if signed else 0)
                    for v in expected]
    got = get(dev, out).astype(np.float64) if name in FLOATS else get(dev, out).tolist()
    if name in FLOATS and kind == "sum":
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-6)
    else:
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == expected


def test_scan_sums_in_place_and_short(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    x = random("i32", 37, seed=2)
    xb = put(dev, x)
    cub.inclusive_sum(xb, xb)
    assert get(dev, xb).tolist() == list(itertools.accumulate(int(v) for v in x))
    yb = put(dev, x)
    cub.exclusive_sum(yb, yb, 5)
    assert get(dev, yb).tolist() == [0, *itertools.accumulate(int(v) for v in x[:4]),
                                     *(int(v) for v in x[5:])]
    zb = put(dev, x)
    cub.exclusive_sum(zb, zb, 0)
    assert get(dev, zb).tolist() == x.tolist()


# --------------------------------------------------------------------- sorts


def cub_key(value: Any) -> tuple[int, float]:
    """CUB's radix order of one value: NaNs by sign at either end, -0.0 equal to +0.0."""
    if isinstance(value, float) and math.isnan(value):
        return (1, 0.0) if math.copysign(1.0, value) > 0 else (-1, 0.0)
    return (0, value)


def reference_order(keys: np.ndarray[Any, Any], descending: bool) -> list[int]:
    floats = keys.dtype.kind == "f" or keys.dtype == np.dtype(ml_dtypes.bfloat16)
    values = keys.astype(np.float64).tolist() if floats else [int(v) for v in keys]
    return sorted(range(len(values)), key=lambda i: cub_key(values[i]), reverse=descending)


@pytest.mark.parametrize("name", [*ARITHMETIC, "bf16"])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_keys_every_dtype(env: tuple[Any, Cub], name: str, descending: bool) -> None:
    dev, cub = env
    x = random(name, 1000, seed=17)
    xb, out = put(dev, x, name), empty(dev, 1000, name)
    (cub.sort_keys_descending if descending else cub.sort_keys)(xb, out)
    order = reference_order(x, descending)
    expected = x[order]
    got = get(dev, out)
    assert got.view(f"u{x.itemsize}").tolist() == expected.view(f"u{x.itemsize}").tolist() \
        or got.astype(np.float64).tolist() == expected.astype(np.float64).tolist()


@pytest.mark.parametrize("name", ["f16", "f32", "f64", "bf16"])
def test_float_sort_special_values(env: tuple[Any, Cub], name: str) -> None:
    dev, cub = env
    dtype = np_dtype(name)
    x = np.array([1.5, np.nan, -np.inf, -0.0, 0.0, -np.nan, np.inf, -2.0, -0.0, 3.0], dtype=dtype)
    values = np.arange(x.size, dtype=np.int32)
    keys_out, values_out = empty(dev, x.size, name), empty(dev, x.size, "i32")
    cub.sort_pairs(put(dev, x, name), keys_out, put(dev, values), values_out)
    # -NaN, -inf, -2, then the zeros in input order (-0.0 == +0.0), 1.5, 3, inf, +NaN
    assert get(dev, values_out).tolist() == [5, 2, 7, 3, 4, 8, 0, 9, 6, 1]
    cub.sort_pairs_descending(put(dev, x, name), keys_out, put(dev, values), values_out)
    assert get(dev, values_out).tolist() == [1, 6, 9, 0, 3, 4, 8, 7, 2, 5]


@pytest.mark.parametrize("name", ["u8", "i32", "u64", "f32"])
@pytest.mark.parametrize("n", LENGTHS)
def test_sort_pairs_is_stable(env: tuple[Any, Cub], name: str, n: int) -> None:
    dev, cub = env
    keys = random(name, n, seed=n, duplicates=True)
    values = np.arange(n, dtype=np.int64)[::-1].copy()
    for descending in (False, True):
        keys_out, values_out = empty(dev, n, name), empty(dev, n, "i64")
        sort = cub.sort_pairs_descending if descending else cub.sort_pairs
        sort(put(dev, keys), keys_out, put(dev, values), values_out)
        order = reference_order(keys, descending)
        assert get(dev, values_out)[:n].tolist() == values[order].tolist()
        assert get(dev, keys_out)[:n].tolist() == keys[order].tolist()


@pytest.mark.parametrize(("name", "begin", "end"), [("u32", 4, 12), ("i16", 0, 8),
                                                     ("i64", 20, 64), ("u8", 7, 8)])
def test_sort_bit_range(env: tuple[Any, Cub], name: str, begin: int, end: int) -> None:
    dev, cub = env
    keys = random(name, 1000, seed=21)
    values = np.arange(1000, dtype=np.int32)
    keys_out, values_out = empty(dev, 1000, name), empty(dev, 1000, "i32")
    cub.sort_pairs(put(dev, keys), keys_out, put(dev, values), values_out, begin_bit=begin,
                   end_bit=end)
    width = keys.itemsize * 8
    offset = 1 << (width - 1) if name.startswith("i") else 0

    def field(v: int) -> int:
        return ((v + offset) >> begin) & ((1 << (end - begin)) - 1)

    order = sorted(range(1000), key=lambda i: field(int(keys[i])))
    assert get(dev, values_out).tolist() == order


def test_sort_in_place_prefix_and_empty(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    x = random("i32", 50, seed=4)
    xb = put(dev, x)
    cub.sort_keys(xb, xb, 20)
    assert get(dev, xb).tolist() == sorted(x[:20].tolist()) + x[20:].tolist()
    cub.sort_keys(xb, xb, 0)
    assert get(dev, xb).tolist() == sorted(x[:20].tolist()) + x[20:].tolist()


# ---------------------------------------------------------------- histograms


@pytest.mark.parametrize("name", ["u8", "i32", "f16", "f32", "f64"])
def test_histogram_even(env: tuple[Any, Cub], name: str) -> None:
    dev, cub = env
    x = random(name, 4097, seed=23)
    if np_dtype(name).kind == "f":
        x[:3] = np.nan
    lower, upper, bins = -50.5, 80.25, 13
    hist = empty(dev, bins, "i32")
    cub.histogram_even(put(dev, x), hist, bins, lower, upper)
    expected = [0] * bins
    for v in x.astype(np.float64).tolist():
        if math.isnan(v):
            continue
        b = math.floor((v - lower) * (bins / (upper - lower)))
        if 0 <= b < bins:
            expected[b] += 1
    assert get(dev, hist).tolist() == expected


@pytest.mark.parametrize("name", ["i16", "u64", "f32"])
def test_histogram_range(env: tuple[Any, Cub], name: str) -> None:
    dev, cub = env
    x = random(name, 3001, seed=29)
    edges = np.unique(random(name, 9, seed=31))
    bins = edges.size - 1
    hist = empty(dev, bins, "u64")
    cub.histogram_range(put(dev, x), put(dev, edges), hist, bins)
    sorted_edges = edges.tolist()
    expected = [0] * bins
    for v in x.tolist():
        b = bisect.bisect_right(sorted_edges, v) - 1
        if 0 <= b < bins:
            expected[b] += 1
    assert get(dev, hist).tolist() == expected


# ------------------------------------------------------ select, unique, runs


@pytest.mark.parametrize("name", ["i8", "u32", "f64"])
@pytest.mark.parametrize("n", [0, 1, 1000])
def test_select_and_partition(env: tuple[Any, Cub], name: str, n: int) -> None:
    dev, cub = env
    x = random(name, max(n, 1), seed=37)
    flags = np.random.default_rng(n).integers(0, 3, max(n, 1)).astype(np.uint8)
    xb, fb = put(dev, x), put(dev, flags)
    out, count = empty(dev, max(n, 1), name), empty(dev, 1, "i64")
    chosen = [v for v, f in zip(x[:n].tolist(), flags[:n].tolist(), strict=True) if f]
    others = [v for v, f in zip(x[:n].tolist(), flags[:n].tolist(), strict=True) if not f]
    cub.select_flagged(xb, fb, out, count, n)
    assert get(dev, count)[0] == len(chosen)
    assert get(dev, out)[: len(chosen)].tolist() == chosen
    cub.partition_flagged(xb, fb, out, count, n)
    assert get(dev, out)[:n].tolist() == chosen + others[::-1]
    cub.select_if(xb, out, count, "x > 3 && x < 90", n)
    picked = [v for v in x[:n].tolist() if 3 < v < 90]
    assert get(dev, count)[0] == len(picked)
    assert get(dev, out)[: len(picked)].tolist() == picked
    cub.partition_if(xb, out, count, "!(x > 3 && x < 90)", n)
    rest = [v for v in x[:n].tolist() if not 3 < v < 90]
    assert get(dev, out)[:n].tolist() == rest + picked[::-1]


def test_predicate_forms(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    x = random("i32", 500, seed=41)
    xb, out, count = put(dev, x), empty(dev, 500, "i32"), empty(dev, 1, "u32")
    cub.select_if(xb, out, count, "(x & 1) == 0 ? x > 0 : abs(x) < 1000000 || x << 1 > 7")
    # |x| < 2**29 here, so x << 1 does not overflow
    picked = [v for v in x.tolist()
              if (v > 0 if (v & 1) == 0 else (abs(v) < 1000000 or (v << 1) > 7))]
    assert get(dev, count)[0] == len(picked)
    assert get(dev, out)[: len(picked)].tolist() == picked


def is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


@pytest.mark.parametrize("name", ["u8", "i64", "f32"])
@pytest.mark.parametrize("n", [0, 1, 2, 999])
def test_unique_and_run_length_encode(env: tuple[Any, Cub], name: str, n: int) -> None:
    dev, cub = env
    x = np.sort(random(name, max(n, 1), seed=43, duplicates=True))
    x = np.repeat(x, 2)[: max(n, 1)] if n else x
    if name == "f32" and n > 2:
        x[n // 2] = np.nan
        x[n // 2 + 1] = np.nan
    xb = put(dev, x)
    out, count = empty(dev, max(n, 1), name), empty(dev, 1, "i32")
    cub.unique(xb, out, count, n)
    runs = [(key, len(list(group))) for key, group in
            itertools.groupby(x[:n].tolist(), key=lambda v: object() if is_nan(v) else v)]
    assert get(dev, count)[0] == len(runs)
    np.testing.assert_array_equal(get(dev, out)[: len(runs)],
                                  np.array([x[:n][sum(c for _, c in runs[:i])]
                                            for i in range(len(runs))], dtype=x.dtype))
    unique_out, counts_out, num_runs = (empty(dev, max(n, 1), name), empty(dev, max(n, 1), "u32"),
                                        empty(dev, 1, "i64"))
    cub.run_length_encode(xb, unique_out, counts_out, num_runs, n)
    assert get(dev, num_runs)[0] == len(runs)
    assert get(dev, counts_out)[: len(runs)].tolist() == [c for _, c in runs]


# ------------------------------------------------------------------ segments


def segments_of(offsets: list[int], length: int) -> list[tuple[int, int]]:
    """Each segment's (begin, end) as the ops clamp offsets: into [0, length], then a running
    maximum."""
    clamped = list(itertools.accumulate((min(max(o, 0), length) for o in offsets), max))
    return list(itertools.pairwise(clamped))


OFFSETS = [[0, 3, 3, 10, 999, 1000], [5, 5, 5], [0, 1000], [2, 1, 7, 2000], [0]]


@pytest.mark.parametrize("offsets", OFFSETS, ids=str)
@pytest.mark.parametrize("name", ["i16", "u32", "f32", "f64"])
@pytest.mark.parametrize("kind", ["sum", "min", "max"])
def test_segmented_reduce(env: tuple[Any, Cub], offsets: list[int], name: str,
                          kind: str) -> None:
    dev, cub = env
    x = random(name, 1000, seed=47)
    dtype = np_dtype(name)
    segments = len(offsets) - 1
    out_name = ("f64" if name in FLOATS else "i64") if kind == "sum" else name
    out = empty(dev, max(segments, 1), out_name)
    cub.segmented_reduce(put(dev, x), out, put(dev, np.array(offsets, dtype=np.int64)),
                         segments, kind=kind)
    values = x.astype(np.float64).tolist() if name in FLOATS else [int(v) for v in x]
    identity = {"sum": 0, "min": np.inf if dtype.kind == "f" else np.iinfo(dtype).max,
                "max": -np.inf if dtype.kind == "f" else np.iinfo(dtype).min}[kind]
    fold = {"sum": sum, "min": min, "max": max}[kind]
    expected = [fold(values[b:e]) if e > b else identity for b, e in segments_of(offsets, 1000)]
    np.testing.assert_allclose(get(dev, out)[:segments].astype(np.float64), expected,
                               rtol=1e-9 if name == "f64" else 1e-5)


@pytest.mark.parametrize("offsets", OFFSETS, ids=str)
@pytest.mark.parametrize("name", ["u8", "i32", "f32", "bf16"])
def test_segmented_sort_pairs(env: tuple[Any, Cub], offsets: list[int], name: str) -> None:
    dev, cub = env
    keys = random(name, 1000, seed=53, duplicates=name == "u8")
    values = np.arange(1000, dtype=np.int32)
    keys_out, values_out = empty(dev, 1000, name), empty(dev, 1000, "i32")
    for descending in (False, True):
        cub.segmented_sort_pairs(put(dev, keys, name), keys_out, put(dev, values), values_out,
                                 put(dev, np.array(offsets, dtype=np.int32)), len(offsets) - 1,
                                 descending=descending)
        expected = list(range(1000))
        for b, e in segments_of(offsets, 1000):
            order = reference_order(keys[b:e], descending)
            expected[b:e] = [b + i for i in order]
        assert get(dev, values_out).tolist() == expected


def test_segmented_sort_keys_prefix(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    keys = random("i64", 100, seed=59)
    out = empty(dev, 100, "i64")
    cub.segmented_sort_keys(put(dev, keys), out, put(dev, np.array([10, 30, 60])), 2, 50)
    expected = keys[:50].tolist()
    expected[10:30] = sorted(expected[10:30])
    expected[30:50] = sorted(expected[30:50])
    assert get(dev, out)[:50].tolist() == expected


# ------------------------------------------------------------------ refusals


def test_bad_input_is_refused_before_the_device(env: tuple[Any, Cub]) -> None:
    dev, cub = env
    f32, i32 = put(dev, random("f32", 10)), put(dev, random("i32", 10))
    one, count = empty(dev, 1, "f32"), empty(dev, 1, "i64")
    with pytest.raises(InvalidArgument, match="argument"):
        cub.reduce_custom(f32, one, "min(a)", 0)
    with pytest.raises(InvalidArgument, match="unknown name"):
        cub.reduce_custom(f32, one, "a + c", 0)
    with pytest.raises(InvalidArgument, match="cannot read"):
        cub.select_if(f32, put(dev, random("f32", 10)), count, "x % 2")
    with pytest.raises(InvalidArgument, match="needs 11"):
        cub.reduce_sum(f32, one, 11)
    with pytest.raises(InvalidArgument, match="n must be"):
        cub.reduce_sum(f32, one, -1)
    with pytest.raises(InvalidArgument, match="dtype"):
        cub.reduce_min(f32, empty(dev, 1, "f64"))
    with pytest.raises(InvalidArgument, match="i64"):
        cub.argmin(f32, empty(dev, 1, "i32"))
    with pytest.raises(InvalidArgument, match="bit range"):
        cub.sort_keys(i32, put(dev, random("i32", 10)), begin_bit=8, end_bit=40)
    with pytest.raises(InvalidArgument, match="dtype"):
        cub.sort_keys(put(dev, np.zeros(4, np.complex64)), empty(dev, 4, "c64"))
    with pytest.raises(InvalidArgument, match="different buffers"):
        cub.select_flagged(i32, put(dev, np.ones(10, np.uint8)), i32, count)
    with pytest.raises(InvalidArgument, match="flags"):
        cub.select_flagged(i32, f32, put(dev, random("i32", 10)), count)
    with pytest.raises(InvalidArgument, match="lower"):
        cub.histogram_even(f32, empty(dev, 4, "i32"), 4, 1.0, 1.0)
    with pytest.raises(InvalidArgument, match="histogram"):
        cub.histogram_even(f32, empty(dev, 4, "f32"), 4, 0.0, 1.0)
    with pytest.raises(InvalidArgument, match="offsets"):
        cub.segmented_reduce(f32, one, put(dev, np.array([0, 5], np.int64)), 3)
    with pytest.raises(InvalidArgument, match="kind"):
        cub.inclusive_scan(f32, put(dev, random("f32", 10)), kind="product")
    with pytest.raises(InvalidArgument, match="sum, min or max"):
        cub.segmented_reduce(f32, one, put(dev, np.array([0, 5], np.int64)), 1, kind="argmin")
    # the device still serves
    cub.reduce_sum(f32, one)
    assert get(dev, one)[0] == pytest.approx(float(np.sum(get(dev, f32).astype(np.float64))),
                                             rel=1e-5)


def test_handle_repr_and_library_switch(env: tuple[Any, Cub]) -> None:
    _, cub = env
    assert repr(cub) == "Cub(device=0)"
    with System.open("cub-off") as system:
        off = system.spawn_device(mock=True, libraries=("blas",))
        with pytest.raises(InvalidArgument, match="cub library is not enabled"):
            off.cub()
