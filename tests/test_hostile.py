"""Hostile input and hostile conditions thrown at the public API, on both hosts.

Every bad call must raise a typed ``GpuRuntimeError`` subclass (the one named),
lose nothing (a sentinel buffer keeps its contents, the context is not
rebuilt), never hang (pytest-timeout, and bounded joins), and leave no worker
process, thread or shared-memory segment behind. Conditions that need a
subprocess (a full or read-only ``/dev/shm``, no file descriptor left, a killed
parent) are in ``test_transport_faults.py``; cancellation and closing under
callers in ``test_request_lifecycle.py``; an unusable journal in
``test_journal_health.py``.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from _ray_hosts import RAY
from _signals import Alarms, in_collector_callback

from atomr_accel import (
    AskTimeout,
    DeviceUnavailable,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    OutOfMemory,
    System,
    SystemClosed,
)
from atomr_accel.core import DType, GpuRef
from atomr_accel.facade import Device
from atomr_accel.hosts._shm import live_segments

HOSTS = ["thread", "process", RAY]
SENTINEL = np.arange(64, dtype=np.float64) * 1.5


@dataclass
class Env:
    """What a hostile call may use: a system, a device, another device, buffers."""

    system: System
    dev: Device
    other: Device
    f64: Any  # 64 float64, holding SENTINEL
    s: Any  # 64 float64 of scratch, for operands
    f32: Any  # 16 float32
    foreign: Any  # a buffer of ``other``


def _workers() -> list[int]:
    """This process's context worker processes (alive, or zombies not yet reaped)."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                command = cmd.read()
        except OSError:
            continue
        if int(fields[1]) == me and b"atomr_accel.hosts._worker" in command:
            found.append(int(entry))
    return found


# The module checks that nothing is left behind (threads, workers, segments): alone, after
# the parallel suite, where other tests' threads and load do not blur it.
pytestmark = pytest.mark.serial

@pytest.fixture(scope="module", params=HOSTS)
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    threads = threading.active_count()
    system = System.open("hostile", op_timeout=60)
    dev = system.spawn_device(0, mock=True, isolation=request.param)
    other = system.spawn_device(1, mock=True)
    f64, s, f32 = dev.allocate_f64(64), dev.allocate_f64(64), dev.allocate_f32(16)
    foreign = other.allocate_f64(64)
    dev.copy_from_numpy(f64, SENTINEL)
    yield Env(system, dev, other, f64, s, f32, foreign)
    system.close()
    assert _workers() == []
    assert live_segments() == []
    assert threading.active_count() <= threads  # no thread left behind


# ---------------------------------------------------------------- bad input: the table


def _use_freed(e: Env) -> object:
    buf = e.dev.allocate_f64(4)
    e.dev.free(buf)
    return e.dev.copy_to_numpy(buf)


def _free_twice(e: Env) -> object:
    buf = e.dev.allocate_f64(4)
    e.dev.free(buf)
    e.dev.free(buf)
    return None


def _cuda_missing(e: Env) -> object:
    from atomr_accel.backends import cuda_device_count

    if cuda_device_count() > 0:
        raise DeviceUnavailable("(a GPU is present: the case does not apply)")
    return e.system.spawn_device(mock=False)



