"""The original's kernel surface: ``KernelArg`` (checked types, ranges and reprs),
``NvrtcKernel.launch(grid, block, [KernelArg, ...])`` beside the variadic form, ``name``
and ``generation``, and ``compile_kernel``. Launches run on CUDA (``gpu``); the CPU
backend checks arguments and refuses kernels as the NVRTC path does."""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System
from atomr_accel.core import KernelRef
from atomr_accel.facade._kernel_args import KernelArg
from atomr_accel.facade._kernels import NvrtcKernel, compile_kernel, compile_kernel_async

pytestmark = pytest.mark.anyio

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

WIDTHS = r"""
extern "C" __global__ void widths(double* out, size_t n, long long a, unsigned long long b,
                                  unsigned int c, int d, float e, double f,
                                  int* iout, unsigned int* uout, unsigned char* bout) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        out[0] = (double)n; out[1] = (double)a; out[2] = (double)b; out[3] = (double)c;
        out[4] = (double)d; out[5] = (double)e; out[6] = f;
        iout[0] = d; uout[0] = c; bout[0] = (unsigned char)(c & 0xff);
    }
}
"""


async def test_kernel_args_check_their_types_and_ranges() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        f32, f64 = await dev.allocate_f32_async(4), await dev.allocate_f64_async(4)
        i32, u32, u8 = [await dev.allocate_async(4, dtype) for dtype in ("i32", "u32", "u8")]
        made = [KernelArg.buffer_f32(f32), KernelArg.buffer_f64(f64), KernelArg.buffer_i32(i32),
                KernelArg.buffer_u32(u32), KernelArg.buffer_u8(u8)]
        assert [arg.value for arg in made] == [f32, f64, i32, u32, u8]
        assert repr(made[0]) == f"KernelArg.buffer_f32({f32!r})"
        for make, buffer in [(KernelArg.buffer_f32, f64), (KernelArg.buffer_u8, i32),
                             (KernelArg.buffer_i32, f32.ref), (KernelArg.buffer_f64, 1.0)]:
            with pytest.raises(InvalidArgument, match="takes a buffer of"):
                make(buffer)  # type: ignore[arg-type]
    scalars = [
        (KernelArg.scalar_i32(-(2**31)), np.int32, "KernelArg.scalar_i32(-2147483648)"),
        (KernelArg.scalar_i64(2**62), np.int64, f"KernelArg.scalar_i64({2**62})"),
        (KernelArg.scalar_u32(2**32 - 1), np.uint32, "KernelArg.scalar_u32(4294967295)"),
        (KernelArg.scalar_u64(np.uint64(7)), np.uint64, "KernelArg.scalar_u64(7)"),
        (KernelArg.usize(2**64 - 1), np.uint64, f"KernelArg.usize({2**64 - 1})"),
        (KernelArg.scalar_f32(1.5), np.float32, "KernelArg.scalar_f32(1.5)"),
        (KernelArg.scalar_f32(3), np.float32, "KernelArg.scalar_f32(3.0)"),
        (KernelArg.scalar_f64(-0.25), np.float64, "KernelArg.scalar_f64(-0.25)"),
        (KernelArg.scalar_f64(float("inf")), np.float64, "KernelArg.scalar_f64(inf)"),
    ]
    for arg, kind, shown in scalars:
        assert type(arg.value) is kind and repr(arg) == shown
    refusals = [
        (KernelArg.scalar_i32, 2**31), (KernelArg.scalar_u32, -1), (KernelArg.scalar_u64, 2**64),
        (KernelArg.usize, -1), (KernelArg.scalar_i64, 1.0), (KernelArg.scalar_i32, True),
        (KernelArg.scalar_i32, "3"), (KernelArg.scalar_f32, 1e39), (KernelArg.scalar_f32, 10**39),
        (KernelArg.scalar_f64, 10**400), (KernelArg.scalar_f64, 1j), (KernelArg.scalar_f32, False),
    ]
    for make, value in refusals:
        with pytest.raises(InvalidArgument, match=make.__name__):
            make(value)  # type: ignore[operator]


