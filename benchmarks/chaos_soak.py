"""Chaos soak: concurrent clients against devices whose contexts keep dying.

Clients send asks (gemm, FFT, reads of durable buffers, increments of a durable
accumulator, allocations too large to fit) to a process-host and a thread-host
device while a fault injector SIGKILLs the worker process and injects
poisoned-context and out-of-memory faults at random. Every ask must be answered
(a result or a typed error), every result must be right (NumPy decides), the
durable buffers must come back whole after every rebuild, and at the end the
devices must serve and no worker process or shared-memory segment may be left.
``tests/test_chaos.py`` runs it small in CI.

    python benchmarks/chaos_soak.py [--asks 100000] [--duration 120] [--seed N]
                                    [--clients 32] [--cuda] [--poison inject|kernel]
                                    [--standby] [--durable] [--fault-interval LOW HIGH]

It exits 1 when any answer was wrong, any error unexpected, any ask timed out,
or a worker or segment was left behind; 0 otherwise.

``--cuda`` runs the devices on CUDA (process host only: a thread host cannot
recover a CUDA context). ``--poison kernel`` poisons the context for real with
an NVRTC kernel that stores through an invalid address (CUDA error 700) instead
of ``InjectFault``: the hook is ``poison_with_kernel``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from _report import add_quick, print_table, quiet_expected_faults, write_json

from atomr_accel import (
    AskTimeout,
    ContextPoisoned,
    Device,
    GpuBuffer,
    GpuRefStale,
    OutOfMemory,
    QueueFull,
    Status,
    System,
)
from atomr_accel.hosts._shm import live_segments

T = TypeVar("T")

ALLOWED = (ContextPoisoned, OutOfMemory, GpuRefStale, QueueFull)
"""Typed errors a client may get while contexts die; anything else is a failure."""

N = 256  # elements of the durable buffers
CAPACITY = 64 << 20  # bytes each CPU device may hold; the OOM job asks for more


@dataclass
class SoakConfig:
    """What to run: how many asks, how long at most, which seed, where."""

    asks: int = 10_000
    seed: int = 20_240_611
    clients: int = 24
    duration: float | None = None
    fault_interval: tuple[float, float] = (0.005, 0.03)
    cuda: bool = False
    poison: str = "inject"
    op_timeout: float = 30.0
    standby: bool = False
    """Process-host devices keep a warm standby context (``spawn_device(standby=1)``)."""
    durable: bool = False
    """The jobs' own buffers are durable too: their ops run again after a rebuild."""

    @property
    def isolations(self) -> tuple[str, ...]:
        """The hosts of the devices under test."""
        return ("process",) if self.cuda else ("process", "thread")


@dataclass
class SoakReport:
    """What happened: asks by outcome, faults by kind, wrong answers, leaks."""

    seed: int
    asks: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    failed_asks: Counter[str] = field(default_factory=Counter)
    """Failed asks by what was asked and the error's type (``"gemm: WorkerLost"``)."""
    faults: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    timeouts: int = 0
    stuck: list[str] = field(default_factory=list)
    """Requests a device held for more than ``STUCK_SECONDS``, as the watchdog saw them."""
    seconds: float = 0.0
    worker_pids: set[int] = field(default_factory=set)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def answered(self) -> int:
        """Asks answered with a result or a typed error."""
        return self.ok + sum(self.errors.values())

    def summary(self) -> dict[str, Any]:
        """The report as plain data (for JSON)."""
        return {"seed": self.seed, "asks": self.asks, "answered": self.answered,
                "ok": self.ok, "errors": dict(self.errors),
                "failed_asks": dict(self.failed_asks), "faults": dict(self.faults),
                "wrong": self.wrong[:20], "unexpected": self.unexpected[:20],
                "timeouts": self.timeouts, "stuck": self.stuck[:20], "seconds": self.seconds,
                "devices": self.devices,
                "worker_pids": len(self.worker_pids)}


class Abort(Exception):
    """The current job stops: an ask failed (as allowed) or the asks ran out."""