Case = Callable[[Env], object]
CASES: dict[str, tuple[type[GpuRuntimeError], Case]] = {
    # sizes
    "negative length": (InvalidArgument, lambda e: e.dev.allocate_f32(-1)),
    "float length": (InvalidArgument, lambda e: e.dev.allocate_f32(1.5)),  # type: ignore[arg-type]
    "NaN length": (InvalidArgument, lambda e: e.dev.allocate_f32(math.nan)),  # type: ignore[arg-type]
    "string length": (InvalidArgument, lambda e: e.dev.allocate_f32("8")),  # type: ignore[arg-type]
    "bool length": (InvalidArgument, lambda e: e.dev.allocate_f32(True)),
    "huge length": (OutOfMemory, lambda e: e.dev.allocate_f64(1 << 60)),
    "length past int64": (OutOfMemory, lambda e: e.dev.allocate_f64(1 << 70)),
    "unknown dtype": (InvalidArgument, lambda e: e.dev.allocate(8, "f128")),
    "dtype None": (InvalidArgument, lambda e: e.dev.allocate(8, None)),  # type: ignore[arg-type]
    # copies
    "upload of another dtype": (InvalidArgument, lambda e: e.dev.copy_from_numpy(
        e.f64, np.ones(64, np.float32))),
    "upload of another size": (InvalidArgument, lambda e: e.dev.copy_from_numpy(
        e.f64, np.ones(63))),
    "upload at a negative offset": (InvalidArgument, lambda e: e.dev.copy_from_numpy(
        e.f64, np.ones(4), offset=-1)),
    "upload past the end": (InvalidArgument, lambda e: e.dev.copy_from_numpy(
        e.f64, np.ones(4), offset=61)),
    "upload of a string": (InvalidArgument, lambda e: e.dev.copy_from_numpy(e.f64, "abc")),
    "upload of objects": (InvalidArgument, lambda e: e.dev.copy_from_numpy(
        e.f64, np.array([object()] * 64))),
    "download past the end": (InvalidArgument, lambda e: e.dev.copy_to_numpy(e.f64, offset=65)),
    "download of a negative length": (InvalidArgument, lambda e: e.dev.copy_to_numpy(
        e.f64, length=-2)),
    "download into a wrong shape": (InvalidArgument, lambda e: e.dev.copy_to_numpy(
        e.f64, shape=(3, 3))),
    "download with a float offset": (InvalidArgument, lambda e: e.dev.copy_to_numpy(
        e.f64, offset=1.0)),  # type: ignore[arg-type]
    # buffers that are not this device's
    "a foreign buffer": (InvalidArgument, lambda e: e.dev.copy_to_numpy(e.foreign)),
    "a forged ref": (InvalidArgument, lambda e: e.dev.copy_to_numpy(
        GpuRef(e.dev.device_id, 10**9, DType.F64, 64, e.dev.generation, 12345))),
    "a forged id of this device": (InvalidArgument, lambda e: e.dev.copy_to_numpy(
        GpuRef(e.dev.device_id, 10**9, DType.F64, 64, e.dev.generation,
               e.f64.ref.owner))),
    "None as a buffer": (InvalidArgument, lambda e: e.dev.copy_to_numpy(None)),  # type: ignore[arg-type]
    "an array as a buffer": (InvalidArgument, lambda e: e.dev.blas().asum(
        4, np.ones(4))),  # type: ignore[arg-type]
    "a freed buffer": (InvalidArgument, _use_freed),
    "a double free": (InvalidArgument, _free_twice),
    # options and operands of library calls
    "gemv trans='Z'": (InvalidArgument, lambda e: e.dev.blas().gemv(
        4, 4, e.s, e.s, e.s, trans="Z")),
    "syrk upper='Z'": (InvalidArgument, lambda e: e.dev.blas().syrk(
        4, 4, e.s, e.s, upper="Z")),
    "an unknown keyword option": (InvalidArgument, lambda e: e.dev.blas().asum(
        4, e.s, bogus=1)),
    "axpy over more than the buffer": (InvalidArgument, lambda e: e.dev.blas().axpy(
        65, 1.0, e.s, e.s)),
    "axpy with n = -1": (InvalidArgument, lambda e: e.dev.blas().axpy(-1, 1.0, e.s, e.s)),
    "axpy with a string alpha": (InvalidArgument, lambda e: e.dev.blas().axpy(
        4, "x", e.s, e.s)),  # type: ignore[arg-type]
    "gemm larger than its buffers": (InvalidArgument, lambda e: e.dev.blas().gemm(
        e.s, e.s, e.s, 9, 9, 9)),
    "gemm mixing dtypes": (InvalidArgument, lambda e: e.dev.blas().gemm(
        e.s, e.f32, e.s, 2, 2, 2)),
    "an FFT of length 0": (InvalidArgument, lambda e: e.dev.fft().c2c(e.s, e.s, 0)),
    "a negative seed": (InvalidArgument, lambda e: e.dev.rng(-1)),
    "a seed past 2**64": (InvalidArgument, lambda e: e.dev.rng(1 << 64)),
    "potrf larger than its buffer": (InvalidArgument, lambda e: e.dev.solver().potrf(
        e.s, 9)),
    # the device and the system
    "inject_fault('bogus')": (InvalidArgument, lambda e: e.dev.inject_fault("bogus")),
    "run() of a non-op": (InvalidArgument, lambda e: e.dev.run("gemm")),  # type: ignore[arg-type]
    "mark_durable without a journal": (InvalidArgument, lambda e: e.dev.mark_durable(e.f64)),
    "copy_between on one device": (InvalidArgument, lambda e: e.system.copy_between(
        e.f64, e.f64)),
    "place() a negative size": (InvalidArgument, lambda e: e.system.place(-1)),
    "place() more than any device has": (OutOfMemory, lambda e: e.system.place(
        1 << 62, "memory_fit")),
    "an unknown placement policy": (InvalidArgument, lambda e: e.system.placement("bogus")),
    "spawn with isolation='bogus'": (InvalidArgument, lambda e: e.system.spawn_device(
        mock=True, isolation="bogus")),  # type: ignore[arg-type]
    "spawn with backend='bogus'": (InvalidArgument, lambda e: e.system.spawn_device(
        backend="bogus")),
    "spawn with an unknown backend option": (InvalidArgument, lambda e: e.system.spawn_device(
        mock=True, backend_options={"bogus": 1})),
    "spawn of a negative device id": (InvalidArgument, lambda e: e.system.spawn_device(
        -1, mock=True)),
    "spawn of a library that does not exist": (InvalidArgument, lambda e: e.system.spawn_device(
        mock=True, libraries=["bogus"])),
    "CUDA on a machine without it": (DeviceUnavailable, _cuda_missing),
}


