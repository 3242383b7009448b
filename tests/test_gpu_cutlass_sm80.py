"""The ``sm80`` template family and odd sizes on CUDA, against the CPU backend and torch.

An H100 runs the Ampere templates too, so ``family="sm80"`` forces them there: f16,
bf16, f32 (TF32) and f64 (DMMA) GEMMs with every epilogue node against the CPU
backend, and the plain products against ``torch.matmul`` in float64; then GEMMs of
odd ``m``, ``n``, ``k`` (1, 3, 17, 33, 127, 257...), which take the narrow-load
``sm80`` kernels on any device, with every activation, bias along rows and columns,
a residual and a reduction. The fixture first builds every plan used with nvcc in
parallel (``build_kernels``) and checks each kernel's stages and shared memory.
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cutlass_data import get, put, rand

from atomr_accel import DType, System
from atomr_accel.cutlass import Epilogue, build_kernels, gemm_plan

pytestmark = pytest.mark.gpu

TOL = {"f16": 4e-3, "bf16": 2e-2, "f32": 2e-2, "f64": 1e-11}  # f32 runs as TF32
NAMES = ("f16", "bf16", "f32", "f64")
SHAPE = (300, 256, 192)
ODD = [(1, 1, 1), (3, 17, 33), (127, 3, 17), (33, 127, 1), (17, 33, 127), (257, 129, 131)]
PLANS = ([gemm_plan(DType(name), *SHAPE, family="sm80") for name in NAMES]
         + [gemm_plan(DType(name), *ODD[1]) for name in NAMES]
         + [gemm_plan(DType.F32, *ODD[1], bias_axis="row")])


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Any, Any]]:
    start = time.perf_counter()
    build_kernels(PLANS)
    print(f"\nbuilt {len(PLANS)} CUTLASS kernels in {time.perf_counter() - start:.1f} s")
    with System.open("cutlass-gpu-sm80") as system:
        yield system.spawn_device(mock=True), system.spawn_device(mock=False)










def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], name: str) -> None:
    tol = TOL[name]
    want64 = np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.abs(want64).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want64, rtol=tol,
                               atol=tol * scale)


def test_built_kernels_match_their_plans(devices: tuple[Any, Any]) -> None:
    from atomr_accel.backends._cutlass_build import library
    for plan in PLANS:
        kernel = library(plan)
        assert plan.family == "sm80" and plan.arch == "sm_90a", plan.name
        assert kernel.stages == plan.stages, plan.name
        assert 0 < kernel.smem_bytes <= 232448, plan.name


def gemm_both(devices: tuple[Any, Any], name: str, shape: tuple[int, int, int], fn: str,
              axis: str, family: str | None, seed: int) -> list[dict[str, Any]]:
    """The fused GEMM ``fn(0.5 A @ B + bias + 0.25 C)`` and its row sums on each device, from
    the same data; answers the CPU's outputs, then CUDA's."""
    m, n, k = shape
    arrays = {"a": rand((m, k), name, seed), "b": rand((k, n), name, seed + 1),
              "bias": rand((m if axis == "row" else n,), name, seed + 2),
              "c": rand((m, n), name, seed + 3)}
    answers = []
    for dev in devices:
        bufs = {key: put(dev, value, name) for key, value in arrays.items()}
        d = dev.allocate(m * n, DType(name))
        sums = dev.allocate(m, DType.F64 if name == "f64" else DType.F32)
        ep = (Epilogue().scale(0.5).bias(bufs["bias"], axis=axis)
              .residual_add(bufs["c"], beta=0.25).activation(fn).reduce(sums))
        dev.cutlass().gemm(bufs["a"], bufs["b"], d, m, n, k, ep, family=family,
                           timeout_secs=600)
        answers.append({"d": get(dev, d, (m, n)), "sums": np.asarray(dev.copy_to_numpy(sums)),
                        **arrays})
    return answers


def check(cpu: dict[str, Any], gpu: dict[str, Any], name: str) -> None:
    close(gpu["d"], cpu["d"], name)
    # the reduction sums the stored D: check it against CUDA's own D
    want = np.asarray(gpu["d"], np.float64).sum(axis=1)
    np.testing.assert_allclose(np.asarray(gpu["sums"], np.float64), want,
                               rtol=1e-10 if name == "f64" else 1e-4,
                               atol=1e-10 if name == "f64" else 1e-3)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fn", ["identity", "relu", "gelu", "silu"])
def test_sm80_family_on_this_gpu_matches_the_cpu(devices: tuple[Any, Any], name: str,
                                                 fn: str) -> None:
    cpu, gpu = gemm_both(devices, name, SHAPE, fn, "column", "sm80", 10)
    check(cpu, gpu, name)


@pytest.mark.parametrize("name", NAMES)
def test_sm80_family_matches_torch_in_float64(devices: tuple[Any, Any], name: str) -> None:
    torch = pytest.importorskip("torch")
    m, n, k = SHAPE
    a, b = rand((m, k), name, 20), rand((k, n), name, 21)
    _, gpu = devices
    d = gpu.allocate(m * n, DType(name))
    gpu.cutlass().gemm(put(gpu, a, name), put(gpu, b, name), d, m, n, k, family="sm80",
                       timeout_secs=600)
    ta = torch.tensor(np.asarray(a, np.float64), device="cuda")
    tb = torch.tensor(np.asarray(b, np.float64), device="cuda")
    close(get(gpu, d, (m, n)), (ta @ tb).cpu().numpy(), name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", ODD, ids=lambda s: "x".join(map(str, s)))
def test_odd_sizes_match_the_cpu(devices: tuple[Any, Any], name: str,
                                 shape: tuple[int, int, int]) -> None:
    for i, fn in enumerate(("identity", "relu", "gelu", "silu")):
        cpu, gpu = gemm_both(devices, name, shape, fn, "column", None, 30 + i)
        check(cpu, gpu, name)


@pytest.mark.parametrize("shape", ODD, ids=lambda s: "x".join(map(str, s)))
def test_odd_sizes_with_a_row_bias_match_the_cpu_and_torch(devices: tuple[Any, Any],
                                                          shape: tuple[int, int, int]) -> None:
    torch = pytest.importorskip("torch")
    cpu, gpu = gemm_both(devices, "f32", shape, "gelu", "row", None, 40)
    check(cpu, gpu, "f32")
    ta, tb, tc, tbias = (torch.tensor(np.asarray(gpu[key], np.float64), device="cuda")
                         for key in ("a", "b", "c", "bias"))
    want = torch.nn.functional.gelu(0.5 * (ta @ tb) + tbias[:, None] + 0.25 * tc)
    close(gpu["d"], want.cpu().numpy(), "f32")
