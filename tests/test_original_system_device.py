"""Sections 1 and 2 of the original package's API: the top level, ``atomr_accel.errors``,
``atomr_accel.system``, ``atomr_accel.device`` (``Device``, ``DeviceLoad``, ``GpuBuffer*``),
on the CPU backend."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import numpy as np
import pytest

import atomr_accel
import atomr_accel.device
import atomr_accel.errors
import atomr_accel.memory
import atomr_accel.system
from atomr_accel import Device, DTypeMismatch, GpuRuntimeError, InvalidArgument, System

TOP_LEVEL = (
    "System", "Device", "DeviceLoad", "GpuBuffer", "GpuBufferF32", "GpuBufferF64",
    "GpuBufferI32", "GpuBufferU32", "GpuBufferU8", "GpuBufferC64", "GpuBufferC128", "Blas",
    "GraphCapture", "GraphScript", "GraphHandle", "Memory", "ManagedBufferF32", "Fft",
    "RngGenerator", "Solver", "NvrtcKernel", "KernelArg", "IpcMemHandle", "IpcOpenedMem",
    "__version__",
)
ERRORS = ("GpuRuntimeError", "ContextPoisoned", "OutOfMemory", "Unrecoverable", "GpuRefStale",
          "LibraryError", "AskTimeout")
DTYPES = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "u32": np.uint32,
          "u8": np.uint8, "complex64": np.complex64, "complex128": np.complex128}


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("original") as opened:
        yield opened


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(0, "original-dev", True)


def test_top_level_and_submodules() -> None:
    for name in TOP_LEVEL:
        assert getattr(atomr_accel, name) is not None, name
    for name in ERRORS:
        error = getattr(atomr_accel.errors, name)
        assert issubclass(error, atomr_accel.errors.GpuRuntimeError)
        assert getattr(atomr_accel, name) is error
    assert atomr_accel.system.System is System
    assert atomr_accel.device.Device is Device
    assert atomr_accel.device.DeviceLoad is atomr_accel.DeviceLoad
    assert atomr_accel.device.GpuBufferF32 is atomr_accel.GpuBufferF32
    with pytest.raises(AttributeError):
        _ = atomr_accel.device.NoSuchName  # type: ignore[attr-defined]


def test_system_names_and_spawn_signature(system: System, dev: Device) -> None:
    assert system.name == "original"
    assert repr(system).startswith("System(name='original'")
    params = list(inspect.signature(System.spawn_device).parameters)
    assert params[1:4] == ["device_id", "name", "mock"]
    assert dev.device_id == 0 and repr(dev).startswith("Device(id=0")
    with pytest.raises(InvalidArgument, match="already has a device named"):
        system.spawn_device(0, "original-dev", True)


def test_typed_allocation_and_copies(dev: Device) -> None:
    rng = np.random.default_rng(11)
    for suffix, dtype in DTYPES.items():
        buf = getattr(dev, f"allocate_{suffix}")(6)
        assert len(buf) == buf.len == 6
        assert buf.dtype == {"complex64": "c64", "complex128": "c128"}.get(suffix, suffix)
        assert buf.device_id == 0 and not buf.is_stale()
        host = (rng.standard_normal(6) * 50).astype(dtype) if dtype not in (np.uint8, np.uint32) \
            else rng.integers(0, 200, 6).astype(dtype)
        if suffix == "f32":
            dev.copy_from_numpy(buf, host)
            np.testing.assert_array_equal(dev.copy_to_numpy(buf), host)
        else:
            getattr(dev, f"copy_from_numpy_{suffix}")(buf, host)
            np.testing.assert_array_equal(getattr(dev, f"copy_to_numpy_{suffix}")(buf), host)
    assert dev.allocate_f32(3).dtype == "f32"
    assert dev.allocate_complex64(3).dtype == "c64"  # ours; the original said "C32"


def test_a_wrong_dtype_is_a_type_error(dev: Device) -> None:
    buf = dev.allocate_f32(4)
    with pytest.raises(TypeError):
        dev.copy_from_numpy(buf, np.ones(4))
    with pytest.raises(DTypeMismatch):
        dev.copy_from_numpy_f64(buf, np.ones(4))
    with pytest.raises(DTypeMismatch):
        dev.copy_to_numpy_f64(buf)


def test_async_twins_check_when_called(dev: Device) -> None:
    buf = dev.allocate_f32(4)

    async def main() -> None:
        with pytest.raises(InvalidArgument):
            dev.copy_from_numpy_async(buf, np.ones(3, np.float32))  # no await needed
        with pytest.raises(InvalidArgument):
            dev.allocate_f32_async(-1)

    asyncio.run(main())


def test_sgemm_is_column_major(dev: Device) -> None:
    rng = np.random.default_rng(12)
    m, n, k = 3, 4, 5
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    da, db, dc = dev.allocate_f32(m * k), dev.allocate_f32(k * n), dev.allocate_f32(m * n)
    dev.copy_from_numpy(da, a.astype(np.float32).reshape(-1, order="F"))
    dev.copy_from_numpy(db, b.astype(np.float32).reshape(-1, order="F"))
    dev.sgemm(da, db, dc, m, n, k, alpha=2.0)
    got = dev.copy_to_numpy(dc).reshape((m, n), order="F")
    np.testing.assert_allclose(got, 2.0 * a @ b, rtol=1e-5, atol=1e-5)


def test_stats_is_a_device_load(dev: Device) -> None:
    dev.memory_info()
    load = dev.stats(timeout_secs=2.0)
    assert isinstance(load, atomr_accel.DeviceLoad)
    assert load.total_bytes > 0 and 0 <= load.free_bytes <= load.total_bytes
    assert load.active_streams == 0 and (load.compute_cap_major, load.compute_cap_minor) == (0, 0)
    assert load.queue_depth == 0
    text = repr(load)
    assert text.startswith(f"DeviceLoad(free={load.free_bytes}, total={load.total_bytes}, "
                           "streams=0, queue=0, sm=0.0, device_id=0, backend='cpu'")
    assert isinstance(load, atomr_accel.DeviceStats)


def test_native_module_exposes_the_original_classes() -> None:
    from atomr_accel import _native

    original = (*TOP_LEVEL, *ERRORS, "Cudnn", "RnnBwdInputs", "MultiHeadAttnBwdInputs",
                "Collective", "Cub", "Cutlass", "FlashAttn", "TensorRt", "NvtxKernelTrace",
                "NvmlActor", "CuptiSession", "DynamicBatchingServer", "InferenceCascade",
                "ModelReplicaPool", "FairShareScheduler", "HotSwapServer", "SpeculativeDecoder",
                "MoeRouter", "AsyncParameterServer", "DataParallelTrainer",
                "PipelineParallelTrainer", "TensorParallelTrainer", "SharedGpuStateCoordinator",
                "EmbeddingCache", "CpuVectorIndex", "RagPipeline", "LangGraphGpuActor",
                "ClothSimulationActor", "FluidSimulationActor", "ParticleSystemActor",
                "SpatialIndexActor", "GpuHashMapActor", "ImageFilterPipeline")
    assert set(original) <= set(_native.__all__)
    for name in _native.__all__:
        where = atomr_accel.memory if name.startswith("ipc_") else atomr_accel
        assert getattr(_native, name) is getattr(where, name), name
    assert _native.Device is Device


def test_collective_module_beside_the_other_domains() -> None:
    from atomr_accel import _native, blas, collective

    assert collective.Collective is atomr_accel.Collective is _native.Collective
    assert issubclass(collective.CollectiveAborted, GpuRuntimeError)
    assert collective.ReduceOp("sum") is collective.ReduceOp.SUM
    assert blas.Blas is atomr_accel.Blas


def test_libraries_ready_and_handles(system: System, dev: Device) -> None:
    ready = dev.libraries_ready()
    assert ready == {"blas": True, "cudnn": True, "cufft": True, "curand": True,
                     "cusolver": True, "nvrtc": False, "extras": ready["extras"], "ready": True}
    assert ready["extras"] >= 2  # sparse, tensor
    assert "Blas" in repr(type(dev.blas(timeout_secs=2.0)))
    assert repr(dev.cudnn(timeout_secs=2.0)).startswith("Cudnn(")
    assert dev.cudnn().is_available(timeout_secs=2.0)  # the CPU backend runs it on NumPy
    no_cudnn = system.spawn_device(mock=True, libraries=["blas"])
    with pytest.raises(GpuRuntimeError, match="cudnn library is not enabled"):
        no_cudnn.cudnn(timeout_secs=2.0)
    only_fft = system.spawn_device(mock=True, libraries=["fft"])
    with pytest.raises(GpuRuntimeError, match="not enabled"):
        only_fft.blas()
    assert only_fft.libraries_ready()["blas"] is False


def test_compile_kernel_on_the_cpu_is_a_typed_error(dev: Device) -> None:
    with pytest.raises(GpuRuntimeError):
        dev.compile_kernel("k", 'extern "C" __global__ void k() {}')