def _intact(e: Env, generation: int) -> None:
    """Nothing lost: the sentinel buffer holds what it held, on the same context, and no
    request stays in flight (one whose caller has just heard back may take a moment to
    leave the books: a lost one never does)."""
    np.testing.assert_array_equal(e.dev.copy_to_numpy(e.f64), SENTINEL)
    assert e.dev.generation == generation
    deadline = time.monotonic() + 5.0
    while e.dev.stats().in_flight:
        assert time.monotonic() < deadline, f"a request stays in flight: {e.dev.stats()}"
        time.sleep(0.01)


def test_the_table_is_large() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_typed_error_and_loses_nothing(env: Env, case: str) -> None:
    expected, call = CASES[case]
    generation = env.dev.generation
    with pytest.raises(GpuRuntimeError) as info:
        call(env)
    assert isinstance(info.value, expected), repr(info.value)
    _intact(env, generation)


# ---------------------------------------------------------------- input that is fine


def test_numpy_integers_and_nan_are_accepted(env: Env) -> None:
    generation = env.dev.generation
    buf = env.dev.allocate_f64(np.int64(8))
    assert len(buf) == 8
    data = np.full(8, np.nan)
    data[::2] = np.inf
    env.dev.copy_from_numpy(buf, data, offset=np.int32(0))
    got = env.dev.copy_to_numpy(buf, offset=np.uint8(0), length=np.int16(8))
    np.testing.assert_array_equal(got, data)  # NaN and inf are data
    assert math.isnan(env.dev.blas().asum(np.int64(8), buf))
    _intact(env, generation)


# ---------------------------------------------------------------- hostile conditions


def test_a_stale_buffer_after_a_rebuild_is_refused(env: Env) -> None:
    dev = env.dev
    old = dev.allocate_f64(4)
    with pytest.raises(GpuRuntimeError):
        dev.inject_fault("poison")
    with pytest.raises(GpuRefStale):
        dev.copy_to_numpy(old)
    with pytest.raises(GpuRefStale):
        dev.blas().asum(4, old)
    env.f64, env.s, env.f32 = dev.allocate_f64(64), dev.allocate_f64(64), dev.allocate_f32(16)
    dev.copy_from_numpy(env.f64, SENTINEL)  # the old context took the sentinel with it
    _intact(env, dev.generation)


@pytest.mark.parametrize(("isolation", "timeout"), [("thread", 0.5), ("process", 3.0)])
def test_an_op_past_the_op_timeout_is_ask_timeout_and_the_device_goes_on(
        isolation: str, timeout: float) -> None:
    """(A blocking call on the thread host runs its op on the caller's own thread, which
    the timeout does not cut short: this asks from an event loop. A call behind the op
    still working waits for it within its own timeout.)"""
    with System.open("timeout", op_timeout=timeout) as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        buf = dev.allocate_f64(4)
        dev.copy_from_numpy(buf, np.arange(4.0))
        with pytest.raises(AskTimeout) as info:  # the op works longer than the timeout
            asyncio.run(dev.inject_fault_async("oom", delay=timeout + 1.0))
        assert isinstance(info.value, GpuRuntimeError)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf, timeout_secs=timeout + 10.0),
                                      np.arange(4.0))
        assert dev.generation == 1


