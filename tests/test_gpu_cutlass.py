"""``dev.cutlass()`` on CUDA against the CPU backend and cuBLAS (torch) on the same data.

The first fixture builds every kernel plan the tests use with nvcc, in parallel
(``build_kernels``: the compile path, into the disk cache), and checks each
built kernel's pipeline depth and shared memory against its plan. Then GEMMs in
f16, bf16 and f32 (TF32) with fused epilogues (scale, bias along columns and
rows, residual add, each activation, row and column reductions), a large bf16
GEMM, grouped GEMMs of mixed shapes (a 1x1x1 problem, empty ones, unaligned
ones) and convolutions run on both devices; CUDA must match the CPU backend and
``torch`` (cuBLAS / cuDNN) within the dtype's rounding.
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _cutlass_data import get, put, rand

from atomr_accel import DType, System
from atomr_accel.cutlass import Epilogue, build_kernels, conv2d_plan, gemm_plan, grouped_plan

pytestmark = pytest.mark.gpu

TOL = {"f16": 4e-3, "bf16": 2e-2, "f32": 2e-2}  # f32 runs as TF32 on CUDA
PLANS = [
    gemm_plan(DType.F16, 256, 256, 256), gemm_plan(DType.BF16, 256, 256, 256),
    gemm_plan(DType.F32, 256, 256, 256), gemm_plan(DType.BF16, 256, 256, 256, bias_axis="row"),
    gemm_plan(DType.BF16, 4096, 4096, 4096), grouped_plan(DType.F16), grouped_plan(DType.BF16),
    conv2d_plan(DType.F16), conv2d_plan(DType.BF16), conv2d_plan(DType.F32),
]


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Any, Any]]:
    start = time.perf_counter()
    build_kernels(PLANS)
    print(f"\nbuilt {len(PLANS)} CUTLASS kernels in {time.perf_counter() - start:.1f} s")
    with System.open("cutlass-gpu") as system:
        yield system.spawn_device(mock=True), system.spawn_device(mock=False)










def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], name: str) -> None:
    tol = TOL[name]
    want32 = np.asarray(want, dtype=np.float32)
    scale = max(1.0, float(np.abs(want32).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want32, rtol=tol,
                               atol=tol * scale)


def test_built_kernels_match_their_plans(devices: tuple[Any, Any]) -> None:
    from atomr_accel.backends._cutlass_build import library
    for plan in PLANS:
        kernel = library(plan)
        assert kernel.stages == plan.stages, plan.name
        assert 0 < kernel.smem_bytes <= 232448, plan.name
    _, gpu = devices
    assert gpu.cutlass().is_available()


def run_both(devices: tuple[Any, Any], arrays: dict[str, np.ndarray[Any, Any]], name: str,
             call: Any, outputs: dict[str, tuple[tuple[int, ...], str]],
             ) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Run ``call(dev, cutlass, bufs)`` on both devices from the same arrays; answer the
    outputs of the CPU, then of CUDA."""
    answers = []
    for dev in devices:
        bufs = {k: put(dev, v, name) for k, v in arrays.items()}
        bufs |= {k: dev.allocate(math.prod(shape), DType(dt)) for k, (shape, dt) in
                 outputs.items()}
        call(dev, dev.cutlass(), bufs)
        answers.append({k: get(dev, bufs[k], shape) for k, (shape, _) in outputs.items()})
    return answers


@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("act", ["identity", "relu", "gelu", "silu"])
def test_gemm_epilogue_matches_the_cpu(devices: tuple[Any, Any], name: str, act: str) -> None:
    m, n, k = 300, 256, 192
    arrays = {"a": rand((m, k), name, 1), "b": rand((k, n), name, 2),
              "bias": rand((n,), name, 3), "c": rand((m, n), name, 4)}

    def call(dev: Any, cl: Any, bufs: dict[str, Any]) -> None:
        ep = (Epilogue().scale(0.5).bias(bufs["bias"]).residual_add(bufs["c"], beta=0.25)
              .activation(act).reduce(bufs["sums"], axis="row"))
        cl.gemm(bufs["a"], bufs["b"], bufs["d"], m, n, k, ep, timeout_secs=600)

    cpu, gpu = run_both(devices, arrays, name, call,
                        {"d": ((m, n), name), "sums": ((m,), "f32")})
    close(gpu["d"], cpu["d"], name)
    # the reduction sums the stored D: check it against CUDA's own D exactly enough
    np.testing.assert_allclose(gpu["sums"], np.asarray(gpu["d"], np.float64).sum(axis=1),
                               rtol=1e-4, atol=1e-3)


