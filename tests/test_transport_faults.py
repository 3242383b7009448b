"""The process host's transport under hostile conditions: shared memory that is short or
gone, no file descriptor left, a parent that dies mid-transfer, a reply nobody can hold,
a reply reader that fails. Each is a typed error for one request (or a rebuilt context),
never a crashed process, a hung caller or a leaked segment."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.hosts import _process
from atomr_accel.hosts._shm import SEGMENT_PREFIX, SHM_ENV, live_segments, shm_dir

MODES = ["memfd", "file"]  # anonymous segments, or files under /dev/shm


def run_script(body: str, mode: str, timeout: float = 90.0,
               wrap: list[str] | None = None) -> dict[str, Any]:
    """Run ``body`` in a fresh interpreter (segments in ``mode``); it prints one JSON line."""
    code = textwrap.dedent("""
        import json, logging, os, sys
        import numpy as np
        logging.disable(logging.CRITICAL)
        from atomr_accel import System
        from atomr_accel.hosts._shm import live_segments
        out = {}
    """) + textwrap.dedent(body) + "\nprint(json.dumps(out), flush=True)\n"
    env = dict(os.environ, **{SHM_ENV: mode})
    command = [*(wrap or []), sys.executable, "-c", code]
    proc = subprocess.run(command, check=False, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def typed(expr: str) -> str:
    """Python that records how ``expr`` ended: ``ok`` or the error's class name."""
    return textwrap.dedent(f"""
        try:
            {expr}
            ended = "ok"
        except Exception as exc:
            ended = type(exc).__name__ + ("/typed" if isinstance(exc, GpuRuntimeError) else "")
    """)


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"], check=False,
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_full_dev_shm_is_a_typed_error_not_a_bus_error(mode: str) -> None:
    """Two devices move 40 MiB each under a 64 MiB ``/dev/shm`` (Docker's default)."""
    if not _can_mount_tmpfs():
        pytest.skip("needs unshare and mount (a private 64 MiB /dev/shm)")
    body = """
        from atomr_accel import GpuRuntimeError
        with System.open("shm") as s:
            devs = [s.spawn_device(i, mock=True, isolation="process") for i in (0, 1)]
            n = 40 << 18
            out["uploads"] = []
            for d in devs:
                a = d.allocate_f32(n)
    """ + textwrap.indent(typed("d.copy_from_numpy(a, np.ones(n, np.float32))"), " " * 16) + """
                out["uploads"].append(ended)
                small = d.allocate_f32(4)
                d.copy_from_numpy(small, np.arange(4, dtype=np.float32))
                out.setdefault("small", []).append(d.copy_to_numpy(small).tolist())
                out.setdefault("generations", []).append(d.generation)
        out["left"] = os.listdir("/dev/shm")
    """
    wrapper = ["unshare", "-m", "sh", "-c",
               'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh"]
    result = run_script(body, mode, wrap=wrapper)
    if mode == "memfd":  # anonymous memory is not bounded by /dev/shm
        assert result["uploads"] == ["ok", "ok"]
    else:
        assert all(u in ("ok", "OutOfMemory/typed") for u in result["uploads"])
        assert "OutOfMemory/typed" in result["uploads"]
    assert result["small"] == [[0.0, 1.0, 2.0, 3.0]] * 2
    assert result["generations"] == [1, 1]
    assert result["left"] == []


@pytest.mark.parametrize("mode", MODES)
def test_shared_memory_past_a_size_limit_fails_that_upload_only(mode: str) -> None:
    """``RLIMIT_FSIZE`` caps every segment the parent makes: an 80 MiB upload (larger than
    the arena) is an
    ``OutOfMemory``, the device and its buffers are untouched, nothing is left behind."""
    body = """
        import resource
        from atomr_accel import GpuRuntimeError
        with System.open("fsize") as s:
            d = s.spawn_device(mock=True, isolation="process")
            keep = d.allocate_f32(4); d.copy_from_numpy(keep, np.arange(4, dtype=np.float32))
            big = d.allocate_f32(20 << 20)
            resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, resource.RLIM_INFINITY))
    """ + textwrap.indent(typed("d.copy_from_numpy(big, np.ones(20 << 20, np.float32))"),
                          " " * 12) + """
            out["upload"] = ended
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            out["keep"] = d.copy_to_numpy(keep).tolist()
            d.copy_from_numpy(big, np.full(20 << 20, 2.0, np.float32))
            out["again"] = float(d.copy_to_numpy(big).sum())
            st = d.stats(); out["gen"] = [st.generation, st.restarts, st.in_flight]
        out["left"] = live_segments()
    """
    result = run_script(body, mode)
    assert result["upload"] == "OutOfMemory/typed"
    assert result["keep"] == [0.0, 1.0, 2.0, 3.0]
    assert result["again"] == 2.0 * (20 << 20)
    assert result["gen"] == [1, 0, 0]
    assert result["left"] == []


@pytest.mark.parametrize("spare", [0, 1])
@pytest.mark.parametrize("mode", MODES)
def test_no_file_descriptor_left_fails_that_upload_only(mode: str, spare: int) -> None:
    """Every descriptor taken (or all but one: the segment is made, mapping it is not) while
    an 80 MiB upload needs a segment of its own."""
    body = """
        import resource
        from atomr_accel import GpuRuntimeError
        with System.open("fd") as s:
            d = s.spawn_device(mock=True, isolation="process")
            keep = d.allocate_f32(4); d.copy_from_numpy(keep, np.arange(4, dtype=np.float32))
            big = d.allocate_f32(20 << 20); x = np.ones(20 << 20, np.float32)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            held = []
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            for _ in range(SPARE):
                os.close(held.pop())
    """ + textwrap.indent(typed("d.copy_from_numpy(big, x)"), " " * 12) + """
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            out["upload"] = ended
            out["keep"] = d.copy_to_numpy(keep).tolist()
            d.copy_from_numpy(big, x)
            out["again"] = float(d.copy_to_numpy(big).sum())
            st = d.stats(); out["gen"] = [st.generation, st.restarts, st.in_flight]
        out["left"] = live_segments()
    """
    result = run_script(body.replace("SPARE", str(spare)), mode)
    assert result["upload"] == "LibraryError/typed"
    assert result["keep"] == [0.0, 1.0, 2.0, 3.0]
    assert result["again"] == float(20 << 20)
    assert result["gen"] == [1, 0, 0]
    assert result["left"] == []


@pytest.mark.parametrize("mode", MODES)
def test_a_parent_killed_mid_transfer_leaves_no_shared_memory(mode: str) -> None:
    """SIGKILL the parent while 100 MiB uploads (larger than the arena) stream to its
    worker: no segment file is left, and the orphaned worker exits."""
    code = textwrap.dedent("""
        import os, threading, numpy as np
        from atomr_accel import System
        s = System.open("kill"); d = s.spawn_device(mock=True, isolation="process")
        a = d.allocate_f32(25 << 20); x = np.ones(25 << 20, np.float32)
        print(d.stats().host_pid, os.getpid(), flush=True)
        d.copy_from_numpy(a, x)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), 9)).start()
        while True:
            d.copy_from_numpy(a, x)
    """)
    env = dict(os.environ, **{SHM_ENV: mode})
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                          text=True, timeout=90)
    assert proc.returncode == -signal.SIGKILL
    worker, parent = (int(word) for word in proc.stdout.split()[:2])
    gone = time.monotonic() + 30.0  # a guard against a hang, not a performance bound
    while _alive(worker) and time.monotonic() < gone:
        time.sleep(0.05)
    assert not _alive(worker)
    prefix = f"{SEGMENT_PREFIX}{parent}-"
    assert [name for name in os.listdir(shm_dir()) if name.startswith(prefix)] == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", MODES)
