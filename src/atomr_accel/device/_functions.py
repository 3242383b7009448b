"""What a device knows of users' code: its residents (built again on every new context) and
the calls of its device functions (counts and latencies), for stats and dashboards.

``DeviceState.functions`` holds one ``FunctionBook``; ``snapshot()`` reads it from any
thread (``Device.functions_stats()``, and ``DeviceStats.functions``).
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass

import numpy as np

from atomr_accel.core._errors import ContextPoisoned, GpuRuntimeError, Unrecoverable
from atomr_accel.core.ops._function import BuildResident
from atomr_accel.hosts._base import ContextHost

__all__ = ["FunctionBook", "FunctionStats", "FunctionsStats", "ResidentStats"]

_log = logging.getLogger("atomr_accel.device")

_SAMPLES = 1024
"""Latencies kept per function for its percentiles (the most recent calls)."""


@dataclass(frozen=True, slots=True)
class ResidentStats:
    """One resident of a device: its name, the context generation it was last built on
    (None: not built on the current one yet) and why its factory last failed, if it did."""

    name: str
    generation: int | None
    builds: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FunctionStats:
    """The calls of one device function (by name): how many, how many failed, and their
    latency in milliseconds as their callers saw it (percentiles of the last 1024)."""

    name: str
    calls: int
    failures: int
    mean_ms: float
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True, slots=True)
class FunctionsStats:
    """Residents and device functions of one device, as of one moment."""

    residents: tuple[ResidentStats, ...] = ()
    functions: tuple[FunctionStats, ...] = ()


@dataclass(slots=True)
class _Resident:
    build: BuildResident
    name: str
    generation: int | None = None
    builds: int = 0
    error: str | None = None


class _Calls:
    __slots__ = ("calls", "failures", "samples", "total")

    def __init__(self) -> None:
        self.calls = 0
        self.failures = 0
        self.total = 0.0
        self.samples: collections.deque[float] = collections.deque(maxlen=_SAMPLES)


class FunctionBook:
    """A device's residents and function counters; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._residents: dict[int, _Resident] = {}
        self._calls: dict[str, _Calls] = {}

    # ------------------------------------------------------------ residents

    def register(self, build: BuildResident, name: str) -> None:
        """Build the resident of ``build`` on every new context from now on."""
        with self._lock:
            self._residents[build.token] = _Resident(build, name)

    def forget(self, token: int) -> None:
        """The resident is closed (or its first build failed): build it no more."""
        with self._lock:
            self._residents.pop(token, None)

    def built(self, token: int, generation: int) -> None:
        """The resident ``token`` was built (or found built) on context ``generation``."""
        with self._lock:
            entry = self._residents.get(token)
            if entry is not None and entry.generation != generation:
                entry.generation, entry.error = generation, None
                entry.builds += 1

    def _failed(self, token: int, error: BaseException) -> None:
        with self._lock:
            entry = self._residents.get(token)
            if entry is not None:
                entry.generation, entry.error = None, str(error)

    def builds(self) -> list[BuildResident]:
        """The builds of every registered resident, in the order they were made."""
        with self._lock:
            return [entry.build for entry in self._residents.values()]

    async def build_all(self, host: ContextHost, generation: int | None) -> None:
        """Build every registered resident on ``host`` (a new context, or a standby with
        ``generation`` None). A factory that fails is logged and its resident's calls fail
        on that context; a context that goes down stops the builds (it is rebuilt)."""
        for build in self.builds():
            try:
                await host.submit(build)
            except (ContextPoisoned, Unrecoverable):
                return
            except GpuRuntimeError as exc:
                self._failed(build.token, exc)
                _log.warning("resident %r could not be built again: %s",
                             self._name(build.token), exc)
                continue
            if generation is not None:
                self.built(build.token, generation)

    async def warm(self, host: ContextHost) -> None:
        """Build the residents on a standby context ahead of its use."""
        await self.build_all(host, None)

    def _name(self, token: int) -> str:
        with self._lock:
            entry = self._residents.get(token)
            return "?" if entry is None else entry.name

    # ------------------------------------------------------------ calls

    def record(self, name: str, seconds: float, failed: bool) -> None:
        """Count one call of function ``name`` that took ``seconds`` (any thread)."""
        with self._lock:
            calls = self._calls.get(name)
            if calls is None:
                calls = self._calls[name] = _Calls()
            calls.calls += 1
            calls.failures += failed
            calls.total += seconds
            calls.samples.append(seconds)

    def snapshot(self) -> FunctionsStats:
        """Residents and function counters now."""
        with self._lock:
            residents = tuple(ResidentStats(e.name, e.generation, e.builds, e.error)
                              for e in self._residents.values())
            counted = [(name, c.calls, c.failures, c.total, list(c.samples))
                       for name, c in self._calls.items()]
        functions = []
        for name, calls, failures, total, samples in counted:
            p50, p99 = (np.percentile(samples, [50, 99]) * 1e3) if samples else (0.0, 0.0)
            functions.append(FunctionStats(name, calls, failures,
                                           total / calls * 1e3 if calls else 0.0,
                                           float(p50), float(p99)))
        return FunctionsStats(residents, tuple(functions))
