"""``Cutlass.gemm_fp8`` on CUDA against the CPU backend and ``torch._scaled_mm`` (cuBLASLt).

The fixture builds the fp8 kernel plans the tests use (``build_kernels``) and
checks each built kernel against its plan (stages, shared memory). Then fp8
GEMMs of both formats, mixed, into bf16 / f16 / f32, with scales and fused
epilogues (bias along rows and columns, residual add, each activation, a
reduction) run on both devices. Operands exactly representable in fp8 make the
CPU's product exact; CUDA must match it within D's rounding (relative: 8e-3 for
bf16, 1e-3 for f16, 1e-5 for f32) plus 2^-10 of the largest magnitude (the fp8
tensor cores sum a k-block at reduced precision before the f32 promotion); each
test prints the error it saw. Against ``torch._scaled_mm`` (e4m3 and e4m3 x
e5m2, bf16 output, its default accumulation) and the exact product, the same
tolerance; and the
codecs against torch's own ``.to(torch.float8_*)`` casts (``saturate=False``).
Kept apart from ``test_gpu_cutlass.py`` so that its fixture does not build the
other kernels. Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from atomr_accel import DType, System
from atomr_accel.cutlass import Epilogue, build_kernels, from_fp8, gemm_fp8_plan, to_fp8

pytestmark = pytest.mark.gpu

PLANS = [
    gemm_fp8_plan(DType.BF16, 256, 256, 256),
    gemm_fp8_plan(DType.F16, 256, 256, 256, "e5m2", "e4m3", bias_axis="row"),
    gemm_fp8_plan(DType.F32, 256, 256, 256, "e4m3", "e5m2"),
    gemm_fp8_plan(DType.F32, 256, 256, 256),
    gemm_fp8_plan(DType.BF16, 256, 256, 256, "e4m3", "e5m2"),
    gemm_fp8_plan(DType.BF16, 4096, 4096, 4096),
]
TOL = {"bf16": 8e-3, "f16": 1e-3, "f32": 1e-5}


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Any, Any]]:
    start = time.perf_counter()
    build_kernels(PLANS)
    print(f"\nbuilt {len(PLANS)} fp8 CUTLASS kernels in {time.perf_counter() - start:.1f} s")
    with System.open("cutlass-fp8-gpu") as system:
        yield system.spawn_device(mock=True), system.spawn_device(mock=False)


def exact(shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Random values both fp8 formats hold exactly: integers in [-8, 8] times 2^-3 .. 2^1."""
    rng = np.random.default_rng(seed)
    return rng.integers(-8, 9, shape) * np.exp2(rng.integers(-3, 2, shape)).astype(np.float64)


def put(dev: Any, values: np.ndarray[Any, Any], dtype: DType) -> Any:
    buf = dev.allocate(values.size, dtype)
    dev.copy_from_numpy(buf, values.reshape(-1))
    return buf


def get(dev: Any, buf: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return np.asarray(dev.copy_to_numpy(buf), dtype=np.float64)[: math.prod(shape)].reshape(shape)


def as_dtype(x: np.ndarray[Any, Any], out: str) -> np.ndarray[Any, Any]:
    return x.astype(ml_dtypes.bfloat16 if out == "bf16" else np.dtype(DType(out).numpy))


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], out: str, what: str) -> None:
    """Within D's rounding (``rtol``) plus 2^-10 of the largest magnitude: the fp8 tensor
    cores add within a k-block at reduced precision before CUTLASS promotes to f32."""
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    print(f"{what}: max |got - want| / max |want| = {np.abs(got - want).max() / scale:.2e}")
    np.testing.assert_allclose(got, want, rtol=TOL[out], atol=2 ** -10 * scale)


def test_built_kernels_match_their_plans(devices: tuple[Any, Any]) -> None:
    from atomr_accel.backends._cutlass_build import library
    for plan in PLANS:
        kernel = library(plan)
        assert kernel.stages == plan.stages, plan.name
        assert 0 < kernel.smem_bytes <= 232448, plan.name
    assert devices[1].cutlass().is_available()


