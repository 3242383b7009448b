"""Copies between devices and peer topology on the CPU backend (thread and process hosts).

CPU devices have no peer access: every copy between two of them is staged
through the host, and the topology says so. The CUDA paths are in
tests/test_gpu_peer.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    CopyPath,
    Device,
    DType,
    FaultKind,
    GpuRefStale,
    InvalidArgument,
    PeerTopology,
    System,
    SystemClosed,
)
from atomr_accel.core.ops._peer import (
    CanAccessPeer,
    EnablePeerAccess,
    ExportBuffer,
    ImportCopy,
    PeerSource,
)

HOSTS = ["thread", "process"]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("peer-tests") as system:
        yield system


@pytest.fixture(scope="module")
def devices(system: System) -> dict[str, tuple[Device, Device]]:
    """Two CPU devices per host kind."""
    return {
        isolation: (system.spawn_device(0, mock=True, isolation=isolation),
                    system.spawn_device(1, mock=True, isolation=isolation))
        for isolation in HOSTS
    }


def random(rng: np.random.Generator, n: int, dtype: DType) -> np.ndarray:
    return rng.standard_normal(n).astype(dtype.numpy)


@pytest.mark.parametrize("isolation", HOSTS)
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64, DType.C128])
def test_staged_copies_match_numpy_both_ways(
    system: System, devices: dict[str, tuple[Device, Device]], isolation: str, dtype: DType,
) -> None:
    rng = np.random.default_rng(7)
    a, b = devices[isolation]
    x, y = random(rng, 300, dtype), random(rng, 200, dtype)
    src, dst = a.allocate(300, dtype), b.allocate(200, dtype)
    a.copy_from_numpy(src, x)
    b.copy_from_numpy(dst, y)

    path = system.copy_between(src, dst, 50, src_offset=120, dst_offset=30)
    assert path is CopyPath.STAGED and path == "staged"
    expected = y.copy()
    expected[30:80] = x[120:170]
    np.testing.assert_array_equal(b.copy_to_numpy(dst), expected)
    np.testing.assert_array_equal(a.copy_to_numpy(src), x)  # the source is untouched

    assert system.copy_between(dst, src) is CopyPath.STAGED  # default: as many as fit (200)
    x[:200] = expected
    np.testing.assert_array_equal(a.copy_to_numpy(src), x)


def test_copies_between_a_thread_and_a_process_device(
    system: System, devices: dict[str, tuple[Device, Device]],
) -> None:
    rng = np.random.default_rng(8)
    here, there = devices["thread"][0], devices["process"][1]
    x = random(rng, 1000, DType.F32)
    src, mid, back = here.allocate_f32(1000), there.allocate_f32(1000), here.allocate_f32(1000)
    here.copy_from_numpy(src, x)
    assert system.copy_between(src, mid) is CopyPath.STAGED
    assert system.copy_between(mid, back) is CopyPath.STAGED
    np.testing.assert_array_equal(here.copy_to_numpy(back), x)


def test_a_zero_length_copy_changes_nothing(
    system: System, devices: dict[str, tuple[Device, Device]],
) -> None:
    a, b = devices["thread"]
    src, dst = a.allocate_f64(4), b.allocate_f64(4)
    b.copy_from_numpy(dst, np.arange(4.0))
    assert system.copy_between(src, dst, 0, src_offset=4, dst_offset=4) is CopyPath.STAGED
    np.testing.assert_array_equal(b.copy_to_numpy(dst), np.arange(4.0))


def test_cpu_devices_have_no_peer_access(
    system: System, devices: dict[str, tuple[Device, Device]],
) -> None:
    a, b = devices["thread"]
    p, q = devices["process"]
    assert system.can_access(a, a)  # a device reaches its own memory
    assert not system.can_access(a, b) and not system.can_access(b, a)
    assert not system.can_access(a, p) and not system.can_access(p, q)
    assert system.peer_topology() == PeerTopology((), frozenset())
    assert system.enable_peer_access() == PeerTopology((), frozenset())
    for device in (a, p):  # each context answers for itself, in its own process
        assert device.run(CanAccessPeer((0, 1))) == (False, False)
        assert device.run(EnablePeerAccess((0, 1))) == (False, False)


def test_export_needs_a_cuda_device(devices: dict[str, tuple[Device, Device]]) -> None:
    a, _ = devices["thread"]
    buf = a.allocate_f32(4)
    with pytest.raises(InvalidArgument, match="no implementation of ExportBuffer"):
        a.run(ExportBuffer(buf.ref))


def test_peer_topology_reads_as_a_table() -> None:
    topology = PeerTopology((0, 1, 2), frozenset({(0, 1), (1, 0), (2, 0)}))
    assert topology.can_access(0, 1) and topology.can_access(2, 0) and topology.can_access(2, 2)
    assert not topology.can_access(0, 2) and not topology.can_access(3, 3)
    assert str(topology).splitlines() == [
        "        0   1   2",
        "   0    Y   Y   .",
        "   1    Y   Y   .",
        "   2    Y   .   Y",
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda s, d: (s, d.allocate_f64(8), {}), "dtype"),
        (lambda s, d: (s, d.allocate_f32(8), {"length": 9}), "needs 9 elements"),
        (lambda s, d: (s, d.allocate_f32(8), {"src_offset": 9}), "needs 9 elements"),
        (lambda s, d: (s, d.allocate_f32(8), {"length": 4, "dst_offset": 5}), "needs 9"),
        (lambda s, d: (s, d.allocate_f32(8), {"src_offset": -1}), "non-negative"),
        (lambda s, d: (s, d.allocate_f32(8), {"length": -2}), "non-negative"),
        (lambda s, d: (s, s.ref, {}), "must be a GpuBuffer"),
        (lambda s, d: (s, s.device.allocate_f32(8), {}), "Device.copy"),
    ],
    ids=["dtype", "length", "src_offset", "dst_range", "negative_offset", "negative_length",
         "not_a_buffer", "same_device"],
)
def test_bad_copies_raise_and_write_nothing(
    system: System, devices: dict[str, tuple[Device, Device]], make: object, message: str,
) -> None:
    a, b = devices["thread"]
    src = a.allocate_f32(8)
    a.copy_from_numpy(src, np.arange(8, dtype=np.float32))
    _, dst, options = make(src, b)  # type: ignore[operator]
    before = dst.device.copy_to_numpy(dst) if hasattr(dst, "device") else None
    with pytest.raises(InvalidArgument, match=message):
        system.copy_between(src, dst, **options)
    if before is not None:
        np.testing.assert_array_equal(dst.device.copy_to_numpy(dst), before)


def test_devices_of_another_system_are_refused(
    system: System, devices: dict[str, tuple[Device, Device]],
) -> None:
    a, _ = devices["thread"]
    with System.open("peer-other") as other:
        stranger = other.spawn_device(mock=True)
        theirs, ours = stranger.allocate_f32(4), a.allocate_f32(4)
        with pytest.raises(InvalidArgument, match="not a device of this system"):
            system.copy_between(ours, theirs)
        with pytest.raises(InvalidArgument, match="not a device of this system"):
            system.can_access(a, stranger)
    with pytest.raises(InvalidArgument, match="must be a Device"):
        system.can_access(a, "gpu1")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_stale_buffers_and_closed_systems_are_refused() -> None:
    async with await System.open_async("peer-stale") as system:
        a = await system.spawn_device_async(0, mock=True)
        b = await system.spawn_device_async(1, mock=True)
        old, dst = await a.allocate_f32_async(4), await b.allocate_f32_async(4)
        await b.copy_from_numpy_async(dst, np.ones(4, np.float32))
        with pytest.raises(ContextPoisoned):
            await a.inject_fault_async(FaultKind.POISON)
        fresh = await a.allocate_f32_async(4)  # the context has been rebuilt
        with pytest.raises(GpuRefStale):
            await system.copy_between_async(old, dst)
        with pytest.raises(GpuRefStale):
            await system.copy_between_async(dst, old)
        np.testing.assert_array_equal(await b.copy_to_numpy_async(dst), np.ones(4))
        await a.copy_from_numpy_async(fresh, np.arange(4, dtype=np.float32))
        assert await system.copy_between_async(fresh, dst) is CopyPath.STAGED
        np.testing.assert_array_equal(await b.copy_to_numpy_async(dst), np.arange(4))
    with pytest.raises(SystemClosed):
        await system.copy_between_async(fresh, dst)
    with pytest.raises(SystemClosed):
        await system.can_access_async(a, b)
    with pytest.raises(SystemClosed):
        await system.peer_topology_async()


@pytest.mark.anyio
async def test_a_copy_into_a_durable_buffer_comes_back_after_a_rebuild() -> None:
    """The copy is journaled on the destination as an Upload with its data, so it replays."""
    async with await System.open_async("peer-durable") as system:
        a = await system.spawn_device_async(0, mock=True)
        b = await system.spawn_device_async(1, mock=True, journal=":memory:")
        x = np.random.default_rng(9).standard_normal(64)
        src, dst = await a.allocate_f64_async(64), await b.allocate_f64_async(64)
        await b.mark_durable_async(dst)
        await a.copy_from_numpy_async(src, x)
        assert await system.copy_between_async(src, dst, 40, dst_offset=24) is CopyPath.STAGED
        with pytest.raises(ContextPoisoned):
            await b.inject_fault_async(FaultKind.POISON)
        want = np.zeros(64)
        want[24:] = x[:40]
        np.testing.assert_array_equal(await b.copy_to_numpy_async(dst), want)
        assert b.generation == 2 and not dst.is_stale()


def test_peer_ops_check_their_fields(devices: dict[str, tuple[Device, Device]]) -> None:
    _, b = devices["thread"]
    dst = b.allocate_f32(8)
    source = PeerSource(pid=1, device_id=0, dtype=DType.F32, length=8, pointer=0)
    for op, message in [
        (CanAccessPeer((0, -1)), "non-negative"),
        (EnablePeerAccess([0]), "tuple"),  # type: ignore[arg-type]
        (ExportBuffer("buf"), "GpuRef"),  # type: ignore[arg-type]
        (ImportCopy(source, dst.ref, 9), "source needs 9"),
        (ImportCopy(source, dst.ref, 4, dst_offset=5), "dst needs 9"),
        (ImportCopy(dataclasses.replace(source, dtype=DType.F64), dst.ref, 1), "dtype"),
        (ImportCopy(object(), dst.ref, 1), "PeerSource"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidArgument, match=message):
            b.run(op)
