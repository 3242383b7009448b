"""DeviceConfig: everything that decides how one device is built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from atomr_accel.backends import BACKENDS, Capabilities, capabilities
from atomr_accel.core._catalogue import catalogue, library
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.device._journal import JournalConfig
from atomr_accel.device._streams import PerActorStreams, StreamAllocator
from atomr_accel.hosts._base import BackendSpec, ContextHost

__all__ = ["ALL_LIBRARIES", "DeviceConfig"]

ALL_LIBRARIES: tuple[str, ...] = tuple(info.name for info in catalogue())
"""Every library a device can enable, in the catalogue's order (``core._catalogue``)."""

Isolation = Literal["thread", "process", "ray"]


@dataclass(frozen=True)
class DeviceConfig:
    """How to build a device.

    ``backend`` is ``"cpu"`` or ``"cuda"``; ``isolation`` picks the context host
    (``"thread"``: lowest latency; ``"process"``: a worker process, real recovery;
    ``"ray"``: a Ray actor on any node of a Ray cluster, pinned to ``node`` (a Ray
    node id) when given, asking Ray for ``ray_options`` beyond its defaults).
    ``max_restarts`` context rebuilds within ``within`` seconds are allowed; past
    that the device stops for good. ``stash_capacity`` bounds requests queued
    while the context (re)builds. ``streams`` hands out kernel-actor streams.
    ``completion`` picks how the CUDA backend learns that work has finished
    (``"inline"``, ``"sync"``, ``"poll"``, ``"host_fn"``; None: its default).
    ``backend_options`` go to the backend's constructor (e.g. the CPU backend's
    ``capacity`` in bytes); ``host_factory`` replaces the host entirely (tests).
    ``journal`` records completed ops for replay and keeps durable buffers
    across rebuilds (None: no journal).
    """

    device_id: int = 0
    backend: str = "cpu"
    isolation: Isolation = "thread"
    libraries: tuple[str, ...] = ALL_LIBRARIES
    max_restarts: int = 3
    within: float = 60.0
    stash_capacity: int = 1024
    streams: StreamAllocator = field(default_factory=PerActorStreams)
    completion: str | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)
    host_factory: Callable[[BackendSpec], ContextHost] | None = None
    journal: JournalConfig | None = None
    standby: int = 0
    """Spare contexts kept started (0 or 1; process isolation only): see ``_standby``."""
    node: str | None = None
    """The Ray node id the context prefers (``isolation="ray"`` only; a rebuild after the
    node is lost lands on another one)."""
    ray_options: dict[str, Any] = field(default_factory=dict)
    """Options for Ray's actor (``isolation="ray"`` only): resources, a scheduling strategy."""

    def __post_init__(self) -> None:
        if self.isolation not in ("thread", "process", "ray"):
            raise InvalidArgument(
                f"isolation must be 'thread', 'process' or 'ray', got {self.isolation!r}"
            )
        if self.isolation != "ray" and (self.node is not None or self.ray_options):
            raise InvalidArgument("node and ray_options apply to isolation='ray' only")
        if self.node is not None and (not isinstance(self.node, str) or not self.node):
            raise InvalidArgument(f"node must be a Ray node id (a str), got {self.node!r}")
        for name in self.libraries:
            library(name)  # raises for an unknown name, naming the choices
        if self.device_id < 0:
            raise InvalidArgument(f"device_id must be >= 0, got {self.device_id}")
        offers = BACKENDS.get(self.backend)
        if self.completion is not None and not (offers and offers.completion_strategies):
            raise InvalidArgument("completion strategies apply to the CUDA backend only")
        if self.standby not in (0, 1) or isinstance(self.standby, bool):
            raise InvalidArgument(f"standby must be 0 or 1, got {self.standby!r}")
        if self.standby and self.isolation != "process":
            raise InvalidArgument("a standby context needs isolation='process' (a thread "
                                  "host rebuilds in place)")
        if self.stash_capacity < 0 or self.max_restarts < 0 or self.within <= 0:
            raise InvalidArgument("stash_capacity and max_restarts must be >= 0, within > 0")

    @property
    def capabilities(self) -> Capabilities:
        """What the backend offers (``DeviceUnavailable`` for an unknown backend)."""
        return capabilities(self.backend)

    @property
    def spec(self) -> BackendSpec:
        """The backend to build in the context host."""
        options = dict(self.backend_options)
        if self.completion is not None:
            options["completion"] = self.completion
        return BackendSpec(self.backend, self.device_id, options)

    def make_host(self) -> ContextHost:
        """A new, unstarted context host."""
        if self.host_factory is not None:
            return self.host_factory(self.spec)
        if self.isolation == "ray":
            from atomr_accel.hosts._ray import RayHost

            return RayHost(self.spec, self.node, self.ray_options)
        if self.isolation == "process":
            from atomr_accel.hosts._process import ProcessHost

            return ProcessHost(self.spec)
        from atomr_accel.hosts._thread import ThreadHost

        return ThreadHost(self.spec)