async def test_launch_forms_are_checked_when_called_and_the_cpu_refuses_kernels() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        with pytest.raises(InvalidArgument, match="needs the CUDA backend"):
            await compile_kernel_async(dev, "saxpy", SAXPY)
        with pytest.raises(InvalidArgument, match="timeout_secs"):
            compile_kernel_async(dev, "saxpy", SAXPY, timeout_secs=-1)
        with pytest.raises(InvalidArgument, match="source must be"):
            compile_kernel_async(dev, "saxpy", " ")
        x = await dev.allocate_f32_async(4)
        kernel = NvrtcKernel(dev, KernelRef(0, 1, "saxpy", dev.generation, dev._state.owner))
        assert kernel.name == "saxpy" and kernel.generation == dev.generation
        args = [KernelArg.scalar_f32(2.0), KernelArg.buffer_f32(x), KernelArg.buffer_f32(x),
                KernelArg.scalar_i32(4)]
        refusals = [
            (lambda: kernel.launch_async(1, 32, [KernelArg.scalar_f32(2.0), x]),
             "argument 1 must be a KernelArg"),
            (lambda: kernel.launch_async(1, 32, args, shared=64, shared_mem=32), "disagree"),
            (lambda: kernel.launch_async(1, 32, args, shared=-1), "shared_mem must be"),
            (lambda: kernel.launch_async(0, 32, args), "grid must be"),
            (lambda: kernel.launch_async(1, 32, args, timeout_secs=0), "timeout_secs"),
            (lambda: kernel.launch_async(1, 32, x, 2.0), "Python float"),
        ]
        for call, message in refusals:  # raised by the call itself, before any await
            with pytest.raises(InvalidArgument, match=message):
                call()
        with pytest.raises(InvalidArgument, match="needs the CUDA backend"):
            await kernel.launch_async(1, 32, args, shared=0)


def test_compile_kernel_blocking_on_the_cpu() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        with pytest.raises(InvalidArgument, match="needs the CUDA backend"):
            compile_kernel(dev, "saxpy", SAXPY)


@pytest.mark.gpu
async def test_kernel_arg_launches_match_numpy() -> None:
    rng = np.random.default_rng(9)
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=False)
        dx, dy = await dev.allocate_f32_async(n), await dev.allocate_f32_async(n)
        await dev.copy_from_numpy_async(dx, x)
        await dev.copy_from_numpy_async(dy, y)
        saxpy = await compile_kernel_async(dev, "saxpy", SAXPY)
        assert saxpy.name == "saxpy" and saxpy.generation == dev.generation
        args = [KernelArg.scalar_f32(2.5), KernelArg.buffer_f32(dx), KernelArg.buffer_f32(dy),
                KernelArg.scalar_i32(n)]
        await saxpy.launch_async((8, 1, 1), (128, 1, 1), args, shared=0)
        expected = 2.5 * x.astype(np.float64) + y
        np.testing.assert_allclose(await dev.copy_to_numpy_async(dy), expected, rtol=1e-6)
        await saxpy.launch_async(8, 128, np.float32(-2.5), dx, dy, np.int32(n))  # variadic form
        np.testing.assert_allclose(await dev.copy_to_numpy_async(dy), y, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_kernel_args_pass_their_exact_widths() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=False)
        out = dev.allocate_f64(7)
        iout, uout, bout = dev.allocate_i32(1), dev.allocate_u32(1), dev.allocate_u8(1)
        kernel = compile_kernel(dev, "widths", WIDTHS)
        kernel.launch(1, 32, [
            KernelArg.buffer_f64(out), KernelArg.usize(2**40 + 3), KernelArg.scalar_i64(-(2**40)),
            KernelArg.scalar_u64(2**63), KernelArg.scalar_u32(2**32 - 2), KernelArg.scalar_i32(-7),
            KernelArg.scalar_f32(1.5), KernelArg.scalar_f64(-2.25), KernelArg.buffer_i32(iout),
            KernelArg.buffer_u32(uout), KernelArg.buffer_u8(bout),
        ])
        assert dev.copy_to_numpy(out).tolist() == [2**40 + 3, -(2**40), 2**63, 2**32 - 2, -7,
                                                    1.5, -2.25]
        assert dev.copy_to_numpy(iout)[0] == -7 and dev.copy_to_numpy(uout)[0] == 2**32 - 2
        assert dev.copy_to_numpy(bout)[0] == 0xFE