def test_a_blocking_call_behind_a_long_op_ends_at_its_timeout() -> None:
    """On the thread host, a blocking call that finds the context busy with a long op
    waits for it only until its own timeout: ``AskTimeout``, never a hang; then it runs."""
    with System.open("behind", op_timeout=30) as system:
        dev = system.spawn_device(mock=True, isolation="thread")
        buf = dev.allocate_f64(4)
        dev.copy_from_numpy(buf, np.arange(4.0))
        ended: list[BaseException] = []

        def work_long() -> None:
            try:
                dev.inject_fault("oom", delay=2.0)
            except OutOfMemory as exc:  # what the injected fault ends with
                ended.append(exc)

        long_op = threading.Thread(target=work_long, daemon=True)
        long_op.start()
        time.sleep(0.3)  # it holds the context now
        started = time.perf_counter()
        with pytest.raises(AskTimeout):
            dev.copy_to_numpy(buf, timeout_secs=0.5)
        assert 0.4 < time.perf_counter() - started < 1.5
        long_op.join(10.0)
        assert len(ended) == 1
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), np.arange(4.0))
        assert dev.generation == 1 and dev.stats().in_flight == 0


def test_a_blocking_call_interrupted_by_a_signal_loses_nothing(env: Env) -> None:
    """KeyboardInterrupt lands while a blocking call waits for its op (a second of work):
    the caller hears it; the op is settled, the device keeps every buffer and goes on."""
    dev = env.dev
    generation = dev.generation
    # Python's own SIGINT handler, whatever a library of an earlier test left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, (
        f"SIGINT stays with {signal.getsignal(signal.SIGINT)!r} (signal.signal is "
        f"{signal.signal!r})")
    timer = threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            dev.inject_fault("oom", delay=1.0)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    buf = dev.allocate_f64(4)
    dev.copy_from_numpy(buf, np.arange(4.0))
    assert dev.blas().asum(4, buf) == 6.0
    deadline = time.monotonic() + 10.0
    while dev.stats().in_flight:  # the interrupted op ends (its second of work) and settles
        assert time.monotonic() < deadline, "the interrupted op never settled"
        time.sleep(0.01)
    _intact(env, generation)


class Alarm(Exception):
    """The user's own exception, raised by the user's own signal handler."""


@pytest.mark.parametrize("call", ["a second of work", "copy_to_numpy", "gemm"])
def test_a_signal_handlers_exception_reaches_the_caller_unchanged(env: Env, call: str) -> None:
    """A signal handler of the user's raises the user's exception while a blocking call runs
    or waits for its op: the caller hears that exception itself (not the op's
    ``LibraryError``), and the device keeps every buffer and goes on."""
    dev, n = env.dev, 256
    generation = dev.generation
    a, c = dev.allocate_f64(n * n), dev.allocate_f64(n * n)
    dev.copy_from_numpy(a, np.random.default_rng(7).standard_normal(n * n))
    calls: dict[str, Callable[[], object]] = {
        "a second of work": lambda: dev.inject_fault("oom", delay=1.0),
        "copy_to_numpy": lambda: dev.copy_to_numpy(a),
        "gemm": lambda: dev.blas().gemm_f64(a, a, c, m=n, n=n, k=n),
    }
    alarms = Alarms(Alarm)
    previous = signal.signal(signal.SIGUSR1, alarms)
    try:
        alarms.send(0.3)
        with pytest.raises(Alarm) as info:
            while True:  # until the signal lands (the calls take nearly all the time)
                calls[call]()
    finally:
        alarms.join()
        signal.signal(signal.SIGUSR1, previous)
    assert type(info.value) is Alarm and info.value.__cause__ is None
    assert any("atomr_accel" in str(entry.path) for entry in info.traceback), \
        "the signal landed between the calls, not in one"
    dev.free(a)
    dev.free(c)
    assert dev.blas().asum(64, env.f64) == float(np.abs(SENTINEL).sum())
    _intact(env, generation)


