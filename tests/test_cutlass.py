"""``dev.cutlass()`` on the CPU backend against references written here.

GEMMs with every epilogue node (scale, bias along rows and columns, residual
add, relu / gelu / silu, row and column reductions) in f16, bf16 and f32 against
a NumPy product and a node-by-node evaluation written here (gelu with
``math.erf``); grouped GEMMs of mixed shapes, a 1x1x1 problem and empty ones
included, against per-problem products; conv2d against a direct loop over
output positions; kernel plans and the device's counters; and the typed
errors bad input raises before the device runs anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cutlass_data import get, np_dtype, put, rand

from atomr_accel import DType, InvalidArgument, System
from atomr_accel.cutlass import Cutlass, Epilogue, KernelPlan, PlanKind

TOL = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 1e-5}


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Any, Cutlass]]:
    with System.open("cutlass-cpu") as system:
        dev = system.spawn_device(mock=True)
        yield dev, dev.cutlass()










def f32(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(x, dtype=np.float32)


def gelu(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    erf = np.vectorize(math.erf)
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(np.float32)


ACTS = {
    "identity": lambda x: x,
    "relu": lambda x: np.where(x > 0, x, 0).astype(np.float32),
    "gelu": gelu,
    "silu": lambda x: (x * (1.0 / (1.0 + np.exp(-x.astype(np.float64))))).astype(np.float32),
}


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], name: str) -> None:
    tol = TOL[name]
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(f32(got), f32(want), rtol=tol, atol=tol * scale)


# ---------------------------------------------------------------------------------- GEMM


@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("act", ["identity", "relu", "gelu", "silu"])
def test_gemm_fused_epilogue(env: tuple[Any, Cutlass], name: str, act: str) -> None:
    dev, cl = env
    m, n, k = 37, 24, 40
    a, b = rand((m, k), name, 1), rand((k, n), name, 2)
    bias, c = rand((n,), name, 3), rand((m, n), name, 4)
    A, B, D = put(dev, a, name), put(dev, b, name), dev.allocate(m * n, DType(name))
    ep = Epilogue().scale(0.75).bias(put(dev, bias, name)).residual_add(
        put(dev, c, name), beta=-0.5).activation(act)
    cl.gemm(A, B, D, m, n, k, ep)
    want = ACTS[act](0.75 * (f32(a) @ f32(b)) + f32(bias)[None, :] - 0.5 * f32(c))
    got = get(dev, D, (m, n))
    assert got.dtype == np_dtype(name)
    close(got, want, name)


@pytest.mark.parametrize("name", ["bf16", "f32"])
def test_gemm_without_epilogue_and_row_bias(env: tuple[Any, Cutlass], name: str) -> None:
    dev, cl = env
    m, n, k = 5, 8, 16
    a, b, bias = rand((m, k), name, 5), rand((k, n), name, 6), rand((m,), name, 7)
    A, B, D = put(dev, a, name), put(dev, b, name), dev.allocate(m * n, DType(name))
    cl.gemm(A, B, D, m, n, k)
    close(get(dev, D, (m, n)), f32(a) @ f32(b), name)
    cl.gemm(A, B, D, m, n, k, Epilogue().bias(put(dev, bias, name), axis="row").silu())
    close(get(dev, D, (m, n)), ACTS["silu"](f32(a) @ f32(b) + f32(bias)[:, None]), name)


def test_silu_of_a_very_negative_product_is_zero_without_an_error(
        env: tuple[Any, Cutlass]) -> None:
    """exp(-x) overflows f32 below x ~ -88: silu is -0 there, as a GPU computes it, not a
    warning turned into an error."""
    dev, cl = env
    m, n, k = 4, 8, 16
    a = np.full((m, k), -20.0, np.float32)
    b = np.random.default_rng(3).uniform(1.0, 2.0, (k, n)).astype(np.float32)
    A, B, D = put(dev, a, "f32"), put(dev, b, "f32"), dev.allocate(m * n, DType.F32)
    cl.gemm(A, B, D, m, n, k, Epilogue().silu())  # products below -320
    np.testing.assert_array_equal(get(dev, D, (m, n)), np.zeros((m, n), np.float32))


@pytest.mark.parametrize("axis", ["row", "column"])
def test_gemm_reduction_sums_the_stored_output(env: tuple[Any, Cutlass], axis: str) -> None:
    dev, cl = env
    m, n, k, name = 19, 16, 8, "bf16"
    a, b = rand((m, k), name, 8), rand((k, n), name, 9)
    A, B, D = put(dev, a, name), put(dev, b, name), dev.allocate(m * n, DType.BF16)
    sums = dev.allocate(m if axis == "row" else n, DType.F32)
    cl.gemm(A, B, D, m, n, k, Epilogue().relu().reduce(sums, axis=axis))
    d = get(dev, D, (m, n))
    close(d, ACTS["relu"](f32(a) @ f32(b)), name)
    stored = f32(d).astype(np.float64)
    want = stored.sum(axis=1 if axis == "row" else 0)
    np.testing.assert_allclose(dev.copy_to_numpy(sums), want, rtol=1e-5, atol=1e-4)


def test_one_by_one_gemm(env: tuple[Any, Cutlass]) -> None:
    dev, cl = env
    a, b = rand((1, 8), "f16", 10), rand((8, 8), "f16", 11)
    D = dev.allocate(8, DType.F16)
    cl.gemm(put(dev, a, "f16"), put(dev, b, "f16"), D, 1, 8, 8)
    close(get(dev, D, (1, 8)), f32(a) @ f32(b), "f16")


# ----------------------------------------------------------------------------- grouped


def packed(problems: list[tuple[int, int, int]], name: str, seed: int,
           ) -> tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]]:
    a = [rand((m, k), name, seed + 2 * i) for i, (m, _, k) in enumerate(problems)]
    b = [rand((k, n), name, seed + 2 * i + 1) for i, (_, n, k) in enumerate(problems)]
    return a, b


def flat(parts: list[np.ndarray[Any, Any]], name: str) -> np.ndarray[Any, Any]:
    return np.concatenate([p.reshape(-1) for p in parts] + [np.zeros(0, np_dtype(name))])


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_grouped_gemm_mixed_shapes(env: tuple[Any, Cutlass], name: str) -> None:
    dev, cl = env
    problems = [(64, 256, 128), (1, 1, 1), (0, 8, 8), (7, 0, 16), (5, 9, 0), (33, 24, 40),
                (3, 5, 7), (128, 64, 8)]
    a, b = packed(problems, name, 20)
    total_d = sum(m * n for m, n, _ in problems)
    A, B = put(dev, flat(a, name), name), put(dev, flat(b, name), name)
    D = put(dev, np.full(total_d, 7, np_dtype(name)), name)
    cl.grouped_gemm(A, B, D, problems, alpha=1.5)
    got = np.asarray(dev.copy_to_numpy(D))
    start = 0
    for (m, n, _), ai, bi in zip(problems, a, b, strict=True):
        part = got[start: start + m * n].reshape(m, n)
        close(part, 1.5 * (f32(ai) @ f32(bi)), name)  # k = 0: zeros
        start += m * n


def test_grouped_gemm_of_only_empty_problems_launches_nothing(env: tuple[Any, Cutlass]) -> None:
    dev, _ = env
    cl = dev.cutlass()
    before = cl.dispatched
    A, B, D = (dev.allocate(64, DType.F16) for _ in range(3))
    cl.grouped_gemm(A, B, D, [(0, 4, 4), (4, 0, 4)])
    assert cl.dispatched == before


# ------------------------------------------------------------------------------ conv2d


def conv_reference(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any], pad: tuple[int, int],
                   stride: tuple[int, int], dilation: tuple[int, int],
                   ) -> np.ndarray[Any, Any]:
    n, h, wd, _ = x.shape
    k, r, s, _ = w.shape
    p = (h + 2 * pad[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + 2 * pad[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    out = np.zeros((n, p, q, k), np.float64)
    for i in range(p):
        for j in range(q):
            for fr in range(r):
                for fs in range(s):
                    y = i * stride[0] - pad[0] + fr * dilation[0]
                    z = j * stride[1] - pad[1] + fs * dilation[1]
                    if 0 <= y < h and 0 <= z < wd:
                        out[:, i, j, :] += x[:, y, z, :].astype(np.float64) @ \
                            w[:, fr, fs, :].astype(np.float64).T
    return out


@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
def test_conv2d_against_a_direct_loop(env: tuple[Any, Cutlass], name: str) -> None:
    dev, cl = env
    n, h, w, c, k, r, s = 2, 7, 6, 8, 16, 3, 2
    pad, stride, dilation = (1, 0), (2, 1), (1, 2)
    x, f, bias = rand((n, h, w, c), name, 30), rand((k, r, s, c), name, 31), rand((k,), name, 32)
    want = conv_reference(x, f, pad, stride, dilation)
    p, q = want.shape[1:3]
    Y = dev.allocate(n * p * q * k, DType(name))
    cl.conv2d(put(dev, x, name), put(dev, f, name), Y, n, h, w, c, k, r, s, pad=pad,
              stride=stride, dilation=dilation, alpha=0.5, bias=put(dev, bias, name))
    close(get(dev, Y, (n, p, q, k)), 0.5 * want + f32(bias), name)


# ------------------------------------------------------------------- plans and counters


def test_plans() -> None:
    plan = Cutlass.gemm_f32_plan(512, 512, 512)
    assert isinstance(plan, KernelPlan) and plan.kind is PlanKind.GEMM
    assert plan.dtype is DType.F32 and plan.arch == "sm_90a" and plan.schedule == "cooperative"
    assert plan.tile == (128, 128, 32) and plan.stages >= 2
    assert int(plan) == plan.key == Cutlass.gemm_f32_plan(1024, 256, 64).key
    big = Cutlass.gemm_plan("bf16", 8192, 8192, 8192)
    small = Cutlass.gemm_plan("bf16", 256, 256, 256)
    assert big.tile == (128, 256, 64) and big.cluster == (2, 1, 1)
    assert small.tile == (128, 128, 64) and big.key != small.key
    assert Cutlass.gemm_plan("bf16", 256, 256, 256, bias_axis="row").key != small.key
    assert Cutlass.grouped_plan("f16").kind is PlanKind.GROUPED
    assert Cutlass.conv2d_plan("f32").warp == (64, 64, 32)
    assert Cutlass.gemm_f32_plan(64, 64, 64, arch="sm_90").arch == "sm_90"
    # stages: as many as fit beside the epilogue's reserve in 227 KiB
    per_stage = (128 + 256) * 64 * 2 + 32
    assert big.stages == (232448 - 34816) // per_stage == 4
    with pytest.raises(InvalidArgument, match="Hopper"):
        Cutlass.grouped_plan("f16", arch="sm_80")
    with pytest.raises(InvalidArgument, match="arch must be one of"):
        Cutlass.gemm_f32_plan(64, 64, 64, arch="sm_75")


def test_counters_count_launches_and_distinct_plans() -> None:
    with System.open("cutlass-counters") as system:
        dev = system.spawn_device(mock=True)
        cl = dev.cutlass()
        assert cl.is_available()
        assert (cl.dispatched, cl.plan_cache_len) == (0, 0)
        a = put(dev, rand((16, 16), "f16", 40), "f16")
        d = dev.allocate(256, DType.F16)
        cl.gemm(a, a, d, 16, 16, 16)
        cl.gemm(a, a, d, 16, 16, 16, Epilogue().relu())
        assert (cl.dispatched, cl.plan_cache_len) == (2, 1)
        bias = put(dev, rand((16,), "f16", 41), "f16")
        cl.gemm(a, a, d, 16, 16, 16, Epilogue().bias(bias, axis="row"))
        cl.grouped_gemm(a, a, d, [(4, 8, 8)])
        assert cl.stats() == (4, 3)
        assert repr(cl) == "Cutlass(device=0)"


# ------------------------------------------------------------------------------ errors


def test_bad_input_is_a_typed_error(env: tuple[Any, Cutlass]) -> None:
    dev, cl = env
    a = dev.allocate(64, DType.F16)
    d = dev.allocate(64, DType.F16)
    with pytest.raises(InvalidArgument, match="family must be"):
        cl.gemm(a, a, d, 8, 8, 8, family="sm70")
    with pytest.raises(InvalidArgument, match="b has dtype f32 but a has f16"):
        cl.gemm(a, dev.allocate(64, DType.F32), d, 8, 8, 8)
    with pytest.raises(InvalidArgument, match="f16, bf16, f32, f64"):
        i = dev.allocate(64, DType.I32)
        cl.gemm(i, i, dev.allocate(64, DType.I32), 8, 8, 8)
    with pytest.raises(InvalidArgument, match="cannot follow"):
        cl.gemm(a, a, d, 8, 8, 8, Epilogue().relu().bias(dev.allocate(8, DType.F16)))
    with pytest.raises(InvalidArgument, match="one Scale"):
        cl.gemm(a, a, d, 8, 8, 8, Epilogue().scale(2.0).scale(3.0))
    with pytest.raises(InvalidArgument, match="bias"):
        cl.gemm(a, a, d, 8, 8, 8, Epilogue().bias(dev.allocate(4, DType.F16)))
    with pytest.raises(InvalidArgument, match="bias must be f16"):
        cl.gemm(a, a, d, 8, 8, 8, Epilogue().bias(dev.allocate(8, DType.F32)))
    with pytest.raises(InvalidArgument, match="reduction output"):
        cl.gemm(a, a, d, 8, 8, 8, Epilogue().reduce(dev.allocate(8, DType.F16)))
    with pytest.raises(InvalidArgument, match="activation must be one of"):
        Epilogue().activation("tanh")
    with pytest.raises(InvalidArgument, match="axis"):
        Epilogue().bias(a, axis="diagonal")
    with pytest.raises(InvalidArgument, match="must be a buffer"):
        Epilogue().bias(np.zeros(8))
    with pytest.raises(InvalidArgument, match="epilogue must be an Epilogue"):
        cl.gemm(a, a, d, 8, 8, 8, "relu")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="output must not be"):
        cl.gemm(a, a, a, 8, 8, 8)
    with pytest.raises(InvalidArgument):
        cl.gemm(a, a, d, 8, 16, 8)  # d too short
    with pytest.raises(InvalidArgument, match="f16, bf16"):
        f = dev.allocate(64, DType.F32)
        cl.grouped_gemm(f, f, dev.allocate(64, DType.F32), [(2, 2, 2)])
    with pytest.raises(InvalidArgument, match="ints >= 0"):
        cl.grouped_gemm(a, a, d, [(2, -1, 2)])
    with pytest.raises(InvalidArgument, match="at least one problem"):
        cl.grouped_gemm(a, a, d, [])
    with pytest.raises(InvalidArgument, match="filter does not fit"):
        cl.conv2d(a, a, d, 1, 2, 2, 8, 8, 3, 3)
    with pytest.raises(InvalidArgument, match="multiple of 8"):
        cl.conv2d(a, a, d, 1, 2, 2, 4, 8, 1, 1)
    # the device still serves
    b = put(dev, rand((8, 8), "f16", 50), "f16")
    cl.gemm(b, b, d, 8, 8, 8)
    close(get(dev, d, (8, 8)), f32(get(dev, b, (8, 8))) @ f32(get(dev, b, (8, 8))), "f16")


def test_epilogue_buffers_cross_a_process_host() -> None:
    with System.open("cutlass-process") as system:
        dev = system.spawn_device(mock=True, isolation="process")
        cl = dev.cutlass()
        m, n, k, name = 9, 16, 8, "f32"
        a, b, bias = rand((m, k), name, 70), rand((k, n), name, 71), rand((n,), name, 72)
        d, sums = dev.allocate(m * n, DType.F32), dev.allocate(n, DType.F32)
        cl.gemm(put(dev, a, name), put(dev, b, name), d, m, n, k,
                Epilogue().bias(put(dev, bias, name)).relu().reduce(sums, axis="column"))
        want = ACTS["relu"](f32(a) @ f32(b) + f32(bias)[None, :])
        close(get(dev, d, (m, n)), want, name)
        np.testing.assert_allclose(dev.copy_to_numpy(sums), want.sum(axis=0), rtol=1e-5,
                                   atol=1e-5)
        assert cl.stats() == (1, 1)


def test_missing_package_or_nvcc_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from atomr_accel.backends import _cutlass_build, _optional
    from atomr_accel.cutlass import build_kernels, gemm_plan
    from atomr_accel.errors import LibraryUnavailable

    plan = gemm_plan(DType.F16, 64, 64, 64)
    monkeypatch.setitem(_optional.OPTIONAL, "cutlass", _optional.Optional(
        "atomr_accel_no_such_module", "nvidia-cutlass", "cutlass", program="nvcc"))
    with pytest.raises(LibraryUnavailable, match=r"nvidia-cutlass.*atomr-accel-py\[cutlass\]"):
        build_kernels([plan])
    monkeypatch.setitem(_optional.OPTIONAL, "cutlass", _optional.Optional(
        "json", "nvidia-cutlass", "cutlass", program="nvcc"))
    monkeypatch.setattr(_cutlass_build, "find_nvcc", lambda: None)
    assert _optional.unavailable("cutlass") is not None
    with pytest.raises(LibraryUnavailable, match="nvcc"):
        build_kernels([plan])
