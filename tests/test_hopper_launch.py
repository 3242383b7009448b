"""Hopper launch features on the CPU backend: cluster shapes and tensor-map (TMA)
descriptors are checked exactly as on CUDA (typed ``InvalidArgument`` before any device
is touched), the CPU backend refuses to run them with a clear error and keeps serving,
and a descriptor of a buffer from an older context generation is refused as stale.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, FaultKind, GpuRefStale, InvalidArgument, System, TensorMap
from atomr_accel.core import KernelRef
from atomr_accel.core.ops._kernels import LaunchKernel
from atomr_accel.nvrtc import KernelArg, NvrtcKernel, cuda_include_options

pytestmark = pytest.mark.anyio

HOPPER = "compute capability 9.0"


def kernel_of(dev: Any, owner: int = 0) -> NvrtcKernel:
    """A kernel handle of the device's generation and ``owner`` token (the CPU backend
    compiles none, so the tests make the handle a CUDA compile would answer)."""
    return NvrtcKernel(dev, KernelRef(0, 1, "k", dev.generation, owner))


async def test_a_tiled_tensor_map_holds_the_view_and_its_c_contiguous_strides() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        buf = await dev.allocate_f32_async(6 * 8 * 12)
        view = TensorMap.tiled(buf, "f32", (6, 8, 12), (2, 4, 8))
        assert view.buffer == buf.ref and view.rank == 3
        assert view.strides == (8 * 12 * 4, 12 * 4)  # NumPy's strides but the last
        assert view.strides == np.zeros((6, 8, 12), np.float32).strides[:-1]
        assert view.element_strides == (1, 1, 1) and view.box_bytes == 2 * 4 * 8 * 4
        padded = TensorMap.tiled(buf.ref, "f32", (5, 10), (5, 4), strides=(64, 4),
                                 offset=32, element_strides=(2, 1), swizzle="32b",
                                 l2_promotion="128b", oob_fill="nan")
        assert padded.strides == (64,) and padded.box_bytes == 3 * 4 * 4
        assert pickle.loads(pickle.dumps(padded)) == padded
        ints = await dev.allocate_u8_async(4 * 32)
        assert TensorMap.tiled(ints, "u8", (4, 32), (1, 16)).box_bytes == 16


async def tensor_map_cases(dev: Any) -> list[tuple[dict[str, Any], str]]:
    """(arguments of ``TensorMap.tiled`` over a 1024-float buffer, the error's message)."""
    buf = await dev.allocate_f32_async(1024)
    f64, i32 = await dev.allocate_f64_async(64), await dev.allocate_i32_async(256)
    base: dict[str, Any] = {"buffer": buf, "dtype": "f32", "shape": (8, 32), "box": (4, 8)}

    def case(message: str, **changes: Any) -> tuple[dict[str, Any], str]:
        return {**base, **changes}, message

    return [
        case("1 to 5 dimensions", shape=(), box=()),
        case("1 to 5 dimensions", shape=(2,) * 6, box=(1,) * 6),
        case("box must have 2 entries", box=(4,)),
        case("shape must be a sequence of ints", shape=(8, 32.0)),
        case("each dimension must be in", shape=(0, 32)),
        case("each box dimension must be in", box=(0, 8)),
        case("each box dimension must be in", shape=(2, 512), box=(1, 257)),
        case("multiple of 16 bytes", box=(4, 3)),  # 12 bytes
        case("positive multiple of 16", shape=(8, 5), box=(4, 4)),  # a 20-byte row
        case("positive multiple of 16", strides=(40, 4)),
        case("its stride must be 4 bytes", strides=(128, 8)),
        case("strides must have 2 entries", strides=(128,)),
        case("element stride must be in", element_strides=(1, 9)),
        case("element stride must be in", element_strides=(0, 1)),
        case("swizzle must be one of", swizzle="16b"),
        case("span at most 32 bytes", box=(4, 16), swizzle="32b"),  # 64 bytes
        case("interleave must be one of", interleave="8b"),
        case("at least 3 dimensions", interleave="16b"),
        case("needs swizzle '32b'", shape=(2, 8, 32), box=(1, 4, 8), interleave="32b"),
        case("l2_promotion must be one of", l2_promotion="512b"),
        case("oob_fill must be one of", oob_fill="inf"),
        case("'nan' needs a floating type", buffer=i32, dtype="i32", oob_fill="nan"),
        case("the copy engine moves", buffer=await dev.allocate_async(256, "c64"), dtype="c64"),
        case("the copy engine moves", buffer=await dev.allocate_async(256, "i8"), dtype="i8",
             shape=(8, 32), box=(4, 16)),
        case("offset must be a non-negative multiple of 16", offset=8),
        case("offset must be a non-negative multiple of 32", shape=(2, 8, 32), box=(1, 4, 8),
             interleave="32b", swizzle="32b", offset=16),
        case("reaches byte 4160 of a 4096-byte buffer", offset=64, shape=(32, 32)),
        case("reaches byte", shape=(8, 32), strides=(1024, 4)),
        case("reaches byte", buffer=f64, dtype="f64", shape=(8, 32), box=(4, 2)),
        case("buffer must be a GpuBuffer", buffer=np.zeros(1024, np.float32)),
    ]


async def test_every_driver_rule_of_a_tensor_map_is_a_typed_error() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        for arguments, message in await tensor_map_cases(dev):
            args = dict(arguments)
            positional = [args.pop(k) for k in ("buffer", "dtype", "shape", "box")]
            with pytest.raises(InvalidArgument, match=message):
                TensorMap.tiled(*positional, **args)
        with pytest.raises(InvalidArgument):
            TensorMap.tiled(await dev.allocate_f32_async(64), "f128", (64,), (16,))


CLUSTER_CASES = [
    ((8, 1, 1), (3, 1, 1), False, "x = 8 is not divisible by 3"),
    ((4, 6, 1), (2, 4, 1), False, "y = 6 is not divisible by 4"),
    ((4, 4, 3), (1, 1, 2), False, "z = 3 is not divisible by 2"),
    ((16, 1, 1), (16, 1, 1), False, "at most 8 blocks.*non_portable_cluster=True"),
    ((4, 4, 1), (4, 4, 1), False, "at most 8 blocks"),
    ((32, 1, 1), (32, 1, 1), True, "at most 16 blocks"),
    ((8, 1, 1), (0, 1, 1), False, "cluster must be 1 to 3 positive ints"),
    ((8, 1, 1), (2, 1, 1, 1), False, "cluster must be 1 to 3 positive ints"),
    ((8, 1, 1), None, True, "non_portable_cluster needs a cluster"),
]


@pytest.mark.parametrize(("grid", "cluster", "non_portable", "message"), CLUSTER_CASES)
async def test_cluster_shapes_are_checked_when_called(
        grid: tuple[int, ...], cluster: Any, non_portable: bool, message: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        out = await dev.allocate_i32_async(16)
        with pytest.raises(InvalidArgument, match=message):
            kernel_of(dev).launch_async(grid, 32, out, cluster=cluster,
                                        non_portable_cluster=non_portable)
        with pytest.raises(InvalidArgument, match=message):  # the op itself, as a backend
            LaunchKernel(kernel_of(dev).ref, grid, (32, 1, 1), (out.ref,),
                         cluster=cluster, non_portable_cluster=non_portable).validate()


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_the_cpu_backend_refuses_clusters_and_tensor_maps_and_keeps_serving(
        isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        src, out = await dev.allocate_f32_async(256), await dev.allocate_f32_async(256)
        kernel = kernel_of(dev, src.ref.owner)
        view = TensorMap.tiled(src, "f32", (16, 16), (8, 8))
        with pytest.raises(InvalidArgument, match=HOPPER):
            await kernel.launch_async((4, 2, 1), 32, out, cluster=(2, 2))
        with pytest.raises(InvalidArgument, match=HOPPER):
            await kernel.launch_async((16, 1, 1), 32, out, cluster=16,
                                      non_portable_cluster=True)
        with pytest.raises(InvalidArgument, match=HOPPER):
            await kernel.launch_async(4, 32, view, out, np.int32(16))
        with pytest.raises(InvalidArgument, match=HOPPER):
            await kernel.launch_async(4, 32, [KernelArg.tensor_map(view),
                                              KernelArg.buffer_f32(out)])
        with pytest.raises(InvalidArgument, match="needs the CUDA backend"):
            await kernel.launch_async(4, 32, out)  # a plain launch: the usual refusal
        data = np.random.default_rng(1).standard_normal(256).astype(np.float32)
        await dev.copy_from_numpy_async(src, data)  # the device keeps serving
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(src), data)


async def test_tensor_map_arguments_are_read_and_written_buffers() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        a, b = await dev.allocate_f32_async(64), await dev.allocate_f32_async(64)
        view = TensorMap.tiled(a, "f32", (64,), (16,))
        kernel = kernel_of(dev).ref
        op = LaunchKernel(kernel, (4, 1, 1), (32, 1, 1), (view, b.ref, np.int32(3)))
        op.validate()
        assert op.refs() == (a.ref, b.ref) and op.writes() == (a.ref, b.ref)
        assert op.uses_hopper()
        only_b = LaunchKernel(kernel, (4, 1, 1), (32, 1, 1), (view, b.ref), written=(1,))
        assert only_b.writes() == (b.ref,)
        stores = LaunchKernel(kernel, (4, 1, 1), (32, 1, 1), (view, b.ref), written=(0,))
        assert stores.writes() == (a.ref,)
        assert not LaunchKernel(kernel, (4, 1, 1), (32, 1, 1), (b.ref,)).uses_hopper()
        broken = TensorMap(a.ref, TensorMap.tiled(a, "f32", (64,), (16,)).dtype, (64,), (16,),
                           (), 0, (1,), swizzle="none", oob_fill="nan", interleave="none",
                           l2_promotion="none")
        assert broken.oob_fill == "nan"  # made without ``tiled``: checked at the launch
        bad = TensorMap(a.ref, broken.dtype, (64,), (300,), (), 0, (1,))
        with pytest.raises(InvalidArgument, match="each box dimension"):
            LaunchKernel(kernel, (1, 1, 1), (32, 1, 1), (bad,)).validate()
        with pytest.raises(InvalidArgument, match=r"KernelArg\.tensor_map takes a TensorMap"):
            KernelArg.tensor_map(a)  # type: ignore[arg-type]
        assert "TensorMap" in repr(KernelArg.tensor_map(view))


async def test_a_tensor_map_of_an_older_generation_is_stale() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        old = await dev.allocate_f32_async(64)
        view = TensorMap.tiled(old, "f32", (4, 16), (4, 16))
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        out = await dev.allocate_f32_async(64)  # waits for the rebuild
        assert old.is_stale() and not out.is_stale()
        with pytest.raises(GpuRefStale):
            await kernel_of(dev, out.ref.owner).launch_async(2, 32, view, out, cluster=2)


def test_cuda_include_options_name_the_toolkit_s_header_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    include = tmp_path / "include"
    include.mkdir()
    (include / "cooperative_groups.h").write_text("")
    assert cuda_include_options(tmp_path) == (f"-I{include}",)
    (include / "cccl").mkdir()  # CUDA 13 keeps libcu++ (cuda/barrier, cuda/ptx) there
    assert cuda_include_options(tmp_path) == (f"-I{include}", f"-I{include / 'cccl'}")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert cuda_include_options() == (f"-I{include}", f"-I{include / 'cccl'}")
    with pytest.raises(InvalidArgument, match="no CUDA toolkit headers"):
        cuda_include_options(tmp_path / "missing")