@dataclass
class Target:
    """A device under test with its durable buffers and what they must hold."""

    name: str
    dev: Device
    base: GpuBuffer
    ones: GpuBuffer
    acc: GpuBuffer
    base_data: np.ndarray[Any, Any]
    increments: int = 0

    @classmethod
    async def start(cls, system: System, isolation: str, cfg: SoakConfig) -> Target:
        """Spawn a journaling device with three durable buffers."""
        options = {} if cfg.cuda else {"capacity": CAPACITY}
        dev = await system.spawn_device_async(
            mock=not cfg.cuda, isolation=isolation, journal=":memory:",
            max_restarts=1_000_000, within=60.0, backend_options=options,
            standby=int(cfg.standby and isolation == "process"))
        base_data = np.random.default_rng(cfg.seed).standard_normal(N)
        base = await dev.allocate_f64_async(N, durable=True)
        ones = await dev.allocate_f64_async(N, durable=True)
        acc = await dev.allocate_f64_async(N, durable=True)
        await dev.copy_from_numpy_async(base, base_data)
        await dev.copy_from_numpy_async(ones, np.ones(N))
        return cls(isolation, dev, base, ones, acc, base_data)


class Soak:
    """The shared state of one soak: tickets (asks left), the report, the stop signal."""

    def __init__(self, cfg: SoakConfig, report: SoakReport, targets: list[Target]) -> None:
        self.cfg = cfg
        self.report = report
        self.targets = targets
        self.tickets = cfg.asks
        self.deadline = None if cfg.duration is None else time.monotonic() + cfg.duration

    def more(self) -> bool:
        """True while asks are left and time is not up."""
        return self.tickets > 0 and (self.deadline is None or time.monotonic() < self.deadline)

    async def ask(self, what: str, make: Callable[[], Awaitable[T]], durable: bool = False) -> T:
        """Send one ask and classify its answer; ``Abort`` the job unless it succeeded."""
        if not self.more():
            raise Abort
        self.tickets -= 1
        self.report.asks += 1
        try:
            result = await make()
        except AskTimeout:
            self.report.timeouts += 1
            raise Abort from None
        except ALLOWED as exc:
            self.report.errors[type(exc).__name__] += 1
            self.report.failed_asks[f"{what}: {type(exc).__name__}"] += 1
            if durable and isinstance(exc, GpuRefStale):
                self.report.unexpected.append(f"{what} on a durable buffer: {exc!r}")
            raise Abort from None
        except Exception as exc:
            self.report.unexpected.append(f"{what}: {exc!r}")
            self.report.errors[type(exc).__name__] += 1
            raise Abort from None
        self.report.ok += 1
        return result

    def check(self, what: str, good: bool) -> None:
        """Record a wrong answer."""
        if not good:
            self.report.wrong.append(what)


async def gemm_job(soak: Soak, t: Target, rng: random.Random) -> None:
    """Allocate, upload, multiply, download, compare with NumPy, free."""
    n = rng.choice((4, 8, 16))
    data = np.random.default_rng(rng.getrandbits(32))
    a_np, b_np = data.standard_normal((n, n)), data.standard_normal((n, n))
    dev = t.dev
    durable = soak.cfg.durable
    a = await soak.ask("allocate", lambda: dev.allocate_f64_async(n * n, durable=durable))
    b = await soak.ask("allocate", lambda: dev.allocate_f64_async(n * n, durable=durable))
    c = await soak.ask("allocate", lambda: dev.allocate_f64_async(n * n, durable=durable))
    await soak.ask("upload", lambda: dev.copy_from_numpy_async(a, a_np))
    await soak.ask("upload", lambda: dev.copy_from_numpy_async(b, b_np))
    await soak.ask("gemm", lambda: dev.blas().matmul_async(a, b, c, n, n, n))
    out = await soak.ask("download", lambda: dev.copy_to_numpy_async(c, shape=(n, n)))
    soak.check(f"gemm {n} on {t.name}", np.allclose(out, a_np @ b_np, rtol=1e-12, atol=1e-12))
    for buf in (a, b, c):
        await soak.ask("free", lambda buf=buf: dev.free_async(buf))