@pytest.mark.parametrize(("fa", "fb", "out", "axis", "fn"), [
    ("e4m3", "e4m3", "bf16", "column", "gelu"),
    ("e5m2", "e4m3", "f16", "row", "relu"),
    ("e4m3", "e5m2", "f32", "column", "silu"),
    ("e4m3", "e4m3", "bf16", "column", "identity"),
])
def test_gemm_fp8_matches_the_cpu(devices: tuple[Any, Any], fa: str, fb: str, out: str,
                                  axis: str, fn: str) -> None:
    m, n, k = 320, 256, 512
    a, bt = exact((m, k), 1), exact((n, k), 2)
    rng = np.random.default_rng(3)
    dt = DType(out)
    bias = as_dtype(rng.standard_normal(m if axis == "row" else n), out)
    c = as_dtype(rng.standard_normal((m, n)), out)
    answers = []
    for dev in devices:
        A, B = put(dev, to_fp8(a, fa), DType.U8), put(dev, to_fp8(bt, fb), DType.U8)
        D, sums = dev.allocate(m * n, dt), dev.allocate(m, DType.F32)
        ep = (Epilogue().scale(0.5).bias(put(dev, bias, dt), axis=axis)
              .residual_add(put(dev, c, dt), beta=0.25).activation(fn).reduce(sums))
        dev.cutlass().gemm_fp8(A, B, D, m, n, k, ep, a_format=fa, b_format=fb, scale_a=0.25,
                               scale_b=2.0, timeout_secs=600)
        answers.append((get(dev, D, (m, n)), get(dev, sums, (m,))))
    (cpu, _), (gpu, gpu_sums) = answers
    close(gpu, cpu, out, f"{fa}x{fb}->{out} {axis} {fn}")
    np.testing.assert_allclose(gpu_sums, gpu.sum(axis=1), rtol=1e-4, atol=1e-2)


def test_gemm_fp8_without_epilogue(devices: tuple[Any, Any]) -> None:
    m, n, k = 128, 384, 256
    a, bt = exact((m, k), 4), exact((n, k), 5)
    got = []
    for dev in devices:
        A, B = put(dev, to_fp8(a), DType.U8), put(dev, to_fp8(bt), DType.U8)
        D = dev.allocate(m * n, DType.F32)
        dev.cutlass().gemm_fp8(A, B, D, m, n, k, timeout_secs=600)
        got.append(get(dev, D, (m, n)))
    np.testing.assert_array_equal(got[0], a @ bt.T)  # the CPU: exact
    close(got[1], a @ bt.T, "f32", "e4m3 -> f32 vs the exact product")


@pytest.mark.parametrize(("fb", "m", "n", "k"), [("e4m3", 4096, 4096, 1024),
                                                 ("e5m2", 512, 256, 768)])
def test_gemm_fp8_matches_torch_scaled_mm(devices: tuple[Any, Any], fb: str, m: int, n: int,
                                          k: int) -> None:
    torch = pytest.importorskip("torch")
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    rng = np.random.default_rng(6)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bt = rng.standard_normal((n, k)).astype(np.float32)
    a_bits, b_bits = to_fp8(a), to_fp8(bt, fb)
    ta = torch.from_numpy(a_bits).cuda().view(torch.float8_e4m3fn)
    tb = torch.from_numpy(b_bits).cuda().view(fp8[fb])
    sa = torch.tensor(0.5, device="cuda")
    sb = torch.tensor(1.5, device="cuda")
    want = torch._scaled_mm(ta, tb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    want64 = want.float().cpu().numpy().astype(np.float64)
    _, gpu = devices
    A, B = put(gpu, a_bits, DType.U8), put(gpu, b_bits, DType.U8)
    D = gpu.allocate(m * n, DType.BF16)
    gpu.cutlass().gemm_fp8(A, B, D, m, n, k, b_format=fb, scale_a=0.5, scale_b=1.5,
                           timeout_secs=600)
    got = get(gpu, D, (m, n))
    exact64 = 0.75 * (from_fp8(a_bits).astype(np.float64) @ from_fp8(b_bits, fb).T)
    close(got, exact64, "bf16", f"e4m3x{fb} {m}x{n}x{k}: ours vs the exact product")
    close(want64, exact64, "bf16", f"e4m3x{fb} {m}x{n}x{k}: torch._scaled_mm vs exact")
    close(got, want64, "bf16", f"e4m3x{fb} {m}x{n}x{k}: ours vs torch._scaled_mm")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_to_fp8_plain_cast_matches_torch(fmt: str) -> None:
    torch = pytest.importorskip("torch")
    kind = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(20000) * rng.choice([1e-4, 1, 100, 1e4, 1e6], 20000)).astype(
        np.float32)
    x[:4] = [np.inf, -np.inf, 1e30, -1e30]
    want = torch.from_numpy(x).to(kind).view(torch.uint8).numpy()
    got = to_fp8(x, fmt, saturate=False)
    same = (got == want) | (np.isnan(from_fp8(got, fmt)) & np.isnan(from_fp8(want, fmt)))
    assert same.all(), np.flatnonzero(~same)[:10]
    top = float(torch.finfo(kind).max)
    clipped = torch.from_numpy(np.clip(x, -top, top)).to(kind).view(torch.uint8).numpy()
    np.testing.assert_array_equal(to_fp8(x, fmt), clipped)
