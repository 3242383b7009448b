"""Collectives (``System.nccl_world``) on CPU devices: every collective and dtype against
NumPy, typed errors for bad input, and rebuilds after a poisoned context or a killed
worker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _procs import process_gone

from atomr_accel import (
    ContextPoisoned,
    DTypeMismatch,
    FaultKind,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    LibraryError,
    System,
)
from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._collective import (
    CallKind,
    CollectiveCall,
    CommInit,
    ReduceOp,
    RunCollective,
)
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.errors import CollectiveAborted
from atomr_accel.facade import Collective, Device, GpuBuffer
from atomr_accel.hosts._shm import live_segments, shm_dir

pytestmark = pytest.mark.anyio

DTYPES = ["f16", "bf16", "f32", "f64", "i8", "u8", "i32", "u32", "i64", "u64"]
OPS = ["sum", "prod", "min", "max", "avg"]


def np_dtype(name: str) -> Any:
    return ml_dtypes.bfloat16 if name == "bf16" else np.dtype(
        {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "u8": "uint8",
         "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64"}[name])


def sample(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray[Any, Any]:
    """Random non-zero values small enough that a product of 4 fits every dtype."""
    if dtype.startswith("u"):
        values = rng.integers(1, 4, n)
    elif dtype.startswith("i"):
        values = rng.integers(-3, 4, n)
        values[values == 0] = 2
    else:
        values = rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)
    return values.astype(np_dtype(dtype))


def reference(op: str, arrays: list[np.ndarray[Any, Any]], dtype: str) -> np.ndarray[Any, Any]:
    """The reduction in float64 (exact for these small integers), avg truncated for ints."""
    wide = np.stack([a.astype(np.float64) for a in arrays])
    result = {"sum": wide.sum(0), "prod": wide.prod(0), "min": wide.min(0),
              "max": wide.max(0), "avg": wide.sum(0) / len(arrays)}[op]
    if dtype[0] in "iu" and op == "avg":
        result = np.trunc(result)
    return result


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], dtype: str) -> None:
    tol = {"f16": 1e-2, "bf16": 5e-2, "f32": 1e-5, "f64": 1e-12}.get(dtype, 0.0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


async def upload(dev: Device, data: np.ndarray[Any, Any], dtype: str) -> GpuBuffer:
    buf = await dev.allocate_async(len(data), dtype)
    await dev.copy_from_numpy_async(buf, data)
    return buf


async def world_of(system: System, n: int, isolation: str = "thread"
                   ) -> tuple[list[Device], Collective]:
    devices = [await system.spawn_device_async(device_id=i, mock=True, isolation=isolation)
               for i in range(n)]
    return devices, await system.nccl_world_async(devices)


async def test_all_reduce_every_op_and_dtype() -> None:
    rng = np.random.default_rng(1)
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, 3)
        for dtype in DTYPES:
            for op in OPS:
                xs = [sample(rng, dtype, 17) for _ in devices]
                send = [await upload(d, x, dtype) for d, x in zip(devices, xs, strict=True)]
                recv = [await d.allocate_async(17, dtype) for d in devices]
                await world.all_reduce_async(send, recv, op)
                want = reference(op, xs, dtype)
                for d, r in zip(devices, recv, strict=True):
                    close(await d.copy_to_numpy_async(r), want, dtype)
                await world.all_reduce_async(send, op=op)  # in place
                for d, s in zip(devices, send, strict=True):
                    close(await d.copy_to_numpy_async(s), want, dtype)
        stats = await world.stats_async()
        assert stats.calls["all_reduce"] == 2 * len(DTYPES) * len(OPS)
        assert stats.bytes_moved["all_reduce"] > 0 and stats.epoch == 1 and stats.rebuilds == 0


@pytest.mark.parametrize(("n", "isolation"), [(2, "thread"), (4, "thread"), (2, "process")])
async def test_every_collective_and_dtype(n: int, isolation: str) -> None:
    rng = np.random.default_rng(n)
    count = 6
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, n, isolation)
        for dtype in DTYPES:
            xs = [sample(rng, dtype, count) for _ in devices]
            bufs = [await upload(d, x, dtype) for d, x in zip(devices, xs, strict=True)]
            await world.broadcast_async(bufs, root=n - 1)
            for d, b in zip(devices, bufs, strict=True):
                close(await d.copy_to_numpy_async(b), xs[-1].astype(np.float64), dtype)

            send = [await upload(d, x, dtype) for d, x in zip(devices, xs, strict=True)]
            recv: list[GpuBuffer | None] = [await d.allocate_async(count, dtype)
                                            for d in devices]
            before = await devices[0].copy_to_numpy_async(recv[0])  # type: ignore[arg-type]
            recv_root = list(recv)
            await world.reduce_async(send, recv_root, root=1, op="max")
            close(await devices[1].copy_to_numpy_async(recv[1]),  # type: ignore[arg-type]
                  reference("max", xs, dtype), dtype)
            np.testing.assert_array_equal(  # a non-root rank's recv is left alone
                await devices[0].copy_to_numpy_async(recv[0]), before)  # type: ignore[arg-type]

            gathered = [await d.allocate_async(count * n, dtype) for d in devices]
            await world.all_gather_async(send, gathered)
            whole = np.concatenate(xs).astype(np.float64)
            for d, g in zip(devices, gathered, strict=True):
                close(await d.copy_to_numpy_async(g), whole, dtype)

            big = [sample(rng, dtype, count * n) for _ in devices]
            big_send = [await upload(d, x, dtype) for d, x in zip(devices, big, strict=True)]
            parts = [await d.allocate_async(count, dtype) for d in devices]
            await world.reduce_scatter_async(big_send, parts, op="sum")
            total = reference("sum", big, dtype)
            for r, (d, p) in enumerate(zip(devices, parts, strict=True)):
                close(await d.copy_to_numpy_async(p), total[r * count:(r + 1) * count], dtype)

            exchanged = [await d.allocate_async(count * n, dtype) for d in devices]
            await world.all_to_all_async(big_send, exchanged)
            for r, (d, e) in enumerate(zip(devices, exchanged, strict=True)):
                want = np.concatenate([big[p][r * count:(r + 1) * count] for p in range(n)])
                close(await d.copy_to_numpy_async(e), want.astype(np.float64), dtype)


async def test_send_recv_and_a_group_of_calls() -> None:
    rng = np.random.default_rng(5)
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, 3)
        x = rng.standard_normal(9)
        src = await upload(devices[0], x, "f64")
        dst = await devices[2].allocate_async(9, "f64")
        await world.send_recv_async(src, dst, 0, 2)
        np.testing.assert_array_equal(await devices[2].copy_to_numpy_async(dst), x)

        xs = [rng.standard_normal(5) for _ in devices]
        ys = [rng.standard_normal(5) for _ in devices]
        bufs = [await upload(d, v, "f64") for d, v in zip(devices, xs, strict=True)]
        others = [await upload(d, v, "f64") for d, v in zip(devices, ys, strict=True)]
        out = [await d.allocate_async(15, "f64") for d in devices]
        async with world.group():
            assert await world.all_reduce_async(bufs) is None  # recorded, runs at the exit
            await world.all_gather_async(others, out)
        for d, b, o in zip(devices, bufs, out, strict=True):
            np.testing.assert_allclose(await d.copy_to_numpy_async(b), sum(xs), rtol=1e-12)
            np.testing.assert_array_equal(await d.copy_to_numpy_async(o), np.concatenate(ys))
        with pytest.raises(InvalidArgument, match="nest"):
            async with world.group(), world.group():
                pass
        async with world.group(timeout_secs=5.0):  # its own time-out
            await world.all_reduce_async(bufs)
        np.testing.assert_allclose(await devices[1].copy_to_numpy_async(bufs[1]),
                                   3 * sum(xs), rtol=1e-12)
        for bad in (0, -1.0, float("nan"), True, "1"):
            with pytest.raises(InvalidArgument, match="timeout_secs"):
                world.group(timeout_secs=bad)  # type: ignore[arg-type]


async def test_rank_views_from_separate_tasks() -> None:
    rng = np.random.default_rng(7)
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, 3)
        xs = [rng.standard_normal(4).astype(np.float32) for _ in devices]
        bufs = [await upload(d, x, "f32") for d, x in zip(devices, xs, strict=True)]

        async def rank(i: int) -> None:
            view = world.rank(i)
            await view.all_reduce_async(bufs[i], op="sum")
            await view.broadcast_async(bufs[i], root=2)

        await asyncio.gather(*(rank(i) for i in range(3)))
        for d, b in zip(devices, bufs, strict=True):
            np.testing.assert_allclose(await d.copy_to_numpy_async(b), sum(xs), rtol=1e-5)
        blocks = [rng.standard_normal(6).astype(np.float32) for _ in devices]
        sends = [await upload(d, x, "f32") for d, x in zip(devices, blocks, strict=True)]
        recvs = [await d.allocate_async(6, "f32") for d in devices]
        root_out = await devices[1].allocate_async(6, "f32")

        async def exchange(i: int) -> None:
            view = world.rank(i)
            await view.all_to_all_async(sends[i], recvs[i])
            await view.reduce_async(sends[i], root_out if i == 1 else None, root=1, op="max")

        await asyncio.gather(*(exchange(i) for i in range(3)))
        for r, (d, out) in enumerate(zip(devices, recvs, strict=True)):
            want = np.concatenate([blocks[p][2 * r:2 * r + 2] for p in range(3)])
            np.testing.assert_array_equal(await d.copy_to_numpy_async(out), want)
        np.testing.assert_array_equal(await devices[1].copy_to_numpy_async(root_out),
                                      np.max(blocks, axis=0))
        # Rank 2 never comes: the others are answered within their time-out, typed.
        started = time.perf_counter()
        results = await asyncio.gather(
            world.rank(0).all_reduce_async(bufs[0], timeout_secs=0.3),
            world.rank(1).all_reduce_async(bufs[1], timeout_secs=0.3),
            return_exceptions=True)
        assert all(isinstance(r, CollectiveAborted) for r in results), results
        assert time.perf_counter() - started < 5.0
        with pytest.raises(InvalidArgument):
            world.rank(3)


def test_blocking_calls_and_bad_input_are_typed() -> None:
    rng = np.random.default_rng(9)
    with System.open("t", op_timeout=20) as system:
        devices = [system.spawn_device(device_id=i, mock=True) for i in range(2)]
        lone = system.spawn_device(device_id=5, mock=True, libraries=["blas"])
        world = system.nccl_world(devices, name="pair")
        xs = [rng.integers(-9, 9, 6).astype(np.int32) for _ in devices]
        bufs = []
        for d, x in zip(devices, xs, strict=True):
            b = d.allocate(6, "i32")
            d.copy_from_numpy(b, x)
            bufs.append(b)
        world.all_reduce(bufs, op="min")
        for d, b in zip(devices, bufs, strict=True):
            np.testing.assert_array_equal(d.copy_to_numpy(b), np.minimum(*xs))
        with world.group():
            world.all_reduce(bufs, op="max")
            world.all_reduce(bufs, op="sum")
        np.testing.assert_array_equal(devices[1].copy_to_numpy(bufs[1]), 2 * np.minimum(*xs))
        assert world.stats().calls["all_reduce"] == 3
        text = system.enable_telemetry().render()
        assert 'atomr_world_collectives_total{kind="all_reduce",world="pair"} 3.0' in text
        assert 'atomr_world_epoch{world="pair"} 1.0' in text
        assert 'atomr_world_bytes_total{kind="all_reduce",world="pair"} 144.0' in text
        assert repr(world).startswith("Collective(name='pair'")

        f64 = devices[1].allocate(6, "f64")
        other = devices[0].allocate(6, "i32")
        short = devices[1].allocate(3, "i32")
        c64 = [d.allocate(6, "c64") for d in devices]
        with pytest.raises(InvalidArgument, match="2 ranks"):
            world.all_reduce(bufs[:1])
        with pytest.raises(InvalidArgument, match="rank 1"):
            world.all_reduce([bufs[0], other])
        with pytest.raises(DTypeMismatch):
            world.all_reduce([bufs[0], f64])
        with pytest.raises(DTypeMismatch):
            world.all_reduce(c64)
        with pytest.raises(InvalidArgument, match="one length"):
            world.all_reduce([bufs[0], short])
        with pytest.raises(InvalidArgument, match="op must be"):
            world.all_reduce(bufs, op="mean")
        with pytest.raises(InvalidArgument, match="root"):
            world.broadcast(bufs, root=2)
        with pytest.raises(InvalidArgument, match="list"):
            world.all_reduce(bufs[0])
        with pytest.raises(InvalidArgument, match="at least"):
            world.all_gather(bufs, [other, devices[1].allocate(6, "i32")])
        with pytest.raises(InvalidArgument, match="divisible"):
            world.all_to_all([devices[0].allocate(3, "i32"), short], bufs)
        with pytest.raises(InvalidArgument, match="distinct"):
            world.all_to_all(bufs, bufs)
        with pytest.raises(InvalidArgument, match="timeout"):
            world.all_reduce(bufs, timeout_secs=0)
        with pytest.raises(InvalidArgument, match="twice"):
            system.nccl_world([devices[0], devices[0]])
        with pytest.raises(InvalidArgument, match="nccl"):
            system.nccl_world([devices[0], lone])
        with pytest.raises(InvalidArgument, match="list"):
            system.nccl_world(devices[0])  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="timeout"):
            system.nccl_world(devices, timeout_secs=-1)
        world.all_reduce(bufs)  # still serving
        assert world.stats().status == "ready"


def test_a_repeated_call_runs_its_kept_plan_on_each_calls_data() -> None:
    """A call repeated on the same buffers takes its kept plan (kept by its refs' identities);
    each run reduces the data of its own moment, whichever way the reduction is named, and
    a buffer of the same size and dtype gets a plan of its own."""
    rng = np.random.default_rng(21)
    with System.open("t", op_timeout=20) as system:
        devices = [system.spawn_device(device_id=i, mock=True) for i in range(2)]
        world = system.nccl_world(devices, name="again")
        bufs = [d.allocate(5, "f64") for d in devices]
        others = [d.allocate(5, "f64") for d in devices]
        for op, reduce in (("sum", np.add), (ReduceOp.SUM, np.add), ("max", np.maximum),
                           (ReduceOp.MAX, np.maximum), ("sum", np.add)):
            for target in (bufs, others):
                xs = [rng.standard_normal(5) for _ in devices]
                for d, b, x in zip(devices, target, xs, strict=True):
                    d.copy_from_numpy(b, x)
                world.all_reduce(target, op=op)
                for d, b in zip(devices, target, strict=True):
                    np.testing.assert_allclose(d.copy_to_numpy(b), reduce(*xs), rtol=1e-12)
        assert world.stats().calls["all_reduce"] == 10


def test_a_collective_ops_buffers_are_its_sends_and_receives() -> None:
    """``RunCollective.refs`` names each buffer once (sends first), ``writes`` the receives."""
    a, b, c = (GpuRef(0, i, DType.F32, 8, 1) for i in range(3))
    twin = GpuRef(0, 0, DType.F32, 8, 1)  # equal to ``a``, another object

    def run(*calls: CollectiveCall) -> RunCollective:
        return RunCollective(1, 1, 2, calls)

    reduce = CallKind.ALL_REDUCE
    assert run(CollectiveCall(reduce, a, a, 8)).refs() == (a,)
    assert run(CollectiveCall(reduce, a, twin, 8)).refs() == (a,)
    assert run(CollectiveCall(reduce, a, b, 8)).refs() == (a, b)
    assert run(CollectiveCall(CallKind.SEND, a, None, 8, root=1)).refs() == (a,)
    assert run(CollectiveCall(CallKind.RECV, None, b, 8, root=1)).refs() == (b,)
    assert run(CollectiveCall(reduce, a, b, 8)).writes() == (b,)
    assert run(CollectiveCall(CallKind.SEND, a, None, 8, root=1)).writes() == ()
    two = run(CollectiveCall(reduce, a, b, 8), CollectiveCall(reduce, b, c, 8))
    assert two.refs() == (a, b, c)
    assert two.writes() == (b, c)


async def test_a_world_of_thread_and_process_hosts_meets_through_files() -> None:
    """Ranks in this process and a rank in a worker: the in-memory exchange is only for
    worlds whose every rank runs here; this one still answers every rank alike."""
    rng = np.random.default_rng(23)
    async with await System.open_async("t", op_timeout=20) as system:
        devices = [await system.spawn_device_async(device_id=i, mock=True, isolation=iso)
                   for i, iso in enumerate(["thread", "process", "thread"])]
        world = await system.nccl_world_async(devices)
        for _ in range(3):
            xs = [rng.standard_normal(257) for _ in devices]
            bufs = [await upload(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
            await world.all_reduce_async(bufs)
            for d, b in zip(devices, bufs, strict=True):
                np.testing.assert_allclose(await d.copy_to_numpy_async(b), sum(xs), rtol=1e-12)
        await world.send_recv_async(bufs[1], bufs[2], src=1, dst=2)
        np.testing.assert_array_equal(await devices[2].copy_to_numpy_async(bufs[2]),
                                      await devices[1].copy_to_numpy_async(bufs[1]))
    assert world_files() == []


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_poisoned_member_rebuilds_the_world(isolation: str) -> None:
    rng = np.random.default_rng(11)
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, 2, isolation)
        with pytest.raises(ContextPoisoned):
            await devices[1].inject_fault_async(FaultKind.POISON)
        xs = [rng.standard_normal(8) for _ in devices]
        bufs = [await upload(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
        await world.all_reduce_async(bufs)  # waits for the rebuilt world, then runs
        for d, b in zip(devices, bufs, strict=True):
            np.testing.assert_allclose(await d.copy_to_numpy_async(b), sum(xs), rtol=1e-12)
        stats = await world.stats_async()
        assert stats.epoch == 2 and stats.rebuilds == 1
        assert stats.member_generations == (1, 2)


async def test_killed_worker_mid_collective_every_caller_typed_world_rebuilt() -> None:
    rng = np.random.default_rng(13)
    timeout = 10.0
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, 3, "process")
        pids = [(await d.stats_async()).host_pid for d in devices]
        xs = [rng.standard_normal(64) for _ in devices]
        bufs = [await upload(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
        # Keep rank 1's worker busy, so the collective is in flight when it is killed.
        busy = asyncio.ensure_future(devices[1].run_async(
            InjectFault(FaultKind.OOM, delay=2.0)))
        started = time.perf_counter()
        calls = [asyncio.ensure_future(world.rank(i).all_reduce_async(
            bufs[i], timeout_secs=timeout)) for i in range(3)]
        controller = asyncio.ensure_future(world.all_reduce_async(bufs, timeout_secs=timeout))
        await asyncio.sleep(0.2)
        assert not any(c.done() for c in calls)
        os.kill(pids[1], 9)  # type: ignore[arg-type]
        results = await asyncio.gather(*calls, controller, busy, return_exceptions=True)
        assert time.perf_counter() - started < timeout
        assert isinstance(results[1], ContextPoisoned), results
        assert isinstance(results[0], CollectiveAborted), results
        assert isinstance(results[2], CollectiveAborted), results
        assert isinstance(results[3], GpuRuntimeError), results  # the controller's call
        assert isinstance(results[4], GpuRuntimeError), results
        with pytest.raises(GpuRefStale):
            await world.all_reduce_async(bufs)
        fresh = [await upload(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
        await world.all_reduce_async(fresh, timeout_secs=timeout)
        for d, b in zip(devices, fresh, strict=True):
            np.testing.assert_allclose(await d.copy_to_numpy_async(b), sum(xs), rtol=1e-12)
        stats = await world.stats_async()
        assert stats.rebuilds >= 1 and stats.status == "ready" and stats.aborted >= 1
        new_pids = [(await d.stats_async()).host_pid for d in devices]
        assert new_pids[1] not in (None, pids[1])
    assert all(process_gone(p) for p in [*pids, *new_pids])  # type: ignore[arg-type]
    assert live_segments() == []


async def test_a_world_whose_communicators_cannot_be_made_fails_fast_typed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(backend: Any, op: CommInit) -> None:
        raise LibraryError("nccl", "ncclInvalidUsage", "no communicator for you")

    monkeypatch.setitem(CpuBackend.handlers, CommInit, broken)
    async with await System.open_async("t", op_timeout=20) as system:
        devices = [await system.spawn_device_async(device_id=i, mock=True) for i in range(2)]
        started = time.perf_counter()
        with pytest.raises(LibraryError, match="no communicator"):
            await system.nccl_world_async(devices, timeout_secs=15)
        assert time.perf_counter() - started < 10  # three tries, not the whole time-out
        buf = await devices[0].allocate_async(4, "f32")  # the devices serve on
        assert len(buf) == 4


def world_files(pid: int | None = None) -> list[str]:
    """The files process ``pid``'s (default: this one's) worlds keep in shared memory: abort
    words, and the data the ranks of a CPU world exchange beside them."""
    pid = os.getpid() if pid is None else pid
    return [n for n in os.listdir(shm_dir()) if n.startswith(f"atomr-nccl-{pid}-")]


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_a_cpu_world_keeps_few_files_and_leaves_none(isolation: str) -> None:
    rng = np.random.default_rng(17)
    async with await System.open_async("t", op_timeout=20) as system:
        devices, world = await world_of(system, 3, isolation)
        xs = [rng.standard_normal(1000) for _ in devices]
        bufs = [await upload(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
        for _ in range(5):
            await world.all_reduce_async(bufs, op="max")
        await world.send_recv_async(bufs[0], bufs[2], src=0, dst=2)
        # the word, each rank's process id and last files (none where all run here: they
        # meet in memory)
        kept = 1 + world.nranks if isolation == "thread" else 1 + 2 * world.nranks + 2
        assert len(world_files()) <= kept
        with pytest.raises(ContextPoisoned):
            await devices[1].inject_fault_async(FaultKind.POISON)
        fresh = [await upload(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
        await world.all_reduce_async(fresh)
        for d, b in zip(devices, fresh, strict=True):
            np.testing.assert_allclose(await d.copy_to_numpy_async(b), sum(xs), rtol=1e-12)
    assert world_files() == []


def test_a_world_left_open_at_exit_leaves_no_file() -> None:
    code = ("import os\n"
            "from atomr_accel import System\n"
            "system = System.open('t')\n"
            "devices = [system.spawn_device(i, mock=True) for i in range(2)]\n"
            "world = system.nccl_world(devices)\n"
            "world.all_reduce([d.allocate_f32(4) for d in devices])\n"
            "print(os.getpid())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert world_files(int(out.stdout.split()[-1])) == []