async def fft_job(soak: Soak, t: Target, rng: random.Random) -> None:
    """A real-to-complex FFT compared with ``numpy.fft.rfft``."""
    x_np = np.random.default_rng(rng.getrandbits(32)).standard_normal(64)
    dev = t.dev
    durable = soak.cfg.durable
    x = await soak.ask("allocate", lambda: dev.allocate_f64_async(64, durable=durable))
    y = await soak.ask("allocate", lambda: dev.allocate_async(33, "c128", durable=durable))
    await soak.ask("upload", lambda: dev.copy_from_numpy_async(x, x_np))
    await soak.ask("fft", lambda: dev.fft().r2c_async(x, y, 64))
    out = await soak.ask("download", lambda: dev.copy_to_numpy_async(y))
    soak.check(f"fft on {t.name}", np.allclose(out, np.fft.rfft(x_np), rtol=1e-12, atol=1e-12))
    for buf in (x, y):
        await soak.ask("free", lambda buf=buf: dev.free_async(buf))


async def durable_read_job(soak: Soak, t: Target, rng: random.Random) -> None:
    """Read a durable buffer: it must never be stale and always hold its data."""
    dev = t.dev
    if rng.random() < 0.5:
        total = await soak.ask("dot", lambda: dev.blas().dot_async(N, t.base, t.ones),
                               durable=True)
        soak.check(f"dot of durable buffers on {t.name}",
                   bool(np.isclose(total, t.base_data.sum(), rtol=1e-12, atol=1e-12)))
    else:
        out = await soak.ask("download", lambda: dev.copy_to_numpy_async(t.base), durable=True)
        soak.check(f"durable buffer on {t.name}", out.tobytes() == t.base_data.tobytes())


async def increment_job(soak: Soak, t: Target, rng: random.Random) -> None:
    """acc += ones: the journal must replay exactly the increments that succeeded."""
    await soak.ask("axpy", lambda: t.dev.blas().axpy_async(N, 1.0, t.ones, t.acc), durable=True)
    t.increments += 1


async def oom_job(soak: Soak, t: Target, rng: random.Random) -> None:
    """An allocation larger than the device: it must fail with ``OutOfMemory``."""
    if soak.cfg.cuda:
        return
    buf = await soak.ask("allocate too much",
                         lambda: t.dev.allocate_f64_async(CAPACITY // 8 + 1))
    soak.check(f"an allocation past capacity succeeded on {t.name}", False)
    await soak.ask("free", lambda: t.dev.free_async(buf))


JOBS = (gemm_job, fft_job, durable_read_job, increment_job, oom_job)
WEIGHTS = (30, 12, 30, 8, 2)


async def client(soak: Soak, index: int) -> None:
    """Run random jobs until the asks run out."""
    rng = random.Random(soak.cfg.seed * 1009 + index)
    while soak.more():
        job = rng.choices(JOBS, WEIGHTS)[0]
        with contextlib.suppress(Abort):
            await job(soak, rng.choice(soak.targets), rng)


async def poison_with_kernel(dev: Device) -> None:
    """Poison a CUDA context for real: a kernel stores through an invalid address (error 700)."""
    source = ('extern "C" __global__ void bad(unsigned long long addr) '
              "{ *(volatile float*)addr = 1.0f; }")
    kernel = await dev.nvrtc().compile_async(source, "bad")
    await kernel.launch_async(1, 1, np.uint64(0xDEAD0000))


async def inject(soak: Soak, t: Target, kind: str) -> None:
    """Cause one fault of ``kind`` on ``t`` and check that it is answered as it should be."""
    report = soak.report
    if kind == "kill":
        for _ in range(40):  # a rebuilding device has no worker yet: wait for one (2 s at most)
            pid = (await t.dev.stats_async()).host_pid
            if pid is not None and pid != os.getpid() and pid in children(zombies=False):
                report.worker_pids.add(pid)
                os.kill(pid, signal.SIGKILL)
                report.faults[kind] += 1
                return
            await asyncio.sleep(0.05)
        report.faults["kill (no live worker)"] += 1
        return
    expected = OutOfMemory if kind == "oom" else ContextPoisoned
    try:
        if kind == "poison" and soak.cfg.poison == "kernel":
            await poison_with_kernel(t.dev)
        else:
            await t.dev.inject_fault_async(kind)
    except expected:
        report.faults[kind] += 1
    except ALLOWED:
        report.faults[f"{kind} (hit a rebuild)"] += 1
    except Exception as exc:
        report.unexpected.append(f"inject {kind}: {exc!r}")
    else:
        report.unexpected.append(f"inject {kind} succeeded")


async def injector(soak: Soak, done: asyncio.Event) -> None:
    """Inject a random fault every ``fault_interval`` seconds until ``done``."""
    rng = random.Random(soak.cfg.seed - 1)
    low, high = soak.cfg.fault_interval
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), rng.uniform(low, high))
            return
        t = rng.choice(soak.targets)
        kinds = ["poison", "oom"] + (["kill"] * 3 if t.name == "process" else [])
        await inject(soak, t, rng.choice(kinds))


