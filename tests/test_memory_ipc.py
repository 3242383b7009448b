"""Buffers shared between processes: a second Python process opens what the first
exported, reads its data and writes back, and the first sees it; on the CPU backend
(memfd segments) with both hosts and, marked ``gpu``, on CUDA (``cudaIpc*``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from atomr_accel import GpuBufferF32, InvalidArgument, System
from atomr_accel.facade._memory import (
    IpcMemHandle,
    IpcOpenedMem,
    Memory,
    buffer_address,
    ipc_get_mem_handle,
    ipc_handle,
    ipc_open_mem_handle,
    open_ipc,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")
HOSTS = [
    ("cpu", "thread"),
    ("cpu", "process"),
    pytest.param("cuda", "thread", marks=pytest.mark.gpu),
    pytest.param("cuda", "process", marks=pytest.mark.gpu),
]

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from atomr_accel import System
    from atomr_accel.facade._memory import IpcMemHandle, open_ipc

    handle_hex, length, backend, folder = sys.argv[1:]
    handle = IpcMemHandle.from_bytes(bytes.fromhex(handle_hex))
    sent = np.load(f"{folder}/sent.npy")
    with System.open("child") as system:
        dev = system.spawn_device(backend=backend)
        buf = open_ipc(dev, handle, int(length), "f32")
        got = dev.copy_to_numpy(buf)
        np.testing.assert_array_equal(got, sent)
        dev.copy_from_numpy(buf, -2 * got + 1)
        dev.free(buf)  # unmaps; the exporter's memory stays
    print("CHILD OK")
""")


def run_child(handle: IpcMemHandle, length: int, backend: str, folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, handle.bytes().hex(), str(length), backend, str(folder)],
        env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True,
        timeout=120, check=False)
    assert "CHILD OK" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(("backend", "isolation"), HOSTS)
def test_another_process_reads_and_writes_an_exported_buffer(
        backend: str, isolation: str, tmp_path: Path) -> None:
    n = 5000
    sent = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    np.save(tmp_path / "sent.npy", sent)
    with System.open("parent") as system:
        dev = system.spawn_device(backend=backend, isolation=isolation)
        buf = dev.allocate_f32(n)
        dev.copy_from_numpy(buf, sent)
        handle = ipc_handle(dev, buf)
        assert len(handle.bytes()) == 64 and ipc_handle(dev, buf) == handle  # moved once
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), sent)  # the move kept the data
        run_child(handle, n, backend, tmp_path)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), -2 * sent + 1)
        dev.blas().scal(n, 2.0, buf)  # the buffer keeps serving every op
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), -4 * sent + 2)


def test_two_devices_of_one_process_share_memory() -> None:
    with System.open("t") as system:
        a, b = system.spawn_device(mock=True), system.spawn_device(mock=True, isolation="process")
        src = a.allocate_f32(8)
        a.copy_from_numpy(src, np.arange(8, dtype=np.float32))
        view = open_ipc(b, ipc_handle(a, src), 6)
        assert isinstance(view, GpuBufferF32) and len(view) == 6
        assert b.copy_to_numpy(view).tolist() == [0, 1, 2, 3, 4, 5]
        b.blas().scal(6, 10.0, view)
        assert a.copy_to_numpy(src).tolist() == [0, 10, 20, 30, 40, 50, 6, 7]
        as_ints = open_ipc(b, ipc_handle(a, src), 8, "i32")  # any dtype that fits
        assert b.copy_to_numpy(as_ints)[1] == np.float32(10).view(np.int32)
        assert b.stats().bytes_allocated == 0  # mappings hold none of b's memory
        b.free(view)
        b.free(as_ints)
        assert a.copy_to_numpy(src)[1] == 10  # freeing a mapping leaves the exporter alone
        a.copy_from_numpy(src, np.ones(8, np.float32))
        kept = open_ipc(b, ipc_handle(a, src), 8)
        a.free(src)  # the segment lives on while a mapping holds it
        assert b.copy_to_numpy(kept).tolist() == [1.0] * 8
        assert b.stats().bytes_allocated == 0


