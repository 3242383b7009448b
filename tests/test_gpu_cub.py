"""``dev.cub()`` on CUDA against the CPU backend on the same random data.

Every op runs on both devices from the same host arrays and the downloads are
compared: exactly for sorts, selections, counts, integer results and float
min/max; to a tolerance for float sums (CUB's reduction order is not NumPy's).
One sort and one reduction run over 2^30 elements on the GPU alone (checked by
sortedness, element sums and a bit hash; and against a float64 sum).
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from atomr_accel import DType, System

pytestmark = pytest.mark.gpu

Arrays = dict[str, np.ndarray[Any, Any]]
Scenario = Callable[[Any, Any, Arrays], list[np.ndarray[Any, Any]]]


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Any, Any]]:
    with System.open("cub-gpu") as system:
        yield system.spawn_device(mock=True), system.spawn_device(mock=False)


def np_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bf16" else DType(name).numpy


def random(name: str, n: int, seed: int = 0, duplicates: bool = False) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    dtype = np_dtype(name)
    if duplicates:
        return rng.integers(0, 5, n).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=np.int64 if dtype.kind == "i"
                            else np.uint64, endpoint=True).astype(dtype)
    return (rng.standard_normal(n) * 100).astype(dtype)


def put(dev: Any, values: np.ndarray[Any, Any], name: str | None = None) -> Any:
    buf = dev.allocate(max(values.size, 1), DType(name) if name else DType.of(values.dtype))
    if values.size:
        dev.copy_from_numpy(buf, values)
    return buf


def empty(dev: Any, n: int, name: str) -> Any:
    return dev.allocate(max(n, 1), DType(name))


def get(dev: Any, buf: Any) -> np.ndarray[Any, Any]:
    return np.asarray(dev.copy_to_numpy(buf))


def both(devices: tuple[Any, Any], scenario: Scenario, inputs: Arrays,
         ) -> tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]]:
    cpu, gpu = devices
    return scenario(cpu, cpu.cub(), inputs), scenario(gpu, gpu.cub(), inputs)


def same(cpu: list[np.ndarray[Any, Any]], gpu: list[np.ndarray[Any, Any]],
         rtol: float = 0.0) -> None:
    for a, b in zip(cpu, gpu, strict=True):
        if rtol and a.dtype.kind == "f":
            np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=rtol,
                                       atol=rtol)
        else:
            np.testing.assert_array_equal(b.view(f"u{b.itemsize}"), a.view(f"u{a.itemsize}"))


# ---------------------------------------------------------------- reductions

REDUCE_DTYPES = ["i8", "u32", "i64", "f16", "f32", "f64"]


@pytest.mark.parametrize("name", REDUCE_DTYPES)
@pytest.mark.parametrize("n", [0, 1, 1 << 20])
def test_reductions(devices: tuple[Any, Any], name: str, n: int) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        x = put(dev, inputs["x"])
        wide = "f64" if name.startswith("f") else name[0] + "64"
        outs = [empty(dev, 1, wide), empty(dev, 1, name), empty(dev, 1, name),
                empty(dev, 1, "i64"), empty(dev, 1, "i64")]
        cub.reduce_sum(x, outs[0], n)
        cub.reduce_min(x, outs[1], n)
        cub.reduce_max(x, outs[2], n)
        cub.argmin(x, outs[3], n)
        cub.argmax(x, outs[4], n)
        return [get(dev, b) for b in outs]

    cpu, gpu = both(devices, scenario, {"x": random(name, max(n, 1), seed=n)})
    same(cpu[:1], gpu[:1], rtol=1e-3 if name == "f16" else 1e-9)
    same(cpu[1:], gpu[1:])


@pytest.mark.parametrize(("name", "expr", "init"), [
    ("i32", "a > b ? a : b", -2147483648), ("f32", "max(a, b)", -1e30),
    ("f64", "min(a, b)", 1e300), ("u32", "a ^ b", 0), ("i64", "(a & ~b) | (~a & b)", 0)])
def test_custom_reduction(devices: tuple[Any, Any], name: str, expr: str, init: float) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        out = empty(dev, 1, name)
        cub.reduce_custom(put(dev, inputs["x"]), out, expr, init)
        return [get(dev, out)]

    cpu, gpu = both(devices, scenario, {"x": random(name, 100003, seed=7)})
    same(cpu, gpu)


# --------------------------------------------------------------------- scans


@pytest.mark.parametrize(("name", "out_name", "kind"), [
    ("i32", "i64", "sum"), ("u8", "u64", "sum"), ("f32", "f32", "sum"), ("i32", "i32", "min"),
    ("f32", "f32", "max"), ("f16", "f16", "min"), ("u64", "u64", "max")])
@pytest.mark.parametrize("n", [1, 5000, 5_000_003])
@pytest.mark.parametrize("exclusive", [False, True])
def test_scans(devices: tuple[Any, Any], name: str, out_name: str, kind: str, n: int,
               exclusive: bool) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        out = empty(dev, n, out_name)
        (cub.exclusive_scan if exclusive else cub.inclusive_scan)(put(dev, inputs["x"]), out,
                                                                   kind=kind)
        return [get(dev, out)]

    x = random(name, n, seed=13)
    if name == "f32" and kind == "sum":  # small integers: every partial sum is exact in f32
        x = np.random.default_rng(13).integers(0, 4, n).astype(np.float32)
    cpu, gpu = both(devices, scenario, {"x": x})
    same(cpu, gpu, rtol=1e-4 if kind == "sum" and out_name == "f32" else
         1e-9 if kind == "sum" and out_name == "f64" else 0.0)


def test_reduce_and_scan_awaited_again_compute_each_calls_data(
        devices: tuple[Any, Any]) -> None:
    """A reduction and a scan that ran once are launched from the caller's event loop (their
    kernels are compiled): three rounds with new data, 3 reductions (sum, max, a custom
    one) and 2 scans (sum, min) in flight each round, against the CPU backend in float64."""
    import asyncio

    n = 300_007
    bufs = {dev: (dev.allocate(n, DType.F64), [dev.allocate(1, DType.F64) for _ in range(3)],
                  [dev.allocate(n, DType.F64) for _ in range(2)]) for dev in devices}

    async def one_round(dev: Any) -> None:
        cub, (x, outs, scans) = dev.cub(), bufs[dev]
        await asyncio.gather(
            cub.reduce_sum_async(x, outs[0], n), cub.reduce_max_async(x, outs[1], n),
            cub.reduce_custom_async(x, outs[2], "min(a, b)", 1e300, n),
            cub.inclusive_scan_async(x, scans[0], kind="sum"),
            cub.exclusive_scan_async(x, scans[1], kind="min"))

    for seed in range(3):
        data = np.random.default_rng(seed).standard_normal(n)
        results = []
        for dev in devices:
            x, outs, scans = bufs[dev]
            dev.copy_from_numpy(x, data)
            asyncio.run(one_round(dev))
            results.append([get(dev, b) for b in (*outs, *scans)])
        cpu, gpu = results
        np.testing.assert_allclose(gpu[0], data.sum(), rtol=1e-9)
        np.testing.assert_allclose(gpu[3], np.cumsum(data), rtol=1e-9, atol=1e-9)
        for theirs, ours in zip(cpu[1:3] + cpu[4:], gpu[1:3] + gpu[4:], strict=True):
            np.testing.assert_array_equal(ours, theirs)  # max, min and the min scan: exact


# --------------------------------------------------------------------- sorts

SORTABLE = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "bf16"]


@pytest.mark.parametrize("name", SORTABLE)
@pytest.mark.parametrize("n", [1, 300_007])
def test_sort_keys_and_pairs(devices: tuple[Any, Any], name: str, n: int) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        results = []
        for descending in (False, True):
            keys_out, values_out = empty(dev, n, name), empty(dev, n, "i32")
            (cub.sort_keys_descending if descending else cub.sort_keys)(
                put(dev, inputs["keys"], name), keys_out)
            results.append(get(dev, keys_out))
            (cub.sort_pairs_descending if descending else cub.sort_pairs)(
                put(dev, inputs["dups"], name), keys_out, put(dev, inputs["values"]),
                values_out)
            results += [get(dev, keys_out), get(dev, values_out)]
        return results

    inputs = {"keys": random(name, n, seed=n), "dups": random(name, n, seed=n, duplicates=True),
              "values": np.arange(n, dtype=np.int32)}
    cpu, gpu = both(devices, scenario, inputs)
    same(cpu, gpu)


@pytest.mark.parametrize("name", ["f16", "f32", "f64"])
def test_float_special_values(devices: tuple[Any, Any], name: str) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        keys_out, values_out = empty(dev, 10, name), empty(dev, 10, "i32")
        cub.sort_pairs(put(dev, inputs["x"]), keys_out, put(dev, inputs["v"]), values_out)
        return [get(dev, values_out)]

    x = np.array([1.5, np.nan, -np.inf, -0.0, 0.0, -np.nan, np.inf, -2.0, -0.0, 3.0],
                 dtype=np_dtype(name))
    cpu, gpu = both(devices, scenario, {"x": x, "v": np.arange(10, dtype=np.int32)})
    same(cpu, gpu)
    assert gpu[0].tolist() == [5, 2, 7, 3, 4, 8, 0, 9, 6, 1]


@pytest.mark.parametrize(("name", "begin", "end"), [("u32", 4, 12), ("i16", 0, 8),
                                                     ("f32", 16, 32), ("i64", 20, 64)])
def test_sort_bit_range(devices: tuple[Any, Any], name: str, begin: int, end: int) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        keys_out, values_out = empty(dev, 20000, name), empty(dev, 20000, "i32")
        cub.sort_pairs(put(dev, inputs["k"]), keys_out, put(dev, inputs["v"]), values_out,
                       begin_bit=begin, end_bit=end)
        return [get(dev, keys_out), get(dev, values_out)]

    cpu, gpu = both(devices, scenario, {"k": random(name, 20000, seed=3),
                                        "v": np.arange(20000, dtype=np.int32)})
    same(cpu, gpu)


# ------------------------------------------------ histograms, select, runs


@pytest.mark.parametrize("name", ["u8", "i32", "f16", "f64"])
def test_histograms(devices: tuple[Any, Any], name: str) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        x = put(dev, inputs["x"])
        even, ranged = empty(dev, 37, "u32"), empty(dev, 6, "i64")
        cub.histogram_even(x, even, 37, -120.5, 99.25)
        cub.histogram_range(x, put(dev, inputs["edges"]), ranged, 6)
        return [get(dev, even), get(dev, ranged)]

    x = random(name, 1_000_003, seed=5)
    if x.dtype.kind == "f":
        x[::1000] = np.nan
    edges = np.unique(random(name, 7, seed=9))
    if edges.size < 7:
        edges = np.arange(7).astype(x.dtype)
    cpu, gpu = both(devices, scenario, {"x": x, "edges": edges})
    same(cpu, gpu)


@pytest.mark.parametrize("name", ["i8", "u32", "f64"])
@pytest.mark.parametrize("n", [0, 1, 1_000_003])
def test_select_partition_unique_runs(devices: tuple[Any, Any], name: str, n: int) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        x, flags = put(dev, inputs["x"]), put(dev, inputs["flags"])
        out, count = empty(dev, n, name), empty(dev, 1, "i64")
        results = []
        cub.select_flagged(x, flags, out, count, n)
        results += [get(dev, count), get(dev, out)[: int(get(dev, count)[0])]]
        cub.partition_flagged(x, flags, out, count, n)
        results += [get(dev, count), get(dev, out)[:n]]
        cub.select_if(x, out, count, "x > 3 && x < 90", n)
        results += [get(dev, count), get(dev, out)[: int(get(dev, count)[0])]]
        cub.partition_if(x, out, count, "x < 0 || x >= 50", n)
        results += [get(dev, count), get(dev, out)[:n]]
        runs = put(dev, inputs["runs"])
        cub.unique(runs, out, count, n)
        results += [get(dev, count), get(dev, out)[: int(get(dev, count)[0])]]
        unique_out, counts_out = empty(dev, n, name), empty(dev, n, "u32")
        cub.run_length_encode(runs, unique_out, counts_out, count, n)
        k = int(get(dev, count)[0])
        return [*results, get(dev, count), get(dev, unique_out)[:k], get(dev, counts_out)[:k]]

    size = max(n, 1)
    runs = np.repeat(random(name, size, seed=2, duplicates=True), 3)[:size]
    if np_dtype(name).kind == "f" and size > 10:
        runs[5:7] = np.nan
    inputs = {"x": random(name, size, seed=1),
              "flags": np.random.default_rng(4).integers(0, 2, size).astype(np.uint8),
              "runs": runs}
    cpu, gpu = both(devices, scenario, inputs)
    same(cpu, gpu)


# ------------------------------------------------------------------ segments

OFFSETS = [[0, 3, 3, 10, 99_999, 100_000], [5, 5, 5], [0, 100_000], [2, 1, 7, 200_000],
           [0], [*list(range(0, 100001, 7)), 100000]]


@pytest.mark.parametrize("offsets", OFFSETS, ids=lambda o: f"{len(o) - 1}-segments")
@pytest.mark.parametrize(("name", "out_name", "kind"), [
    ("i32", "i64", "sum"), ("f32", "f32", "min"), ("u16", "u16", "max"), ("f16", "f16", "max"),
    ("f64", "f64", "sum")])
def test_segmented_reduce(devices: tuple[Any, Any], offsets: list[int], name: str,
                          out_name: str, kind: str) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        segments = len(offsets) - 1
        out = empty(dev, segments, out_name)
        cub.segmented_reduce(put(dev, inputs["x"]), out, put(dev, inputs["o"]), segments,
                             kind=kind)
        return [get(dev, out)[:segments]]

    cpu, gpu = both(devices, scenario, {"x": random(name, 100_000, seed=8),
                                        "o": np.array(offsets, dtype=np.int64)})
    same(cpu, gpu, rtol=1e-9 if kind == "sum" and out_name == "f64" else 0.0)


@pytest.mark.parametrize("offsets", OFFSETS, ids=lambda o: f"{len(o) - 1}-segments")
@pytest.mark.parametrize("name", ["u8", "i32", "f32"])
def test_segmented_sort(devices: tuple[Any, Any], offsets: list[int], name: str) -> None:
    def scenario(dev: Any, cub: Any, inputs: Arrays) -> list[np.ndarray[Any, Any]]:
        keys_out, values_out = empty(dev, 100_000, name), empty(dev, 100_000, "i32")
        results = []
        for descending in (False, True):
            cub.segmented_sort_pairs(put(dev, inputs["k"]), keys_out, put(dev, inputs["v"]),
                                     values_out, put(dev, inputs["o"]), len(offsets) - 1,
                                     descending=descending)
            results += [get(dev, keys_out), get(dev, values_out)]
        return results

    cpu, gpu = both(devices, scenario, {
        "k": random(name, 100_000, seed=6, duplicates=name == "u8"),
        "v": np.arange(100_000, dtype=np.int32), "o": np.array(offsets, dtype=np.int32)})
    same(cpu, gpu)


# ------------------------------------------------------------------- 2^30


def test_sort_and_reduce_of_two_to_the_thirty(devices: tuple[Any, Any]) -> None:
    _, gpu = devices
    cub = gpu.cub()
    n = 1 << 30
    keys = np.random.default_rng(0).integers(0, 1 << 32, n, dtype=np.uint32)
    source, target = put(gpu, keys), empty(gpu, n, "u32")
    cub.sort_keys(source, target, timeout_secs=120)
    gpu.free(source)
    result = get(gpu, target)
    gpu.free(target)
    assert bool(np.all(result[1:] >= result[:-1]))
    assert int(result.sum(dtype=np.uint64)) == int(keys.sum(dtype=np.uint64))
    assert int(np.bitwise_xor.reduce(result)) == int(np.bitwise_xor.reduce(keys))
    del result, keys
    values = np.random.default_rng(1).random(n, dtype=np.float32)
    x, total = put(gpu, values), empty(gpu, 1, "f32")
    cub.reduce_sum(x, total, timeout_secs=60)
    gpu.free(x)
    assert float(get(gpu, total)[0]) == pytest.approx(float(values.sum(dtype=np.float64)),
                                                      rel=1e-5)