# Python raises a handler's exception after any call returns, so one may land between the
# blocking twin making its call's coroutine and running it: Python warns that it was never
# awaited (harmless: it never started).
@pytest.mark.filterwarnings("ignore:coroutine '.*' was never awaited:RuntimeWarning")
def test_a_storm_of_signal_handler_exceptions_leaves_nothing_held(env: Env) -> None:
    """Thousands of exceptions raised by a signal handler, one at a time, each landing at
    whatever bytecode a blocking call had reached (taking or giving back a lock, waiting,
    registering or answering its request, waiting for the system's loop): every call
    answers or raises the user's exception (none is swallowed; none is raised inside a
    garbage-collector callback that the call happened to run, where Python itself would
    swallow it), and afterwards the device
    answers at once, with every buffer intact, no lock held, no request left in the books
    and no shared memory left behind. (Not on Ray: its client reports an exception raised
    inside its deserializer as its own ``RaySystemError``, a string.)"""
    if env.dev.isolation == "ray":
        pytest.skip("Ray's client turns an exception raised inside it into RaySystemError")
    dev, n = env.dev, 8
    generation = dev.generation
    a, c = dev.allocate_f64(n * n), dev.allocate_f64(n * n)
    x = np.random.default_rng(11).standard_normal((n, n))
    dev.copy_from_numpy(a, x.ravel())
    calls: list[Callable[[], object]] = [
        lambda: dev.blas().gemm_f64(a, a, c, m=n, n=n, k=n),
        lambda: dev.copy_to_numpy(a),
        lambda: dev.copy_from_numpy(c, x.ravel()),
        dev.stats,  # an ask of the device actor, through the system's loop
    ]
    interrupted, answered = _storm(calls, 8.0, 500, seed=12)
    assert interrupted > 50 and answered > 50, (interrupted, answered)
    started = time.perf_counter()
    dev.blas().gemm_f64(a, a, c, m=n, n=n, k=n, timeout_secs=10)
    assert time.perf_counter() - started < 5.0  # no lock or latch left for it to wait out
    np.testing.assert_allclose(dev.copy_to_numpy(c).reshape(n, n), x @ x, rtol=1e-12)
    np.testing.assert_array_equal(dev.copy_to_numpy(a), x.ravel())
    dev.free(a)
    dev.free(c)
    _intact(env, generation)


def test_signal_handler_exceptions_while_other_threads_hold_the_context_leave_nothing_held(
        ) -> None:
    """Three threads keep a thread host's context busy with blocking gemms while a signal
    handler's exceptions land in the main thread's own blocking calls, wherever they are
    (waiting for the context asleep behind another waiter, yielding for it, holding it):
    each call answers or raises the user's exception, and afterwards eight threads' calls
    all answer at once with the right values (a waiting place left taken would keep every
    contended caller waiting until its deadline)."""
    n = 8
    x = np.random.default_rng(13).standard_normal((n, n))
    with System.open("storm-contended") as system:
        dev = system.spawn_device(mock=True, isolation="thread")
        a = dev.allocate_f64(n * n)
        dev.copy_from_numpy(a, x.ravel())
        stop = threading.Event()
        errors: list[BaseException] = []

        def busy() -> None:
            out = dev.allocate_f64(n * n)
            try:
                while not stop.is_set():
                    dev.blas().gemm_f64(a, a, out, m=n, n=n, k=n, timeout_secs=10)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=busy) for _ in range(3)]
        c = dev.allocate_f64(n * n)
        for worker in workers:
            worker.start()
        try:
            interrupted, answered = _storm(
                [lambda: dev.blas().gemm_f64(a, a, c, m=n, n=n, k=n, timeout_secs=10)], 6.0, 300,
                seed=14)
        finally:
            stop.set()
            for worker in workers:
                worker.join()
        assert not errors, errors
        assert interrupted > 20 and answered > 20, (interrupted, answered)
        outs = [dev.allocate_f64(n * n) for _ in range(8)]
        started = time.perf_counter()

        def calls(out: Any) -> None:
            for _ in range(50):
                dev.blas().gemm_f64(a, a, out, m=n, n=n, k=n, timeout_secs=10)

        threads = [threading.Thread(target=calls, args=(out,)) for out in outs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert time.perf_counter() - started < 5.0
        for out in outs:
            np.testing.assert_allclose(dev.copy_to_numpy(out).reshape(n, n), x @ x,
                                       rtol=1e-12)


def _storm(calls: list[Callable[[], object]], seconds: float, enough: int, seed: int,
           ) -> tuple[int, int]:
    """Run ``calls`` in turn while a signal handler raises ``Alarm`` at random moments, one
    at a time, wherever a call has reached inside the package (never in a callback of the
    garbage collector, where Python swallows it), until ``seconds`` pass or both counts
    reach ``enough``: ``(interrupted, answered)``."""
    armed = iter(np.random.default_rng(seed).uniform(2e-5, 5e-4, 1 << 16))

    def arm() -> None:
        signal.setitimer(signal.ITIMER_PROF, float(next(armed)))

    def alarm(signum: int, frame: Any) -> None:
        if in_collector_callback(frame):  # Python swallows what is raised there
            arm()
            return
        while frame is not None:  # only inside the package: the loop below stays exact
            if "atomr_accel" in frame.f_code.co_filename:
                raise Alarm(f"signal {signum}")
            frame = frame.f_back
        arm()  # landed outside a call: again, soon

    interrupted = answered = 0
    # SIGPROF, of CPU time: pytest-timeout holds SIGALRM
    previous = signal.signal(signal.SIGPROF, alarm)
    try:
        # (SIGPROF counts CPU time: a waiting caller uses little)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and min(interrupted, answered) < enough:
            try:
                if signal.getitimer(signal.ITIMER_PROF)[0] == 0:
                    arm()  # the next one, once the last was raised
                calls[(interrupted + answered) % len(calls)]()
                answered += 1
            except Alarm:
                interrupted += 1
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, previous)
    return interrupted, answered


