"""What a device says of itself: where it is in its life (``Status``) and a snapshot of
what it is doing and how it has fared (``DeviceStats``)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from atomr_accel.device._functions import FunctionsStats

__all__ = ["DeviceStats", "Status"]


class Status(enum.Enum):
    """Where the device is in its life."""

    STARTING = "starting"
    READY = "ready"
    REBUILDING = "rebuilding"
    STOPPED = "stopped"


_LOAD_FIELDS = frozenset({"memory_free", "memory_total", "active_streams", "queue_depth",
                          "compute_capability"})
"""The fields the original's ``DeviceLoad`` repr shows first, in its own words."""


@dataclass(frozen=True, slots=True, repr=False)
class DeviceStats:
    """A snapshot of a device: what it is doing and how it has fared (the original
    package's ``DeviceLoad``, the name its ``repr`` shows)."""

    device_id: int
    backend: str
    isolation: str
    status: Status
    generation: int
    restarts: int
    in_flight: int
    queue_depth: int
    completed: int
    failed: int
    out_of_memory: int
    host_pid: int | None
    bytes_allocated: int
    """Bytes held by the live buffers of the current context generation."""
    memory_free: int | None
    """Free device bytes: the last ``MemoryInfo`` reading less what was allocated since
    (None before the first reading). Exact on the CPU backend."""
    memory_total: int | None
    """Total device bytes as of the last ``MemoryInfo`` reading (None before it)."""
    journal_healthy: bool | None = None
    """None without a journal; False once a journal write failed or its queue overflowed:
    durable buffers are then lost at the next rebuild and ``mark_durable`` fails."""
    journal_error: str | None = None
    """Why the journal is unhealthy (None while it is healthy or absent)."""
    active_streams: int = 0
    """Streams the context runs ops on (one per library on CUDA; 0 on the CPU backend)."""
    compute_capability: tuple[int, int] = (0, 0)
    """The GPU's compute capability, ``(9, 0)`` on an H100; ``(0, 0)`` on the CPU backend."""
    standby_ready: bool | None = None
    """None without a standby (``spawn_device(standby=1)``); else whether a started spare
    context waits (False while one starts)."""
    standby_pid: int | None = None
    """The worker process of the waiting spare context: it holds a context of its own
    (on CUDA, its context's memory on the GPU)."""
    standby_switches: int = 0
    """Rebuilds that took the spare context instead of starting one."""
    standby_switch_ms: float | None = None
    """How long the last such rebuild waited for the spare (None before the first)."""
    reruns: int = 0
    """Requests run again on a new context after theirs died under them (their buffers
    durable, their op not the cause)."""
    functions: FunctionsStats = dataclasses.field(default_factory=FunctionsStats)
    """Its residents (name, generation built on) and device functions (calls, failures,
    latencies); the same as ``Device.functions_stats()``."""

    def __repr__(self) -> str:
        """``DeviceLoad(free=…, total=…, streams=…, queue=…, sm=M.m, …)``: the original's
        repr, then this snapshot's other fields."""
        major, minor = self.compute_capability
        rest = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                         if f.name not in _LOAD_FIELDS)
        return (f"DeviceLoad(free={self.free_bytes}, total={self.total_bytes}, "
                f"streams={self.active_streams}, queue={self.queue_depth}, "
                f"sm={major}.{minor}, {rest})")

    @property
    def free_bytes(self) -> int:
        """Free device bytes as last read (0 before the first reading): ``DeviceLoad``'s name."""
        return self.memory_free or 0

    @property
    def total_bytes(self) -> int:
        """Total device bytes as last read (0 before the first reading)."""
        return self.memory_total or 0

    @property
    def compute_cap_major(self) -> int:
        """The major compute capability (0 on the CPU backend)."""
        return self.compute_capability[0]

    @property
    def compute_cap_minor(self) -> int:
        """The minor compute capability (0 on the CPU backend)."""
        return self.compute_capability[1]