def test_gemm_row_bias_and_column_reduction(devices: tuple[Any, Any]) -> None:
    m, n, k, name = 130, 72, 64, "bf16"
    arrays = {"a": rand((m, k), name, 5), "b": rand((k, n), name, 6), "bias": rand((m,), name, 7)}

    def call(dev: Any, cl: Any, bufs: dict[str, Any]) -> None:
        cl.gemm(bufs["a"], bufs["b"], bufs["d"], m, n, k,
                Epilogue().bias(bufs["bias"], axis="row").relu().reduce(bufs["sums"],
                                                                        axis="column"),
                timeout_secs=600)

    cpu, gpu = run_both(devices, arrays, name, call,
                        {"d": ((m, n), name), "sums": ((n,), "f32")})
    close(gpu["d"], cpu["d"], name)
    np.testing.assert_allclose(gpu["sums"], np.asarray(gpu["d"], np.float64).sum(axis=0),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
def test_gemm_matches_cublas(devices: tuple[Any, Any], name: str) -> None:
    torch = pytest.importorskip("torch")
    m, n, k = 384, 512, 256
    a, b = rand((m, k), name, 8), rand((k, n), name, 9)
    _, gpu = devices
    d = gpu.allocate(m * n, DType(name))
    gpu.cutlass().gemm(put(gpu, a, name), put(gpu, b, name), d, m, n, k, timeout_secs=600)
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]
    ta = torch.tensor(np.asarray(a, np.float32), device="cuda").to(tdt)
    tb = torch.tensor(np.asarray(b, np.float32), device="cuda").to(tdt)
    want = (ta @ tb).float().cpu().numpy()
    close(get(gpu, d, (m, n)), want, name)