STUCK_SECONDS = 10.0
"""A request a device holds this long is reported by the watchdog (with how it stands)."""


async def watchdog(soak: Soak, done: asyncio.Event) -> None:
    """Report requests held for more than ``STUCK_SECONDS``: where each stands (launched,
    on which generation, re-runs) and where its device stands, to tell a hang's cause."""
    seen: dict[int, float] = {}
    reported: set[int] = set()
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 1.0)
        now = time.monotonic()
        for t in soak.targets:
            state = t.dev._state  # a diagnostic: the device's own books
            with state.lock:
                held = list(state.pending)
            recorder = state.recorder
            for p in held:
                first = seen.setdefault(id(p), now)
                if now - first > STUCK_SECONDS and id(p) not in reported:
                    reported.add(id(p))
                    soak.report.stuck.append(
                        f"{t.name}: {type(p.op).__name__} launched={p.launched} "
                        f"on generation {p.generation} (device: {state.generation}, "
                        f"{state.status.value}, serving "
                        f"{None if recorder is None else recorder.serving}), "
                        f"reruns={p.reruns}, held {now - first:.0f} s")


async def final_check(soak: Soak, t: Target) -> None:
    """With the faults stopped: the device serves, durable buffers hold what they must."""
    dev, report = t.dev, soak.report
    try:
        base = await dev.copy_to_numpy_async(t.base)
        acc = await dev.copy_to_numpy_async(t.acc)
        probe = await dev.allocate_f64_async(4)
        await dev.copy_from_numpy_async(probe, np.arange(4.0))
        await dev.blas().scal_async(4, 2.0, probe)
        healthy = bool((await dev.copy_to_numpy_async(probe) == np.arange(4.0) * 2).all())
        stats = await dev.stats_async()
    except Exception as exc:
        report.unexpected.append(f"final check of {t.name}: {exc!r}")
        return
    soak.check(f"durable buffer at the end on {t.name}", base.tobytes() == t.base_data.tobytes())
    soak.check(f"accumulator on {t.name} holds {acc[0]} increments, {t.increments} succeeded",
               bool((acc == t.increments).all()))
    soak.check(f"final op on {t.name}", healthy)
    soak.check(f"{t.name} ends {stats.status}", stats.status is Status.READY)
    if stats.host_pid is not None and stats.host_pid != os.getpid():
        report.worker_pids.add(stats.host_pid)
    report.devices[t.name] = {"generation": stats.generation, "restarts": stats.restarts,
                              "increments": t.increments, "completed": stats.completed,
                              "failed": stats.failed}


async def soak(cfg: SoakConfig) -> SoakReport:
    """Run one soak and return its report (the system is closed when it returns)."""
    report = SoakReport(cfg.seed)
    start = time.monotonic()
    async with await System.open_async("chaos", op_timeout=cfg.op_timeout) as system:
        targets = [await Target.start(system, isolation, cfg) for isolation in cfg.isolations]
        run = Soak(cfg, report, targets)
        done = asyncio.Event()
        faults = asyncio.create_task(injector(run, done))
        watch = asyncio.create_task(watchdog(run, done))
        await asyncio.gather(*(client(run, i) for i in range(cfg.clients)))
        done.set()
        await faults
        await watch
        for t in targets:
            await final_check(run, t)
    report.seconds = time.monotonic() - start
    return report


