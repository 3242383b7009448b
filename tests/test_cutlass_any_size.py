"""``dev.cutlass()`` beyond Hopper and at any size, on the CPU backend.

Plans for every architecture the original package named (no GPU needed): the
``sm90`` family on Hopper for aligned f16 / bf16 / f32, the ``sm80`` family
elsewhere, for f64 and for sizes whose ``k`` or ``n`` is not a multiple of the
16-byte vector (narrower loads); the ``family`` override and what it refuses.
GEMMs of odd ``m``, ``n``, ``k`` (1, 3, 17, 33, 127) with every epilogue node,
and f64 GEMMs (an f64 reduction), against float64 references written here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cutlass_data import get, put, rand

from atomr_accel import DType, InvalidArgument, System
from atomr_accel.cutlass import Cutlass, Epilogue, KernelPlan, gemm_plan

TOL = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 1e-5, "f64": 1e-12}
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120")


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Any, Cutlass]]:
    with System.open("cutlass-any-size") as system:
        dev = system.spawn_device(mock=True)
        yield dev, dev.cutlass()










def f64(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(x, dtype=np.float64)


def act(name: str, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    return x


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], name: str) -> None:
    tol = TOL[name]
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(f64(got), f64(want), rtol=tol, atol=tol * scale)


# ----------------------------------------------------------------------------------- plans


@pytest.mark.parametrize("arch", ARCHS)
def test_every_original_arch_has_f32_and_f64_plans(arch: str) -> None:
    plan = Cutlass.gemm_f32_plan(96, 40, 24, arch)
    assert isinstance(plan, KernelPlan) and plan.arch == arch and int(plan) == plan.key
    hopper = arch in ("sm_90", "sm_90a")
    assert plan.family == ("sm90" if hopper else "sm80")
    assert plan.align == 4 and plan.stages >= 2
    f64_plan = Cutlass.gemm_f64_plan(96, 40, 24, arch)
    assert f64_plan.family == "sm80" and f64_plan.dtype is DType.F64
    assert f64_plan.tile == (128, 128, 16) and f64_plan.warp == (32, 64, 16)
    assert f64_plan.align == 1 and f64_plan.schedule == "multistage"
    assert f64_plan.key != plan.key
    # every sm80 mainloop fits the architecture's shared memory
    per_stage = (128 + 128) * 16 * 8
    assert f64_plan.stages * per_stage <= (101376 if arch in ("sm_86", "sm_89", "sm_120")
                                           else 166912)


@pytest.mark.parametrize("arch", ARCHS)
def test_plans_render_their_kernels_without_a_gpu(arch: str) -> None:
    from atomr_accel.backends._cutlass_source import render
    f32 = render(Cutlass.gemm_f32_plan(96, 40, 24, arch))
    f64 = render(Cutlass.gemm_f64_plan(96, 40, 17, arch))
    assert "using Element = double;" in f64 and "GemmShape<8,8,4>" in f64
    assert "constexpr int Align = 1;" in f64 and "Sm80EVT" in f64
    for source in (f32, f64):  # a repeated GEMM launches as prepared once
        assert 'extern "C" void* atomr_prepare(' in source
        assert 'extern "C" int atomr_launch(' in source
    if arch in ("sm_90", "sm_90a"):
        assert "KernelTmaWarpSpecializedCooperative" in f32
    else:
        assert "DefaultGemmWithVisitor" in f32 and "constexpr int Align = 4;" in f32


def test_alignment_picks_the_widest_load_and_the_family() -> None:
    assert gemm_plan(DType.F16, 64, 64, 64).align == 8
    assert gemm_plan(DType.F16, 64, 64, 64).family == "sm90"
    odd = gemm_plan(DType.F16, 64, 64, 17)
    assert (odd.family, odd.align, odd.schedule, odd.stages) == ("sm80", 1, "pipelined", 2)
    two = gemm_plan(DType.BF16, 64, 6, 64)
    assert (two.family, two.align, two.schedule) == ("sm80", 2, "multistage")
    assert gemm_plan(DType.F32, 5, 3, 17).align == 1
    assert gemm_plan(DType.F32, 5, 3, 17).schedule == "multistage"  # 4-byte cp.async
    assert gemm_plan(DType.F32, 5, 6, 18).align == 2
    assert gemm_plan(DType.F64, 5, 3, 17).align == 1
    # m never matters: rows are k and n long
    assert gemm_plan(DType.F16, 1, 64, 64).align == 8
    big = gemm_plan(DType.BF16, 4096, 4096, 4096, "sm_80")
    assert big.tile == (128, 256, 32) and big.stages == 4
    assert gemm_plan(DType.F32, 4096, 4096, 4096, "sm_86").stages == 3  # 99 KiB of smem


def test_family_override() -> None:
    forced = gemm_plan(DType.BF16, 256, 256, 256, "sm_90a", family="sm80")
    assert forced.family == "sm80" and forced.arch == "sm_90a"
    assert forced.key != gemm_plan(DType.BF16, 256, 256, 256, "sm_90a").key
    assert "sm80" in forced.name and forced.name.endswith("_sm_90a")
    with pytest.raises(InvalidArgument, match="Hopper"):
        gemm_plan(DType.BF16, 256, 256, 256, "sm_80", family="sm90")
    with pytest.raises(InvalidArgument, match="Hopper"):
        gemm_plan(DType.BF16, 256, 256, 256, "sm_100", family="sm90")
    with pytest.raises(InvalidArgument, match="needs the sm80 family"):
        gemm_plan(DType.F16, 64, 64, 17, family="sm90")
    with pytest.raises(InvalidArgument, match="needs the sm80 family"):
        gemm_plan(DType.F64, 64, 64, 64, family="sm90")
    with pytest.raises(InvalidArgument, match="family must be one of"):
        gemm_plan(DType.F16, 64, 64, 64, family="sm100")
    with pytest.raises(InvalidArgument, match="Hopper"):
        Cutlass.gemm_fp8_plan("bf16", 64, 64, 64, arch="sm_89")
    assert Cutlass.conv2d_plan("f16", "sm_86").family == "sm80"


# ------------------------------------------------------------------------------- odd sizes


ODD = [(1, 1, 1), (3, 17, 33), (127, 3, 17), (33, 127, 1), (17, 33, 127)]


@pytest.mark.parametrize("name", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("shape", ODD, ids=lambda s: "x".join(map(str, s)))
def test_odd_sizes_with_every_epilogue_node(env: tuple[Any, Cutlass], name: str,
                                            shape: tuple[int, int, int]) -> None:
    dev, cl = env
    m, n, k = shape
    a, b, c = rand((m, k), name, 1), rand((k, n), name, 2), rand((m, n), name, 3)
    row_bias, col_bias = rand((m,), name, 4), rand((n,), name, 5)
    A, B, C = put(dev, a, name), put(dev, b, name), put(dev, c, name)
    product = f64(a) @ f64(b)
    sums_dtype = DType.F64 if name == "f64" else DType.F32
    for i, fn in enumerate(("identity", "relu", "gelu", "silu")):
        axis = "row" if i % 2 else "column"
        bias = row_bias[:, None] if axis == "row" else col_bias[None, :]
        D = dev.allocate(m * n, DType(name))
        sums = dev.allocate(m, sums_dtype)
        ep = (Epilogue().scale(0.5).bias(put(dev, row_bias if axis == "row" else col_bias,
                                                 name), axis=axis)
              .residual_add(C, beta=-0.25).activation(fn).reduce(sums))
        cl.gemm(A, B, D, m, n, k, ep)
        want = act(fn, 0.5 * product + f64(bias) - 0.25 * f64(c))
        d = get(dev, D, (m, n))
        close(d, want, name)
        np.testing.assert_allclose(dev.copy_to_numpy(sums) if name == "f64"
                                   else dev.copy_to_numpy(sums).astype(np.float64),
                                   f64(d).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_f64_gemm_is_computed_in_f64(env: tuple[Any, Cutlass]) -> None:
    dev, cl = env
    m, n, k = 37, 29, 41
    a, b = rand((m, k), "f64", 7), rand((k, n), "f64", 8)
    D = dev.allocate(m * n, DType.F64)
    cl.gemm(put(dev, a, "f64"), put(dev, b, "f64"), D, m, n, k, Epilogue().scale(1 / 3))
    np.testing.assert_allclose(get(dev, D, (m, n)), (a @ b) / 3, rtol=1e-13, atol=1e-13)
    with pytest.raises(InvalidArgument, match="the reduction output"):
        cl.gemm(put(dev, a, "f64"), put(dev, b, "f64"), D, m, n, k,
                Epilogue().reduce(dev.allocate(m, DType.F32)))


def test_forcing_a_family_on_the_cpu_backend_counts_its_plan(env: tuple[Any, Cutlass]) -> None:
    dev, _ = env
    cl = dev.cutlass()
    a = put(dev, rand((16, 16), "f16", 9), "f16")
    d = dev.allocate(256, DType.F16)
    before = cl.stats()
    cl.gemm(a, a, d, 16, 16, 16, family="sm80")
    cl.gemm(a, a, d, 16, 16, 16, family="sm90")
    after = cl.stats()
    assert after[0] == before[0] + 2
    close(get(dev, d, (16, 16)), f64(get(dev, a, (16, 16))) @ f64(get(dev, a, (16, 16))), "f16")
    with pytest.raises(InvalidArgument, match="needs the sm80 family"):
        cl.gemm(a, a, d, 16, 16, 3, family="sm90")


def test_an_nvcc_without_the_arch_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvcc that lists no code for a plan's architecture (here one that lists none)
    raises ``LibraryUnavailable`` naming the architecture, before compiling anything."""
    pytest.importorskip("cutlass_library")
    from atomr_accel.backends import _cutlass_build
    from atomr_accel.cutlass import build_kernels
    from atomr_accel.errors import LibraryUnavailable

    monkeypatch.setattr(_cutlass_build, "find_nvcc", lambda: "/bin/false")
    with pytest.raises(LibraryUnavailable, match="cannot generate code for sm_120"):
        build_kernels([gemm_plan(DType.F32, 64, 64, 64, "sm_120")])