def test_large_bf16_gemm_matches_cublas(devices: tuple[Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    m = n = k = 4096
    _, gpu = devices
    ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    tb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    a, b, d = (gpu.allocate(x, DType.BF16) for x in (m * k, k * n, m * n))
    gpu.copy_from_numpy(a, ta.float().cpu().numpy().astype(ml_dtypes.bfloat16).reshape(-1))
    gpu.copy_from_numpy(b, tb.float().cpu().numpy().astype(ml_dtypes.bfloat16).reshape(-1))
    gpu.cutlass().gemm(a, b, d, m, n, k, timeout_secs=600)
    want = (ta @ tb).float().cpu().numpy()
    close(get(gpu, d, (m, n)), want, "bf16")


def test_gemm_repeated_on_the_same_buffers_computes_each_calls_data(
        devices: tuple[Any, Any]) -> None:
    """A repeated GEMM launches as prepared for its operands: new data in the same buffers,
    another scale or activation, and more operand sets than are kept (70, so the oldest
    prepared launches are released and prepared again) each compute their own result."""
    m = n = k = 256
    name = "bf16"
    _, gpu = devices
    cl = gpu.cutlass()
    a, b = gpu.allocate(m * k, DType.BF16), gpu.allocate(k * n, DType.BF16)
    outs = [gpu.allocate(m * n, DType.BF16) for _ in range(70)]
    for round_ in range(3):
        x, y = rand((m, k), name, 40 + round_), rand((k, n), name, 50 + round_)
        gpu.copy_from_numpy(a, x.reshape(-1))
        gpu.copy_from_numpy(b, y.reshape(-1))
        exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
        for i, d in enumerate(outs):
            scale = (0.5, 2.0)[i % 2]
            act = ("identity", "relu")[(i // 2) % 2]
            cl.gemm(a, b, d, m, n, k, Epilogue().scale(scale).activation(act),
                    timeout_secs=600)
        for i, d in enumerate(outs):
            want = (0.5, 2.0)[i % 2] * exact
            if (i // 2) % 2:
                want = np.maximum(want, 0.0)
            close(get(gpu, d, (m, n)), want, name)


def test_a_gemm_of_a_signature_that_ran_only_queues_work(devices: tuple[Any, Any]) -> None:
    """Once a GEMM ran, a GEMM of its signature only queues work whatever its buffers and
    scalars (an awaited one launches from the caller's event loop); another shape or kind
    of epilogue node does not until it ran (its kernel may have to be built)."""
    from atomr_accel.backends.cuda._backend import CudaBackend
    from atomr_accel.core import GpuRef
    from atomr_accel.core.ops._cutlass import CutlassGemm

    backend = CudaBackend(0)
    try:
        def ref(length: int) -> GpuRef:
            return GpuRef(0, backend.allocate(DType.BF16, length), DType.BF16, length, 1)

        m = 256
        a, b, d, other = (ref(m * m) for _ in range(4))
        bias = ref(m)

        def gemm(out: GpuRef, epilogue: Epilogue, k: int = m) -> CutlassGemm:
            return CutlassGemm(a, b, out, m, m, k, epilogue)

        first = gemm(d, Epilogue().scale(0.5).bias(bias))
        assert not backend.queues_only(first)
        backend.execute(first)
        assert backend.queues_only(first)
        assert backend.queues_only(gemm(other, Epilogue().scale(2.0).bias(bias)))
        assert not backend.queues_only(gemm(d, Epilogue().scale(0.5)))
        assert not backend.queues_only(gemm(d, Epilogue().scale(0.5).bias(bias), k=m // 2))
    finally:
        backend.close()


def test_gathered_gemms_awaited_again_compute_each_calls_data(
        devices: tuple[Any, Any]) -> None:
    """GEMMs of one signature awaited together, round after round with new data, scales and
    row sums (launched from the caller's event loop once the first ran), match NumPy in
    float64."""
    import asyncio

    m = n = k = 256
    name = "bf16"
    _, gpu = devices
    cl = gpu.cutlass()
    a, b = gpu.allocate(m * k, DType.BF16), gpu.allocate(k * n, DType.BF16)
    outs = [(gpu.allocate(m * n, DType.BF16), gpu.allocate(m, DType.F32)) for _ in range(6)]

    async def together(scales: list[float]) -> None:
        await asyncio.gather(*(
            cl.gemm_async(a, b, d, m, n, k, Epilogue().scale(scale).reduce(sums, axis="row"),
                          timeout_secs=600)
            for (d, sums), scale in zip(outs, scales, strict=True)))

    for round_ in range(3):
        x, y = rand((m, k), name, 70 + round_), rand((k, n), name, 80 + round_)
        gpu.copy_from_numpy(a, x.reshape(-1))
        gpu.copy_from_numpy(b, y.reshape(-1))
        scales = [0.5 + i + round_ for i in range(len(outs))]
        asyncio.run(together(scales))
        exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
        for (d, sums), scale in zip(outs, scales, strict=True):
            got = get(gpu, d, (m, n))
            close(got, scale * exact, name)
            np.testing.assert_allclose(get(gpu, sums, (m,)),
                                       np.asarray(got, np.float64).sum(axis=1),
                                       rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_grouped_gemm_matches_the_cpu_and_cublas(devices: tuple[Any, Any], name: str) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    problems = [(int(rng.integers(64, 513)), int(rng.choice([256, 512, 1024])),
                 int(rng.choice([256, 512, 1024]))) for _ in range(12)]
    problems += [(1, 1, 1), (0, 64, 64), (16, 0, 8), (9, 24, 0), (33, 20, 12), (5, 7, 3)]
    a = [rand((m, k), name, 100 + i) for i, (m, _, k) in enumerate(problems)]
    b = [rand((k, n), name, 200 + i) for i, (_, n, k) in enumerate(problems)]
    flat = {"a": np.concatenate([x.reshape(-1) for x in a]),
            "b": np.concatenate([x.reshape(-1) for x in b])}
    total = sum(m * n for m, n, _ in problems)

    def call(dev: Any, cl: Any, bufs: dict[str, Any]) -> None:
        cl.grouped_gemm(bufs["a"], bufs["b"], bufs["d"], problems, alpha=0.5, timeout_secs=600)

    cpu, gpu = run_both(devices, flat, name, call, {"d": ((total,), name)})
    start = 0
    tdt = torch.float16 if name == "f16" else torch.bfloat16
    for (m, n, _), ai, bi in zip(problems, a, b, strict=True):
        got = gpu["d"][start: start + m * n].reshape(m, n)
        close(got, cpu["d"][start: start + m * n].reshape(m, n), name)
        ta = torch.tensor(np.asarray(ai, np.float32), device="cuda").to(tdt)
        tb = torch.tensor(np.asarray(bi, np.float32), device="cuda").to(tdt)
        close(got, (0.5 * (ta @ tb).float()).cpu().numpy(), name)
        start += m * n


@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
def test_conv2d_matches_the_cpu_and_cudnn(devices: tuple[Any, Any], name: str) -> None:
    torch = pytest.importorskip("torch")
    n, h, w, c, k, r, s = 4, 17, 15, 32, 64, 3, 3
    pad, stride, dilation = (1, 1), (2, 1), (1, 2)
    arrays = {"x": rand((n, h, w, c), name, 40), "w": rand((k, r, s, c), name, 41),
              "bias": rand((k,), name, 42)}
    p = (h + 2 * pad[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * pad[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1

    def call(dev: Any, cl: Any, bufs: dict[str, Any]) -> None:
        cl.conv2d(bufs["x"], bufs["w"], bufs["y"], n, h, w, c, k, r, s, pad=pad, stride=stride,
                  dilation=dilation, alpha=0.5, bias=bufs["bias"], timeout_secs=600)

    cpu, gpu = run_both(devices, arrays, name, call, {"y": ((n, p, q, k), name)})
    close(gpu["y"], cpu["y"], name)
    tx = torch.tensor(np.asarray(arrays["x"], np.float32), device="cuda").permute(0, 3, 1, 2)
    tw = torch.tensor(np.asarray(arrays["w"], np.float32), device="cuda").permute(0, 3, 1, 2)
    tb = torch.tensor(np.asarray(arrays["bias"], np.float32), device="cuda")
    want = torch.nn.functional.conv2d(tx.double(), tw.double(), None, stride, pad, dilation)
    want = (0.5 * want + tb.double()[None, :, None, None]).permute(0, 2, 3, 1)
    close(gpu["y"], want.cpu().numpy(), name)


def test_counters_on_cuda(devices: tuple[Any, Any]) -> None:
    _, gpu = devices
    cl = gpu.cutlass()
    before, plans = cl.stats()
    a = put(gpu, rand((64, 64), "f16", 60), "f16")
    d = gpu.allocate(64 * 64, DType.F16)
    for _ in range(3):
        cl.gemm(a, a, d, 64, 64, 64)
    assert cl.dispatched == before + 3
    assert cl.plan_cache_len >= 1 and cl.plan_cache_len >= plans