def children(zombies: bool = True) -> list[int]:
    """Context workers (and zombie children) of this process, read from /proc."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        zombie = fields[0] == "Z"  # a zombie's command line is empty
        if int(fields[1]) == me and (
                (zombies and zombie) or b"atomr_accel.hosts._worker" in command):
            found.append(int(entry))
    return found


def segments() -> list[str]:
    """Shared-memory segments this process holds by name (memfds, files in /dev/shm)."""
    return live_segments()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=100_000)
    parser.add_argument("--duration", type=float, default=None,
                        help="stop sending asks after this many seconds")
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--cuda", action="store_true", help="CUDA devices (process host)")
    parser.add_argument("--poison", choices=("inject", "kernel"), default="inject",
                        help="kernel: a real illegal-address kernel (CUDA only)")
    parser.add_argument("--standby", action="store_true",
                        help="a warm standby context on the process-host device")
    parser.add_argument("--durable", action="store_true",
                        help="the jobs' buffers are durable too (their ops run again)")
    parser.add_argument("--fault-interval", type=float, nargs=2, metavar=("LOW", "HIGH"),
                        default=SoakConfig.fault_interval,
                        help="seconds between one fault's answer and the next fault")
    parser.add_argument("--out", default="benchmarks/results/chaos_soak.json")
    parser.add_argument("--log", action="store_true",
                        help="also print the package's log records (a traceback per fault)")
    add_quick(parser, asks=600, duration=20.0, clients=8)
    args = parser.parse_args()
    if not args.log:
        quiet_expected_faults()
    cfg = SoakConfig(asks=args.asks, seed=args.seed, clients=args.clients,
                     duration=args.duration, cuda=args.cuda, poison=args.poison,
                     standby=args.standby, durable=args.durable,
                     fault_interval=tuple(args.fault_interval))
    print(f"chaos soak: seed {cfg.seed}, {cfg.asks} asks, {cfg.clients} clients, "
          f"devices {', '.join(cfg.isolations)}{' on CUDA' if cfg.cuda else ''}")
    report = asyncio.run(soak(cfg))
    leaked_pids = [pid for pid in report.worker_pids if pid in children()]
    leaked_shm = segments()
    print_table(f"chaos soak (seed {cfg.seed}), {report.seconds:.1f} s", ["what", "count"], [
        ["asks sent", report.asks], ["answered", report.answered], ["ok", report.ok],
        *[[f"error {k}", v] for k, v in sorted(report.errors.items())],
        *[[f"fault {k}", v] for k, v in sorted(report.faults.items())],
        ["wrong results", len(report.wrong)], ["unexpected errors", len(report.unexpected)],
        ["ask timeouts (hangs)", report.timeouts], ["requests held > 10 s", len(report.stuck)],
        ["asks / s", report.asks / report.seconds],
        ["leaked workers", len(leaked_pids)], ["leaked shm segments", len(leaked_shm)],
    ])
    print_table("devices at the end", ["device", "generation", "restarts", "increments"],
                [[k, v["generation"], v["restarts"], v["increments"]]
                 for k, v in report.devices.items()])
    for line in report.wrong[:10] + report.unexpected[:10] + report.stuck[:10]:
        print("!", line)
    for what, count in report.failed_asks.most_common(10):
        print(f"failed: {what} x{count}")
    write_json(args.out, {"benchmark": "chaos_soak", "cuda": cfg.cuda, "poison": cfg.poison,
                          "clients": cfg.clients, **report.summary(),
                          "leaked_workers": leaked_pids, "leaked_segments": leaked_shm})
    failures = (len(report.wrong) + len(report.unexpected) + report.timeouts
                + len(leaked_pids) + len(leaked_shm))
    print("soak passed" if not failures else f"soak FAILED: {failures} failures")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