def test_calls_after_close_are_system_closed() -> None:
    system = System.open("closed")
    dev = system.spawn_device(mock=True)
    buf = dev.allocate_f32(4)
    system.close()
    for call in (lambda: dev.allocate_f32(4), lambda: dev.copy_to_numpy(buf), dev.stats,
                 lambda: dev.blas().asum(4, buf), lambda: system.spawn_device(mock=True),
                 lambda: system.place(0)):
        with pytest.raises(SystemClosed) as info:
            call()
        assert isinstance(info.value, GpuRuntimeError)


def test_a_read_only_dev_shm_is_not_needed() -> None:
    """Anonymous segments do not need ``/dev/shm``; file segments move to the temp
    directory when it is read-only."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o ro tmpfs /dev/shm"],
            check=False, capture_output=True).returncode:
        pytest.skip("needs unshare and mount (a private read-only /dev/shm)")
    code = (
        "import logging, json; logging.disable(logging.CRITICAL)\n"
        "from atomr_accel import System, GpuRuntimeError\n"
        "out = {}\n"
        "with System.open('ro') as s:\n"
        "    try:\n"
        "        d = s.spawn_device(mock=True, isolation='process'); d.allocate_f32(4)\n"
        "        out['spawn'] = 'ok'\n"
        "    except GpuRuntimeError as exc:\n"
        "        out['spawn'] = type(exc).__name__\n"
        "print(json.dumps(out))\n")
    ends = {}
    for mode in ("memfd", "file"):
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o ro tmpfs /dev/shm && exec "$@"',
             "sh", sys.executable, "-c", code], check=False, capture_output=True, text=True,
            env=dict(os.environ, ATOMR_ACCEL_SHM=mode), timeout=90)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ends[mode] = proc.stdout.strip().splitlines()[-1]
    assert ends == {"memfd": '{"spawn": "ok"}', "file": '{"spawn": "ok"}'}


def test_many_threads_of_bad_calls_at_once_lose_nothing(env: Env) -> None:
    generation = env.dev.generation
    failures: list[BaseException] = []
    names = list(CASES)[:30]

    def hammer(i: int) -> None:
        for name in names[i::6]:
            expected, call = CASES[name]
            try:
                call(env)
            except expected:
                continue
            except BaseException as exc:
                failures.append(exc)
                return
            failures.append(AssertionError(f"{name} did not fail"))

    # daemons: a failing check must not leave the session unable to exit
    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60.0)
    assert not any(t.is_alive() for t in threads) and failures == []
    _intact(env, generation)