def test_the_original_pointer_functions() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        memory = Memory.spawn(system)
        buf = dev.allocate_f32(16)
        dev.copy_from_numpy(buf, np.full(16, 2.5, np.float32))
        pointer = buffer_address(dev, buf)
        handle = ipc_get_mem_handle(pointer)
        assert handle == ipc_handle(dev, buf)
        same = IpcMemHandle.from_bytes(bytearray(handle.bytes()))
        opened = ipc_open_mem_handle(same, 64)  # on the device of the latest Memory
        assert isinstance(opened, IpcOpenedMem) and opened.bytes == 64
        assert opened.buffer.device is memory.device
        assert dev.copy_to_numpy(opened.buffer).view(np.float32).tolist() == [2.5] * 16
        assert isinstance(opened.dev_ptr(), int) and "IpcOpenedMem(bytes=64" in repr(opened)
        opened.close()
        opened.close()  # once closed, closing does nothing
        assert dev.copy_to_numpy(buf)[0] == 2.5
        with pytest.raises(InvalidArgument, match="no live buffer of this process has address"):
            ipc_get_mem_handle(12345)
        managed = memory.allocate_managed_f32(4)
        with pytest.raises(InvalidArgument, match="managed buffers cannot be shared"):
            ipc_get_mem_handle(managed.device_ptr())


def test_bad_handles_and_exports_are_refused() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        buf = dev.allocate_f32(4)
        for data, message in [(b"x" * 63, "64 bytes, got 63"), ("x" * 64, "made of bytes")]:
            with pytest.raises(InvalidArgument, match=message):
                IpcMemHandle.from_bytes(data)  # type: ignore[arg-type]
        handle = ipc_handle(dev, buf)
        refusals = [
            (lambda: ipc_handle(dev, dev.allocate_f32(0)), "empty buffer"),
            (lambda: ipc_handle(dev, dev.allocate(4, "f32", managed=True)), "managed"),
            (lambda: ipc_handle(dev, open_ipc(dev, handle, 4)), "mapping of another"),
            (lambda: open_ipc(dev, handle, 5), "shares 16 bytes; 20 do not fit"),
            (lambda: open_ipc(dev, handle, 0), "positive"),
            (lambda: open_ipc(dev, handle.bytes(), 4), "must be an IpcMemHandle"),  # type: ignore[arg-type]
            (lambda: open_ipc(dev, IpcMemHandle.from_bytes(b"\0" * 64), 4), "cpu device"),
            (lambda: ipc_open_mem_handle(handle, 16, device="dev"), "must be a Device"),  # type: ignore[arg-type]
            (lambda: ipc_handle(dev, buf, timeout_secs="soon"), "timeout_secs"),  # type: ignore[arg-type]
        ]
        for call, message in refusals:
            with pytest.raises(InvalidArgument, match=message):
                call()
        dev.free(buf)
        with pytest.raises(InvalidArgument, match="freed"):
            open_ipc(dev, handle, 4)


@pytest.mark.gpu
def test_cuda_devices_of_one_process_alias_an_export() -> None:
    """CUDA opens a handle only in another process; within one, the export is aliased."""
    n = 1000
    values = np.arange(n, dtype=np.float32)
    with System.open("t") as system:
        a, b = system.spawn_device(mock=False), system.spawn_device(mock=False)
        src = a.allocate_f32(n)
        a.copy_from_numpy(src, values)
        before = buffer_address(a, src)
        handle = ipc_handle(a, src)
        assert buffer_address(a, src) != before  # moved into an allocation of its own
        view = open_ipc(b, handle, n)
        np.testing.assert_array_equal(b.copy_to_numpy(view), values)
        b.blas().scal(n, 3.0, view)
        np.testing.assert_array_equal(a.copy_to_numpy(src), 3 * values)
        with pytest.raises(InvalidArgument, match=r"shares \d+ bytes"):
            open_ipc(b, handle, 1 << 20)
        cpu = system.spawn_device(mock=True)
        cpu_handle = ipc_handle(cpu, cpu.allocate_f32(4))
        with pytest.raises(InvalidArgument, match="made by a cpu device"):
            open_ipc(b, cpu_handle, 4)
        x = a.allocate_f32(64)
        rec = a.record_graph()
        rec.blas().scal(64, 2.0, x)
        graph = rec.capture()
        with pytest.raises(InvalidArgument, match="recorded in a CUDA graph"):
            ipc_handle(a, x)
        graph.destroy()
        ipc_handle(a, x)  # once the graph is gone, the buffer may move