def test_a_download_the_parent_cannot_hold_is_out_of_memory(mode: str) -> None:
    """An address-space limit on the parent only: a 400 MiB download (blocking, then from
    an event loop) is an ``OutOfMemory``; the 16-byte one after it is served."""
    body = """
        import asyncio, resource
        from atomr_accel import GpuRuntimeError
        vm = lambda: next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
                          if l.startswith("VmSize"))
        with System.open("as", op_timeout=60) as s:
            d = s.spawn_device(mock=True, isolation="process")
            big, small = d.allocate_f32(100 << 20), d.allocate_f32(4)
            d.copy_from_numpy(small, np.arange(4, dtype=np.float32))
            out["ends"] = []
            for how in ("blocking", "async"):
                resource.setrlimit(resource.RLIMIT_AS, (vm() + (300 << 20),
                                                        resource.RLIM_INFINITY))
                call = ("d.copy_to_numpy(big)" if how == "blocking" else
                        "asyncio.run(d.copy_to_numpy_async(big))")
                try:
                    eval(call)
                    ended = "ok"
                except Exception as exc:
                    ended = type(exc).__name__
                resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
                out["ends"].append(ended)
                out.setdefault("small", []).append(d.copy_to_numpy(small).tolist())
            st = d.stats(); out["gen"] = [st.generation, st.in_flight]
        out["left"] = live_segments()
    """
    result = run_script(body, mode)
    assert result["ends"] == ["OutOfMemory", "OutOfMemory"]
    assert result["small"] == [[0.0, 1.0, 2.0, 3.0]] * 2
    assert result["gen"] == [1, 0]
    assert result["left"] == []


def test_a_reply_reader_that_fails_loses_the_context_not_the_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading one of the worker's reply frames fails: the worker is killed, supervision
    rebuilds the context, and the request it held (an allocation: it touches no buffer, so
    it may run twice) runs again there; the device serves again."""
    real_read = _process.read_frame
    armed = False

    async def failing_read(stream: Any) -> Any:
        nonlocal armed
        frame = await real_read(stream)
        if armed and frame is not None:
            armed = False
            raise MemoryError("no memory for this frame")
        return frame

    monkeypatch.setattr(_process, "read_frame", failing_read)

    async def main() -> None:  # on the system's own loop: replies come as frames there
        nonlocal armed
        async with await System.open_async("reader") as system:
            dev = await system.spawn_device_async(mock=True, isolation="process")
            first = (await dev.stats_async()).host_pid
            armed = True
            again = await dev.allocate_f32_async(8)  # answered by a frame on stdout
            assert (len(again) == 8 and again.generation == 2
                    and (await dev.stats_async()).reruns == 1)
            buf = await dev.allocate_f32_async(4)  # the rebuilt context serves
            await dev.copy_from_numpy_async(buf, np.arange(4, dtype=np.float32))
            np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), np.arange(4))
            stats = await dev.stats_async()
            assert stats.generation == 2 and stats.restarts == 1 and stats.in_flight == 0
            assert stats.host_pid not in (None, first) and not _alive(first or 0)

    asyncio.run(main())
    assert live_segments() == []
