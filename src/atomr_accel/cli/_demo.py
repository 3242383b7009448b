"""``atomr-accel demo``: the main job on the best backend, every result checked against NumPy."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from atomr_accel import (
    ContextPoisoned,
    Device,
    FaultKind,
    GpuRefStale,
    InvalidArgument,
    System,
)
from atomr_accel.backends import capabilities, cuda_device_count
from atomr_accel.cli._table import Progress, format_bytes, format_table
from atomr_accel.facade._system import resolve_backend

__all__ = ["DemoCheckFailed", "run_demo"]


class DemoCheckFailed(AssertionError):
    """A demo result disagreed with NumPy (or a fault was not recovered)."""


@dataclass
class _Row:
    step: str
    device: str
    check: str
    seconds: float = 0.0


class _Events(logging.Handler):
    """Counts the structured ``event`` field of the package's log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event is not None:
            self.counts[event] += 1


def _relative_error(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> float:
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


def _check(name: str, error: float, tolerance: float) -> str:
    if not error <= tolerance:
        raise DemoCheckFailed(f"{name}: relative error {error:.1e} exceeds {tolerance:.0e}")
    return f"rel. error {error:.1e} vs NumPy"


def _gemm(dev: Device, rng: np.random.Generator, n: int) -> str:
    x = rng.standard_normal((n, n)).astype(np.float32)
    y = rng.standard_normal((n, n)).astype(np.float32)
    a, b, c = dev.allocate_f32(n * n), dev.allocate_f32(n * n), dev.allocate_f32(n * n)
    dev.copy_from_numpy(a, x)
    dev.copy_from_numpy(b, y)
    dev.blas().matmul(a, b, c, n, n, n)
    want = x.astype(np.float64) @ y.astype(np.float64)
    error = _relative_error(dev.copy_to_numpy(c, shape=(n, n)), want)
    for buffer in (a, b, c):
        dev.free(buffer)
    return f"{n}x{n}x{n} f32: " + _check("gemm", error, 1e-4)


def _fft(dev: Device, rng: np.random.Generator, n: int) -> str:
    x = rng.standard_normal(n)
    src, dst = dev.allocate_f64(n), dev.allocate(n // 2 + 1, "c128")
    dev.copy_from_numpy(src, x)
    dev.fft().r2c(src, dst, n)
    error = _relative_error(dev.copy_to_numpy(dst), np.fft.rfft(x))
    dev.free(src)
    dev.free(dst)
    return f"r2c of {n} f64: " + _check("fft", error, 1e-10)


def _rng(dev: Device, n: int) -> str:
    whole, halves = dev.allocate_f64(n), dev.allocate_f64(n)
    dev.rng(seed=42).normal(whole)
    gen = dev.rng(seed=42)
    gen.normal(halves, length=n // 2)
    first = dev.copy_to_numpy(halves, length=n // 2)
    gen.normal(halves, length=n - n // 2)  # the stream continues where it stopped
    second = dev.copy_to_numpy(halves, length=n - n // 2)
    x = dev.copy_to_numpy(whole)
    dev.free(whole)
    dev.free(halves)
    if not np.array_equal(np.concatenate([first, second]), x):
        raise DemoCheckFailed("rng: two fills of n/2 differ from one fill of n")
    mean, std = float(x.mean()), float(x.std())
    if abs(mean) > 6 / np.sqrt(n) or abs(std - 1) > 0.01:
        raise DemoCheckFailed(f"rng: normal(0, 1) gave mean {mean:.4f}, std {std:.4f}")
    return f"{n} normals: mean {mean:+.4f}, std {std:.4f}, stream continues exactly"


def _solver(dev: Device, rng: np.random.Generator, n: int) -> str:
    m = rng.standard_normal((n, n))
    spd = m @ m.T + n * np.eye(n)
    rhs = rng.standard_normal(n)
    a, b = dev.allocate_f64(n * n), dev.allocate_f64(n)
    dev.copy_from_numpy(a, spd)
    dev.copy_from_numpy(b, rhs)
    solver = dev.solver()
    solver.potrf(a, n)
    solver.potrs(a, b, n, 1)
    error = _relative_error(dev.copy_to_numpy(b), np.linalg.solve(spd, rhs))
    dev.free(a)
    dev.free(b)
    return f"potrf + potrs {n}x{n} f64: " + _check("solver", error, 1e-9)


def _bad_input(dev: Device) -> str:
    buffer = dev.allocate_f32(8)
    try:
        dev.copy_from_numpy(buffer, np.zeros(8))  # float64 into a float32 buffer
    except InvalidArgument:
        return "f64 data into an f32 buffer: InvalidArgument"
    finally:
        dev.free(buffer)
    raise DemoCheckFailed("bad input was accepted")


def _fault(dev: Device, rng: np.random.Generator) -> str:
    before = dev.stats()
    old = dev.allocate_f32(16)
    try:
        dev.inject_fault(FaultKind.POISON)
    except ContextPoisoned:
        pass
    else:
        raise DemoCheckFailed("the injected fault did not fail its op")
    x = rng.standard_normal(16).astype(np.float32)
    fresh = dev.allocate_f32(16)  # queued until the new context is up
    dev.copy_from_numpy(fresh, x)
    if not np.array_equal(dev.copy_to_numpy(fresh), x):
        raise DemoCheckFailed("the rebuilt context returned wrong data")
    try:
        dev.copy_to_numpy(old)
    except GpuRefStale:
        pass
    else:
        raise DemoCheckFailed("a buffer of the dead context was accepted")
    after = dev.stats()
    if after.generation != before.generation + 1 or after.host_pid == before.host_pid:
        raise DemoCheckFailed(f"no rebuild: {before} -> {after}")
    return (f"new worker {after.host_pid} (was {before.host_pid}), generation "
            f"{after.generation}, old buffers refused")


def run_demo(out: IO[str], backend: str = "auto") -> int:
    """Run the demo on ``backend`` (``auto``: CUDA when present), print it; return 0 if all
    checks pass. Raises ``DemoCheckFailed`` on a wrong result."""
    chosen = resolve_backend(None, backend)
    cuda = capabilities(chosen).needs_gpu
    size = 1024 if cuda else 256
    rng = np.random.default_rng(0)
    logger = logging.getLogger("atomr_accel")
    events, level = _Events(), logger.level
    logger.addHandler(events)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    where = (f"CUDA backend, {cuda_device_count()} GPU(s)" if cuda
             else "CPU backend (NumPy/SciPy; no CUDA device visible)")
    print(f"atomr-accel demo on the {where}\n", file=out)
    rows: list[_Row] = []
    try:
        with System.open("demo") as system:
            total = 8

            def step(index: int, label: str, device: str,
                     body: Callable[[], str]) -> None:
                with Progress(out, index, total, label) as progress:
                    progress.done(body())
                rows.append(_Row(label, device, progress.result, progress.seconds))

            devices: list[Device] = []

            def spawn() -> str:
                count = max(1, min(2, cuda_device_count())) if cuda else 2
                for i in range(count):
                    devices.append(system.spawn_device(device_id=i, backend=chosen))
                devices.append(system.spawn_device(device_id=0, backend=chosen,
                                                   isolation="process"))
                return f"{count} on context threads, 1 in a worker process"

            step(1, "spawn devices", "all", spawn)
            placement = system.placement("least_loaded", devices[:-1])

            def on(label: str, index: int, body: Callable[[Device], str]) -> None:
                dev = placement.pick()
                step(index, label, f"{dev.device_id} ({dev.isolation})", lambda: body(dev))

            on("gemm (cuBLAS-shaped)", 2, lambda d: _gemm(d, rng, size))
            on("FFT", 3, lambda d: _fft(d, rng, size * size))
            on("RNG (Philox)", 4, lambda d: _rng(d, 1 << 20))
            on("solver (Cholesky)", 5, lambda d: _solver(d, rng, size))
            on("typed errors", 6, _bad_input)
            isolated = devices[-1]
            step(7, "fault injected + recovered", f"{isolated.device_id} (process)",
                 lambda: _fault(isolated, rng))

            def placement_step() -> str:
                big = system.place(bytes_needed=1 << 20, policy="memory_fit")
                return f"memory_fit for 1 MiB: device {big.device_id} ({big.isolation})"

            step(8, "placement", "all", placement_step)
            stats = [d.stats() for d in devices]
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
    print("\nsummary", file=out)
    print(format_table(["step", "device", "check", "seconds"],
                       [[r.step, r.device, r.check, f"{r.seconds:.2f}"] for r in rows]), file=out)
    print("\ndevices", file=out)
    print(format_table(
        ["device", "backend", "isolation", "generation", "restarts", "ops ok", "ops failed",
         "allocated", "memory free"],
        [[s.device_id, s.backend, s.isolation, s.generation, s.restarts, s.completed, s.failed,
          format_bytes(s.bytes_allocated), format_bytes(s.memory_free)] for s in stats]),
        file=out)
    logged = ", ".join(f"{k} x{v}" for k, v in sorted(events.counts.items())) or "none"
    print(f"\nlog events (logger atomr_accel.device): {logged}", file=out)
    print(f"all {len(rows)} steps passed", file=out)
    return 0
